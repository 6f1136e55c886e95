"""Statistics for comparing methods over a few seeds: bootstrap intervals, Welch's t, permutation tests.

Pure numpy and the standard library (no scipy, no jax): launch/compare.py uses it on finished runs.

The unit of replication is the training run (one seed): a method's pass@k is one number per seed, and two
methods are compared on those numbers. What launch/compare.py reports for each pair of methods, and why:

  primary   permutation_test over seeds (difference of means). Exact (every split of the pooled seeds is
            enumerated) at the sizes we run, 3-10 seeds per method; it assumes only that, if the methods
            do not differ, the seeds' numbers are exchangeable between them -- no normality, which a
            bounded, often saturated pass@k over 3 seeds cannot be checked to have. Its price is
            resolution: the smallest p it can give is 2 / C(n_a + n_b, n_a) (the observed split and its
            mirror). At 3 vs 3 seeds that is 2/20 = 0.1, so three seeds per method can never show
            p < 0.05; 4 vs 4 can (2/70 = 0.029), 5 vs 5 comfortably (2/252 = 0.008). "Enough seeds" starts
            at four.
  strata    stratified_permutation_test: the same test with labels permuted only among runs that share a
            factor, the warm start in a protocol. When runs from one warm start are alike, this removes the
            warm starts' own spread from the comparison; it is the primary test whenever runs come from
            several warm starts (launch/compare.py adds it then).
  effect    bootstrap_diff_ci: the difference of means with a 95% percentile-bootstrap interval, seeds
            resampled independently per method. A description of the size and spread of the effect, not
            a test: at n = 3 the percentile bootstrap is too narrow (the bootstrap variance of a mean is
            (n-1)/n of s^2/n, and it uses normal-like rather than t quantiles).
  reference welch_t: Welch's unequal-variance t-test, the usual parametric answer, shown so the numbers can
            be read against the literature. At 3 seeds its p leans on normality and can go far below what
            the permutation test can resolve; trust the permutation p where they disagree.
  where     paired_task_test: a sign-flip permutation test over tasks of the per-task difference of
            seed-averaged pass@k. Both methods are evaluated on the same task ids with the same protocol,
            so tasks pair naturally, and pairing removes the (large) differences in difficulty between
            tasks. But its random unit is the task, conditional on the runs that were made: it ignores the
            seed-to-seed variance of training, so a small p says "the gap is spread over many tasks for
            these runs", not "it would replicate with new seeds". Together with the per-task table it shows
            *where* a difference comes from (a few tasks or all of them).

No correction for multiple comparisons is applied (pairs x task sets x k); read several p-values together
with that in mind (Holm's step-down is the simple fix when a claim rests on one of many).

Every randomised quantity takes a `seed` and uses its own numpy Generator, so the numbers are reproducible.
"""

from __future__ import annotations

import itertools
import math
from typing import Sequence

import numpy as np

# At or below this many splits (or sign patterns) the permutation tests enumerate all of them.
EXACT_LIMIT = 100_000
# Monte Carlo draws when a permutation test cannot enumerate and the caller gives none.
DEFAULT_RESAMPLES = 10_000


def _values(values: Sequence[float], name: str = "values") -> np.ndarray:
  v = np.asarray(values, dtype=np.float64).reshape(-1)
  if v.size == 0:
    raise ValueError(f"{name} is empty")
  if not np.all(np.isfinite(v)):
    raise ValueError(f"{name} has non-finite entries: {v}")
  return v


def _tolerance(observed):
  """Slack for float ties: statistics of other splits that equal the observed one up to rounding count
  (elementwise for an array of observed statistics)."""
  return 1e-9 * np.maximum(1.0, np.abs(observed))


def _combinations(n: int, k: int) -> np.ndarray:
  """Every k-subset of range(n), one per row: [C(n, k), k] (one empty row for k = 0)."""
  flat = np.fromiter(itertools.chain.from_iterable(itertools.combinations(range(n), k)), dtype=np.int64)
  return flat.reshape(math.comb(n, k), k)


def _random_subsets(rng: np.random.Generator, n: int, k: int, count: int) -> np.ndarray:
  """`count` uniformly random k-subsets of range(n), one per row (the first k of a random permutation)."""
  return rng.permuted(np.broadcast_to(np.arange(n), (count, n)), axis=1)[:, :k]


# ---------------------------------------------------------------------------------------------------------
# Bootstrap


def _percentiles(means: np.ndarray, confidence: float) -> tuple[float, float]:
  if not 0.0 < confidence < 1.0:
    raise ValueError(f"confidence must be in (0, 1), got {confidence}")
  alpha = 1.0 - confidence
  low, high = np.quantile(means, [alpha / 2, 1.0 - alpha / 2])
  return float(low), float(high)


def bootstrap_ci(values: Sequence[float], *, confidence: float = 0.95, resamples: int = 10_000,
                 seed: int = 0) -> tuple[float, float, float]:
  """The mean of `values` (one per seed) and its percentile-bootstrap confidence interval.

  Method (Efron's percentile bootstrap): with x_1..x_n the values, draw B = `resamples` samples
  x*_b = (x_{i_1}, ..., x_{i_n}), the i_j uniform on {1..n} with replacement, and their means m*_b; with
  alpha = 1 - confidence the interval is

    [ Q(alpha / 2), Q(1 - alpha / 2) ]       Q = the empirical quantile of {m*_1, ..., m*_B}

  (numpy's default linear interpolation between order statistics). The point estimate is the sample mean
  (1/n) sum_i x_i, not the bootstrap mean.

  Edge cases: one value gives (x, nan, nan) -- no spread can be estimated from one seed, and a degenerate
  interval [x, x] would claim certainty; constant values give the degenerate interval (c, c, c), which is
  what the resampling gives. Deterministic given `seed`.
  """
  v = _values(values)
  mean = float(v.mean())
  if v.size == 1:
    return mean, math.nan, math.nan
  rng = np.random.default_rng(seed)
  means = v[rng.integers(0, v.size, size=(resamples, v.size))].mean(axis=1)
  low, high = _percentiles(means, confidence)
  # Quantiles of a constant set can differ from it in the last bit; the interval of constants is exact.
  if np.all(v == v[0]):
    low = high = mean
  return mean, low, high


def bootstrap_diff_ci(a: Sequence[float], b: Sequence[float], *, confidence: float = 0.95,
                      resamples: int = 10_000, seed: int = 0) -> tuple[float, float, float]:
  """mean(a) - mean(b) and its percentile-bootstrap interval, resampling a and b independently.

  The two methods' seeds are independent runs, so each bootstrap draw resamples n_a values of a and n_b
  values of b (with replacement, each within its own method) and takes d*_b = mean(a*_b) - mean(b*_b); the
  interval is [Q(alpha/2), Q(1 - alpha/2)] of {d*_b} as in `bootstrap_ci`. (nan, nan) bounds when either
  side has a single value (its spread is unknown, and treating it as fixed would understate the spread).
  """
  a, b = _values(a, "a"), _values(b, "b")
  diff = float(a.mean() - b.mean())
  if a.size < 2 or b.size < 2:
    return diff, math.nan, math.nan
  rng = np.random.default_rng(seed)
  ma = a[rng.integers(0, a.size, size=(resamples, a.size))].mean(axis=1)
  mb = b[rng.integers(0, b.size, size=(resamples, b.size))].mean(axis=1)
  low, high = _percentiles(ma - mb, confidence)
  if np.all(a == a[0]) and np.all(b == b[0]):
    low = high = diff
  return diff, low, high


# ---------------------------------------------------------------------------------------------------------
# Student's t distribution


def _betacf(a: float, b: float, x: float, max_iter: int = 500, eps: float = 1e-15) -> float:
  """The continued fraction of the incomplete beta function, by the modified Lentz method.

    I_x(a, b) = x^a (1 - x)^b / (a B(a, b)) * 1 / (1 + d_1 / (1 + d_2 / (1 + ...)))

    d_{2m+1} = -(a + m)(a + b + m) x / ((a + 2m)(a + 2m + 1))
    d_{2m}   =  m (b - m) x / ((a + 2m - 1)(a + 2m))

  which converges fast for x < (a + 1) / (a + b + 2). Returns the fraction 1 / (1 + d_1 / (1 + ...)).
  """
  tiny = 1e-300
  c = 1.0
  d = 1.0 - (a + b) * x / (a + 1.0)
  d = 1.0 / (d if abs(d) > tiny else tiny)
  h = d
  for m in range(1, max_iter + 1):
    for num in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
      d = 1.0 + num * d
      d = 1.0 / (d if abs(d) > tiny else tiny)
      c = 1.0 + num / c
      c = c if abs(c) > tiny else tiny
      h *= d * c
    if abs(d * c - 1.0) < eps:
      return h
  raise ArithmeticError(f"incomplete beta continued fraction did not converge (a={a}, b={b}, x={x})")


def regularized_incomplete_beta(x: float, a: float, b: float) -> float:
  """I_x(a, b) = B(x; a, b) / B(a, b) = (1 / B(a, b)) int_0^x t^(a-1) (1-t)^(b-1) dt, for a, b > 0.

  Evaluated by the continued fraction of `_betacf` where it converges fast (x < (a+1)/(a+b+2)), and by the
  symmetry I_x(a, b) = 1 - I_{1-x}(b, a) elsewhere; the prefactor x^a (1-x)^b / B(a, b) goes through
  log-gamma: ln B(a, b) = lgamma(a) + lgamma(b) - lgamma(a + b).
  """
  if not (a > 0 and b > 0):
    raise ValueError(f"need a, b > 0, got a={a}, b={b}")
  if not 0.0 <= x <= 1.0:
    raise ValueError(f"need 0 <= x <= 1, got {x}")
  if x == 0.0 or x == 1.0:
    return float(x)
  log_front = (math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
  if x < (a + 1.0) / (a + b + 2.0):
    return math.exp(log_front) * _betacf(a, b, x) / a
  return 1.0 - math.exp(log_front) * _betacf(b, a, 1.0 - x) / b


def student_t_two_sided_p(t: float, dof: float) -> float:
  """P(|T| >= |t|) for T ~ Student's t with `dof` (> 0, not necessarily an integer) degrees of freedom.

    P(|T| >= |t|) = I_{dof / (dof + t^2)}(dof / 2, 1 / 2)

  (the t CDF in terms of the regularized incomplete beta function; e.g. Abramowitz & Stegun 26.7.1 and
  26.5.27). Checks: t = 1, dof = 1 (Cauchy) gives 1/2; t = 2.776, dof = 4 gives 0.05.
  """
  if not dof > 0:
    raise ValueError(f"need dof > 0, got {dof}")
  if math.isnan(t):
    return math.nan
  if math.isinf(t):
    return 0.0
  return regularized_incomplete_beta(dof / (dof + t * t), dof / 2.0, 0.5)


def student_t_cdf(t: float, dof: float) -> float:
  """P(T <= t) = 1 - p/2 for t >= 0 and p/2 for t < 0, with p = student_t_two_sided_p(t, dof)."""
  p = student_t_two_sided_p(t, dof)
  return 1.0 - p / 2.0 if t >= 0 else p / 2.0


# ---------------------------------------------------------------------------------------------------------
# Tests


def welch_t(a: Sequence[float], b: Sequence[float]) -> tuple[float, float, float]:
  """Welch's unequal-variance t-test of mean(a) = mean(b): (t, dof, two-sided p).

    t   = (mean(a) - mean(b)) / sqrt(s_a^2 / n_a + s_b^2 / n_b)           s^2: sample variance (ddof = 1)
    dof = (s_a^2/n_a + s_b^2/n_b)^2 / ((s_a^2/n_a)^2 / (n_a - 1) + (s_b^2/n_b)^2 / (n_b - 1))
                                                                       (Welch-Satterthwaite)
    p   = P(|T_dof| >= |t|)                                             (`student_t_two_sided_p`)

  Needs at least two values on each side, else (nan, nan, nan). With both variances zero the standard
  error is 0: equal means give (nan, nan, nan) (0/0: nothing to test), different means give
  (+-inf, nan, 0.0) (a difference with no noise at all).
  """
  a, b = _values(a, "a"), _values(b, "b")
  if a.size < 2 or b.size < 2:
    return math.nan, math.nan, math.nan
  va, vb = float(a.var(ddof=1)) / a.size, float(b.var(ddof=1)) / b.size
  diff = float(a.mean() - b.mean())
  se2 = va + vb
  if se2 == 0.0:
    if diff == 0.0:
      return math.nan, math.nan, math.nan
    return math.copysign(math.inf, diff), math.nan, 0.0
  t = diff / math.sqrt(se2)
  dof = se2 * se2 / (va * va / (a.size - 1) + vb * vb / (b.size - 1))
  return float(t), float(dof), student_t_two_sided_p(t, dof)


def permutation_test(a: Sequence[float], b: Sequence[float], *, resamples: int | None = None,
                     seed: int = 0) -> float:
  """Two-sided permutation test of mean(a) = mean(b) with the difference of means as the statistic.

  Under the null the n = n_a + n_b pooled values are exchangeable: every split into n_a "a" and n_b "b"
  values is equally likely. With D(split) = mean(a side) - mean(b side) and D_obs the observed one,

    exact (C(n, n_a) <= EXACT_LIMIT):  p = #{splits: |D| >= |D_obs|} / C(n, n_a)
    Monte Carlo (otherwise):           p = (1 + #{r <= R: |D_r| >= |D_obs|}) / (1 + R)

  with R = `resamples` (default DEFAULT_RESAMPLES) random splits drawn with `seed`; the +1's count the
  observed split, which keeps a Monte Carlo p valid (never 0). The exact p counts the observed split among
  the splits, so it is at least 1 / C(n, n_a) (2 / C(n, n_a) for n_a = n_b, the mirror split ties).
  ">=" carries a tolerance of 1e-9 * max(1, |D_obs|) so splits equal up to float rounding count as ties.
  """
  return stratified_permutation_test(a, b, [0] * np.size(a), [0] * np.size(b), resamples=resamples, seed=seed)


def stratified_permutation_test(a: Sequence[float], b: Sequence[float], strata_a: Sequence, strata_b: Sequence,
                                *, resamples: int | None = None, seed: int = 0) -> float:
  """Two-sided permutation test of mean(a) = mean(b) with labels permuted only *within* strata.

  For designs where runs share a factor that moves them together, e.g. the warm start: every arm of a
  protocol runs on the same warm starts, runs from one warm start are alike, and the null hypothesis only
  says the arm labels are exchangeable among runs from the *same* warm start. Permuting within strata keeps
  each stratum's a/b counts, removes the between-strata variance from the null distribution, and so is
  valid and usually much more powerful than `permutation_test` (which permutes across strata and is then
  conservative). The statistic is the difference of the overall means, as in `permutation_test`:

    exact (prod_s C(n_s, n_a,s) <= EXACT_LIMIT):  p = #{within-strata relabellings: |D| >= |D_obs|} / count
    Monte Carlo (otherwise):                      p = (1 + #{r: |D_r| >= |D_obs|}) / (1 + R)

  A stratum with runs of only one method cannot be relabelled and only adds a constant; with a single
  stratum this is `permutation_test`. Its smallest p is 2 / prod_s C(n_s, n_a,s) for balanced strata
  (3 + 3 runs in each of 2 strata: 2/400 = 0.005).
  """
  a, b = _values(a, "a"), _values(b, "b")
  strata_a, strata_b = list(strata_a), list(strata_b)
  if len(strata_a) != a.size or len(strata_b) != b.size:
    raise ValueError(f"one stratum per value: {len(strata_a)} strata for {a.size} a's, "
                     f"{len(strata_b)} for {b.size} b's")
  na, nb = a.size, b.size
  observed = float(a.mean() - b.mean())
  threshold = abs(observed) - _tolerance(observed)
  groups = []  # per stratum: its pooled values and how many of them are labelled a
  for s in dict.fromkeys(strata_a + strata_b):
    va = a[[i for i, x in enumerate(strata_a) if x == s]]
    vb = b[[i for i, x in enumerate(strata_b) if x == s]]
    groups.append((np.concatenate([va, vb]), va.size))
  total = float(a.sum() + b.sum())
  count = math.prod(math.comb(v.size, k) for v, k in groups)
  if count <= EXACT_LIMIT:
    # Sum of the a-labelled values for every within-stratum choice, combined across strata by broadcasting.
    sums_a = np.zeros(1)
    for v, k in groups:
      sums_a = (sums_a[:, None] + v[_combinations(v.size, k)].sum(axis=1)[None, :]).reshape(-1)
    diffs = sums_a / na - (total - sums_a) / nb
    return float(np.mean(np.abs(diffs) >= threshold))
  resamples = DEFAULT_RESAMPLES if resamples is None else int(resamples)
  rng = np.random.default_rng(seed)
  sums_a = np.zeros(resamples)
  for v, k in groups:
    sums_a += v[_random_subsets(rng, v.size, k, resamples)].sum(axis=1)
  diffs = sums_a / na - (total - sums_a) / nb
  return float((1 + np.sum(np.abs(diffs) >= threshold)) / (1 + resamples))


def task_differences(a_by_task_and_seed, b_by_task_and_seed) -> np.ndarray:
  """d_t = mean_s a[t, s] - mean_s b[t, s]: per task, the difference of the seed-averaged values.

  a is [T, S_a], b is [T, S_b] (a 1-D input is one seed per task); row t of both must be the same task.
  """
  a = np.asarray(a_by_task_and_seed, dtype=np.float64)
  b = np.asarray(b_by_task_and_seed, dtype=np.float64)
  a = a[:, None] if a.ndim == 1 else a
  b = b[:, None] if b.ndim == 1 else b
  if a.ndim != 2 or b.ndim != 2 or a.shape[0] != b.shape[0] or a.shape[0] == 0:
    raise ValueError(f"need [tasks, seeds] arrays over the same tasks, got {a.shape} and {b.shape}")
  if a.shape[1] == 0 or b.shape[1] == 0:
    raise ValueError("need at least one seed per method")
  if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
    raise ValueError("non-finite per-task values")
  return a.mean(axis=1) - b.mean(axis=1)


def paired_task_test(a_by_task_and_seed, b_by_task_and_seed, *, resamples: int | None = None,
                     seed: int = 0) -> float:
  """Two-sided paired sign-flip permutation test over tasks; returns p.

  Tasks are the pairing unit: both methods are evaluated on the same tasks (same ids, same number of
  samples, same temperature), so each task gives one paired difference of seed-averaged values,

    d_t = mean_s a[t, s] - mean_s b[t, s]          (`task_differences`)

  and the statistic is their mean dbar = (1/T) sum_t d_t. Under the null that the method labels are
  exchangeable within each task, each d_t is as likely to have either sign, so with sigma in {-1, +1}^T,

    exact (2^T <= EXACT_LIMIT):   p = #{sigma: |mean_t sigma_t d_t| >= |dbar|} / 2^T
    Monte Carlo (otherwise):      p = (1 + #{r <= R: |mean_t sigma_{r,t} d_t| >= |dbar|}) / (1 + R)

  (R = `resamples`, default DEFAULT_RESAMPLES, signs drawn with `seed`; ties within 1e-9 * max(1, |dbar|)).
  Tasks with d_t = 0 (e.g. solved by both every time) flip to themselves and only dilute the mean.
  Its random unit is the task given these runs, not the seed: see the module docstring.
  """
  d = task_differences(a_by_task_and_seed, b_by_task_and_seed)
  t = d.size
  observed = float(d.mean())
  threshold = abs(observed) - _tolerance(observed)
  if 2 ** t <= EXACT_LIMIT:
    # Row j of signs is the binary expansion of j: all 2^T sign patterns.
    bits = (np.arange(2 ** t)[:, None] >> np.arange(t)[None, :]) & 1
    means = ((1 - 2 * bits) * d[None, :]).mean(axis=1)
    return float(np.mean(np.abs(means) >= threshold))
  resamples = DEFAULT_RESAMPLES if resamples is None else int(resamples)
  rng = np.random.default_rng(seed)
  done, count = 0, 0
  while done < resamples:  # in chunks: R x T signs can be large for many tasks
    m = min(resamples - done, max(1, 2_000_000 // t))
    signs = rng.choice(np.array([-1.0, 1.0]), size=(m, t))
    count += int(np.sum(np.abs((signs * d[None, :]).mean(axis=1)) >= threshold))
    done += m
  return float((1 + count) / (1 + resamples))


def permutation_power(effect: float, sd: float, n_a: int, n_b: int | None = None, *, strata: int = 1,
                      alpha: float = 0.05, simulations: int = 2_000, splits: int = 2_000, seed: int = 0) -> float:
  """Probability that the permutation test gives p <= alpha when the methods truly differ by `effect`.

  The planning model for "how many seeds": each run's number is Normal(mu_a, sd) or Normal(mu_a - effect,
  sd), independently, with the same spread for both methods. Power is estimated by simulation: draw both
  samples `simulations` times and count how often the two-sided test on the difference of means rejects
  at `alpha`. The test is the one compare.py reports: exact over all splits when there are at most
  `splits`, otherwise over `splits` random splits (shared by all simulations; a fixed set of splits is
  itself a valid Monte Carlo test). Returns the rejecting fraction; its Monte Carlo standard error is at
  most 0.5 / sqrt(simulations) (0.011 at the default).

  strata = 1: `permutation_test` on n_a vs n_b runs; sd is the run-to-run standard deviation, warm starts
  and machines included if the protocol varies them.
  strata = S > 1: `stratified_permutation_test` on S warm starts with n_a vs n_b runs in each. Relabelling
  within strata keeps every stratum's counts, so the strata's own offsets cancel exactly and are not
  drawn: sd is then the standard deviation *within* a warm start.

  Only effect / sd matters (the test is scale-free), so it is the standardised effect d = effect / sd
  that a protocol has to be planned for. Normal draws ignore that pass@k is bounded; near 0 or 1 runs
  bunch up, which usually helps a rank-like test, so read the answer as a planning number.
  """
  n_b = n_a if n_b is None else n_b
  if strata < 1 or n_a < 1 or n_b < 1 or strata * min(n_a, n_b) < 2:
    raise ValueError(f"need at least 2 runs per method, got {strata} strata of {n_a} and {n_b}")
  if sd <= 0:
    raise ValueError(f"sd must be positive, got {sd}")
  rng = np.random.default_rng(seed)
  n = n_a + n_b
  exact = math.comb(n, n_a) ** strata <= splits
  # Per stratum, the subsets labelled a: all of them (combined across strata by broadcasting), or `splits`
  # random ones (combined row by row), with the observed split counted once as permutation_test does.
  idx = [_combinations(n, n_a) if exact else _random_subsets(rng, n, n_a, splits) for _ in range(strata)]
  mc = 0 if exact else 1
  a = rng.normal(effect, sd, size=(simulations, strata, n_a))
  b = rng.normal(0.0, sd, size=(simulations, strata, n_b))
  pooled = np.concatenate([a, b], axis=2)
  total = pooled.sum(axis=(1, 2))[:, None]
  observed = a.mean(axis=(1, 2)) - b.mean(axis=(1, 2))
  threshold = np.abs(observed) - _tolerance(observed)
  rejected = 0
  for start in range(0, simulations, 256):  # chunks keep sims x splits small
    sl = slice(start, start + 256)
    sums_a = np.zeros((pooled[sl].shape[0], 1))
    for s in range(strata):
      part = pooled[sl, s][:, idx[s]].sum(axis=2)
      sums_a = (sums_a[:, :, None] + part[:, None, :]).reshape(part.shape[0], -1) if exact else sums_a + part
    diffs = sums_a / (strata * n_a) - (total[sl] - sums_a) / (strata * n_b)
    extreme = np.sum(np.abs(diffs) >= threshold[sl, None], axis=1)
    p = (mc + extreme) / (mc + diffs.shape[1])
    rejected += int(np.sum(p <= alpha))
  return rejected / simulations
