"""Methods as plug-ins: the registry, the group-relative variants' settings, jax-free prompt hooks."""

import os
import pickle
import subprocess
import sys
import types

import numpy as np
import pytest

from configs import grpo_keydoor
from explore_jax.methods import ObservationPrompt, make_method, registered_methods
from explore_jax.methods.base import overlong_penalty

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_registry_names_and_errors():
  assert {"grpo", "dr_grpo", "dapo", "gigpo"} <= set(registered_methods())
  c = grpo_keydoor.get_config()
  c.method = "nonexistent"
  with pytest.raises(KeyError, match="unknown method 'nonexistent'"):
    make_method(c)


@pytest.mark.parametrize("variant, advantage, aggregation, eps_high, drops", [
    ("grpo", "grpo", "seq-mean-token-mean", 0.2, False),
    ("dr_grpo", "grpo", "seq-mean-token-sum-norm", 0.2, False),
    ("dapo", "grpo", "token-mean", 0.28, True),
    ("gigpo", "gigpo", "token-mean", 0.2, False),
])
def test_variants_configure_the_papers_settings(variant, advantage, aggregation, eps_high, drops):
  method = make_method(grpo_keydoor.get_config(variant))
  loss = method.loss_config()
  assert (method.name, method.advantage_name, loss.aggregation, loss.eps_high) == (variant, advantage, aggregation, eps_high)
  assert method.advantage_options()["normalize_std"] == (variant != "dr_grpo")
  groups = {0: np.array([1.0, 0.0]), 1: np.array([1.0, 1.0]), 2: np.array([0.0, 0.0])}
  assert method.keep_groups(groups) == ({0} if drops else {0, 1, 2})  # DAPO drops groups with no signal


def _records(task, fmt, lengths, width=16):
  mask = np.arange(width)[None, :] < np.asarray(lengths)[:, None]
  return types.SimpleNamespace(task_reward=np.asarray(task, np.float32), format_reward=np.asarray(fmt, np.float32),
                               response_mask=mask)


def test_step_rewards_penalise_malformed_actions():
  method = make_method(grpo_keydoor.get_config())
  r = method.extrinsic_rewards(_records([0.0, 1.0, 0.0], [1.0, 1.0, 0.0], [3, 3, 3]))
  np.testing.assert_allclose(r, [0.0, 1.0, -0.1])


def test_overlong_shaping_matches_dapo():
  # L_max = 16, L_cache = 4: no penalty up to 12 tokens, then -(len - 12) / 4, reaching -1 at 16.
  np.testing.assert_allclose(overlong_penalty(np.array([0, 12, 13, 14, 16]), 16, 4), [0, 0, -0.25, -0.5, -1.0])
  c = grpo_keydoor.get_config()
  c.rollout.max_new_tokens, c.rl.overlong_buffer, c.rl.format_penalty = 16, 4, 0.0
  r = make_method(c).extrinsic_rewards(_records([1.0, 1.0, 0.0], [1, 1, 1], [10, 14, 16]))
  np.testing.assert_allclose(r, [1.0, 0.5, -1.0])
  with pytest.raises(ValueError, match="overlong buffer"):
    overlong_penalty(np.array([1]), 16, 20)


def test_negative_dual_clip_disables_it():
  c = grpo_keydoor.get_config()
  c.rl.loss.dual_clip = -1.0
  assert make_method(c).loss_config().dual_clip is None


def test_prompt_hook_unpickles_without_jax():
  hook = ObservationPrompt(system="sys", history_steps=1)
  messages = hook("obs 2", [("obs 1", "go right")], {}, {}).messages
  assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
  code = ("import pickle, sys; hook = pickle.loads(sys.stdin.buffer.read()); "
          "hook('o', [], {}, {}); print('jax' in sys.modules)")
  out = subprocess.run([sys.executable, "-c", code], input=pickle.dumps(hook), capture_output=True, cwd=REPO)
  assert out.returncode == 0, out.stderr.decode()[-2000:]
  assert out.stdout.decode().strip() == "False"


def test_past_the_budget_the_history_loses_its_oldest_steps_first():
  hook = ObservationPrompt(system="sys", history_steps=2, action_history=3)
  history = [("o1", "a1"), ("o2", "a2"), ("o3", "a3")]
  prompt = hook("o4", history, {}, {})
  last = {"role": "user", "content": "o4\nYour last actions: a1; a2; a3."}
  turns = lambda *n: [m for i in n for m in ({"role": "user", "content": f"o{i}"},
                                             {"role": "assistant", "content": f"a{i}"})]
  system = {"role": "system", "content": "sys"}
  assert prompt.messages == [system, *turns(2, 3), last]
  assert list(prompt.shorter) == [[system, *turns(3), last], [system, last]]
  assert hook("o1", [], {}, {}) == [system, {"role": "user", "content": "o1"}]  # nothing to shorten: plain messages


def test_the_action_history_lists_the_last_actions_after_the_observation():
  hook = ObservationPrompt(system="", action_history=2, instruction="Act.")
  history = [("o1", "go to drawer 1"), ("o2", "open drawer 1\n  now"), ("o3", "go to desk 1")]
  assert hook("o4", history, {}, {}) == [
      {"role": "user", "content": "o4\nYour last actions: open drawer 1 now; go to desk 1.\nAct."}]
  assert hook("o1", [], {}, {}) == [{"role": "user", "content": "o1\nAct."}]
  assert ObservationPrompt(system="")("o4", history, {}, {}) == [{"role": "user", "content": "o4"}]


def test_every_loss_field_is_reachable_from_the_config():
  c = grpo_keydoor.get_config()
  c.rl.loss.low_prob_mask, c.rl.loss.low_prob_log_threshold, c.rl.loss.kl_type = "sequence", -3.0, "abs"
  c.rl.loss.aggregation = "seq-mean-token-sum-norm-verl"
  loss = make_method(c).loss_config()
  assert (loss.low_prob_mask, loss.low_prob_log_threshold, loss.kl_type, loss.aggregation) == (
      "sequence", -3.0, "abs", "seq-mean-token-sum-norm-verl")
  import dataclasses

  from explore_jax.rl.losses import PolicyLossConfig
  assert set(c.rl.loss) == {f.name for f in dataclasses.fields(PolicyLossConfig)}  # the base config sets each
  with c.unlocked():
    c.rl.loss.eps_lo = 0.1
  with pytest.raises(ValueError, match="unknown field.*eps_lo"):
    make_method(c).loss_config()
