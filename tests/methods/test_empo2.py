"""EMPO² (methods/empo2.py, methods/empo2_memory.py) by hand-computed cases: retrieval's threshold, ranking and k;
the memory's rules; the prompts with and without tips; the mode draws; the off-policy batch; both novelty
rewards; the memories through a checkpoint's two halves."""

import dataclasses

import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from configs import empo2_twx
from explore_jax.actors.protocol import EpisodeResult, EpisodeSpec, Prompt, Response, StepRecord
from explore_jax.methods import make_method
from explore_jax.methods.base import BuildContext, ObservationPrompt
from explore_jax.methods.empo2 import (MEMORY_HEADER, NO_TIPS, OFF_POLICY, ON_POLICY, PLAIN, TIP_PROMPT, TipPrompt,
                                       draw_iteration_mode, draw_mode, tip_block)
from explore_jax.methods.empo2_memory import StateNovelty, TipMemory, retrieve


def unit(*v):
  v = np.asarray(v, np.float32)
  return v / np.linalg.norm(v)


# ---- retrieval ---------------------------------------------------------------------------------------------------

def test_retrieval_keeps_keys_above_the_threshold_ranked_by_return_then_similarity_then_recency():
  query = unit(1, 0)
  keys = np.stack([unit(1, 0),        # 0: cos 1.0, return 0
                   unit(1, 1),        # 1: cos 0.707, return 1
                   unit(0, 1),        # 2: cos 0, return 5 (below the threshold)
                   unit(1, 0.2),      # 3: cos 0.981, return 1
                   unit(1, 1.8),      # 4: cos 0.486 (below 0.5), return 9
                   unit(1, 1)])       # 5: cos 0.707, return 1, newer than 1
  returns = np.array([0.0, 1.0, 5.0, 1.0, 9.0, 1.0])
  np.testing.assert_array_equal(retrieve(keys, returns, query, threshold=0.5, k=10), [3, 5, 1, 0])
  np.testing.assert_array_equal(retrieve(keys, returns, query, threshold=0.5, k=2), [3, 5])
  np.testing.assert_array_equal(retrieve(keys, returns, query, threshold=0.99, k=10), [0])
  np.testing.assert_array_equal(retrieve(keys, returns, query, threshold=0.4, k=1), [4])  # the best return wins
  assert retrieve(keys[:0], returns[:0], query).shape == (0,)
  # Keys stored as float16 retrieve as their float32 values do.
  np.testing.assert_array_equal(retrieve(keys.astype(np.float16), returns, query, threshold=0.5), [3, 5, 1, 0])


def test_the_memory_drops_its_oldest_and_skips_exact_duplicates():
  memory = TipMemory(capacity=3)
  for i, tip in enumerate(["a", "b", "a", "c", "d"]):
    memory.add(7, tip, unit(1, i), float(i))
  snap = memory.snapshot(7)
  assert snap["tips"] == ["b", "c", "d"] and memory.snapshot(8) is None
  np.testing.assert_array_equal(snap["returns"], [1.0, 3.0, 4.0])
  assert snap["keys"].dtype == np.float16 and snap["keys"].shape == (3, 2)
  assert not memory.add(7, "", unit(1, 0), 0.0)  # an empty tip is not a memory


# ---- prompts -----------------------------------------------------------------------------------------------------

def test_a_memory_augmented_step_shows_the_retrieved_tips_and_keeps_the_prompt_without_them():
  hook = TipPrompt(inner=ObservationPrompt(system="Act."), retrieve_threshold=0.5, top_k=2)
  memory = {"tips": ["go north first", "the key is in the kitchen", "never mind"],
            "keys": np.stack([unit(1, 0), unit(1, 0.1), unit(0, 1)]).astype(np.float16),
            "returns": np.array([0.0, 1.0, 1.0], np.float32)}
  context = {"mode": OFF_POLICY, "tip": True, "memory": memory}
  assert hook.embedding_texts("You are in the hall.", [], context, {}) == ["You are in the hall."]
  prompt = hook("You are in the hall.", [], context, {"embeddings": unit(1, 0)[None]})
  assert isinstance(prompt, Prompt) and prompt.notes == {"tips": 2}
  plain = [{"role": "system", "content": "Act."}, {"role": "user", "content": "You are in the hall."}]
  assert prompt.variants == {NO_TIPS: plain}
  assert prompt.messages[-1]["content"] == ("You are in the hall.\n" + MEMORY_HEADER +
                                            "\n<tip>the key is in the kitchen\ngo north first</tip>")
  assert tip_block(["x"]) == MEMORY_HEADER + "\n<tip>x</tip>"
  # The released code's query: the chat without the system prompt.
  history_hook = dataclasses.replace(hook, query="history")
  assert history_hook.embedding_texts("You are in the hall.", [], context, {}) == ["user:You are in the hall."]
  # A memory-free rollout, and evaluation (no context), prompt as the plain hook does and embed nothing.
  assert hook("You are in the hall.", [], {"mode": PLAIN, "tip": True}, {}) == plain
  assert hook("You are in the hall.", [], {}, {}) == plain and hook.embedding_texts("x", [], {}, {}) == []
  # A tip mode on an empty memory: nothing retrieved, the two prompts equal.
  empty = hook("You are in the hall.", [], {"mode": ON_POLICY, "tip": True}, {})
  assert empty.messages == plain and empty.notes == {"tips": 0}
  # Past the budget the inner prompt's shorter forms (here: without the earlier step) keep the tips; then the tips
  # go, lowest ranked first, and the observation stays.
  with_history = dataclasses.replace(hook, inner=ObservationPrompt(system="Act.", history_steps=1))
  prompt = with_history("You are in the hall.", [("At the door.", "go in")], context, {"embeddings": unit(1, 0)[None]})
  forms = list(prompt.shorter)
  assert len(prompt.messages) == 4 and [f.notes for f in forms] == [{"tips": 2}, {"tips": 1}, {"tips": 0}]
  assert all(f.messages[0] == prompt.messages[0] and len(f.messages) == 2 for f in forms)
  assert forms[0].messages[-1] == prompt.messages[-1]
  assert forms[1].messages[-1]["content"] == ("You are in the hall.\n" + MEMORY_HEADER +
                                              "\n<tip>the key is in the kitchen</tip>")
  assert forms[2].messages[-1] == {"role": "user", "content": "You are in the hall."}
  # fit=False: no shorter forms (the actor cuts from the left, as the first protocol runs did).
  unfit = dataclasses.replace(with_history, fit=False)
  assert list(unfit("You are in the hall.", [("At the door.", "go in")], context, {"embeddings": unit(1, 0)[None]})
              .shorter) == []


def test_the_tip_prompt_follows_the_whole_episode_and_evaluation_asks_for_none():
  hook = TipPrompt(inner=ObservationPrompt(system="Act."))
  history = [("Hall. Exits: north.", "go north"), ("Corridor.", "go east"), ("Kitchen. A coin.", "take coin")]
  prompt = hook.final_prompt("You took the coin.", history, {"tip": True}, {})
  system = {"role": "system", "content": "Act."}
  final = {"role": "user", "content": "You took the coin.\n" + TIP_PROMPT}
  turns = [[{"role": "user", "content": o}, {"role": "assistant", "content": a}] for o, a in history]
  assert prompt.messages == [system, *turns[0], *turns[1], *turns[2], final]
  # Past the budget the middle of the episode goes first; its first step stays longest.
  assert list(prompt.shorter) == [[system, *turns[0], *turns[2], final], [system, *turns[0], final], [system, final]]
  assert hook.final_prompt("You took the coin.", history, {}, {}) is None
  assert list(dataclasses.replace(hook, fit=False).final_prompt("You took the coin.", history, {"tip": True}, {})
              .shorter) == []
  tip = hook.oracle_final_text(["Task: find the coin.\nHall.", "Task: find the coin.\nKitchen."],
                               ["go north", "take coin"], "Task: find the coin.\nYou took the coin. Well done.", True)
  assert tip == "I did go north; take coin; then I saw: You took the coin; the task is complete."


# ---- the method ------------------------------------------------------------------------------------------------

def config(prompt_tokens=384, **empo2):
  c = empo2_twx.get_config()
  c.rollout.task_pool = 4
  c.rollout.max_prompt_tokens = prompt_tokens
  for k, v in empo2.items():
    setattr(c.empo2, k, v)
  return c


class Encoder:
  """Texts as unit vectors: 'room N' texts point in direction N, anything else along the last axis."""

  def __call__(self, texts):
    rows = np.zeros((len(texts), 4), np.float32)
    for i, t in enumerate(texts):
      words = t.split()
      rows[i, int(words[1]) if len(words) > 1 and words[0] == "room" else 3] = 1.0
    return rows


def method(prompt_tokens=384, **empo2):
  m = make_method(config(prompt_tokens, **empo2))
  m.setup(BuildContext(model_config=None, encode=Encoder(), embedding_dim=4))
  return m


def spec(traj, seed=0, context=None):
  return EpisodeSpec(episode_id=traj, group_id=0, traj_id=traj, env_id="explore_jax/TextWorldExpress-v0",
                     seed=seed, context=context or {})


def episode(traj, observations, *, seed=0, context=None, reward=0.0, tip="", notes=None, variants=None):
  steps = [StepRecord(episode_id=traj, group_id=0, traj_id=traj, step_index=i, actor_id=0, prompt_ids=[5, 6, 7],
                      response=Response(traj, i, np.array([1], np.int32), np.zeros(1, np.float32),
                                        np.ones(1, np.float32), np.zeros(1, np.int32), 0),
                      response_text="look", task_reward=reward if i == len(observations) - 1 else 0.0,
                      format_reward=1.0, state_key=i, done=i == len(observations) - 1, success=reward > 0, info={},
                      observation=o, prompt_notes=(notes or {}), prompt_variants=variants or {})
           for i, o in enumerate(observations)]
  return EpisodeResult(spec=spec(traj, seed, context), steps=steps, success=reward > 0, total_reward=reward,
                       feedback="", final_text=tip, final_observation="room 2 end")


@pytest.mark.parametrize("how", ["rollout", "iteration"])
def test_the_mode_draws(how):
  m = method(mode_draw=how)
  p, q = 0.75, 1 / 3
  assert (draw_mode(0.7, 0.0, p, q), draw_mode(0.8, 0.2, p, q), draw_mode(0.8, 0.5, p, q)) == (
      PLAIN, ON_POLICY, OFF_POLICY)
  assert (draw_iteration_mode(0.16, p, q), draw_iteration_mode(0.2, p, q), draw_iteration_mode(0.3, p, q)) == (
      OFF_POLICY, ON_POLICY, PLAIN)
  iterations = []
  for it in range(1000):
    rng = np.random.default_rng([7, it])
    iterations.append([m.episode_context(spec(t), rng)["mode"] for t in range(8)])
  modes = np.array(iterations)
  if how == "iteration":  # one mode for the whole batch
    assert (modes == modes[:, :1]).all()
  else:
    assert not (modes == modes[:, :1]).all()
  share = [(modes == k).mean() for k in (PLAIN, ON_POLICY, OFF_POLICY)]
  np.testing.assert_allclose(share, [0.75, 0.25 / 3, 0.5 / 3], atol=0.04 if how == "iteration" else 0.015)
  # The same iteration stream gives the same contexts.
  rng = np.random.default_rng([7, 3])
  again = [m.episode_context(spec(t), rng)["mode"] for t in range(8)]
  assert again == iterations[3]


def test_tips_enter_the_memory_of_their_task_and_come_back_in_memory_modes():
  m = method(novelty="off")
  first = [episode(0, ["room 0 hall", "room 1 kitchen"], seed=1, reward=1.0, tip="  The coin is\nin the kitchen. "),
           episode(1, ["room 0 hall"], seed=1, tip="Nothing found."),
           episode(2, ["room 0 hall"], seed=2, tip="Nothing found.")]
  metrics = m.observe(first, training=True)
  assert metrics["empo2/tips_added"] == 3.0
  snap = m.tips.snapshot(1)
  assert snap["tips"] == ["The coin is in the kitchen.", "Nothing found."]
  np.testing.assert_array_equal(snap["keys"], np.tile(np.array([0, 0, 1, 0], np.float16), (2, 1)))  # "room 2 end"
  np.testing.assert_array_equal(snap["returns"], [1.0, 0.0])
  assert m.observe(first, training=False) == {} and m.tips.size(1) == 2  # evaluation writes nothing
  rng = np.random.default_rng(0)
  contexts = [m.episode_context(spec(t, seed=1), rng) for t in range(64)]
  assert all(("memory" in c) == (c["mode"] != PLAIN) and c["tip"] for c in contexts)
  assert [c for c in contexts if "memory" in c][0]["memory"]["tips"] == snap["tips"]
  # The released form: an entry per step, naming its action and the score.
  steps = method(novelty="off", entries="step")
  steps.observe(first[:1], training=True)
  assert steps.tips.snapshot(1)["tips"] == [
      f"The coin is in the kitchen.; At that timestep, the specific action you took was look; "
      f"Eventually you got the score 1"]  # the same text at both steps: one entry


def test_the_off_policy_rows_are_scored_without_their_tips_and_keep_their_behaviour_logprobs():
  from explore_jax.replay import RecordSpec
  from explore_jax.train import rollout

  m = method(prompt_tokens=8, novelty="off")
  with_tips, without = [9, 9, 9, 5, 6, 7], [5, 6, 7]
  results = [episode(t, ["room 0 a", "room 1 b"], context={"mode": mode, "tip": True},
                     variants={NO_TIPS: without} if mode != PLAIN else None)
             for t, mode in enumerate((PLAIN, ON_POLICY, OFF_POLICY))]
  for r in results:
    for s in r.steps:
      if r.spec.context["mode"] != PLAIN:
        s.prompt_ids = with_tips
  m.observe(results, training=True)
  spec_ = RecordSpec(prompt_len=8, response_len=2, pad_id=0, intrinsic_names=m.intrinsic_names,
                     extras=m.record_fields(BuildContext(model_config=None)))
  records = rollout.to_records(spec_, m, results, max_steps=2, pad_to=8)
  batch = {"prompt_tokens": jnp.asarray(records.prompt_tokens), "prompt_mask": jnp.asarray(records.prompt_mask),
           "behaviour_logprobs": jnp.asarray(records.behaviour_logprobs), "advantages": jnp.arange(8.0)}
  out = m.update_batch(batch, records, np.random.default_rng(0))
  modes = np.asarray(records.extras["empo2_mode"])
  np.testing.assert_array_equal(modes[:6], [PLAIN, PLAIN, ON_POLICY, ON_POLICY, OFF_POLICY, OFF_POLICY])
  left = lambda ids: np.pad(np.asarray(ids, np.int32), (8 - len(ids), 0))  # noqa: E731
  for row in range(6):
    expected = without if modes[row] == OFF_POLICY else (with_tips if modes[row] == ON_POLICY else [5, 6, 7])
    np.testing.assert_array_equal(out["prompt_tokens"][row], left(expected))
    np.testing.assert_array_equal(out["prompt_mask"][row], left(expected) != 0)
  np.testing.assert_array_equal(out["behaviour_logprobs"], batch["behaviour_logprobs"])
  np.testing.assert_array_equal(out["advantages"], batch["advantages"])


def test_low_probability_masking_is_configured_at_both_levels():
  token = method().loss_config()
  assert (token.low_prob_mask, token.low_prob_log_threshold) == ("token", -5.0)
  c = config()
  c.rl.loss.low_prob_mask = "sequence"
  assert make_method(c).loss_config().low_prob_mask == "sequence"
  c.rl.loss.low_prob_mask = "none"
  assert make_method(c).loss_config().low_prob_mask is None


def test_state_novelty_is_one_over_the_similar_past_states():
  novelty = StateNovelty(capacity=2, threshold=0.9)
  a, b, c = unit(1, 0, 0), unit(0, 1, 0), unit(0, 0, 1)
  near_a = unit(1, 0.1, 0)  # cos 0.995 with a
  assert [novelty.reward(0, k) for k in (a, a, near_a, b, a)] == [1.0, 1 / 2, 1 / 3, 1.0, 1 / 4]
  assert novelty.reward(1, a) == 1.0  # per task
  assert novelty.reward(0, c) == 1.0 and novelty.reward(0, c) == 1.0  # the list is full: c is never remembered
  restored = StateNovelty(capacity=2, threshold=0.9)
  restored.restore(novelty.arrays(2, 3))
  assert restored.reward(0, a) == novelty.reward(0, a) == 1 / 5


def test_state_novelty_grows_past_its_first_block_and_restores_exactly():
  novelty = StateNovelty(capacity=40, threshold=0.9)
  keys = np.eye(20, dtype=np.float32)  # 20 orthogonal states, more than the 16 rows first allocated
  assert [novelty.reward(0, k) for k in keys] == [1.0] * 20
  assert [novelty.reward(0, k) for k in keys] == [0.5] * 20
  restored = StateNovelty(capacity=40, threshold=0.9)
  restored.restore(novelty.arrays(1, 20))
  assert restored.reward(0, keys[17]) == novelty.reward(0, keys[17]) == 1 / 3
  assert restored.reward(0, np.ones(20, np.float32) / np.sqrt(20)) == 1.0  # a new state still enters


def test_both_novelty_rewards_reach_the_records():
  state = method(novelty="state")
  results = [episode(0, ["room 0 a", "room 0 a", "room 1 b"]), episode(1, ["room 1 b"])]
  state.observe(results, training=True)
  got = [f["empo2_novelty"] for r in results for f in state.step_fields(r)]
  np.testing.assert_allclose(got, [1.0, 0.5, 1.0, 0.5])
  retrieved = method(novelty="retrieved")
  results = [episode(0, ["room 0 a"], context={"mode": ON_POLICY, "tip": True}, notes={"tips": 3}),
             episode(1, ["room 0 a"], context={"mode": PLAIN, "tip": True})]
  retrieved.observe(results, training=True)
  assert [f["empo2_novelty"] for r in results for f in retrieved.step_fields(r)] == [0.25, 0.0]
  records = ml_collections.ConfigDict({"extras": {"empo2_novelty": np.array([0.25, 1.0])},
                                       "valid": np.array([True, False])})
  np.testing.assert_allclose(retrieved.intrinsic_rewards(records, {})["novelty"], [0.0025, 0.0])


def test_the_memories_come_back_from_a_checkpoints_two_halves_in_either_order():
  m = method()
  m.observe([episode(0, ["room 0 a", "room 1 b"], seed=3, reward=1.0, tip="tip one"),
             episode(1, ["room 2 c"], seed=0, tip="tip two")], training=True)
  state, arrays = m.state_dict(), m.array_state()
  assert arrays["tips"]["keys"].shape == (4, 1000, 4) and arrays["tips"]["keys"].dtype == np.float16
  for first in ("json", "arrays"):
    fresh = method()
    if first == "json":
      fresh.load_state_dict(state)
      assert fresh.tips.size(3) == 0  # waiting for the keys
      fresh.load_array_state(arrays)
    else:
      fresh.load_array_state(arrays)
      fresh.load_state_dict(state)
    for t in range(4):
      a, b = m.tips.snapshot(t), fresh.tips.snapshot(t)
      assert (a is None) == (b is None)
      if a is not None:
        assert a["tips"] == b["tips"]
        np.testing.assert_array_equal(a["keys"], b["keys"])
        np.testing.assert_array_equal(a["returns"], b["returns"])
    for name, array in m.states.arrays(4, 4).items():
      np.testing.assert_array_equal(fresh.states.arrays(4, 4)[name], array)


def test_empo2_needs_a_task_pool_and_probabilities():
  c = config()
  c.rollout.task_pool = 0
  with pytest.raises(ValueError, match="rollout.task_pool"):
    make_method(c)
  with pytest.raises(ValueError, match="empo2.q_on_policy"):
    method(q_on_policy=1.5)
  with pytest.raises(ValueError, match="empo2.novelty"):
    method(novelty="rnd")


def test_empo2_composes_with_sge_its_tips_around_the_strategy_prompt():
  from configs import coding
  from explore_jax.methods.composite import Composite
  from explore_jax.methods.sge import STRATEGY_PROMPT, StrategyPrompt

  c = coding.get_config("sge+empo2")
  m = make_method(c)
  assert isinstance(m, Composite) and m.intrinsic_names == ("novelty",)
  m.setup(BuildContext(model_config=None, encode=Encoder(), embedding_dim=4))
  hook = m.prompt_hook()
  assert isinstance(hook, TipPrompt) and isinstance(hook.inner, StrategyPrompt)
  assert m.temperatures() == [1.2, 0.7] and m.delimiters() == ["### Code"]  # SGE's schedule
  m.observe([episode(0, ["room 0 a"], seed=1, tip="Check the empty list first.")], training=True)
  rng = np.random.default_rng(1)
  context = next(ctx for ctx in (m.episode_context(spec(t, seed=1), rng) for t in range(64)) if "memory" in ctx)
  assert {"mode", "tip", "memory"} <= set(context)
  prompt = hook("room 2 task", [], context, {"embeddings": Encoder()(["room 2 end"])})
  text = prompt.messages[-1]["content"]
  assert STRATEGY_PROMPT in text and text.endswith("<tip>Check the empty list first.</tip>")
  assert STRATEGY_PROMPT in prompt.variants[NO_TIPS][-1]["content"] and "<tip>" not in prompt.variants[NO_TIPS][-1]["content"]
  assert "tips" in m.state_dict()["empo2"] and "good" in m.state_dict()["sge"]
  with pytest.raises(ValueError, match="cannot wrap a prompt hook that has its own"):
    TipPrompt(inner=hook)
