"""The learner's side of the plug-in contract (train/learner.py): dynamic sampling on outcome rewards, step
weights into the estimator, the method's batch rewrite, intrinsic terms per record, SFT inside training,
method arrays in the orbax checkpoint, visitation depths in records, and a policy-sized aux model."""

import dataclasses
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import grpo_keydoor
from explore_jax.actors.protocol import EpisodeResult, EpisodeSpec, Response, StepRecord
from explore_jax.methods import base as methods_base
from explore_jax.methods import make_method
from explore_jax.methods.base import BuildContext, Method, SFTRequest
from explore_jax.parallel import sharding
from explore_jax.replay import ExtraField, from_host
from explore_jax.train import loop, rollout, sft, sft_data
from explore_jax.train import state as state_lib
from explore_jax.train.aux_models import AuxModelSpec, build_aux_models
from explore_jax.train.builder import build
from explore_jax.train.learner import Learner

A_1_0 = 0.5 / (np.sqrt(0.5) + 1e-6)  # GRPO's advantage of returns (1, 0): +-(1 - 0.5) / (unbiased std + eps)


def _config(method="grpo"):
  c = grpo_keydoor.get_config()
  c.sft.enabled = False
  c.mesh.shape = (2, 1, 4)
  c.rollout.num_tasks, c.rollout.group_size = 2, 2
  c.method = method
  return c


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
  return build(_config(), str(tmp_path_factory.mktemp("learner")))


def _learner(parts, method, config):
  """A learner for `method` on the parts' model (no build: the model, mesh and tokenizer are shared)."""
  ctx = BuildContext(model_config=parts.model.config, model=parts.model, initial_params=parts.learner.initial_params,
                     tokenizer=parts.tokenizer, mesh=parts.model.mesh, rules=parts.model.rules)
  return Learner(config, parts.model, method, ctx.initial_params, ctx, jax.random.key(0), tokenizer=parts.tokenizer,
                 prompt_len=parts.server.prompt_len, response_len=parts.server.response_len,
                 max_steps=int(config.env.max_steps))


def _config_like(parts, **rl):
  c = parts.config.copy_and_resolve_references()
  for k, v in rl.items():
    setattr(c.rl, k, v)
  return c


def _row(group, traj, step, task, fmt=1.0, prompt=(3, 4, 5), response=(6, 7), **extra):
  return dict(prompt_tokens=np.asarray(prompt, np.int32), response_tokens=np.asarray(response, np.int32),
              behaviour_logprobs=np.full(len(response), -1.0, np.float32), task_reward=task, format_reward=fmt,
              group_id=group, traj_id=traj, step_index=step, policy_version=0, done=False, **extra)


def _response(tokens=(6, 7)):
  n = len(tokens)
  return Response(0, 0, np.asarray(tokens, np.int32), np.full(n, -1.0, np.float32), np.ones(n, np.float32),
                  np.zeros(n, np.int32), 0)


def _episode(group, traj, task_rewards, *, state_keys=None, infos=None, prompts=None, variants=None):
  """A finished episode of len(task_rewards) steps (format ok), as the actors send it back."""
  n = len(task_rewards)
  state_keys = state_keys or list(range(n))
  steps = [StepRecord(episode_id=traj, group_id=group, traj_id=traj, step_index=i, actor_id=0,
                      prompt_ids=list(prompts[i]) if prompts else [3, 4, 5], response=_response(),
                      response_text="go", task_reward=float(task_rewards[i]), format_reward=1.0,
                      state_key=state_keys[i], done=i == n - 1, success=False, info=(infos or [{}] * n)[i],
                      prompt_variants=variants[i] if variants else {})
           for i in range(n)]
  spec = EpisodeSpec(episode_id=traj, group_id=group, traj_id=traj, env_id="explore_jax/KeyDoor-v0")
  return EpisodeResult(spec=spec, steps=steps, success=False, total_reward=float(sum(task_rewards)), feedback="")


def _register(name, cls):
  """Registers a test method once (the registry is global and refuses a second registration)."""
  methods_base._load_all()
  if name not in methods_base._METHODS:
    methods_base.register_method(name)(cls)
  return name


# ---- 1. dynamic sampling keeps groups on outcome rewards ----------------------------------------------

def test_dynamic_sampling_keeps_groups_on_task_rewards_not_shaped_ones(parts):
  rows = [_row(0, 0, 0, 0.0), _row(0, 0, 1, 0.0, fmt=0.0), _row(0, 1, 0, 0.0),  # group 0: every task reward 0
          _row(1, 2, 0, 1.0), _row(1, 3, 0, 0.0), _row(1, 3, 1, 0.0)]         # group 1: one success
  records = from_host(parts.spec, rows, pad_to=8)
  c = _config_like(parts, drop_uniform_groups=True, format_penalty=0.1)
  learner = _learner(parts, make_method(c), c)
  records, rewards, _ = learner.rewards(records)
  np.testing.assert_allclose(rewards[:6], [0.0, -0.1, 0.0, 1.0, 0.0, 0.0], atol=1e-7)
  rewards = rewards + np.array([0.3, 0, 0, 0, 0, 0, 0, 0], np.float32)  # an exploration bonus on group 0 too
  advantages, valid = learner.advantages(records, rewards)
  # Group 0's shaped returns differ (0.2 vs 0) but its outcomes are all 0: dropped. Group 1 stays.
  np.testing.assert_array_equal(valid, [False, False, False, True, True, True, False, False])
  np.testing.assert_allclose(advantages, [0, 0, 0, A_1_0, -A_1_0, -A_1_0, 0, 0], rtol=1e-5, atol=1e-7)

  # Without dynamic sampling group 0 enters, and the estimator sees its shaped returns (0.2 vs 0).
  c = _config_like(parts, drop_uniform_groups=False, format_penalty=0.1)
  advantages, valid = _learner(parts, make_method(c), c).advantages(records, rewards)
  np.testing.assert_array_equal(valid, [True] * 6 + [False] * 2)
  np.testing.assert_allclose(advantages, [A_1_0, A_1_0, -A_1_0, A_1_0, -A_1_0, -A_1_0, 0, 0], rtol=1e-5, atol=1e-7)


# ---- 2. step weights reach the estimator ---------------------------------------------------------------

class _WeightedSteps(Method):
  """Declares DPEPO's per-step weight W_t (here read from the environment's info)."""

  name = "test_weighted_steps"

  def record_fields(self, ctx):
    return {"step_weight": ((), "float32")}

  def step_fields(self, result):
    return [{"step_weight": s.info["w"]} for s in result.steps]


def test_step_weights_reach_the_dpepo_estimator(parts):
  c = _config_like(parts, advantage="dpepo", format_penalty=0.0, drop_uniform_groups=False)
  c.rl.advantage_options = {"eps": 1e-6, "normalize_std": True}
  method = _WeightedSteps(c)
  ctx = BuildContext(model_config=parts.model.config)
  spec = dataclasses.replace(parts.spec, extras=method.record_fields(ctx))
  results = [_episode(0, 0, [0.0, 1.0], infos=[{"w": 0.5}, {"w": 1.0}]),   # return 1
             _episode(0, 1, [0.0], infos=[{"w": 0.25}]),                     # return 0
             _episode(1, 2, [1.0], infos=[{"w": 0.8}]),                      # return 1
             _episode(1, 3, [0.5], infos=[{"w": 0.6}])]                      # return 0.5
  records = rollout.to_records(spec, method, results, max_steps=10, pad_to=8)
  learner = _learner(parts, method, c)
  records, rewards, _ = learner.rewards(records)
  step = learner.step_records(records, rewards, np.asarray(records.valid))
  np.testing.assert_allclose(step.step_weights, [0.5, 1.0, 0.25, 0.8, 0.6, 0, 0, 0])
  advantages, valid = learner.advantages(records, rewards)
  a0 = A_1_0                                          # group 0: returns (1, 0)
  a1 = 0.25 / (np.sqrt(0.125) + 1e-6)                 # group 1: returns (1, 0.5), unbiased std sqrt(1/8)
  # A_t = A W_t for A >= 0, A (2 - W_t) for A < 0.
  expected = [a0 * 0.5, a0 * 1.0, -a0 * (2 - 0.25), a1 * 0.8, -a1 * (2 - 0.6), 0, 0, 0]
  np.testing.assert_allclose(advantages, expected, rtol=1e-5, atol=1e-7)
  assert valid.sum() == 5


# ---- 3. the method's update-batch rewrite (EMPO2's off-policy prompt swap) -------------------------------

class _PromptSwap(Method):
  """Scores half of the valid rows under the prompt without tips (EMPO2's off-policy update)."""

  name = "test_prompt_swap"

  def record_fields(self, ctx):
    P = self.config.rollout.max_prompt_tokens
    return {"prompt_without_tips": ExtraField((P,), "int32", pad="left"),
            "prompt_without_tips_mask": ExtraField((P,), "bool", pad="left")}

  def step_fields(self, result):
    P = self.config.rollout.max_prompt_tokens
    out = []
    for s in result.steps:
      ids = np.asarray(s.prompt_variants["no_tips"][-P:], np.int32)
      out.append({"prompt_without_tips": ids, "prompt_without_tips_mask": np.ones(len(ids), bool)})
    return out

  def update_batch(self, batch, records, rng):
    rows = np.flatnonzero(np.asarray(batch["valid"]))
    chosen = np.zeros(len(batch["valid"]), bool)
    chosen[rng.permutation(rows)[:len(rows) // 2]] = True
    self.chosen = chosen
    pick = jnp.asarray(chosen)[:, None]
    return {**batch,
            "prompt_tokens": jnp.where(pick, jnp.asarray(records.extras["prompt_without_tips"]), batch["prompt_tokens"]),
            "prompt_mask": jnp.where(pick, jnp.asarray(records.extras["prompt_without_tips_mask"]), batch["prompt_mask"])}


def _left(ids, width, pad):
  tokens, mask = np.full(width, pad, np.int32), np.zeros(width, bool)
  tokens[width - len(ids):], mask[width - len(ids):] = ids, True
  return tokens, mask


def test_update_batch_swaps_the_prompts_of_the_rows_the_method_chooses(parts):
  c = _config_like(parts)
  method = _PromptSwap(c)
  spec = dataclasses.replace(parts.spec, extras=method.record_fields(BuildContext(model_config=parts.model.config)))
  prompts = [[10, 11, 12, 13, 14], [20, 21, 22, 23, 24, 25], [30, 31, 32], [40, 41, 42, 43]]
  no_tips = [[12, 13, 14], [25], [31, 32], [41, 42, 43]]
  results = [_episode(0, 0, [0.0, 1.0], prompts=prompts[:2], variants=[{"no_tips": t} for t in no_tips[:2]]),
             _episode(0, 1, [0.0, 0.0], prompts=prompts[2:], variants=[{"no_tips": t} for t in no_tips[2:]])]
  records = rollout.to_records(spec, method, results, max_steps=10, pad_to=6)
  P, pad = spec.prompt_len, spec.pad_id
  for i, ids in enumerate(no_tips):
    tokens, mask = _left(ids, P, pad)
    np.testing.assert_array_equal(records.extras["prompt_without_tips"][i], tokens)
    np.testing.assert_array_equal(records.extras["prompt_without_tips_mask"][i], mask)
  learner = _learner(parts, method, c)
  valid = np.asarray(records.valid)
  advantages = jnp.arange(6, dtype=jnp.float32)
  batch = learner.update_batch(records, advantages, valid, 3)
  chosen = method.chosen
  assert chosen.sum() == 2 and not chosen[~valid].any()
  for i in range(6):
    ids = (no_tips if chosen[i] else prompts)[i] if i < 4 else []
    tokens, mask = _left(ids, P, pad) if ids else (records.prompt_tokens[i], records.prompt_mask[i])
    np.testing.assert_array_equal(batch["prompt_tokens"][i], tokens)
    np.testing.assert_array_equal(batch["prompt_mask"][i], mask)
  for name in ("response_tokens", "response_mask", "behaviour_logprobs", "temperatures"):
    np.testing.assert_array_equal(batch[name], getattr(records, name))
  np.testing.assert_array_equal(batch["advantages"], np.arange(6))
  np.testing.assert_array_equal(batch["valid"], valid)
  # The rewrite's random stream is a function of (seed, iteration).
  learner.update_batch(records, advantages, valid, 3)
  np.testing.assert_array_equal(method.chosen, chosen)


# ---- 4. intrinsic terms are kept per record -------------------------------------------------------------

class _TwoBonuses(Method):
  name = "test_two_bonuses"
  intrinsic_names = ("novelty", "count")

  def intrinsic_rewards(self, records, aux_params, aux_outputs=None):
    n = len(np.asarray(records.valid))
    return {"count": np.full(n, 0.5, np.float32), "novelty": np.arange(n, dtype=np.float32)}


class _WrongName(Method):
  name = "test_wrong_name"
  intrinsic_names = ("novelty",)

  def intrinsic_rewards(self, records, aux_params, aux_outputs=None):
    return {"other": np.zeros(len(np.asarray(records.valid)), np.float32)}


def test_intrinsic_terms_are_kept_per_record_and_added_to_the_reward(parts):
  c = _config_like(parts, format_penalty=0.1)
  method = _TwoBonuses(c)
  spec = dataclasses.replace(parts.spec, intrinsic_names=method.intrinsic_names)
  rows = [_row(0, 0, 0, 1.0, intrinsic=[0.0, 0.0]), _row(0, 1, 0, 0.0, fmt=0.0, intrinsic=[0.0, 0.0]),
          _row(1, 2, 0, 0.0, intrinsic=[0.0, 0.0])]
  records = from_host(spec, rows, pad_to=5)
  out, rewards, metrics = _learner(parts, method, c).rewards(records)
  np.testing.assert_allclose(out.intrinsic_rewards, [[0, 0.5], [1, 0.5], [2, 0.5], [0, 0], [0, 0]])
  np.testing.assert_allclose(rewards[:3], [1.0 + 0 + 0.5, -0.1 + 1 + 0.5, 0.0 + 2 + 0.5], rtol=1e-6)
  np.testing.assert_allclose(spec.intrinsic(out, "novelty"), [0, 1, 2, 0, 0])
  assert metrics["reward/novelty"] == pytest.approx(1.0) and metrics["reward/count"] == pytest.approx(0.5)
  np.testing.assert_array_equal(records.intrinsic_rewards, 0.0)  # the input records are not modified

  with pytest.raises(ValueError, match="declared intrinsic terms"):
    _learner(parts, _WrongName(c), c).rewards(records)


# ---- 5. SFT inside training -----------------------------------------------------------------------------

DEMOS = ({"messages": [{"role": "user", "content": "go to the red door"}], "response": "open door"},
         {"messages": [{"role": "user", "content": "hello world how are you"}], "response": "take key"})


def _demo_loss(parts, params):
  arrays = sft_data.tokenize_demos(parts.tokenizer, DEMOS, parts.server.prompt_len, parts.server.response_len)
  loss, _ = sft.next_token_loss(parts.model, params, {k: jnp.asarray(v) for k, v in arrays.items()})
  return float(loss)


def test_the_sft_loss_projects_only_the_response_columns_and_is_the_same(parts):
  """next_token_loss(last=response_len), as finetune takes it: the logits of the positions that predict the
  response alone, and the same loss, accuracy and gradient as over every position."""
  arrays = sft_data.tokenize_demos(parts.tokenizer, DEMOS, parts.server.prompt_len, parts.server.response_len)
  batch = {k: jnp.asarray(v) for k, v in arrays.items()}
  params = parts.learner.initial_params
  out = {last: jax.value_and_grad(lambda p: sft.next_token_loss(parts.model, p, batch, last=last), has_aux=True)(params)
         for last in (0, parts.server.response_len)}
  ((whole, whole_metrics), whole_grads), ((kept, kept_metrics), kept_grads) = out.values()
  assert float(whole) > 0 and whole_metrics["target_tokens"] == kept_metrics["target_tokens"] > 0
  for k in whole_metrics:
    np.testing.assert_allclose(kept_metrics[k], whole_metrics[k], rtol=1e-5, err_msg=k)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), kept_grads, whole_grads)


def test_sft_request_trains_the_policy_and_keeps_the_rl_optimizer(parts):
  learner = parts.learner
  learner.init(learner.initial_params)
  # A non-trivial RL optimizer state and step, as after some RL updates.
  learner.state = learner.state.replace(step=learner.state.step + 5,
                                        opt_state=jax.tree.map(lambda x: x + 1, learner.state.opt_state))
  opt_before = jax.tree.map(np.asarray, learner.state.opt_state)
  params_before = jax.tree.map(np.asarray, learner.state.params)
  loss_before = _demo_loss(parts, learner.state.params)
  metrics = learner.sft(SFTRequest(demonstrations=DEMOS, steps=8, batch_size=2, learning_rate=1e-3, label="distill"))
  loss_after = _demo_loss(parts, learner.state.params)
  assert loss_after < 0.7 * loss_before
  assert metrics["distill/steps"] == 8.0 and metrics["distill/demonstrations"] == len(DEMOS)
  assert metrics["distill/loss_first"] == pytest.approx(loss_before, rel=1e-4)
  assert int(learner.state.step) == 5
  for a, b in zip(jax.tree.leaves(opt_before), jax.tree.leaves(learner.state.opt_state)):
    np.testing.assert_array_equal(a, np.asarray(b))
  assert any(not np.array_equal(a, np.asarray(b))
             for a, b in zip(jax.tree.leaves(params_before), jax.tree.leaves(learner.state.params)))
  for a, b in zip(jax.tree.leaves(learner.state.params), jax.tree.leaves(learner.shardings.params)):
    assert a.sharding == b  # back on the policy's layout


def test_a_killed_finetune_goes_on_from_its_last_save_to_the_same_params(parts, tmp_path):
  """A long warm start saves its progress: killed after step 5 of 6 (saves at 2 and 4) and called again, it
  trains steps 5 and 6 only, on the batches an uninterrupted run drew there, and ends bit for bit where that
  run ends."""
  from explore_jax.train.learner import finetune

  demos = DEMOS + ({"messages": [{"role": "user", "content": "a key lies on the floor"}], "response": "take key"},
                   {"messages": [{"role": "user", "content": "the door is locked"}], "response": "use key"})
  request = SFTRequest(demonstrations=demos, steps=6, batch_size=2, learning_rate=1e-3, seed=3)
  args = (parts.model, parts.learner.initial_params, request, parts.tokenizer, parts.server.prompt_len,
          parts.server.response_len)
  straight, straight_losses = finetune(*args)

  class Killed(Exception):
    pass

  def kill_after_5(step, loss):
    if step == 5:
      raise Killed

  saves = str(tmp_path / "in_progress")
  with pytest.raises(Killed):
    finetune(*args, progress=kill_after_5, checkpoint_dir=saves, checkpoint_every=2)
  trained = []
  resumed, losses = finetune(*args, progress=lambda step, loss: trained.append(step), checkpoint_dir=saves,
                             checkpoint_every=2)
  assert trained == [5, 6]
  assert losses == straight_losses and len(set(losses)) == 6
  for a, b in zip(jax.tree.leaves(straight), jax.tree.leaves(resumed)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_an_sft_request_in_micro_batches_makes_the_whole_batchs_steps(parts, monkeypatch):
  """SFTRequest.micro_batch_size (config.sft.micro_batch_size for the warm start): each batch's gradient summed
  over passes of that many rows gives the whole batch's steps, up to float sums; a size that does not divide
  the batch is an error naming it."""
  from explore_jax.train import learner as learner_lib, sft

  passes, make_step = [], sft.make_train_step
  monkeypatch.setattr(learner_lib.sft, "make_train_step",
                      lambda *a, **kw: passes.append(kw.get("micro_batches", 1)) or make_step(*a, **kw))
  finetune = learner_lib.finetune
  args = (parts.model, parts.learner.initial_params)
  tail = (parts.tokenizer, parts.server.prompt_len, parts.server.response_len)
  out = {micro: finetune(*args, SFTRequest(demonstrations=DEMOS, steps=4, batch_size=8, learning_rate=1e-3, seed=1,
                                           micro_batch_size=micro), *tail) for micro in (0, 4)}
  assert passes == [1, 2]  # 8 rows in passes of 4
  (whole, whole_losses), (micro, micro_losses) = out[0], out[4]
  np.testing.assert_allclose(micro_losses, whole_losses, rtol=2e-5)
  assert whole_losses[-1] < whole_losses[0]
  # Adam moves a parameter of near-zero gradient by about the learning rate whatever the gradient's float noise,
  # so a few elements may part: the two runs' parameters differ by under 1% of how far training moved them.
  flat = lambda tree: np.concatenate([np.ravel(np.asarray(x, np.float64)) for x in jax.tree.leaves(tree)])
  moved = np.linalg.norm(flat(whole) - flat(parts.learner.initial_params))
  assert moved > 0 and np.linalg.norm(flat(micro) - flat(whole)) < 0.01 * moved
  with pytest.raises(ValueError, match=r"SFT request 'sft': micro_batch_size must divide its batch_size \(8\)"):
    finetune(*args, SFTRequest(demonstrations=DEMOS, steps=1, batch_size=8, learning_rate=1e-3,
                               micro_batch_size=3), *tail)


# ---- 6. method arrays in the orbax checkpoint -----------------------------------------------------------

class _ArrayMemory(Method):
  """A fixed-shape memory of embeddings with a count (array state) and a list of notes (JSON state)."""

  name = "test_array_memory"

  def __init__(self, config):
    super().__init__(config)
    self.keys = np.zeros((8, 4), np.float32)
    self.count = np.zeros((), np.int32)
    self.notes = []

  def array_state(self):
    return {"keys": self.keys, "count": self.count}

  def load_array_state(self, tree):
    self.keys, self.count = np.asarray(tree["keys"]), np.asarray(tree["count"])

  def state_dict(self):
    return {"notes": list(self.notes)}

  def load_state_dict(self, state):
    self.notes = list(state.get("notes", []))


def test_method_arrays_and_json_state_survive_a_restart(tmp_path):
  c = _config(_register("test_array_memory", _ArrayMemory))
  first = build(c, str(tmp_path))
  assert loop.restore_or_init(first) == 0
  keys = np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32)
  first.method.keys, first.method.count, first.method.notes = keys, np.asarray(3, np.int32), ["a", {"b": 1}]
  loop.save(first, 1)

  again = build(c, str(tmp_path))
  assert isinstance(again.method, _ArrayMemory) and again.method.count == 0
  assert loop.restore_or_init(again) == 1
  np.testing.assert_array_equal(again.method.keys, keys)
  assert again.method.keys.dtype == np.float32 and again.method.keys.shape == (8, 4)
  assert int(again.method.count) == 3 and again.method.count.dtype == np.int32
  assert again.method.state_dict() == {"notes": ["a", {"b": 1}]}
  # Step 0 holds the arrays as they were at the start.
  step0 = first.checkpointer.restore(first.learner.abstract_checkpoint(), 0)
  np.testing.assert_array_equal(np.asarray(step0.state["method"]["keys"]), np.zeros((8, 4)))
  assert step0.metadata["method"] == {"notes": []}


def _host(tree):
  return jax.tree.map(lambda x: np.asarray(x, np.float32), tree)


def _assert_trees_equal(a, b):
  for x, y in zip(jax.tree.leaves(_host(a)), jax.tree.leaves(_host(b)), strict=True):
    np.testing.assert_array_equal(x, y)


def test_a_kl_run_keeps_its_reference_policy_through_checkpoint_rotation(tmp_path, capsys):
  """The KL term's reference is the policy RL started from (step 0): it outlives checkpoint.max_to_keep, so a
  resumed run measures KL against it and not against a later policy; a run whose step 0 is gone (saved before
  step 0 was kept) takes the warm start again, which is what step 0 held."""
  c = _config()
  c.rl.loss.kl_coef, c.checkpoint.max_to_keep = 0.05, 1
  first = build(c, str(tmp_path))
  assert loop.restore_or_init(first) == 0
  start = _host(first.learner.state.params)
  for step in (1, 2, 3):  # stand-ins for updates: each saved policy differs from the start
    first.learner.state = first.learner.state.replace(
        params=jax.tree.map(lambda x: x * (1 + 0.25 * step), first.learner.state.params))
    loop.save(first, step)
  assert first.checkpointer.all_steps() == [0, 3]

  again = build(c, str(tmp_path))
  assert loop.restore_or_init(again) == 3
  _assert_trees_equal(again.learner.reference_params, start)
  _assert_trees_equal(again.learner.state.params, first.learner.state.params)

  again.checkpointer.delete(0)
  capsys.readouterr()
  third = build(c, str(tmp_path))
  assert loop.restore_or_init(third) == 3
  assert "the policy RL started from is the warm start again" in capsys.readouterr().out
  _assert_trees_equal(third.learner.reference_params, start)  # sft is off here: the warm start is the init

  c.rl.loss.kl_coef = 0.0  # without a KL term step 0 rotates away like any other
  no_kl = build(c, str(tmp_path / "no_kl"))
  assert loop.restore_or_init(no_kl) == 0 and no_kl.learner.reference_params is None
  for step in (1, 2):
    loop.save(no_kl, step)
  assert no_kl.checkpointer.all_steps() == [2]


# ---- 7. visitation depths -------------------------------------------------------------------------------

def test_visitation_depths_count_earlier_visits_per_trajectory(parts):
  assert rollout.visitation_depths([5, 7, 5, 5, 7]) == [0, 0, 1, 2, 1]
  assert rollout.visitation_depths([]) == []
  method = make_method(parts.config)
  results = [_episode(0, 0, [0.0] * 5, state_keys=[5, 7, 5, 5, 7]), _episode(0, 1, [0.0, 0.0], state_keys=[5, 5])]
  records = rollout.to_records(parts.spec, method, results, max_steps=10, pad_to=9)
  np.testing.assert_array_equal(records.visitation_depth, [0, 0, 1, 2, 1, 0, 1, 0, 0])  # per trajectory
  np.testing.assert_array_equal(records.state_key[:7], [5, 7, 5, 5, 7, 5, 5])


class _ShortFields(Method):
  name = "test_short_fields"

  def step_fields(self, result):
    return [{}]


def test_step_fields_must_cover_every_step(parts):
  with pytest.raises(ValueError, match="step fields for 1 of the episode's 3 steps"):
    rollout.to_records(parts.spec, _ShortFields(parts.config), [_episode(0, 0, [0.0] * 3)], max_steps=10, pad_to=4)


# ---- 8. a policy-sized aux model with a frozen prior ----------------------------------------------------

def test_policy_sized_aux_model_trains_q_keeps_the_prior_and_shards_like_the_policy(parts):
  model, rules = parts.model, parts.model.rules
  mesh = model.mesh
  assert dict(mesh.shape) == {"data": 2, "fsdp": 1, "tensor": 4}
  policy = parts.learner.initial_params
  rng = np.random.default_rng(0)
  tokens = rng.integers(2, 200, size=(4, 16)).astype(np.int32)
  batch = {"tokens": tokens, "loss_mask": np.ones((4, 16), bool)}
  spec = AuxModelSpec(init=lambda key: {"q": policy, "prior": policy},
                      loss=lambda params, b: sft.next_token_loss(model, params["q"], b),
                      batches=lambda records: [batch, batch], param_axes={"q": model.param_axes(), "prior": model.param_axes()},
                      frozen=("prior",), learning_rate=1e-3)
  aux = build_aux_models({"q_phi": spec}, mesh, rules, jax.random.key(0))["q_phi"]
  start = jax.tree.map(np.asarray, policy)
  metrics = aux.train(None)
  assert np.isfinite(metrics["q_phi/loss"]) and metrics["q_phi/skipped"] == 0.0
  q, prior = jax.tree.map(np.asarray, aux.params["q"]), jax.tree.map(np.asarray, aux.params["prior"])
  assert all(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(start["layers"]), jax.tree.leaves(q["layers"]))
             if a.ndim >= 3)
  for a, b in zip(jax.tree.leaves(start), jax.tree.leaves(prior)):
    np.testing.assert_array_equal(a, b)
  for a, b in zip(jax.tree.leaves(start), jax.tree.leaves(policy)):  # the policy's own arrays are untouched
    np.testing.assert_array_equal(a, np.asarray(b))
  expected = sharding.tree_shardings(mesh, model.param_axes(), rules, model.param_shapes())
  policy_sh = state_lib.state_shardings(model, parts.learner.optimizer, mesh, rules).params
  for part in ("q", "prior"):
    for leaf, want, want2 in zip(jax.tree.leaves(aux.params[part]), jax.tree.leaves(expected),
                                 jax.tree.leaves(policy_sh)):
      assert leaf.sharding == want == want2
  assert aux.params["q"]["layers"]["gate"].sharding.spec[2] == "tensor"  # the layout is a real one
  # Adam's moments of q are laid out like q; the frozen prior has none.
  moments = [(jax.tree_util.keystr(path), leaf) for path, leaf in jax.tree_util.tree_leaves_with_path(aux.state.opt_state)
             if jax.tree_util.keystr(path).endswith("['q']['layers']['gate']")]
  assert len(moments) == 2 and all(leaf.sharding == aux.params["q"]["layers"]["gate"].sharding for _, leaf in moments)
  assert not any("['prior']" in jax.tree_util.keystr(path)
                 for path, _ in jax.tree_util.tree_leaves_with_path(aux.state.opt_state))


# ---- throughput counts ------------------------------------------------------------------------------------

def test_update_counts_the_real_tokens_and_attention_pairs_it_trained_on(parts):
  """train/throughput.py's inputs: every epoch sees each valid row's prompt and response tokens once; padding
  rows and padding columns are not counted."""
  c = _config_like(parts, epochs=2)
  prompts = [[3, 4, 5, 6, 7], [8, 9], [10, 11, 12]]
  results = [_episode(0, 0, [0.0, 1.0], prompts=prompts[:2]), _episode(0, 1, [0.0], prompts=prompts[2:])]
  records = rollout.to_records(parts.spec, parts.method, results, max_steps=10, pad_to=5)
  learner = _learner(parts, parts.method, c)
  learner.init(parts.learner.initial_params)
  valid = np.asarray(records.valid)
  assert valid.sum() == 3
  m = learner.update(learner.update_batch(records, jnp.ones(5, jnp.float32), valid, 0), 0)
  lengths = np.asarray([len(p) + 2 for p in prompts], np.float64)  # every response is 2 tokens (_response)
  assert m["update/tokens"] == 2 * lengths.sum() == 2 * (7 + 4 + 5)
  assert m["update/attention_pairs"] == 2 * (lengths * (lengths + 1) / 2).sum()
  assert m["update/padded_tokens"] >= m["update/tokens"]  # what the steps computed on, padding included
  assert m["time_policy_update_s"] > 0


def test_micro_batches_make_the_whole_minibatchs_update_with_the_kl_term(parts):
  """rl.micro_batch_size: the reference log-probs in passes of that many rows, and each minibatch's gradient
  summed over its micro-batches, give the update of whole minibatches (and a size that does not divide the
  minibatch, or does not split over the mesh, is an error naming the key)."""
  prompts = [[3, 4, 5, 6, 7], [8, 9], [10, 11, 12], [13, 14, 15, 16]]
  results = [_episode(0, 0, [0.0, 1.0], prompts=prompts[:2]), _episode(0, 1, [0.0, 0.0], prompts=prompts[2:]),
             _episode(1, 0, [1.0], prompts=prompts[1:2])]
  records = rollout.to_records(parts.spec, parts.method, results, max_steps=10, pad_to=8)
  advantages = jnp.asarray([1.0, -0.5, 0.25, -1.0, 0.75, 0.0, 0.0, 0.0], jnp.float32)
  valid = np.asarray(records.valid)
  assert valid.sum() == 5
  out = {}
  for micro, by_length in ((0, True), (2, True), (2, False)):  # micro-batches sorted by length, or interleaved
    c = _config_like(parts, minibatch_size=4, micro_batch_size=micro, epochs=2)
    c.rl.loss.kl_coef = 0.1
    c.rl.micro_batches_by_length = by_length
    learner = _learner(parts, make_method(c), c)
    learner.init(parts.learner.initial_params)
    learner.reference_params = jax.tree.map(lambda x: x * 0.9, learner.state.params)  # the KL term is not 0
    m = learner.update(learner.update_batch(records, advantages, valid, 0), 0)
    out[micro, by_length] = (jax.device_get(learner.state.params), m)
  whole_params, whole = out[0, True]
  assert whole["update/kl_loss"] > 0 and whole["update/minibatches"] == 4  # 5 rows, minibatches of 4, 2 epochs
  for got_params, got in (out[2, True], out[2, False]):
    for k in whole:
      if not k.startswith("time_") and k != "update/padded_tokens":
        np.testing.assert_allclose(got[k], whole[k], rtol=2e-5, atol=1e-6, err_msg=k)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), got_params, whole_params)
  with pytest.raises(ValueError, match=r"config\.rl\.micro_batch_size must divide config\.rl\.minibatch_size \(4\)"):
    _learner(parts, parts.method, _config_like(parts, minibatch_size=4, micro_batch_size=3))
  # A micro-batch of 1 row cannot be split over the mesh's 2 batch shards (data 2 x fsdp 1).
  lone = _learner(parts, parts.method, _config_like(parts, minibatch_size=4, micro_batch_size=1))
  lone.init(parts.learner.initial_params)
  with pytest.raises(ValueError, match=r"micro-batches of 1 rows cannot be split over the 2 devices.*micro_batch_size"):
    lone.update(lone.update_batch(records, advantages, valid, 0), 0)


def test_updates_wait_for_rl_first_update(parts):
  """rl.first_update = k: iterations before k leave the policy as it is (ScreenExplorer's world model learns
  first); iteration k updates it."""
  c = _config_like(parts, first_update=2)
  results = [_episode(0, 0, [0.0, 1.0]), _episode(0, 1, [0.0])]
  records = rollout.to_records(parts.spec, parts.method, results, max_steps=10, pad_to=5)
  learner = _learner(parts, parts.method, c)
  learner.init(parts.learner.initial_params)
  valid = np.asarray(records.valid)
  before = jax.tree.map(np.asarray, learner.state.params)
  for it in (0, 1):
    assert learner.update(learner.update_batch(records, jnp.ones(5, jnp.float32), valid, it), it) == {
        "update_delayed": 1.0}
  jax.tree.map(np.testing.assert_array_equal, before, jax.tree.map(np.asarray, learner.state.params))
  m = learner.update(learner.update_batch(records, jnp.ones(5, jnp.float32), valid, 2), 2)
  assert "update_delayed" not in m and m["update/tokens"] > 0
