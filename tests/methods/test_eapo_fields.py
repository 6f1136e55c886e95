"""EAPO's first parts by hand-computed cases: the answer fields, q_phi's targets, R_explore under both clamps,
eq. 10's reward, and q_phi's loss and gradient (eq. 8 as released)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from explore_jax.methods.eapo_fields import (Fields, explore_reward, explored_target_text, log_q, parse_fields,
                                             step_reward, target_text)
from explore_jax.rl.q_phi import q_phi_loss

ANSWER = ("<think>the key may be left</think>\n<explore>go left; open drawer</explore> <memory>room 2: a lamp"
          "</memory><action>I go \\boxed{go  left}</action>")


def test_a_well_formed_answer_gives_its_four_fields_and_the_last_boxed_action():
  assert parse_fields(ANSWER) == (Fields("the key may be left", "go left; open drawer", "room 2: a lamp", "go left"), "")
  two = ANSWER.replace("I go \\boxed{go  left}", "not \\boxed{look}, rather \\boxed{go right}")
  assert parse_fields(two)[0].action == "go right"
  assert parse_fields(ANSWER.replace("the key may be left", ""))[0].think == ""  # an empty think is allowed


@pytest.mark.parametrize("answer, reason", [
    (ANSWER.replace("<think>the key may be left</think>\n", ""), "Expected <think>"),
    (ANSWER.replace("<memory>room 2: a lamp</memory>", ""), "Expected <memory>"),
    (ANSWER.replace("go left; open drawer", " "), "The <explore> block is empty"),
    (ANSWER.replace("\\boxed{go  left}", "go left"), "needs the action in \\boxed"),
    (ANSWER.replace("\\boxed{go  left}", "\\boxed{ }"), "needs the action in \\boxed"),
    (ANSWER + " and more", "Nothing may follow </action>"),
    (ANSWER.replace("</action>", ""), "Expected <action>"),
    (None, "must be text"),
])
def test_a_malformed_answer_says_what_is_wrong(answer, reason):
  fields, error = parse_fields(answer)
  assert fields is None and reason in error


def test_q_phi_targets():
  assert target_text("e", "m") == "<explore>e</explore>\n<memory>m</memory>"
  assert explored_target_text("e", "m", "room 3") == "<explore>e</explore>\n<memory>m\nroom 3</memory>"


def test_log_q_clamps_the_sum_or_the_mean():
  assert log_q([-0.5, -1.5]) == -2.0
  assert log_q([-0.5, -1.5], "token_mean") == -1.0
  assert log_q([-40.0, -30.0]) == -60.0 and log_q([-40.0, -30.0], "token_mean") == -35.0
  assert log_q([0.25]) == 0.0  # a log-prob above 0 cannot come from a model; the clamp holds q <= 1 anyway
  with pytest.raises(ValueError, match="clamp must be one of"):
    log_q([-1.0], "mean")


def test_r_explore_is_the_larger_of_the_plain_and_the_discounted_explored_target():
  plain, explored = [-1.0, -1.0], [-0.1, -0.1]
  assert explore_reward(plain, explored) == pytest.approx(max(math.exp(-2.0), 0.81 * math.exp(-0.2)))
  assert explore_reward([-0.05], [-0.05]) == pytest.approx(math.exp(-0.05))  # gamma^2 < 1: the plain one wins
  assert explore_reward(plain, explored, clamp="token_mean") == pytest.approx(max(math.exp(-1.0), 0.81 * math.exp(-0.1)))
  assert explore_reward([-100.0], [-100.0], gamma=0.5) == pytest.approx(math.exp(-60.0))


def test_eq_10_adds_each_term_once():
  assert step_reward(1.0, 1.0, 0.2) == pytest.approx(1.0 + 0.5 + 0.2)
  assert step_reward(0.0, 0.0, 0.3, alpha1=0.5, alpha2=2.0) == pytest.approx(0.6)


def test_the_q_phi_loss_and_its_gradient_by_hand():
  q = jnp.array([[-0.5, -1.0, -9.0], [-2.0, -0.25, -0.25]])
  p = jnp.array([[-1.0, -1.0, -9.0], [-1.0, -1.0, -1.0]])
  mask = jnp.array([[True, True, False], [True, True, True]])
  reward = jnp.array([1.0, 0.0])
  log_q_b = np.array([-1.5, -2.5])        # the masked sums
  log_p_b = np.array([-2.0, -3.0])
  weight = 1.0 * np.array([1.0, 0.0]) - 1.0 * (log_q_b - log_p_b)   # (0.5, -0.5)
  loss, grad = jax.value_and_grad(q_phi_loss)(q, p, mask, reward)
  assert float(loss) == pytest.approx(-np.mean(weight * log_q_b))
  np.testing.assert_allclose(grad, -weight[:, None] * np.asarray(mask) / 2, rtol=1e-6)
  assert float(q_phi_loss(q, p, mask, reward, beta=2.0, kappa=0.0)) == pytest.approx(-np.mean(2 * np.array([1.0, 0.0]) * log_q_b))
