"""Policy losses: hand-computed values for every mode, gradients through clipping, no NaNs."""

import functools

import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from explore_jax.rl import losses

OLD = np.log(0.5)


def _logp_for_ratios(ratios):
  """Current log-probs giving the requested ratios against a behaviour log-prob of log 0.5."""
  return jnp.asarray(np.log(np.asarray(ratios, dtype=np.float64)) + OLD, dtype=jnp.float32)


# Columns: ratio, advantage, expected loss with eps_low 0.2, eps_high 0.28, dual clip 3.
#   r 1.5, A  1: max(-1.5, -1.28) = -1.28   (clipped high)
#   r 0.5, A  1: max(-0.5, -0.8)  = -0.5    (unclipped: the min picks r A)
#   r 0.5, A -1: max(0.5, 0.8)    = 0.8     (clipped low)
#   r 1.5, A -1: max(1.5, 1.28)   = 1.5, min(1.5, 3) = 1.5
#   r 5.0, A -1: max(5, 1.28)     = 5,   min(5, 3)   = 3   (dual clipped)
#   r 1.1, A  2: max(-2.2, -2.2)  = -2.2
#   r 2.0, A  0: 0
CASES = np.array([
    [1.5, 1.0, -1.28],
    [0.5, 1.0, -0.5],
    [0.5, -1.0, 0.8],
    [1.5, -1.0, 1.5],
    [5.0, -1.0, 3.0],
    [1.1, 2.0, -2.2],
    [2.0, 0.0, 0.0],
])


def _surrogate_inputs():
  logp = _logp_for_ratios(CASES[:, 0])[None]
  old = jnp.full_like(logp, OLD)
  adv = jnp.asarray(CASES[:, 1], dtype=jnp.float32)[None]
  return logp, old, adv


@pytest.mark.parametrize("jit", [False, True])
def test_clipped_surrogate_hand_computed(jit):
  fn = functools.partial(losses.clipped_surrogate_loss, eps_low=0.2, eps_high=0.28, dual_clip=3.0)
  if jit:
    fn = jax.jit(fn)
  loss, masks = fn(*_surrogate_inputs())
  np.testing.assert_allclose(loss[0], CASES[:, 2], rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(masks["clipped_high"][0], [1, 0, 0, 0, 0, 0, 0])
  np.testing.assert_array_equal(masks["clipped_low"][0], [0, 0, 1, 0, 0, 0, 0])
  np.testing.assert_array_equal(masks["dual_clipped"][0], [0, 0, 0, 0, 1, 0, 0])


def test_without_dual_clip_negative_advantages_are_unbounded():
  loss, masks = losses.clipped_surrogate_loss(*_surrogate_inputs(), eps_low=0.2, eps_high=0.28,
                                              dual_clip=None)
  assert np.isclose(loss[0, 4], 5.0) and not np.any(masks["dual_clipped"])


def test_dual_clip_must_exceed_one():
  with pytest.raises(ValueError):
    losses.clipped_surrogate_loss(*_surrogate_inputs(), dual_clip=1.0)


def test_importance_ratio_uses_the_given_behaviour_logprobs_and_clamps():
  # EMPO2 off-policy: current without tips vs behaviour with tips are just different inputs.
  ratio = losses.importance_ratio(jnp.log(jnp.array([0.2, 1.0])), jnp.log(jnp.array([0.4, 1e-30])))
  np.testing.assert_allclose(ratio, [0.5, np.exp(20.0)], rtol=1e-5)


def test_gradient_is_zero_where_clipped_and_the_policy_gradient_elsewhere():
  logp, old, adv = _surrogate_inputs()
  cfg = losses.PolicyLossConfig(eps_low=0.2, eps_high=0.28, dual_clip=3.0)
  mask = jnp.ones_like(logp)
  grad = jax.grad(lambda lp: losses.policy_loss(lp, old, adv, mask, cfg)[0])(logp)
  # d/dlogp of -r A / n is -A r / n on unclipped tokens (token-mean over n = 7).
  ratio, a = CASES[:, 0], CASES[:, 1]
  clipped = np.array([1, 0, 1, 0, 1, 0, 0], dtype=bool)
  expected = np.where(clipped, 0.0, -a * ratio / 7.0)
  np.testing.assert_allclose(grad[0], expected, rtol=1e-5, atol=1e-7)


@hypothesis.settings(max_examples=15, deadline=None, derandomize=True)
@hypothesis.given(seed=st.integers(0, 2**32 - 1))
def test_gradient_vanishes_exactly_on_clip_masks(seed):
  rng = np.random.default_rng(seed)
  logp = jnp.asarray(rng.normal(-1.0, 0.6, (3, 8)), dtype=jnp.float32)
  old = jnp.asarray(rng.normal(-1.0, 0.6, (3, 8)), dtype=jnp.float32)
  adv = jnp.asarray(rng.normal(0.0, 1.0, (3, 8)), dtype=jnp.float32)
  mask = jnp.ones((3, 8))
  grad, masks = _grad_and_masks(logp, old, adv, mask)
  clipped = np.asarray(masks["clipped_low"] | masks["clipped_high"] | masks["dual_clipped"])
  ratio = np.exp(np.asarray(logp) - np.asarray(old))
  expected = np.where(clipped, 0.0, -np.asarray(adv) * ratio / 24.0)
  np.testing.assert_allclose(grad, expected, rtol=1e-4, atol=1e-7)


@jax.jit
def _grad_and_masks(logp, old, adv, mask):
  cfg = losses.PolicyLossConfig(eps_low=0.2, eps_high=0.28, dual_clip=3.0)
  grad = jax.grad(lambda lp: losses.policy_loss(lp, old, adv, mask, cfg)[0])(logp)
  _, masks = losses.clipped_surrogate_loss(logp, old, adv, eps_low=0.2, eps_high=0.28,
                                           dual_clip=3.0)
  return grad, masks


# ----------------------------------------------------------------------------- aggregation

VALUES = jnp.array([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 0.0, 0.0], [9.0, 9.0, 9.0, 9.0]])
MASK = jnp.array([[1, 1, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0]])


@pytest.mark.parametrize("mode,max_len,expected", [
    ("token-mean", None, 17.0 / 5.0),                           # (1+2+3+5+6) / 5
    ("seq-mean-token-mean", None, (6.0 / 3.0 + 11.0 / 2.0) / 2),  # empty row 3 is no sequence
    ("seq-mean-token-sum", None, (6.0 + 11.0) / 2),
    ("seq-mean-token-sum-norm", 10, (6.0 / 10 + 11.0 / 10) / 2),  # Dr.GRPO constant 10
    ("seq-mean-token-sum-norm", None, (6.0 / 4 + 11.0 / 4) / 2),  # default constant T = 4
    # verl: all rows' token sums over L, no division by the number of rows.
    ("seq-mean-token-sum-norm-verl", 10, (6.0 + 11.0) / 10),
    ("seq-mean-token-sum-norm-verl", None, (6.0 + 11.0) / 4),
])
def test_aggregation_modes_hand_computed(mode, max_len, expected):
  np.testing.assert_allclose(losses.aggregate_loss(VALUES, MASK, mode, max_len), expected,
                             rtol=1e-6)


@pytest.mark.parametrize("mode", losses.AGGREGATION_MODES)
def test_empty_masks_and_nan_padding_give_finite_zero_loss_and_gradients(mode):
  logp = jnp.array([[-1.0, jnp.nan], [-jnp.inf, -2.0]])
  old = jnp.array([[-1.2, 0.0], [0.0, -2.0]])
  adv = jnp.array([1.0, -1.0])
  empty = jnp.zeros((2, 2), dtype=bool)
  cfg = losses.PolicyLossConfig(aggregation=mode, kl_coef=0.1, entropy_coef=0.01)
  fn = lambda lp: losses.policy_loss(lp, old, adv, empty, cfg, ref_logp=old,
                                     entropy=jnp.ones((2, 2)))
  (loss, metrics), grad = jax.value_and_grad(fn, has_aux=True)(jnp.zeros((2, 2)))
  assert loss == 0.0 and np.all(np.asarray(grad) == 0.0)
  assert all(np.isfinite(v) for v in metrics.values())
  # A zero-length response next to a real one: only the real one counts, NaN padding ignored.
  partial = jnp.array([[True, False], [False, False]])
  loss, _ = losses.policy_loss(logp, old, adv, partial, cfg, ref_logp=old,
                               entropy=jnp.ones((2, 2)))
  assert np.isfinite(loss)


def test_dr_grpo_norm_divides_by_the_group_size_and_verls_does_not():
  # [3, 4] with one empty row; row sums 6, 11, 0 (the 9s are padding), L = 4.
  ours = losses.aggregate_loss(VALUES, MASK, "seq-mean-token-sum-norm")
  verl = losses.aggregate_loss(VALUES, MASK, "seq-mean-token-sum-norm-verl")
  np.testing.assert_allclose(ours, 17.0 / 4 / 2, rtol=1e-6)  # 1/B' with B' = 2 non-empty rows
  np.testing.assert_allclose(verl, 17.0 / 4, rtol=1e-6)
  # With every row non-empty, ours is Dr.GRPO's (1/G) sum_i sum_t L / MAX_TOKENS with G = 3.
  full = jnp.ones((3, 4))
  total = 10.0 + 11.0 + 36.0
  np.testing.assert_allclose(losses.aggregate_loss(VALUES, full, "seq-mean-token-sum-norm", 8),
                             total / 8 / 3, rtol=1e-6)
  np.testing.assert_allclose(
      losses.aggregate_loss(VALUES, full, "seq-mean-token-sum-norm-verl", 8), total / 8, rtol=1e-6)


def test_policy_loss_uses_verls_norm_through_the_config():
  # Ratio 1 everywhere, A = (1, 2): per-token surrogate -A; row sums -2 and -2 (one token of row
  # 2 masked), L = 2. verl: (-2 - 2) / 2 = -2; ours: -2 / 2 = -1.
  logp = jnp.zeros((2, 2))
  mask = jnp.array([[1, 1], [1, 0]])
  adv = jnp.array([1.0, 2.0])
  for mode, expected in [("seq-mean-token-sum-norm-verl", -2.0), ("seq-mean-token-sum-norm", -1.0)]:
    loss, _ = losses.policy_loss(logp, logp, adv, mask, losses.PolicyLossConfig(aggregation=mode))
    np.testing.assert_allclose(loss, expected, rtol=1e-6)


@pytest.mark.parametrize("mode", losses.AGGREGATION_MODES)
def test_each_aggregation_is_the_sum_of_its_row_blocks_shares(mode):
  """With the whole batch's totals (losses.loss_totals), the aggregates of any split of the rows add up to the
  whole batch's (what micro-batched updates rely on), rows that are empty or all padding included."""
  rng = np.random.default_rng(0)
  values = jnp.asarray(rng.normal(size=(6, 5)), jnp.float32)
  mask = jnp.asarray(rng.random((6, 5)) < 0.6).at[2].set(False)
  totals = losses.loss_totals(mask)
  assert float(totals["tokens"]) == float(mask.sum()) and float(totals["sequences"]) == 5.0
  whole = losses.aggregate_loss(values, mask, mode, 7)
  for blocks in ([slice(0, 3), slice(3, 6)], [slice(0, 1), slice(1, 4), slice(4, 6)]):
    shares = [losses.aggregate_loss(values[b], mask[b], mode, 7, totals) for b in blocks]
    np.testing.assert_allclose(sum(shares), whole, rtol=1e-6)
  if mode != "seq-mean-token-sum-norm-verl":  # the one aggregation with no denominator from the batch
    assert not np.isclose(sum(losses.aggregate_loss(values[b], mask[b], mode, 7) for b in blocks), whole)


def test_unknown_aggregation_is_rejected():
  with pytest.raises(ValueError):
    losses.aggregate_loss(VALUES, MASK, "sum")


# ----------------------------------------------------------------------------- KL, entropy


def test_kl_estimators_hand_computed():
  logp, ref = jnp.log(jnp.array([[0.5]])), jnp.log(jnp.array([[0.25]]))
  ln2 = np.log(2.0)
  np.testing.assert_allclose(losses.kl_penalty(logp, ref, "k1"), [[ln2]], rtol=1e-6)
  np.testing.assert_allclose(losses.kl_penalty(logp, ref, "k2"), [[0.5 * ln2**2]], rtol=1e-6)
  # k3 = exp(ref - logp) - (ref - logp) - 1 = 0.5 + ln 2 - 1.
  np.testing.assert_allclose(losses.kl_penalty(logp, ref, "k3"), [[0.5 + ln2 - 1.0]], rtol=1e-5)


def test_abs_kl_is_verls_absolute_log_ratio():
  logp = jnp.array([[-1.0, -3.0, -2.0, -40.0]])
  ref = jnp.array([[-1.5, -1.0, -2.0, 0.0]])
  # |logp - ref| = 0.5, 2, 0, 40 (not clamped, as verl's "abs").
  np.testing.assert_allclose(losses.kl_penalty(logp, ref, "abs"), [[0.5, 2.0, 0.0, 40.0]])
  grad = jax.grad(lambda lp: losses.kl_penalty(lp, ref, "abs").sum())(logp)
  np.testing.assert_allclose(grad[0, :2], [1.0, -1.0])  # sign(logp - ref)
  with pytest.raises(ValueError):
    losses.kl_penalty(logp, ref, "mse")


def test_k3_clamps_like_verl():
  logp = jnp.array([[0.0, -30.0, -1.0]])
  ref = jnp.array([[-30.0, 0.0, -1.0]])
  # Log-ratio -30 -> clamped to -20: exp(-20) + 20 - 1 = 19 -> clamped to 10. Ratio e^20 -> 10.
  np.testing.assert_allclose(losses.kl_penalty(logp, ref, "k3"), [[10.0, 10.0, 0.0]])


def test_kl_gradient_flows_only_through_current_logprobs():
  ref = jnp.array([[-1.0]])
  g_logp, g_ref = jax.grad(lambda lp, r: losses.kl_penalty(lp, r, "k2").sum(), (0, 1))(
      jnp.array([[-0.5]]), ref)
  np.testing.assert_allclose(g_logp, [[0.5]])  # d/dlogp 0.5 (logp - ref)^2 = logp - ref
  np.testing.assert_array_equal(g_ref, [[0.0]])


def test_entropy_advantage_hand_computed_and_detached():
  a = jnp.array([[1.0, -1.0, 0.1, 0.0]])
  h = jnp.array([[0.5, 2.0, 1.0, 3.0]])
  # min(0.4 H, |A| / 2): 0.2, 0.5, 0.05, 0.
  np.testing.assert_allclose(losses.entropy_advantage(a, h), [[1.2, -0.5, 0.15, 0.0]], rtol=1e-6)
  grad = jax.grad(lambda e: losses.entropy_advantage(a, e).sum())(h)
  np.testing.assert_array_equal(grad, np.zeros((1, 4)))


# ----------------------------------------------------------------------------- low-prob mask


def test_low_probability_mask_token_and_sequence_levels():
  logp = jnp.array([[-1.0, -6.0, -4.9, -5.0], [-1.0, -1.0, -1.0, -1.0]])
  old = jnp.array([[-1.0, -1.0, -1.0, -1.0], [-1.0, -5.5, -1.0, -9.0]])
  mask = jnp.array([[1, 1, 1, 1], [1, 1, 1, 0]])
  token = losses.low_probability_mask(logp, old, mask, level="token", log_threshold=-5.0)
  np.testing.assert_array_equal(token, [[1, 0, 1, 1], [1, 1, 1, 0]])
  # Row 2's minimum old log-prob over response tokens is -5.5 (the -9 is padding).
  seq = losses.low_probability_mask(logp, old, mask, level="sequence", log_threshold=-5.0)
  np.testing.assert_array_equal(seq, [[1, 1, 1, 1], [0, 0, 0, 0]])


def test_policy_loss_low_prob_mask_drops_terms_but_keeps_denominator():
  # Two tokens, ratio 1, A = 1: surrogate -1 each. Token 2 has pi_theta = e^-6 < e^-5.
  logp = jnp.array([[-1.0, -6.0]])
  cfg = losses.PolicyLossConfig(low_prob_mask="token")
  loss, metrics = losses.policy_loss(logp, logp, jnp.array([1.0]), jnp.ones((1, 2)), cfg)
  np.testing.assert_allclose(loss, -1.0 / 2.0)  # EMPO2 eq. 2: indicator inside, 1/(NT) outside
  np.testing.assert_allclose(metrics["low_prob_masked_frac"], 0.5)


# ----------------------------------------------------------------------------- composition


@pytest.mark.parametrize("jit", [False, True])
def test_policy_loss_composes_terms_and_metrics(jit):
  logp = _logp_for_ratios([[1.5, 0.5], [0.5, 1.0]])
  old = jnp.full((2, 2), OLD)
  ref = jnp.full((2, 2), np.log(0.25))
  entropy = jnp.array([[1.0, 2.0], [3.0, 4.0]])
  mask = jnp.array([[1, 1], [1, 0]])
  cfg = losses.PolicyLossConfig(eps_low=0.2, eps_high=0.28, aggregation="seq-mean-token-mean",
                                kl_type="k1", kl_coef=0.1, entropy_coef=0.01)
  fn = functools.partial(losses.policy_loss, config=cfg)
  if jit:
    fn = jax.jit(fn)
  loss, metrics = fn(logp, old, jnp.array([1.0, -1.0]), mask, ref_logp=ref, entropy=entropy)
  # Row 1 (A = 1): r 1.5 -> -1.28, r 0.5 -> -0.5, mean -0.89. Row 2 (A = -1): r 0.5 -> 0.8.
  pg = (-0.89 + 0.8) / 2
  # k1 per token = logp - ref = log(2 r): row 1 mean of log 3 and log 1, row 2 log 1.
  kl = (np.log(3.0) / 2 + 0.0) / 2
  ent = (1.5 + 3.0) / 2
  np.testing.assert_allclose(loss, pg + 0.1 * kl - 0.01 * ent, rtol=1e-5)
  np.testing.assert_allclose(metrics["pg_loss"], pg, rtol=1e-5)
  np.testing.assert_allclose(metrics["kl_loss"], kl, rtol=1e-5)
  np.testing.assert_allclose(metrics["entropy"], (1 + 2 + 3) / 3, rtol=1e-6)
  np.testing.assert_allclose(metrics["clipfrac_high"], 1 / 3, rtol=1e-6)
  np.testing.assert_allclose(metrics["clipfrac_low"], 1 / 3, rtol=1e-6)
  np.testing.assert_allclose(metrics["clipfrac_dual"], 0.0)
  # k3 of (old || current) per token: r - 1 - log r for r = 1.5, 0.5, 0.5.
  k3 = [r - 1 - np.log(r) for r in (1.5, 0.5, 0.5)]
  np.testing.assert_allclose(metrics["approx_kl"], np.mean(k3), rtol=1e-5)
  np.testing.assert_allclose(metrics["ratio_mean"], (1.5 + 0.5 + 0.5) / 3, rtol=1e-5)


def test_policy_loss_entropy_advantage_shapes_the_surrogate():
  # Ratio 1, A = 1, H = 0.5: A' = 1 + min(0.2, 0.5) = 1.2, loss -1.2.
  logp = jnp.array([[-1.0]])
  cfg = losses.PolicyLossConfig(entropy_advantage=True)
  loss, _ = losses.policy_loss(logp, logp, jnp.array([1.0]), jnp.ones((1, 1)), cfg,
                               entropy=jnp.array([[0.5]]))
  np.testing.assert_allclose(loss, -1.2, rtol=1e-6)


def test_policy_loss_requires_the_inputs_its_config_uses():
  x = jnp.zeros((1, 2))
  with pytest.raises(ValueError, match="ref_logp"):
    losses.policy_loss(x, x, jnp.ones(1), x, losses.PolicyLossConfig(kl_coef=0.1))
  with pytest.raises(ValueError, match="entropy"):
    losses.policy_loss(x, x, jnp.ones(1), x, losses.PolicyLossConfig(entropy_coef=0.1))


def test_per_token_and_per_sequence_advantages_agree():
  logp = _logp_for_ratios([[1.5, 0.9], [0.7, 1.0]])
  old = jnp.full((2, 2), OLD)
  mask = jnp.ones((2, 2))
  per_seq, _ = losses.policy_loss(logp, old, jnp.array([1.0, -2.0]), mask)
  per_tok, _ = losses.policy_loss(logp, old, jnp.array([[1.0, 1.0], [-2.0, -2.0]]), mask)
  np.testing.assert_allclose(per_seq, per_tok)
