"""EAPO as wired into the loop: the fields world and prompt through a real actor, q_phi's rows, its training and its
R_explore against an independent scoring, its checkpoint, the exploration measures, rollback demonstrations, and
composition with RND."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import eapo_keydoor
from explore_jax.actors.actor import PromptTokenizer
from explore_jax.actors.protocol import EpisodeSpec
from explore_jax.envs.fields import FieldAnswers
from explore_jax.envs.keydoor import KeyDoorEnv
from explore_jax.methods import eapo, make_method, rnd
from explore_jax.methods.base import BuildContext
from explore_jax.methods.eapo_fields import Fields, answer_text, explore_reward, explored_target_text, target_text
from explore_jax.models import Model
from explore_jax.models.config import PRESETS
from explore_jax.parallel import sharding
from explore_jax.parallel.mesh import make_mesh
from explore_jax.replay import RecordSpec
from explore_jax.sampling.sampler import token_logprobs
from explore_jax.train import aux_models, rollout
from explore_jax.train import checkpoint as checkpoint_lib
from tests.conftest import NANO
from tests.methods import scripted

TINY = scripted.TINY
WORLD = {"num_rooms": 3, "hints": False, "max_steps": 6}


def answer(action, explore="go left", memory="a room"):
  return answer_text(Fields("", explore, memory, action))


def config(**eapo_fields):
  c = eapo_keydoor.get_config()
  c.env.kwargs.update(WORLD)
  c.env.max_steps = 6
  c.eapo.q_phi.max_tokens = 96
  c.eapo.q_phi.batch_size = 4
  c.eapo.update(eapo_fields)
  return c


def spec(c, i=0, seed=5):
  env_id, kwargs = rollout.environment(c, dict(c.env.kwargs))
  return EpisodeSpec(episode_id=i, group_id=0, traj_id=i, env_id=env_id, env_kwargs=kwargs, seed=seed)


def play(hook, spec_, responses):
  """The episode as an actor records it, and the prompts it was asked with (tests/methods/scripted.py)."""
  prompts = []
  return scripted.play(hook, spec_, responses, prompts), prompts


# ---- the fields world and prompt -------------------------------------------------------------------------

def test_the_boxed_action_is_played_and_anything_else_is_an_invalid_action():
  env = FieldAnswers("explore_jax/KeyDoor-v0", env_kwargs=WORLD)
  env.reset(seed=5)
  start = env.raw_observation()
  observation, _, _, _, info = env.step("go left")  # the world's own grammar is not an answer
  assert info["format_reward"] == 0.0 and observation.startswith("Invalid action: Expected <think>")
  observation, _, _, _, info = env.step(answer("fly"))  # well-formed fields, an action the world does not take
  assert info["format_reward"] == 0.0 and "The boxed action is not one this world takes" in observation
  assert env.raw_observation() == start and info["action"] is None
  observation, _, _, _, info = env.step(answer("go left"))
  assert info["format_reward"] == 1.0 and info["action"] == "go left"
  assert observation == env.env.raw_observation() != start
  assert env.env.steps == 1 and env.steps == 3  # the world stepped once; the two refusals cost the episode a step each


def test_the_oracle_answers_in_fields_and_wins():
  env = FieldAnswers("explore_jax/KeyDoor-v0", env_kwargs=WORLD)
  env.reset(seed=5)
  done = False
  while not done:
    text = env.oracle_action()
    *_, terminated, truncated, info = env.step(text)
    assert info["format_reward"] == 1.0, text
    done = terminated or truncated
  assert info["success"]


def test_the_next_prompt_carries_the_last_explore_and_memory_and_lists_actions_not_answers():
  c = config()
  m = make_method(c)
  result, prompts = play(m.prompt_hook(), spec(c), [answer("go left", "take key", "room two is empty"),
                                                    answer("go right")] + [answer("go left")] * 4)
  assert result.steps[0].format_reward == 1.0
  assert "<explore>" not in prompts[0].split("Answer in four blocks")[0]
  assert "Your exploration notes: take key\nYour memory: room two is empty" in prompts[1]
  assert "Your last actions: go left." in prompts[1]


# ---- q_phi's rows, training and R_explore ----------------------------------------------------------------

def test_a_steps_rows_are_its_state_then_each_target_and_a_malformed_step_has_none():
  c = config()
  m = make_method(c)
  result, _ = play(m.prompt_hook(), spec(c), ["no fields", answer("go left", "x", "m")] + [answer("go left")] * 4)
  tokenizer = PromptTokenizer.from_dir(TINY, 10).tokenizer
  rows = eapo.q_rows(tokenizer, result, 96)
  assert not rows[0][eapo.ATTENTION].any()
  ids = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
  state = ids(result.steps[1].observation)
  for row, target in enumerate((target_text("x", "m"), explored_target_text("x", "m", result.steps[2].observation))):
    expected = (state + ids(target))[-96:]
    n = len(expected)
    np.testing.assert_array_equal(rows[1][eapo.TOKENS][row, :n], expected)
    assert rows[1][eapo.ATTENTION][row].sum() == n
    assert rows[1][eapo.TARGET][row].sum() == min(len(ids(target)), 95)
    assert rows[1][eapo.TARGET][row, n - 1] and not rows[1][eapo.TARGET][row, n:].any()


def oracle_actions(c, seed=5):
  """The world's oracle path from `seed` (the actions alone)."""
  world = KeyDoorEnv(**c.env.kwargs)
  world.reset(seed=seed)
  path, done = [], False
  while not done:
    path.append(world.oracle_action())
    *_, terminated, truncated, _ = world.step(path[-1])
    done = terminated or truncated
  return path


def _nano_method(c, mesh=None):
  rules = sharding.DEFAULT_RULES
  mesh = mesh or make_mesh((1, 1, 1), devices=jax.devices()[:1])
  model = Model(PRESETS["tiny"].replace(**NANO), mesh=mesh, rules=rules)
  params = model.init(jax.random.key(0))
  tokenizer = PromptTokenizer.from_dir(TINY, 10).tokenizer
  ctx = BuildContext(model_config=model.config, model=model, initial_params=params, tokenizer=tokenizer, mesh=mesh,
                     rules=rules)
  m = make_method(c)
  m.setup(ctx)
  built = aux_models.build_aux_models(m.aux_models(ctx), mesh, rules, jax.random.key(1))
  return m, ctx, built


def _records(m, ctx, results):
  rs = RecordSpec(prompt_len=400, response_len=128, pad_id=0, intrinsic_names=m.intrinsic_names,
                  extras=m.record_fields(ctx))
  return rollout.to_records(rs, m, results, max_steps=6, pad_to=16)


def test_q_phi_trains_before_the_rewards_and_r_explore_is_its_own_scoring_of_each_target():
  c = config(clamp="token_mean")
  m, ctx, built = _nano_method(c)
  q = built[eapo.AUX]
  assert q.spec.phase == "before_rewards" and q.spec.frozen == ("prior",)
  won, _ = play(m.prompt_hook(), spec(c), [answer(a, f"not {a}", f"memory {t}")
                                           for t, a in enumerate(oracle_actions(c))])
  lost, _ = play(m.prompt_hook(), spec(c, 1), ["nothing"] + [answer("go left")] * 5)
  records = _records(m, ctx, [won, lost])
  before = jax.tree.map(np.asarray, q.params)
  metrics = q.train(records)
  assert np.isfinite(metrics["q_phi/loss"]) and metrics["q_phi/targets"] > 0
  after = jax.tree.map(np.asarray, q.params)
  changed = [not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(before["q"]), jax.tree.leaves(after["q"]))]
  assert any(changed)
  for a, b in zip(jax.tree.leaves(before["prior"]), jax.tree.leaves(after["prior"])):
    np.testing.assert_array_equal(a, b)

  terms = m.intrinsic_rewards(records, {eapo.AUX: q.params})
  tokenizer = ctx.tokenizer
  ids = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
  observations = [s.observation for s in won.steps] + [won.final_observation]
  score = jax.jit(lambda p, row: token_logprobs(ctx.model, p, row, jnp.ones(row.shape, jnp.float32)).logprobs)
  for t, step in enumerate(won.steps):  # one unpadded row per target, scored apart
    fields = eapo.parse_fields(step.response_text)[0]
    scored = []
    for target in (target_text(fields.explore, fields.memory),
                   explored_target_text(fields.explore, fields.memory, observations[t + 1])):
      goal = ids(target)
      row = np.asarray([(ids(observations[t]) + goal)[-96:]], np.int32)
      lp = np.asarray(token_logprobs(ctx.model, q.params["q"], row, np.ones(row.shape, np.float32)).logprobs)[0]
      scored.append(lp[-len(goal):].tolist())
    expected = explore_reward(*scored, gamma=0.9, clamp="token_mean")
    assert terms["eapo_explore"][t] == pytest.approx(expected, rel=1e-4)
    assert terms["eapo_format"][t] == 0.5
  first_lost = len(won.steps)
  assert terms["eapo_explore"][first_lost] == 0.0 and terms["eapo_format"][first_lost] == 0.0
  assert won.success
  assert (terms["eapo_explore"][first_lost + 1:first_lost + 6] > 0).all()
  assert (terms["eapo_explore"][first_lost + 6:] == 0).all()  # padding records


def test_q_phi_and_its_optimizer_resume_exactly(tmp_path):
  c = config()
  m, ctx, built = _nano_method(c)
  result, _ = play(m.prompt_hook(), spec(c), [answer("go left")] * 6)
  records = _records(m, ctx, [result])
  built[eapo.AUX].train(records)
  with checkpoint_lib.Checkpointer(tmp_path / "ckpt") as saver:
    saver.save(1, {"aux": {eapo.AUX: built[eapo.AUX].state}})
  _, _, again = _nano_method(c)  # a fresh process's q_phi: its starting weights and a new optimizer
  with checkpoint_lib.Checkpointer(tmp_path / "ckpt") as saver:
    restored = saver.restore({"aux": {eapo.AUX: again[eapo.AUX].abstract_state()}}).state["aux"][eapo.AUX]
  for a, b in zip(jax.tree.leaves(built[eapo.AUX].state), jax.tree.leaves(restored)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  again[eapo.AUX].state = restored
  # The step after the restart is the step the run would have taken.
  untimed = lambda m: {k: v for k, v in m.items() if k != "q_phi/seconds"}  # noqa: E731
  assert untimed(built[eapo.AUX].train(records)) == untimed(again[eapo.AUX].train(records))
  for a, b in zip(jax.tree.leaves(built[eapo.AUX].state), jax.tree.leaves(again[eapo.AUX].state)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


# ---- grouping measures, rollback demonstrations, composition ---------------------------------------------

def test_the_revisit_measures_and_the_state_depth_groups_of_recorded_episodes():
  c = config()
  m = make_method(c)
  # From room 3 (seed 5): left to room 2, back to room 3 (a revisit at depth 1), left again to room 2 (depth 1).
  result, _ = play(m.prompt_hook(), spec(c), [answer("go left"), answer("go right"), answer("go left"), "bad",
                                              answer("go left"), answer("go right")])
  depths = rollout.visitation_depths([s.state_key for s in result.steps])
  assert depths == [0, 0, 1, 1, 2, 0]  # the malformed step stays in room 2: its third visit
  measures = rollout.revisit_measures([result])
  assert measures["revisit_share"] == pytest.approx(3 / 6)
  # Groups (state, depth): (r3, 0), (r2, 0), (r3, 1), (r2, 1), (r2, 2), (r1, 0): six steps, each alone.
  assert measures["step_group_size"] == 1.0
  again, _ = play(m.prompt_hook(), spec(c, 1), [answer("go left"), answer("go right")] + [answer("go left")] * 4)
  # The second episode's first two steps join (r3, 0) and (r2, 0); its (r3, 1) too; then (r2, 1), (r1, 0), ...
  assert rollout.revisit_measures([result, again])["step_group_size"] == pytest.approx(12 / 7)


def test_rollback_demonstrations_answer_the_verified_way_back_from_the_prompt_the_policy_saw():
  c = config()
  m = make_method(c)
  result, prompts = play(m.prompt_hook(), spec(c), [answer("go left", "take key", "room three"),
                                                    answer("go left", "go right", "room two")] + [answer("go left")] * 4)
  demos = m.rollback_demonstrations([result])
  assert demos, "going left twice from room 3 leaves 'go right' as a verified way back to room 2"
  first = demos[0]
  # The prompt at s' as the actor built it, with eq. 11's instruction and the state s to go back to after the
  # observation.
  back = f"\n{eapo.ROLLBACK_INSTRUCTION}\n{result.steps[0].observation}"
  content = first["messages"][-1]["content"]
  assert back in content and content.replace(back, "") in prompts[1]
  fields = eapo.parse_fields(first["response"])[0]
  assert fields.action == "go right" and fields.memory == "room two"
  assert m.sft_request(0, [result]).label == "eapo_rollback"
  assert m.sft_request(1, [result]) is None  # rollback.every = 5
  c.eapo.rollback.every = 0
  assert make_method(c).sft_request(0, [result]) is None


def test_eapo_composes_with_rnd():
  c = config()
  c.method = "eapo+rnd"
  rnd.add_config(c)
  m = make_method(c)
  assert isinstance(m.prompt_hook(), eapo.FieldsPrompt)
  assert m.intrinsic_names == ("eapo_format", "eapo_explore", "rnd")
  model_config = PRESETS["tiny"].replace(**NANO)
  assert set(m.record_fields(BuildContext(model_config=model_config))) == {eapo.TOKENS, eapo.ATTENTION, eapo.TARGET,
                                                                           "features"}


def test_eapo_names_what_it_needs():
  c = config()
  c.env.answer = "plain"
  with pytest.raises(ValueError, match="env.answer"):
    make_method(c)
  c = config(clamp="mean")
  with pytest.raises(ValueError, match="eapo.clamp"):
    make_method(c)


@pytest.mark.parametrize("name,variant", [("eapo_keydoor", ""), ("eapo_keydoor", "small"), ("eapo_keydoor", "gigpo"),
                                          ("eapo_alfworld", ""), ("eapo_alfworld", "small"), ("eapo_alfworld", "paper"),
                                          ("eapo_miniwob", ""), ("eapo_miniwob", "paper")])
def test_every_eapo_config_builds_its_method_in_the_fields_world(name, variant):
  import importlib

  c = importlib.import_module(f"configs.{name}").get_config(variant)
  m = make_method(c)
  env_id, kwargs = rollout.environment(c, dict(c.env.kwargs))
  if variant == "gigpo":
    assert m.name == "gigpo" and env_id == c.env.id
    return
  assert m.name == "eapo" and env_id == "explore_jax/Fields-v0" and kwargs["env"] == c.env.id
  assert c.rl.advantage == "eapo" and c.rl.advantage_options["gamma"] == 0.9
  if variant == "paper":
    assert (c.rollout.group_size, c.optimizer.learning_rate, c.eapo.q_phi.learning_rate, c.rl.loss.kl_coef) == (
        16, 1e-4, 1e-4, 0.01)


def test_q_phi_restarts_as_copies_of_the_policy_rl_starts_from():
  c = config()
  _, ctx, built = _nano_method(c)
  q = built[eapo.AUX]
  warm = jax.tree.map(lambda x: x + 1.0, ctx.initial_params)  # what a warm start made of the starting weights
  q.start_from_policy(warm)
  for part in ("q", "prior"):
    for a, b in zip(jax.tree.leaves(q.params[part]), jax.tree.leaves(warm)):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert int(q.state.step) == 0
  for leaf in jax.tree.leaves(warm):  # the policy's buffers may be donated by its next update: q_phi holds copies
    leaf.delete()
  assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(q.params))
