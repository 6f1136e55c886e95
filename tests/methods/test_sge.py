"""SGE's plug-in: strategy prompt and reflection prompts, per-task FIFO buffers, Algorithm 1's draw,
mixed-temperature schedule, checkpointed state; and the RLAD baseline's abstraction dropout."""

import collections
import pickle
import subprocess
import sys

import numpy as np
import pytest

from configs import rlad_coding, sge_coding
from explore_jax.actors.protocol import EpisodeResult, EpisodeSpec, Response, StepRecord
from explore_jax.methods import make_method
from explore_jax.methods import sge as sge_lib
from tests.methods.test_methods import REPO


def _spec(seed, context=None):
  return EpisodeSpec(episode_id=0, group_id=0, traj_id=0, env_id="explore_jax/Coding-v0", seed=seed,
                     context=context or {})


def _episode(seed, strategies, success, feedback="assert f(5) == 8 failed (got 15)"):
  response = Response(0, 0, np.zeros(1, np.int32), np.zeros(1, np.float32), np.ones(1, np.float32),
                      np.zeros(1, np.int32), 0)
  steps = [StepRecord(0, 0, 0, i, 0, [1], response, f"### Strategy\n{s}\n### Code\ndef f(x):\n    return x",
                      float(success and i == len(strategies) - 1), 1.0, 0, False, success, {})
           for i, s in enumerate(strategies)]
  return EpisodeResult(spec=_spec(seed), steps=steps, success=success, total_reward=float(success),
                       feedback=feedback)


def test_extract_strategy():
  assert sge_lib.extract_strategy("### Strategy\n multiply  x by 3\n### Code\ndef f(x): ...") == "multiply x by 3"
  assert sge_lib.extract_strategy("add 2\n### Code\nx") == "add 2"            # no header: from the start
  assert sge_lib.extract_strategy("### Strategy\nonly a plan") == "only a plan"  # no code: all strategy
  assert len(sge_lib.extract_strategy("### Strategy\n" + "a " * 500, max_chars=50)) == 50


def test_prompts_are_the_papers_and_fill_in_strategies_and_feedback():
  hook = make_method(sge_coding.get_config()).prompt_hook()
  plain = hook("Write f(x).", [], {}, {})
  assert plain == [{"role": "user", "content": "Write f(x).\n" + sge_lib.STRATEGY_PROMPT}]
  neg = hook("Write f(x).", [], {"reflection": "negative", "strategies": ["add 3"], "feedback": "f(5) != 8"}, {})
  text = neg[-1]["content"]
  assert text.startswith("Write f(x).\nFirst, after \"### Strategy\" critique the failed strategy")
  assert "Strategy: add 3\nFeedback: f(5) != 8 Then write the code" in text
  pos = hook("Q", [], {"reflection": "positive", "strategies": ["add 3", "add 4"]}, {})[-1]["content"]
  assert "inspired by this successful strategy. Step 1 strategy: add 3\nStep 2 strategy: add 4 Then" in pos
  assert "Feedback" not in pos


def test_mixed_temperature_schedule():
  method = make_method(sge_coding.get_config())
  assert method.temperatures() == [1.2, 0.7] and method.delimiters() == ["### Code"]


def test_buffers_are_per_task_fifo_and_only_filled_in_training():
  c = sge_coding.get_config()
  c.sge.buffer_size = 3
  method = make_method(c)
  method.observe([_episode(1, ["s0"], False)], training=False)
  assert not method.bad
  for i in range(5):
    method.observe([_episode(1, [f"bad{i}", f"bad{i}b"], False), _episode(2, [f"good{i}"], True)], training=True)
  key1, key2 = sge_lib.task_key(_spec(1)), sge_lib.task_key(_spec(2))
  assert [e["strategies"] for e in method.bad[key1]] == [["bad2", "bad2b"], ["bad3", "bad3b"], ["bad4", "bad4b"]]
  assert [e["strategies"] for e in method.good[key2]] == [["good2"], ["good3"], ["good4"]]
  assert method.bad[key1][0]["feedback"].startswith("assert f(5) == 8")
  assert key2 not in method.bad and key1 not in method.good


def test_reflection_draw_follows_algorithm_1():
  c = sge_coding.get_config()
  method = make_method(c)
  rng = np.random.default_rng(0)
  assert all(method.episode_context(_spec(1), rng) == {} for _ in range(50))  # empty buffers: no reflection
  method.observe([_episode(1, ["bad"], False), _episode(1, ["good"], True)], training=True)
  kinds = collections.Counter(method.episode_context(_spec(1), rng).get("reflection", "none") for _ in range(20000))
  # P(negative) = p_B; P(positive) = (1 - p_B) p_G; the rest plain.
  assert abs(kinds["negative"] / 20000 - 0.25) < 0.015
  assert abs(kinds["positive"] / 20000 - 0.75 * 0.1) < 0.01
  ctx = {}
  while ctx.get("reflection") != "negative":
    ctx = method.episode_context(_spec(1), rng)
  assert ctx["strategies"] == ["bad"] and ctx["feedback"].startswith("assert")
  assert method.episode_context(_spec(7), rng) == {}  # another task's buffers are empty
  c.sge.p_failure = c.sge.p_success = 0.0
  off = make_method(c)
  off.load_state_dict(method.state_dict())
  assert all(off.episode_context(_spec(1), rng) == {} for _ in range(200))


def test_state_dict_round_trips_through_json():
  import json

  method = make_method(sge_coding.get_config())
  method.observe([_episode(3, ["a", "b"], False), _episode(3, ["c"], True)], training=True)
  state = json.loads(json.dumps(method.state_dict()))
  other = make_method(sge_coding.get_config())
  other.load_state_dict(state)
  assert other.state_dict() == method.state_dict()
  assert other.bad[sge_lib.task_key(_spec(3))].maxlen == 32


def test_bad_probabilities_are_rejected():
  c = sge_coding.get_config()
  c.sge.p_failure = 1.5
  with pytest.raises(ValueError, match="p_failure"):
    make_method(c)


def test_rlad_drops_the_strategy_a_quarter_of_the_time():
  method = make_method(rlad_coding.get_config())
  rng = np.random.default_rng(1)
  contexts = [method.episode_context(_spec(0), rng) for _ in range(8000)]
  assert abs(sum(bool(x.get("direct")) for x in contexts) / 8000 - 0.25) < 0.02
  hook = method.prompt_hook()
  assert hook("Q", [], {"direct": True}, {})[-1]["content"] == "Q\n" + sge_lib.DIRECT_PROMPT
  assert method.loss_config().kl_coef == 0.001
  c = rlad_coding.get_config()
  c.rl.loss.kl_coef = 0.0
  with pytest.raises(ValueError, match="kl_coef"):
    make_method(c)


def test_strategy_prompt_unpickles_without_jax():
  hook = make_method(sge_coding.get_config()).prompt_hook()
  code = ("import pickle, sys; hook = pickle.loads(sys.stdin.buffer.read()); "
          "hook('o', [], {'reflection': 'negative', 'strategies': ['s'], 'feedback': 'f'}, {}); "
          "print('jax' in sys.modules)")
  out = subprocess.run([sys.executable, "-c", code], input=pickle.dumps(hook), capture_output=True, cwd=REPO)
  assert out.returncode == 0, out.stderr.decode()[-2000:]
  assert out.stdout.decode().strip() == "False"
