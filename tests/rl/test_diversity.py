"""DPEPO diversity weight: hand-computed counts, the released code's variants, end to end."""

import hypothesis
import hypothesis.strategies as st
import jax.numpy as jnp
import numpy as np
import pytest

from explore_jax.rl import advantages as adv_lib
from explore_jax.rl import diversity


def test_no_parsed_action_gets_half():
  assert diversity.dpepo_step_weight({1: ["go north"]}, {}) == 0.5
  assert diversity.dpepo_step_weight({}, {}, no_action_weight=0.3) == 0.3


def test_first_step_only_counts_width_repeats():
  # No history: c_dep = c_dtr = c_wtr = 0, so every W_i = 1. Two equal actions: c_wid = 1.
  w = diversity.dpepo_step_weight({}, {1: "go north", 2: "go north", 3: "look"})
  assert w == pytest.approx((0.95 + 1.0) / 2)


def test_width_ignore_reproduces_the_released_alfworld_look_rule():
  actions = {1: "look", 2: "look"}
  assert diversity.dpepo_step_weight({}, actions) == pytest.approx((0.95 + 1.0) / 2)
  assert diversity.dpepo_step_weight({}, actions, width_ignore=("look",)) == pytest.approx(1.0)


def test_depth_and_width_transition_counts_hand_computed():
  histories = {1: ["a", "b", "a"], 2: ["a", "b"], 3: ["z"]}
  actions = {1: "b", 2: "c"}  # copy 3 does not act and does not count
  # Copy 1: c_dep = 1 (one earlier "b"); p = (a, b); own pairs (a,b), (b,a) -> c_dtr = 1;
  #   copy 2's history + action = a b c, pairs (a,b), (b,c) -> c_wtr = 1.
  #   W_1 = (0.8 + 0.95 + 0.95) / 3 = 0.9.
  # Copy 2: c_dep = 0; p = (b, c); own pairs (a,b) -> 0; copy 1's a b a b -> 0. W_2 = 1.
  # c_wid = 0. W_t = (1 + (0.9 + 1) / 2) / 2.
  w = diversity.dpepo_step_weight(histories, actions)
  assert w == pytest.approx((1.0 + (0.9 + 1.0) / 2) / 2)


def test_all_coefficients_are_used_where_the_definitions_say():
  histories = {1: ["a", "b", "a"], 2: ["a", "b"]}
  w = diversity.dpepo_step_weight(histories, {1: "b", 2: "c"}, alpha=0.5, gamma=0.25,
                                  beta=0.125, omega=0.9)
  w_1 = (0.5 + 0.25 + 0.125) / 3
  assert w == pytest.approx((1.0 + (w_1 + 1.0) / 2) / 2)
  # omega only enters through c_wid.
  w = diversity.dpepo_step_weight({}, {1: "x", 2: "x", 3: "x"}, omega=0.5)
  assert w == pytest.approx((0.5**2 + 1.0) / 2)


def test_actions_are_compared_after_stripping_whitespace():
  assert diversity.dpepo_step_weight({1: [" open door\n"]}, {1: "open door "}) == pytest.approx(
      (1.0 + (0.8 + 1.0 + 1.0) / 3) / 2)


def test_trajectory_replay_hand_computed():
  steps = [{1: "a", 2: "a"}, {1: "a"}, {}, {1: "b", 2: "a"}]
  # t0: no history, c_wid = 1                                   -> (0.95 + 1) / 2
  # t1: copy 1 history [a]: c_dep = 1, p = (a, a), no pairs      -> (1 + (0.8 + 1 + 1) / 3) / 2
  # t2: nothing parsed                                           -> 0.5
  # t3: copy 1 history [a, a], action b: c_dep 0, p = (a, b); own pairs (a,a): 0;
  #       copy 2's a + a -> (a,a): 0. W_1 = 1.
  #     copy 2 history [a], action a: c_dep 1, p = (a, a); own pairs none: 0;
  #       copy 1's a a b -> (a,a), (a,b): c_wtr 1. W_2 = (0.8 + 1 + 0.95) / 3.
  w2 = (0.8 + 1.0 + 0.95) / 3
  expected = [(0.95 + 1.0) / 2, (1.0 + 2.8 / 3) / 2, 0.5, (1.0 + (1.0 + w2) / 2) / 2]
  np.testing.assert_allclose(diversity.dpepo_trajectory_weights(steps), expected, rtol=1e-12)


# ----------------------------------------------------------------------------- released code: K copies

W_REPEAT = (0.8 + 1.0 + 1.0) / 3  # one earlier equal action, no repeated pair


def test_only_copies_1_to_k_act_but_width_counts_every_action():
  histories = {1: ["a"], 5: ["a"]}
  actions = {1: "a", 2: "b", 5: "a"}
  # K = 4: copies 1 and 2 act, copy 5 does not exist.
  #   Copy 1: c_dep 1, p = (a, a), own pairs none, copy 2's [b] has no pair -> W_1 = 2.8 / 3.
  #   Copy 2: no history -> W_2 = 1. The mean runs over 2 copies.
  #   c_wid over all three parsed actions a, b, a = 1 (copy 5's "a" included).
  w = diversity.dpepo_step_weight(histories, actions, num_copies=4)
  assert w == pytest.approx((0.95 + (W_REPEAT + 1.0) / 2) / 2)
  # Every copy acting (no K): copy 5 acts with p = (a, a) and copy 1's a a supplies it (and vice
  # versa), so W_1 = W_5 = (0.8 + 1 + 0.95) / 3 and the mean runs over three copies.
  w_both = (0.8 + 1.0 + 0.95) / 3
  w = diversity.dpepo_step_weight(histories, actions)
  assert w == pytest.approx((0.95 + (2 * w_both + 1.0) / 3) / 2)


def test_out_of_range_actions_count_in_width_minus_the_ignored_ones():
  actions = {1: "look", 6: "look", 2: "x", 7: "x "}
  # Copies 1 and 2 act with no history (W_i = 1). c_wid over look, look, x, x.
  w = diversity.dpepo_step_weight({}, actions, num_copies=4)
  assert w == pytest.approx((0.95**2 + 1.0) / 2)
  w = diversity.dpepo_step_weight({}, actions, num_copies=4, width_ignore=("look",))
  assert w == pytest.approx((0.95 + 1.0) / 2)  # were out-of-range actions dropped, W_t = 1


def test_a_step_with_only_out_of_range_copies_is_a_non_action():
  actions = {5: "go north", 6: "open door"}
  assert diversity.dpepo_step_weight({}, actions, num_copies=4) == 0.5
  assert diversity.dpepo_step_weight({}, actions, num_copies=4, no_action_weight=0.3,
                                     round_to=4) == 0.3
  # Without K both copies act and the step would get the maximum weight.
  assert diversity.dpepo_step_weight({}, actions) == pytest.approx(1.0)


def test_copy_ids_must_be_ints_and_k_positive_when_k_is_given():
  with pytest.raises(TypeError):
    diversity.dpepo_step_weight({}, {"1": "a"}, num_copies=4)
  with pytest.raises(ValueError):
    diversity.dpepo_step_weight({}, {1: "a"}, num_copies=0)


def test_round_to_reproduces_the_released_four_decimals():
  # (0.95 + (2.8/3 + 1) / 2) / 2 = 0.958333...
  exact = diversity.dpepo_step_weight({1: ["a"]}, {1: "a", 2: "a"})
  assert exact == pytest.approx(0.9583333333) and exact != 0.9583
  assert diversity.dpepo_step_weight({1: ["a"]}, {1: "a", 2: "a"}, round_to=4) == 0.9583
  assert diversity.dpepo_step_weight({1: ["a"]}, {1: "a", 2: "a"}, round_to=2) == 0.96
  assert diversity.dpepo_step_weight({}, {}, no_action_weight=1 / 3, round_to=4) == 1 / 3


def test_trajectory_with_k_copies_gives_out_of_range_copies_no_history():
  steps = [{1: "a", 5: "a"}, {1: "a", 5: "b"}, {5: "c"}, {1: "a", 2: "a"}]
  # t0: copy 1 acts, no history; c_wid over a, a = 1              -> (0.95 + 1) / 2
  # t1: copy 1 history [a], action a: W_1 = 2.8 / 3; c_wid 0      -> (1 + 2.8 / 3) / 2
  # t2: only copy 5, which does not exist                         -> 0.5
  # t3: copy 1 history [a, a] (copy 5's a, b, c are nowhere), action a: c_dep 2, p = (a, a),
  #     own pairs (a, a) -> c_dtr 1, copy 2's [a] -> c_wtr 0: W_1 = (0.64 + 0.95 + 1) / 3.
  #     Copy 2: no history, W_2 = 1. c_wid over a, a = 1.
  w1 = (0.64 + 0.95 + 1.0) / 3
  expected = [(0.95 + 1.0) / 2, (1.0 + W_REPEAT) / 2, 0.5, (0.95 + (w1 + 1.0) / 2) / 2]
  weights = diversity.dpepo_trajectory_weights(steps, num_copies=4)
  np.testing.assert_allclose(weights, expected, rtol=1e-12)
  rounded = diversity.dpepo_trajectory_weights(steps, num_copies=4, round_to=4)
  assert rounded == [round(w, 4) for w in expected]
  # Without K copy 5 acts at t2 (history [a, b], action c: W_5 = 1, c_wid 0) -> 1.
  assert diversity.dpepo_trajectory_weights(steps)[2] == pytest.approx(1.0)


@hypothesis.settings(max_examples=40, deadline=None, derandomize=True)
@hypothesis.given(steps=st.lists(
    st.dictionaries(st.integers(1, 6), st.sampled_from(["a", "b", "c", "look"]), max_size=6),
    min_size=1, max_size=8))
def test_k_copy_weights_lie_in_unit_interval_and_ignore_out_of_range_histories(steps):
  options = dict(num_copies=4, width_ignore=("look",), round_to=4)
  weights = diversity.dpepo_trajectory_weights(steps, **options)
  assert all(0.0 < w <= 1.0 for w in weights)
  # Out-of-range actions enter no history: replaying the in-range actions alone gives the same
  # W_t at every step that named no out-of-range copy.
  in_range = [{c: a for c, a in step.items() if c <= 4} for step in steps]
  alone = diversity.dpepo_trajectory_weights(in_range, **options)
  for step, w, w_alone in zip(steps, weights, alone):
    if all(c <= 4 for c in step):
      assert w == w_alone


@hypothesis.settings(max_examples=40, deadline=None, derandomize=True)
@hypothesis.given(steps=st.lists(
    st.dictionaries(st.integers(1, 4), st.sampled_from(["a", "b", "c", "look"]), max_size=4),
    min_size=1, max_size=8))
def test_weights_lie_in_unit_interval_and_distinct_first_actions_score_one(steps):
  weights = diversity.dpepo_trajectory_weights(steps)
  assert all(0.0 < w <= 1.0 for w in weights)
  if steps[0] and len(set(steps[0].values())) == len(steps[0]):
    assert weights[0] == pytest.approx(1.0)


def test_weights_feed_the_dpepo_estimator():
  # Trajectory 0 succeeds on its second step; trajectory 1 repeats itself and fails.
  w0 = diversity.dpepo_trajectory_weights([{1: "a", 2: "b"}, {1: "c"}])
  w1 = diversity.dpepo_trajectory_weights([{1: "a"}, {1: "a"}])
  records = adv_lib.StepRecords(
      rewards=jnp.array([0.0, 1.0, 0.0, 0.0]), group_ids=jnp.array([0, 0, 0, 0]),
      traj_ids=jnp.array([0, 0, 1, 1]), step_ids=jnp.array([0, 1, 0, 1]),
      step_weights=jnp.asarray(w0 + w1, dtype=jnp.float32))
  out = adv_lib.get_advantage_estimator("dpepo")(records)
  a = 0.5 / (np.sqrt(0.5) + 1e-6)
  expected = [a * w0[0], a * w0[1], -a * (2 - w1[0]), -a * (2 - w1[1])]
  np.testing.assert_allclose(out, expected, rtol=1e-5)
  assert w1[1] < 1.0  # the repeated action is penalised
