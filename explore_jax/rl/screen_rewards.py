"""ScreenExplorer's exploration rewards and diversity measures, as pure functions over arrays.

A screen state s is a pair (o, e): an image latent o (envs/screen_reading.py) and the text embedding e of the
screen's OCR text, "Screen OCR: " + the boxes' texts joined by spaces (`screen_text`), as the released code embeds
it. For the step t of a trajectory, before (o_t, e_t) and after (o'_t, e'_t) its action a_t, with the world
model's prediction (ô_t, ê_t), the intent embedding i_t of the reply and e_box the embedding of the text under a
click, the terms are (ScreenExplorer, section 3.2; METHODS.md):

  instant_change(x_t, x'_t)              r_inst   = 1 - sim(x_t, x'_t)
  sequence_change(x_0, x', mask, form)   r_seq    paper: E_{i<t, j>t}[1 - sim(x'_i, x'_j)]
                                                  code:  1 - mean(S[0:t+1, t+1:]) over S = sim of [x_0, x'_0 .. x'_{T-1}]
  world_model_surprise(x'_t, x̂_t)        r_world  = 1 - sim(x'_t, x̂_t)
  intent_alignment(i_t, e_t, e'_t)       r_des    = sim(i_t, e_t) + sim(i_t, e'_t)
  intent_box(i_t, e_box, hit)            r_inter  = sim(i_t, e_box) where a click hit OCR boxes, else 0
  total(terms, format_ok, gate)          r        = r_format * sum(terms)   (eq. 1 and the code; gate=True)
                                                    r_format + sum(terms)   (gate=False: format as one term)

each applied to the visual (x = o) and the textual (x = e) representation where it names x. sim is the cosine
of torch's `cosine_similarity`: x.y / (max(|x|, eps) max(|y|, eps)) with eps = 1e-8, each norm clamped on its
own, so a zero vector has similarity 0 with everything (an empty intent, a term switched off upstream).

Shapes: per-step terms take [..., D] rows and give [...]. `sequence_change` takes one trajectory per row:
x_0 [B, D] (the state before the trajectory's first counted step), after [B, T, D] and mask [B, T] (the steps
that count); it gives [B, T], 0 where the mask is off.

  * form="paper": over the counted steps i < t < j (strictly), the mean of 1 - sim(x'_i, x'_j); 0 when no
    such pair exists (the first and the last counted step).
  * form="code": the released code's sequence [x_0, x'_0, ..., x'_{T-1}] made of the counted steps only
    (it scores the well-formed steps of each environment's episode, x_0 the state before the first of them);
    counted step t, at position k+1 of that sequence, gets 1 - mean(S[0:k+1, k+1:]).

The diversity measures of section 4.1 (eqs. 5-6), over the after-states of a trajectory or of a group of them:

  sequence_diversity(x', mask)  d_seq = 1 / (T (T-1)) sum_{k<l} [1 - sim(x'_k, x'_l)]   per trajectory [B]
  group_diversity(x', mask)     D_grp = 1 / (N (N-1)) sum_{k<l} [1 - sim(x'_k, x'_l)]   over all N states

Both are written as the paper prints them: a sum over unordered pairs divided by the number of ordered pairs,
i.e. half the mean pairwise dissimilarity (identical states give 0, orthogonal ones 0.5). T, N count the masked-in
states; fewer than two give 0.

`click_hit_text` and `screen_text`, the host-side string parts (OCR boxes -> the texts the encoder embeds), are
envs/screen_reader.py's, imported here. The reward terms run on numpy or jax inputs, under jit or not; the two
diversity measures are host-side numpy (float64).
"""

from __future__ import annotations

from typing import Mapping

import jax.numpy as jnp
import numpy as np

# The texts a screen is embedded as live beside the wrapper that reads screens (actors run it, without jax).
from explore_jax.envs.screen_reader import CLICK_KINDS, SCREEN_PREFIX, click_hit_text, screen_text  # noqa: F401

COSINE_EPS = 1e-8
SEQUENCE_FORMS = ("paper", "code")


def cosine(a, b, eps: float = COSINE_EPS):
  """[...] cosine of the last axis: a.b / (max(|a|, eps) max(|b|, eps)) (torch's cosine_similarity)."""
  a, b = jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32)
  na = jnp.maximum(jnp.linalg.norm(a, axis=-1), eps)
  nb = jnp.maximum(jnp.linalg.norm(b, axis=-1), eps)
  return jnp.sum(a * b, axis=-1) / (na * nb)


def pairwise_cosine(x, y=None, eps: float = COSINE_EPS):
  """[..., T, U] cosines of every row of x [..., T, D] with every row of y [..., U, D] (y defaults to x)."""
  x = jnp.asarray(x, jnp.float32)
  y = x if y is None else jnp.asarray(y, jnp.float32)
  nx = jnp.maximum(jnp.linalg.norm(x, axis=-1), eps)
  ny = jnp.maximum(jnp.linalg.norm(y, axis=-1), eps)
  return jnp.einsum("...td,...ud->...tu", x, y) / (nx[..., :, None] * ny[..., None, :])


def instant_change(before, after):
  """r_inst: 1 - sim(x_t, x'_t), [...]."""
  return 1.0 - cosine(before, after)


def world_model_surprise(after, predicted):
  """r_world: 1 - sim(x'_t, x̂_t), [...]."""
  return 1.0 - cosine(after, predicted)


def intent_alignment(intent, before_text, after_text):
  """r_des: sim(i_t, e_t) + sim(i_t, e'_t), [...]."""
  return cosine(intent, before_text) + cosine(intent, after_text)


def intent_box(intent, box_text, hit):
  """r_inter: sim(i_t, e_box) where `hit` (a click landed in OCR boxes), else 0, [...]."""
  return jnp.where(jnp.asarray(hit, bool), cosine(intent, box_text), 0.0)


def sequence_change(first, after, mask, form: str = "paper"):
  """r_seq per counted step of each trajectory, [B, T] (module docstring); first [B, D], after [B, T, D]."""
  if form not in SEQUENCE_FORMS:
    raise ValueError(f"sequence form must be one of {SEQUENCE_FORMS}, got {form!r}")
  mask = jnp.asarray(mask, bool)
  m = mask.astype(jnp.float32)
  sims = pairwise_cosine(after)                              # [B, T, T]: sim(x'_i, x'_j)
  steps = jnp.arange(mask.shape[-1])
  earlier = steps[None, :] < steps[:, None]                  # [t, i]: i < t
  if form == "paper":
    pairs = (earlier[None, :, :, None] & (steps[None, None, None, :] > steps[None, :, None, None])
             ).astype(jnp.float32) * m[:, None, :, None] * m[:, None, None, :]  # [B, t, i, j]: i < t < j, counted
    count = jnp.sum(pairs, axis=(-1, -2))
    total = jnp.sum(pairs * (1.0 - sims)[:, None, :, :], axis=(-1, -2))
    value = jnp.where(count > 0, total / jnp.maximum(count, 1.0), 0.0)
    return jnp.where(mask, value, 0.0)
  # The code's form: the past of step t is x_0 and the counted after-states before t; its future is the counted
  # after-states from t on (t's own included).
  past = earlier[None].astype(jnp.float32) * m[:, None, :]   # [B, t, i]
  future = (~earlier[None]).astype(jnp.float32) * m[:, None, :]  # [B, t, j]: j >= t, counted
  first_sims = cosine(jnp.asarray(first, jnp.float32)[:, None, :], after)  # [B, j]: sim(x_0, x'_j)
  total = (jnp.einsum("btj,bj->bt", future, first_sims)
           + jnp.einsum("bti,bij,btj->bt", past, sims, future))
  count = (1.0 + jnp.sum(past, -1)) * jnp.sum(future, -1)
  value = 1.0 - total / jnp.maximum(count, 1.0)
  return jnp.where(mask, value, 0.0)


def total(terms: Mapping[str, "jnp.ndarray"], format_ok, gate: bool = True):
  """r: the terms' sum times r_format (gate, eq. 1 and the code) or plus r_format (gate=False), [...]."""
  fmt = jnp.asarray(format_ok, jnp.float32)
  summed = sum(jnp.asarray(v, jnp.float32) for v in terms.values()) if terms else jnp.zeros_like(fmt)
  return fmt * summed if gate else fmt + summed


def _half_mean_dissimilarity(x, mask) -> np.ndarray:
  """sum_{k<l} [1 - sim(x_k, x_l)] / (n (n - 1)) over the masked-in rows of x [..., T, D], [...].

  numpy on the host, in float64: the measures are bookkeeping over a batch's records, whose shapes change every
  iteration, so a jnp version would compile once per shape on the learner's device.
  """
  x, m = np.asarray(x, np.float64), np.asarray(mask, np.float64)
  norms = np.maximum(np.linalg.norm(x, axis=-1), COSINE_EPS)
  sims = np.einsum("...td,...ud->...tu", x, x) / (norms[..., :, None] * norms[..., None, :])
  n = m.sum(axis=-1)
  pairs = np.triu(np.ones(sims.shape[-2:]), k=1) * m[..., :, None] * m[..., None, :]
  # 1 - sim >= 0; a float cosine of equal rows can come out a hair above 1.
  summed = np.sum(pairs * np.maximum(1.0 - sims, 0.0), axis=(-1, -2))
  return np.where(n > 1, summed / np.maximum(n * (n - 1.0), 1.0), 0.0)


def sequence_diversity(after, mask) -> np.ndarray:
  """d_seq (eq. 5) of each trajectory: after [B, T, D], mask [B, T] -> [B]."""
  return _half_mean_dissimilarity(after, mask)


def group_diversity(after, mask) -> np.ndarray:
  """D_grp (eq. 6) of all the states of a group of trajectories: after [..., N, D] (flattened), mask [..., N]."""
  return _half_mean_dissimilarity(after, mask)
