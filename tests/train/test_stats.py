"""explore_jax/train/stats.py against cases computed by hand and t-table values."""

import itertools
import math

import numpy as np
import pytest

from explore_jax.train import stats


def test_welch_t_and_dof_by_hand():
  # a = [1, 2, 3]:    mean 2,   s^2 = (1 + 0 + 1) / 2 = 1,                     s^2 / n = 1/3
  # b = [4, 5, 6, 7]: mean 5.5, s^2 = (2.25 + 0.25 + 0.25 + 2.25) / 3 = 5/3,   s^2 / n = 5/12
  # se^2 = 1/3 + 5/12 = 3/4;  t = (2 - 5.5) / sqrt(3/4) = -7 / sqrt(3) = -4.04145...
  # dof = (3/4)^2 / ((1/3)^2 / 2 + (5/12)^2 / 3) = (9/16) / (1/18 + 25/432) = (9/16) / (49/432) = 243/49
  t, dof, p = stats.welch_t([1, 2, 3], [4, 5, 6, 7])
  assert t == pytest.approx(-7 / math.sqrt(3), abs=1e-12)
  assert dof == pytest.approx(243 / 49, abs=1e-12)
  assert p == pytest.approx(stats.student_t_two_sided_p(7 / math.sqrt(3), 243 / 49), abs=1e-15)
  # t(4.96) at 4.04: just beyond the table's 0.01 point of t(5) (4.032); scipy's ttest_ind(equal_var=False)
  # gives p = 0.0100769433479889 for these data.
  assert p == pytest.approx(0.0100769433479889, abs=1e-9)
  t2, dof2, p2 = stats.welch_t([4, 5, 6, 7], [1, 2, 3])
  assert (t2, dof2, p2) == pytest.approx((-t, dof, p))


def test_welch_t_edge_cases():
  assert all(math.isnan(x) for x in stats.welch_t([1.0], [2.0, 3.0]))     # one seed: no variance
  assert all(math.isnan(x) for x in stats.welch_t([1.0, 1.0], [1.0, 1.0]))  # 0 / 0
  t, dof, p = stats.welch_t([1.0, 1.0], [0.5, 0.5])
  assert t == math.inf and math.isnan(dof) and p == 0.0


@pytest.mark.parametrize("t, dof, p", [
    (2.776, 4, 0.05), (2.228, 10, 0.05), (4.604, 4, 0.01), (12.706, 1, 0.05), (2.086, 20, 0.05),
    (1.960, 1e6, 0.05), (1.812, 10, 0.10), (0.0, 3, 1.0)])
def test_student_t_p_matches_table_values(t, dof, p):
  assert stats.student_t_two_sided_p(t, dof) == pytest.approx(p, abs=1e-3)
  assert stats.student_t_two_sided_p(-t, dof) == stats.student_t_two_sided_p(t, dof)


def test_student_t_p_exact_values():
  # dof = 1 is the Cauchy distribution: P(|T| >= t) = 1 - 2 atan(t) / pi, 1/2 at t = 1.
  assert stats.student_t_two_sided_p(1.0, 1) == pytest.approx(0.5, abs=1e-12)
  for t in (0.3, 2.0, 7.0):
    assert stats.student_t_two_sided_p(t, 1) == pytest.approx(1 - 2 * math.atan(t) / math.pi, abs=1e-12)
  # dof = 2: P(|T| >= t) = 1 - t / sqrt(2 + t^2).
  for t in (0.5, 1.0, 3.0):
    assert stats.student_t_two_sided_p(t, 2) == pytest.approx(1 - t / math.sqrt(2 + t * t), abs=1e-12)
  assert stats.student_t_cdf(0.0, 5) == 0.5
  assert stats.student_t_cdf(2.776, 4) == pytest.approx(0.975, abs=1e-3)
  assert stats.student_t_cdf(-2.776, 4) == pytest.approx(0.025, abs=1e-3)


def test_regularized_incomplete_beta_closed_forms():
  # I_x(a, 1) = x^a;  I_x(1, b) = 1 - (1 - x)^b;  I_x(a, b) = 1 - I_{1-x}(b, a).
  for x in (0.05, 0.3, 0.5, 0.9):
    assert stats.regularized_incomplete_beta(x, 3.5, 1.0) == pytest.approx(x ** 3.5, abs=1e-12)
    assert stats.regularized_incomplete_beta(x, 1.0, 2.5) == pytest.approx(1 - (1 - x) ** 2.5, abs=1e-12)
    assert stats.regularized_incomplete_beta(x, 2.0, 7.0) == pytest.approx(
        1 - stats.regularized_incomplete_beta(1 - x, 7.0, 2.0), abs=1e-12)


def test_permutation_test_exact_by_hand():
  # Pooled {1..6}, 3 vs 3: C(6, 3) = 20 equally likely splits. The observed split {1,2,3} | {4,5,6} has
  # |mean difference| = 3, the largest possible; only it and its mirror {4,5,6} | {1,2,3} reach 3.
  # p = 2 / 20 = 0.1 -- the smallest p any 3-vs-3 comparison can give.
  assert stats.permutation_test([1, 2, 3], [4, 5, 6]) == pytest.approx(0.1, abs=1e-15)
  # a = [1, 2, 4], b = [3, 5, 6]: observed |diff| = |7/3 - 14/3| = 7/3. Sums of the "a" side (total 21):
  # |diff| = |2 s - 21| / 3 >= 7/3  <=>  s <= 7 or s >= 14. 3-subsets of {1..6} with sum <= 7: {1,2,3},
  # {1,2,4}; with sum >= 14: {3,5,6}, {4,5,6}. p = 4 / 20 = 0.2.
  assert stats.permutation_test([1, 2, 4], [3, 5, 6]) == pytest.approx(0.2, abs=1e-15)
  # Equal groups: every split ties or beats 0.
  assert stats.permutation_test([1, 2], [2, 1]) == 1.0


def test_permutation_test_counts_float_ties():
  # 0.1 + 0.2 != 0.3 in floats; the split sums that equal the observed one up to rounding must count.
  a, b = [0.1, 0.2, 0.3], [0.3, 0.2, 0.1]
  assert stats.permutation_test(a, b) == 1.0


def test_permutation_test_monte_carlo_agrees_with_enumeration():
  rng = np.random.default_rng(3)
  a, b = rng.random(10), rng.random(10) + 0.25    # C(20, 10) = 184756 > EXACT_LIMIT: Monte Carlo
  p = stats.permutation_test(a, b, resamples=20_000, seed=1)
  assert p == stats.permutation_test(a, b, resamples=20_000, seed=1)
  pooled, obs = np.concatenate([a, b]), abs(a.mean() - b.mean())
  sums = np.array([pooled[list(c)].sum() for c in itertools.combinations(range(20), 10)])
  exact = np.mean(np.abs(sums / 10 - (pooled.sum() - sums) / 10) >= obs - 1e-12)
  assert p == pytest.approx(exact, abs=0.01)
  assert p >= 1 / 20_001


def test_bootstrap_ci_properties():
  v = [0.58, 0.64, 0.57, 0.61, 0.55]
  mean, low, high = stats.bootstrap_ci(v)
  assert mean == pytest.approx(np.mean(v), abs=1e-15)
  assert min(v) <= low < mean < high <= max(v)
  assert stats.bootstrap_ci(v, seed=0) == (mean, low, high)             # deterministic given the seed
  assert stats.bootstrap_ci(v, seed=1) != (mean, low, high)
  # More data of the same spread: a narrower interval (width ~ s / sqrt(n)).
  rng = np.random.default_rng(0)
  widths = [np.subtract(*stats.bootstrap_ci(rng.normal(0.6, 0.05, n), seed=0)[2:0:-1]) for n in (4, 40, 400)]
  assert widths[0] > widths[1] > widths[2] > 0
  assert widths[1] / widths[2] == pytest.approx(math.sqrt(10), rel=0.25)
  # 90% inside 95%.
  _, l90, h90 = stats.bootstrap_ci(v, confidence=0.9)
  assert low <= l90 and h90 <= high


def test_bootstrap_ci_degenerate_cases():
  assert stats.bootstrap_ci([0.3, 0.3, 0.3]) == (0.3, 0.3, 0.3)
  mean, low, high = stats.bootstrap_ci([0.7])
  assert mean == 0.7 and math.isnan(low) and math.isnan(high)
  with pytest.raises(ValueError):
    stats.bootstrap_ci([])


def test_bootstrap_diff_ci():
  a, b = [0.875, 0.938, 0.875], [0.781, 0.812, 0.719]
  diff, low, high = stats.bootstrap_diff_ci(a, b)
  assert diff == pytest.approx(np.mean(a) - np.mean(b), abs=1e-15)
  assert low < diff < high
  # The extremes: every draw lies between min(a) - max(b) and max(a) - min(b).
  assert min(a) - max(b) <= low and high <= max(a) - min(b)
  assert stats.bootstrap_diff_ci(a, b, seed=0) == (diff, low, high)
  assert stats.bootstrap_diff_ci([1.0, 1.0], [0.5, 0.5]) == (0.5, 0.5, 0.5)
  d1, l1, h1 = stats.bootstrap_diff_ci([1.0], b)
  assert d1 == pytest.approx(1.0 - np.mean(b)) and math.isnan(l1) and math.isnan(h1)


def test_paired_task_test_by_hand():
  # Per-task differences d = [1, 2, 3] (a is 1 higher on task 0, ...). The 2^3 = 8 sign patterns give
  # sums +-1 +-2 +-3 = 6, 4, 2, 0, 0, -2, -4, -6; |sum| >= 6 for two of them: p = 2 / 8 = 0.25.
  assert stats.paired_task_test([1, 2, 3], [0, 0, 0]) == pytest.approx(0.25, abs=1e-15)
  # Seeds are averaged first: a's task rows [1, 3] -> 2, [0, 0] -> 0, [1, 1] -> 1; b's one seed 0, 1, 1.
  # d = [2, -1, 0]: sums over signs of +-2 +-1 +-0 = {3, 1, -1, -3}, each twice; |sum| >= |1|: all 8.
  # p = 8 / 8 = 1.
  a = [[1.0, 3.0], [0.0, 0.0], [1.0, 1.0]]
  b = [[0.0], [1.0], [1.0]]
  np.testing.assert_allclose(stats.task_differences(a, b), [2.0, -1.0, 0.0])
  assert stats.paired_task_test(a, b) == 1.0
  # Five tasks all favouring a: only the all-plus and all-minus patterns reach it, p = 2 / 32.
  assert stats.paired_task_test([[0.5, 0.7]] * 5, [[0.1, 0.3]] * 5) == pytest.approx(2 / 32, abs=1e-15)
  with pytest.raises(ValueError):
    stats.paired_task_test([[1.0], [2.0]], [[1.0]])


def test_paired_task_test_monte_carlo():
  rng = np.random.default_rng(2)
  a, b = rng.random((30, 3)), rng.random((30, 2))          # 2^30 patterns: Monte Carlo
  p = stats.paired_task_test(a, b, resamples=5000, seed=4)
  assert p == stats.paired_task_test(a, b, resamples=5000, seed=4)
  assert 1 / 5001 <= p <= 1.0
  strong = stats.paired_task_test(a + 1.0, b, resamples=5000, seed=4)
  assert strong == pytest.approx(1 / 5001)                  # nothing beats "every task favours a"


def test_permutation_power_hand_cases():
  # 3 vs 3 seeds: the smallest exact p is 2/20 = 0.1, so no effect however large can reach 0.05.
  assert stats.permutation_power(100.0, 1.0, 3) == 0.0
  # 4 vs 4 under the null: exactly the 2 most extreme of C(8, 4) = 70 splits reject (p = 2/70 <= 0.05 <
  # 4/70), so the rejection rate is 2/70 = 0.0286; 20,000 simulations put 4 standard errors at 0.0047.
  null = stats.permutation_power(0.0, 1.0, 4, simulations=20_000)
  assert abs(null - 2 / 70) < 4 * math.sqrt((2 / 70) * (1 - 2 / 70) / 20_000)
  # A huge effect always rejects from 4 seeds on; only effect / sd matters (same draws, rescaled).
  assert stats.permutation_power(50.0, 1.0, 4) == 1.0
  assert stats.permutation_power(0.1, 0.07, 6) == stats.permutation_power(1.0, 0.7, 6)
  # More seeds, more power; the Monte Carlo split set (C(16, 8) > splits) behaves like the exact one.
  p4, p6, p8 = (stats.permutation_power(1.5, 1.0, n) for n in (4, 6, 8))
  assert p4 < p6 < p8
  # Against the pooled t-test's power at d = 1.5, n = 8 per arm, alpha 0.05 two-sided: noncentrality
  # 1.5 * sqrt(8 / 2) = 3.0, 14 dof, critical t 2.145, power 0.80 (normal approximation: Phi(3.0 - 2.145)
  # = 0.80); for normal data the permutation test is about as powerful.
  assert 0.74 < p8 < 0.86
  with pytest.raises(ValueError, match="at least 2 runs"):
    stats.permutation_power(1.0, 1.0, 1)


def test_stratified_permutation_power_hand_cases():
  # One run per method in each of S warm starts: the within-strata test is a sign-flip test over S pairs,
  # 2^S relabellings, smallest p 2 / 2^S: 0.0625 for S = 5 (never rejects at 0.05), 0.031 for S = 6.
  assert stats.permutation_power(50.0, 1.0, 1, strata=5) == 0.0
  assert stats.permutation_power(50.0, 1.0, 1, strata=6) == 1.0
  # Under the null the test keeps its level: 3 warm starts of 2 vs 2, C(4, 2)^3 = 216 exact relabellings.
  null = stats.permutation_power(0.0, 1.0, 2, strata=3, simulations=20_000)
  assert null <= 0.05 + 4 * math.sqrt(0.05 * 0.95 / 20_000)
  # Stratum offsets cancel, so what buys power is runs per method, however they are split into warm starts:
  # 2 x 4 runs is about as powerful as 8 unstratified runs, and 4 x 4 more than either.
  plain8, two_by_four = stats.permutation_power(1.0, 1.0, 8), stats.permutation_power(1.0, 1.0, 4, strata=2)
  assert abs(plain8 - two_by_four) < 0.06
  assert stats.permutation_power(1.0, 1.0, 4, strata=4) > two_by_four + 0.2
  with pytest.raises(ValueError, match="at least 2 runs"):
    stats.permutation_power(1.0, 1.0, 1, strata=1)


def test_stratified_permutation_test_by_hand(monkeypatch):
  # Two warm starts, one run of each method on each: a = (1 | 10), b = (2 | 12). D_obs = 5.5 - 7 = -1.5.
  # Within-stratum relabellings (2 x 2): swap none -1.5, swap the first -0.5, the second +0.5, both +1.5;
  # |D| >= 1.5 for 2 of 4, p = 0.5. Across strata (C(4, 2) = 6 splits) the D's are -1.5, -9.5, 0.5, -0.5,
  # 1.5, 9.5: p = 4/6 -- the strata's offset inflates the free test's null distribution.
  a, b = [1.0, 10.0], [2.0, 12.0]
  assert stats.stratified_permutation_test(a, b, ["w0", "w1"], ["w0", "w1"]) == pytest.approx(0.5)
  assert stats.permutation_test(a, b) == pytest.approx(4 / 6)
  # One stratum: the plain permutation test.
  assert stats.stratified_permutation_test([1, 2, 3], [4, 5, 6], [0] * 3, [0] * 3) == pytest.approx(0.1)
  # A stratum with one method only adds a constant: stratum x holds a=1 alone; in y, (a=2, b=3) or
  # (a=3, b=2): D = 1.5 - 3 = -1.5 or 2 - 2 = 0, so p = 1/2.
  assert stats.stratified_permutation_test([1, 2], [3], ["x", "y"], ["y"]) == pytest.approx(0.5)
  # Monte Carlo (forced by a zero exact limit) agrees with the enumeration.
  rng = np.random.default_rng(3)
  a, b = rng.normal(0.3, 1, 8), rng.normal(0, 1, 8)
  strata = [0, 0, 0, 0, 1, 1, 1, 1]
  b = b + np.array(strata) * 5.0
  a = a + np.array(strata) * 5.0
  exact = stats.stratified_permutation_test(a, b, strata, strata)
  monkeypatch.setattr(stats, "EXACT_LIMIT", 0)
  assert abs(stats.stratified_permutation_test(a, b, strata, strata, resamples=40_000) - exact) < 0.01
  with pytest.raises(ValueError, match="one stratum per value"):
    stats.stratified_permutation_test([1, 2], [3], ["x"], ["y"])
