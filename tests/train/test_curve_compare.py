"""Training-curve endpoints (explore_jax/train/curve_compare.py): early/late windows, the sign-flip p, arms and
their comparison, on hand-made metrics.jsonl rows."""

import pytest

from explore_jax.train import curve_compare

M = "diversity/d_grp_vis"


def rows(values, metric=M):
  return [{"iteration": i + 1, metric: v} for i, v in enumerate(values)]


def test_windows_average_the_first_and_last_iterations_that_log_the_metric():
  r = rows([0.1, 0.2, 0.3, 0.4, 0.5, 0.6]) + [{"iteration": 7}]
  assert curve_compare.window_means(r, M, 2) == pytest.approx((0.15, 0.55))
  assert curve_compare.window_means(r, M, 100) == pytest.approx((0.35, 0.35))  # the whole run at both ends
  assert curve_compare.window_means(r, "revisit_share", 2) is None


def test_arms_are_reported_with_their_change_and_compared():
  curves = {"rising": [("r0", rows([0.1, 0.1, 0.3, 0.3])), ("r1", rows([0.2, 0.2, 0.5, 0.5])),
                       ("r2", rows([0.1, 0.1, 0.2, 0.2]))],
            "flat": [("f0", rows([0.2, 0.2, 0.2, 0.2])), ("f1", rows([0.3, 0.3, 0.2, 0.2]))],
            "alone": [("a0", rows([0.5, 0.5]))]}  # one run: nothing to say
  report = curve_compare.analyse(curves, window=2, resamples=2000)
  assert list(report) == [M]
  arms = report[M]["arms"]
  assert set(arms) == {"rising", "flat"}
  assert arms["rising"]["change"] == pytest.approx([0.2, 0.3, 0.1])
  assert arms["rising"]["change_mean_ci"][0] == pytest.approx(0.2)
  assert arms["flat"]["late"] == pytest.approx([0.2, 0.2])
  # Exact sign flips of each arm's changes: [0.2, 0.3, 0.1] is as extreme only all-plus or all-minus (2 / 8);
  # [0, -0.1] flips its one non-zero change to a mean as large either way (p = 1).
  assert arms["rising"]["change_sign_flip_p"] == pytest.approx(2 / 8)
  assert arms["flat"]["change_sign_flip_p"] == pytest.approx(1.0)
  (c,) = report[M]["comparisons"]
  assert (c["a"], c["b"]) == ("rising", "flat") and c["diff_ci"][0] == pytest.approx(0.2 - (-0.05))
  # Changes [0.2, 0.3, 0.1] vs [0, -0.1]: of the C(5, 3) = 10 splits, the observed one (three summing to 0.6,
  # D = 0.25) and {0.1, 0, -0.1} (D = -0.25) are as extreme: p = 2 / 10.
  assert c["permutation_p"] == pytest.approx(0.2)
  text = curve_compare.markdown(report)
  assert "### diversity/d_grp_vis" in text and "| rising | 3 |" in text and "| rising - flat |" in text
  assert curve_compare.markdown({}) == ""
