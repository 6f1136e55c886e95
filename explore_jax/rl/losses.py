"""Token-level policy losses for LLM RL: clipped surrogate, KL to a reference, entropy, shaping.

All per-token inputs are [B, T] arrays over response tokens: B sequences (step records), T
positions, with a response mask selecting real tokens. Every piece is a pure function, checked with
chex at the boundary and safe under jit; `policy_loss` composes them from a frozen, hashable
`PolicyLossConfig` so a training step makes one call:

  loss, metrics = policy_loss(logp, old_logp, advantages, mask, config, ref_logp=ref_logp)

The importance ratio takes the current and the behaviour log-probabilities explicitly, so EMPO2's
off-policy update (current log-probs recomputed on the prompt without tips, behaviour log-probs
from the rollout with tips) is only a matter of which arrays are passed.
"""

from __future__ import annotations

import dataclasses

import chex
import jax
import jax.numpy as jnp

Array = jax.Array

AGGREGATION_MODES = (
    "token-mean",
    "seq-mean-token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-sum-norm",
    "seq-mean-token-sum-norm-verl",
)
KL_TYPES = ("k1", "k2", "k3", "abs")
LOW_PROB_LEVELS = ("token", "sequence")

# verl's bounds: the log-ratio is clamped before exp so off-policy gaps cannot overflow.
_LOG_RATIO_BOUND = 20.0
_K3_BOUND = 10.0


def broadcast_advantages(advantages: Array, shape: tuple[int, int]) -> Array:
  """Per-sequence advantages [B] repeated over the T response tokens; [B, T] passes through."""
  chex.assert_rank(advantages, {1, 2})
  if advantages.ndim == 1:
    chex.assert_shape(advantages, (shape[0],))
    return jnp.broadcast_to(advantages[:, None], shape)
  chex.assert_shape(advantages, shape)
  return advantages


def importance_ratio(logp: Array, old_logp: Array) -> Array:
  """Per-token importance ratio r = pi_theta(a) / pi_old(a) = exp(logp - old_logp).

  The log-ratio is clamped to +-20 (verl) so that a large behaviour/current gap cannot overflow.
  """
  chex.assert_equal_shape([logp, old_logp])
  log_ratio = jnp.clip(logp - old_logp, -_LOG_RATIO_BOUND, _LOG_RATIO_BOUND)
  return jnp.exp(log_ratio)


def clipped_surrogate_loss(
    logp: Array,
    old_logp: Array,
    advantages: Array,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    dual_clip: float | None = 3.0,
) -> tuple[Array, dict[str, Array]]:
  """Per-token PPO clipped surrogate loss with clip-higher and dual clip.

  L = -min(r A, clip(r, 1 - eps_low, 1 + eps_high) A)     (PPO, Schulman et al. 2017, eq. 7;
      separate eps_low / eps_high: DAPO, Yu et al. 2025, section 3.1 "Clip-Higher"),
  and for A < 0 the dual clip L = min(L, -c A)             (dual-clip PPO, Ye et al. 2020,
      "Mastering complex control in MOBA games with deep RL"; c = 3 as verl's clip_ratio_c).

  Args:
    logp: [B, T] current log pi_theta(a_t).
    old_logp: [B, T] behaviour log pi_old(a_t) (treated as constant).
    advantages: [B, T] per-token advantages (treated as constant).
    eps_low: lower clip range.
    eps_high: upper clip range (DAPO uses 0.28).
    dual_clip: c > 1, or None to disable.

  Returns:
    (loss [B, T], masks) where masks holds bool [B, T] arrays "clipped_low" (A < 0 and
    r < 1 - eps_low), "clipped_high" (A > 0 and r > 1 + eps_high) and "dual_clipped"
    (A < 0 and r > c): exactly the tokens whose gradient the clipping zeroes.
  """
  chex.assert_rank(logp, 2)
  chex.assert_equal_shape([logp, old_logp, advantages])
  if dual_clip is not None and dual_clip <= 1.0:
    raise ValueError(f"dual_clip must exceed 1, got {dual_clip}")
  old_logp = jax.lax.stop_gradient(old_logp)
  advantages = jax.lax.stop_gradient(advantages)
  ratio = importance_ratio(logp, old_logp)
  unclipped = -advantages * ratio
  clipped = -advantages * jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high)
  loss = jnp.maximum(unclipped, clipped)
  negative = advantages < 0
  masks = {
      "clipped_low": negative & (ratio < 1.0 - eps_low),
      "clipped_high": (advantages > 0) & (ratio > 1.0 + eps_high),
  }
  if dual_clip is not None:
    loss = jnp.where(negative, jnp.minimum(loss, -advantages * dual_clip), loss)
    masks["dual_clipped"] = negative & (ratio > dual_clip)
  else:
    masks["dual_clipped"] = jnp.zeros_like(negative)
  return loss, masks


def loss_totals(mask: Array) -> dict[str, Array]:
  """The denominators `aggregate_loss` takes from a [B, T] response mask: its tokens and its sequences (rows
  with at least one token). Taken over a whole minibatch and passed to each of its micro-batches, they make
  every aggregation a sum over the micro-batches (sft.make_train_step's gradient accumulation)."""
  m = mask.astype(jnp.float32)
  return {"tokens": jnp.sum(m), "sequences": jnp.sum(jnp.sum(m, axis=-1) > 0).astype(jnp.float32)}


def aggregate_loss(
    values: Array, mask: Array, mode: str = "token-mean", max_len: int | None = None,
    totals: dict[str, Array] | None = None,
) -> Array:
  """Reduces a per-token [B, T] loss to a scalar.

    token-mean:              sum_{i,t} m L / sum_{i,t} m                         (DAPO, sec. 3.3)
    seq-mean-token-mean:     1/B' sum_i (sum_t m L / sum_t m)                   (GRPO, Shao et al.
                                                                                  2024, eq. 3)
    seq-mean-token-sum:      1/B' sum_i sum_t m L
    seq-mean-token-sum-norm: 1/B' sum_i sum_t m L / max_len                      (Dr.GRPO, Liu et
                                                                                  al. 2025)
    seq-mean-token-sum-norm-verl: sum_i sum_t m L / max_len                      (verl's agg_loss)
  B' counts the sequences with at least one response token: rows that are all padding are not
  sequences, and empty responses or an empty batch give 0 rather than NaN.

  Dr.GRPO's objective (Liu et al. 2025, "Understanding R1-Zero-Like Training", its Dr. GRPO
  objective) is (1/G) sum_i sum_t (...) / MAX_TOKENS: the token sums are divided by the constant
  MAX_TOKENS *and* averaged over the group's G responses. "seq-mean-token-sum-norm" is that
  objective whenever every row is non-empty (a batch of one group: B' = B = G; of several equal
  groups: the mean of the groups' objectives). verl's "seq-mean-token-sum-norm" (verl/trainer/
  ppo/core_algos.py, agg_loss: sum(seq_losses) / loss_scale_factor, which defaults to the mask's
  length) omits the 1/G: its loss and gradient are B' times ours. "seq-mean-token-sum-norm-verl"
  reproduces it, e.g. to reuse a verl run's learning rate. Empty rows add 0 to the sum in both.

  Args:
    values: [B, T] per-token values.
    mask: [B, T] response mask (bool or 0/1).
    mode: one of AGGREGATION_MODES.
    max_len: Dr.GRPO's constant MAX_TOKENS (both "-norm" modes); defaults to T.
    totals: the denominators (`loss_totals`) of a larger batch this one is part of; default: this mask's.

  Returns:
    Scalar.
  """
  chex.assert_rank(values, 2)
  chex.assert_equal_shape([values, mask])
  if mode not in AGGREGATION_MODES:
    raise ValueError(f"unknown aggregation {mode!r}; expected one of {AGGREGATION_MODES}")
  m = mask.astype(values.dtype)
  # where, not multiply: padded positions may hold inf/NaN log-probs.
  masked = jnp.where(m > 0, values, 0.0)
  if mode == "token-mean":
    tokens = jnp.sum(m) if totals is None else totals["tokens"].astype(values.dtype)
    return jnp.sum(masked) / jnp.maximum(tokens, 1.0)
  lengths = jnp.sum(m, axis=-1)
  sums = jnp.sum(masked, axis=-1)
  sequences = jnp.sum(lengths > 0) if totals is None else totals["sequences"]
  num_sequences = jnp.maximum(sequences, 1).astype(values.dtype)
  if mode == "seq-mean-token-mean":
    per_sequence = sums / jnp.maximum(lengths, 1.0)
  elif mode == "seq-mean-token-sum":
    per_sequence = sums
  else:
    per_sequence = sums / float(values.shape[-1] if max_len is None else max_len)
    if mode == "seq-mean-token-sum-norm-verl":
      return jnp.sum(per_sequence)  # verl: no division by the number of sequences
  return jnp.sum(per_sequence) / num_sequences


def kl_penalty(logp: Array, ref_logp: Array, kind: str = "k3") -> Array:
  """Per-token estimate of KL(pi_theta || pi_ref) from sampled-token log-probabilities.

    k1 = logp - ref_logp
    k2 = 0.5 (logp - ref_logp)^2
    k3 = exp(ref_logp - logp) - (ref_logp - logp) - 1   (low-variance, always >= 0)
    abs = |logp - ref_logp|
  (Schulman 2020, "Approximating KL divergence"; k3 is GRPO's KL term, Shao et al. 2024, eq. 4).
  As verl's low_var_kl, k3 clamps the log-ratio to +-20 and the result to +-10. "abs" is verl's
  kl_penalty "abs" (verl/trainer/ppo/core_algos.py): not an unbiased KL estimate, but a
  non-negative penalty whose gradient has the same size wherever the policies differ; like
  verl, it is not clamped.

  Args:
    logp: [B, T] current log-probs.
    ref_logp: [B, T] reference-policy log-probs (treated as constant).
    kind: "k1", "k2", "k3" or "abs".

  Returns:
    [B, T] per-token KL estimates.
  """
  chex.assert_equal_shape([logp, ref_logp])
  if kind not in KL_TYPES:
    raise ValueError(f"unknown KL type {kind!r}; expected one of {KL_TYPES}")
  ref_logp = jax.lax.stop_gradient(ref_logp)
  if kind == "k1":
    return logp - ref_logp
  if kind == "k2":
    return 0.5 * jnp.square(logp - ref_logp)
  if kind == "abs":
    return jnp.abs(logp - ref_logp)
  log_ratio = jnp.clip(ref_logp - logp, -_LOG_RATIO_BOUND, _LOG_RATIO_BOUND)
  return jnp.clip(jnp.exp(log_ratio) - log_ratio - 1.0, -_K3_BOUND, _K3_BOUND)


def entropy_advantage(
    advantages: Array, entropy: Array, *, alpha: float = 0.4, kappa: float = 2.0
) -> Array:
  """Entropy-based advantage shaping: A' = A + min(alpha * H_t, |A| / kappa), H detached.

  (Cheng et al. 2025, "Reasoning with Exploration: An Entropy Perspective"; the EntropyAdv
  baseline as written in SGE's appendix A.4.) The cap |A| / kappa keeps the bonus from reversing
  or dominating A.

  Args:
    advantages: [B, T] advantages.
    entropy: [B, T] per-token policy entropy H_t (gradient stopped).
    alpha: entropy scale.
    kappa: cap divisor.

  Returns:
    [B, T] shaped advantages.
  """
  chex.assert_equal_shape([advantages, entropy])
  bonus = jnp.minimum(alpha * jax.lax.stop_gradient(entropy), jnp.abs(advantages) / kappa)
  return advantages + bonus


def low_probability_mask(
    logp: Array,
    old_logp: Array,
    mask: Array,
    *,
    level: str = "token",
    log_threshold: float = -5.0,
) -> Array:
  """Which tokens keep their surrogate term under EMPO2's low-probability masking.

  token:    keep 1[pi_theta(a_t) >= delta], delta = exp(log_threshold)   (EMPO2, eq. 2)
  sequence: keep a whole response only if min_t log pi_old(a_t) >= log_threshold  (the released
            code's variant, threshold -5)

  Args:
    logp: [B, T] current log-probs (compared without gradient).
    old_logp: [B, T] behaviour log-probs.
    mask: [B, T] response mask.
    level: "token" or "sequence".
    log_threshold: log delta.

  Returns:
    bool [B, T]: mask AND kept.
  """
  chex.assert_rank(logp, 2)
  chex.assert_equal_shape([logp, old_logp, mask])
  if level not in LOW_PROB_LEVELS:
    raise ValueError(f"unknown low-probability level {level!r}; expected {LOW_PROB_LEVELS}")
  mask = mask.astype(bool)
  if level == "token":
    return mask & (jax.lax.stop_gradient(logp) >= log_threshold)
  lowest = jnp.min(jnp.where(mask, old_logp, jnp.inf), axis=-1, keepdims=True)
  return mask & (lowest >= log_threshold)


@dataclasses.dataclass(frozen=True)
class PolicyLossConfig:
  """Options of `policy_loss` (frozen and hashable, so it can be a static jit argument).

  Attributes:
    eps_low: PPO lower clip epsilon.
    eps_high: upper clip epsilon (clip-higher when > eps_low; DAPO 0.28).
    dual_clip: dual-clip constant c for A < 0 (verl 3.0); None disables.
    aggregation: one of AGGREGATION_MODES.
    max_len: Dr.GRPO's normaliser for the "seq-mean-token-sum-norm*" modes (None = T).
    kl_type: one of KL_TYPES, "k1", "k2", "k3" or "abs" (beta D_KL term).
    kl_coef: beta; 0 drops the KL term.
    entropy_coef: entropy bonus coefficient (the loss subtracts coef * aggregated entropy).
    entropy_advantage: apply EntropyAdv shaping to the advantages (needs entropy).
    entropy_adv_alpha: EntropyAdv alpha.
    entropy_adv_kappa: EntropyAdv kappa.
    low_prob_mask: None, "token" (EMPO2 eq. 2) or "sequence" (EMPO2 released code).
    low_prob_log_threshold: log delta for the low-probability mask.
  """

  eps_low: float = 0.2
  eps_high: float = 0.2
  dual_clip: float | None = 3.0
  aggregation: str = "token-mean"
  max_len: int | None = None
  kl_type: str = "k3"
  kl_coef: float = 0.0
  entropy_coef: float = 0.0
  entropy_advantage: bool = False
  entropy_adv_alpha: float = 0.4
  entropy_adv_kappa: float = 2.0
  low_prob_mask: str | None = None
  low_prob_log_threshold: float = -5.0


def policy_loss(
    logp: Array,
    old_logp: Array,
    advantages: Array,
    mask: Array,
    config: PolicyLossConfig = PolicyLossConfig(),
    *,
    ref_logp: Array | None = None,
    entropy: Array | None = None,
    totals: dict[str, Array] | None = None,
) -> tuple[Array, dict[str, Array]]:
  """The full token-level policy objective of one update, with its diagnostics.

  loss = agg(1_keep * L_clip) + beta * agg(KL(pi_theta || pi_ref)) - c_H * agg(H)
  (GRPO, Shao et al. 2024, eq. 3, with DAPO's clip-higher and token-mean, Dr.GRPO's
  normalisation, EMPO2's eq. 2 indicator 1_keep, and optional EntropyAdv shaping of A).
  The low-probability indicator multiplies the surrogate only; the aggregation denominators
  still count every response token (the 1/(NT) of EMPO2's eq. 2).

  Args:
    logp: [B, T] current log-probs (differentiated).
    old_logp: [B, T] behaviour log-probs.
    advantages: [B] per sequence or [B, T] per token.
    mask: [B, T] response mask.
    config: loss options.
    ref_logp: [B, T] reference log-probs, required when config.kl_coef > 0.
    entropy: [B, T] per-token entropies, required for entropy_coef > 0 or entropy_advantage.
    totals: the denominators of the minibatch these rows are a micro-batch of (`loss_totals`): the loss
      and every metric are then this micro-batch's share, and the shares add up to the minibatch's.

  Returns:
    (scalar loss, metrics) with metrics "pg_loss", "clipfrac_low", "clipfrac_high",
    "clipfrac_dual" (fractions of response tokens), "approx_kl" (token-mean k3 estimate of
    KL(pi_old || pi_theta)), "ratio_mean", and when used "kl_loss", "entropy",
    "low_prob_masked_frac". Metrics carry no gradient.
  """
  chex.assert_rank([logp, old_logp, mask], 2)
  chex.assert_equal_shape([logp, old_logp, mask])
  advantages = broadcast_advantages(advantages, logp.shape)
  needs_entropy = config.entropy_coef != 0.0 or config.entropy_advantage
  if needs_entropy and entropy is None:
    raise ValueError("entropy is required by entropy_coef / entropy_advantage")
  if config.kl_coef != 0.0 and ref_logp is None:
    raise ValueError("ref_logp is required when kl_coef != 0")
  mask = mask.astype(bool)
  agg = lambda values: aggregate_loss(values, mask, config.aggregation, config.max_len, totals)
  token_mean = lambda values: aggregate_loss(values, mask, "token-mean", totals=totals)

  if config.entropy_advantage:
    advantages = entropy_advantage(advantages, entropy, alpha=config.entropy_adv_alpha,
                                   kappa=config.entropy_adv_kappa)
  per_token, clip_masks = clipped_surrogate_loss(
      logp, old_logp, advantages, eps_low=config.eps_low, eps_high=config.eps_high,
      dual_clip=config.dual_clip)
  keep = mask
  if config.low_prob_mask is not None:
    keep = low_probability_mask(logp, old_logp, mask, level=config.low_prob_mask,
                                log_threshold=config.low_prob_log_threshold)
  pg_loss = agg(jnp.where(keep, per_token, 0.0))
  loss = pg_loss

  sg = jax.lax.stop_gradient
  log_ratio = sg(jnp.clip(logp - old_logp, -_LOG_RATIO_BOUND, _LOG_RATIO_BOUND))
  metrics = {
      "pg_loss": sg(pg_loss),
      "clipfrac_low": token_mean(clip_masks["clipped_low"].astype(logp.dtype)),
      "clipfrac_high": token_mean(clip_masks["clipped_high"].astype(logp.dtype)),
      "clipfrac_dual": token_mean(clip_masks["dual_clipped"].astype(logp.dtype)),
      "approx_kl": token_mean(jnp.exp(log_ratio) - 1.0 - log_ratio),
      "ratio_mean": token_mean(jnp.exp(log_ratio)),
  }
  if config.low_prob_mask is not None:
    metrics["low_prob_masked_frac"] = token_mean((mask & ~keep).astype(logp.dtype))
  if config.kl_coef != 0.0:
    kl = agg(kl_penalty(logp, ref_logp, config.kl_type))
    loss = loss + config.kl_coef * kl
    metrics["kl_loss"] = sg(kl)
  if entropy is not None:
    if config.entropy_coef != 0.0:
      loss = loss - config.entropy_coef * agg(entropy)
    metrics["entropy"] = sg(token_mean(entropy))
  return loss, metrics
