"""Methods compose without a new class: "sge+rnd" runs SGE's prompts, schedule and reflections with RND's
bonus and networks (methods/composite.py), in unit checks and end to end through the training loop."""

import json
import types

import jax
import numpy as np
import pytest

from configs import coding
from explore_jax.methods import make_method
from explore_jax.methods import sge as sge_lib
from explore_jax.methods.base import BuildContext
from explore_jax.methods.composite import Composite
from explore_jax.methods.rnd import RND
from explore_jax.methods.sge import SGE, StrategyPrompt
from tests.methods.test_sge import _episode, _spec
from tests.small_runs import small_run


def test_sge_plus_rnd_merges_the_two_plug_ins():
  c = coding.get_config("sge+rnd")
  method = make_method(c)
  assert isinstance(method, Composite) and method.name == "sge+rnd"
  assert [type(m) for m in method.methods] == [SGE, RND]
  sge, rnd = method.methods
  hook = method.prompt_hook()
  assert isinstance(hook, StrategyPrompt) and hook == sge.prompt_hook()
  assert method.temperatures() == [1.2, 0.7] and method.delimiters() == ["### Code"]
  assert method.wants_features and method.intrinsic_names == ("rnd",)
  ctx = BuildContext(model_config=types.SimpleNamespace(hidden_size=32))
  assert method.record_fields(ctx) == {"features": ((32,), "float32")}
  assert set(method.aux_models(ctx)) == {"rnd"}
  assert method.array_state() is None

  rng = np.random.default_rng(0)
  assert method.episode_context(_spec(1), rng) == {}  # empty buffers: no reflection
  metrics = method.observe([_episode(1, ["bad plan"], False), _episode(1, ["good plan"], True)], training=True)
  assert metrics["sge/tasks_with_failure"] == 1.0 and metrics["sge/tasks_with_success"] == 1.0
  kinds = set()
  for _ in range(200):
    ctx_ = method.episode_context(_spec(1), rng)
    kinds.add(ctx_.get("reflection"))
    if ctx_.get("reflection") == "negative":
      assert ctx_["strategies"] == ["bad plan"] and ctx_["feedback"].startswith("assert f(5)")
    if ctx_.get("reflection") == "positive":
      assert ctx_["strategies"] == ["good plan"]
  assert kinds == {None, "negative", "positive"}
  text = hook("Q", [], {"reflection": "negative", "strategies": ["bad plan"], "feedback": "x"}, {})[-1]["content"]
  assert "critique the failed strategy" in text and "Strategy: bad plan" in text

  state = method.state_dict()
  assert set(state) == {"sge", "rnd"} and state["sge"] == sge.state_dict() and state["rnd"] == {}
  other = make_method(c)
  other.load_state_dict(json.loads(json.dumps(state)))
  assert other.state_dict() == state
  assert [e["strategies"] for e in other.methods[0].bad[sge_lib.task_key(_spec(1))]] == [["bad plan"]]


def test_two_parts_that_both_set_the_prompt_are_rejected():
  with pytest.raises(ValueError, match="prompt_hook"):
    make_method(coding.get_config("sge+rlad"))
  with pytest.raises(ValueError, match="twice"):
    make_method(coding.get_config("rnd+rnd"))


def _small(method, checkpoint):
  c = small_run(coding.get_config(method), checkpoint)
  c.train.num_iterations = 2
  c.eval.every, c.eval.passk_samples = 0, 0
  c.checkpoint.every = 1
  return c


@pytest.mark.slow
def test_sge_plus_rnd_trains_end_to_end_and_resumes(tmp_path, nano_checkpoint):
  from explore_jax.train import loop
  from explore_jax.train.builder import build

  c = _small("sge+rnd", nano_checkpoint)
  parts = build(c, str(tmp_path))
  history = loop.run(parts)
  rows = [r for r in history if r["iteration"] > 0]
  assert [r["iteration"] for r in rows] == [1, 2]
  for r in rows:
    assert "reward/rnd" in r and r["reward/rnd"] >= 0.0
    assert "sge/negative_reflections" in r and "rnd/predictor_loss" in r
    assert r["episodes_dropped"] == 0
  assert max(r["reward/rnd"] for r in rows) > 0.0  # failed trajectories get the bonus
  sge = parts.method.methods[0]
  assert sum(len(b) for b in sge.bad.values()) + sum(len(b) for b in sge.good.values()) == 8  # 2 its x 4 episodes
  final = jax.tree.map(np.asarray, parts.learner.aux["rnd"].state)

  again = build(c, str(tmp_path))
  initial = jax.tree.map(np.asarray, again.learner.aux["rnd"].params)  # same key: the run's starting networks
  assert again.method.state_dict() == {"sge": {"good": {}, "bad": {}}, "rnd": {}}
  assert loop.restore_or_init(again) == 2
  assert any(not np.array_equal(a, b) for a, b in
             zip(jax.tree.leaves(initial["predictor"]), jax.tree.leaves(final.params["predictor"])))
  for a, b in zip(jax.tree.leaves(initial["target"]), jax.tree.leaves(final.params["target"])):
    np.testing.assert_array_equal(a, b)  # the target is frozen
  for a, b in zip(jax.tree.leaves(final), jax.tree.leaves(again.learner.aux["rnd"].state)):
    np.testing.assert_array_equal(a, np.asarray(b))
  assert again.method.state_dict() == json.loads(json.dumps(parts.method.state_dict()))
  restored = again.method.methods[0]
  assert sum(len(b) for b in restored.bad.values()) + sum(len(b) for b in restored.good.values()) == 8


def test_a_part_that_overrides_a_config_answer_cannot_be_composed():
  class KeepsAll(RND):
    def keep_groups(self, group_returns):
      return set(group_returns)

  c = coding.get_config("sge+rnd")
  with pytest.raises(ValueError, match="overrides \\['keep_groups'\\]"):
    Composite(c, [SGE(c), KeepsAll(c)], ["sge", "keeps_all"])
