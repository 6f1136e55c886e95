"""Attention of one new token per row over a KV cache indexed per row, reading only each row's own keys.

In a slot engine's cache (sampling/slots.py) row b's keys are the slots [start[b], end[b]): its prompt after the
left padding, then the tokens generated since, contiguous. Slots past end[b] are empty or still hold a previous
occupant's keys. Three implementations, by name (`Model.apply(..., decode_attention=)`, rollout.decode_attention):

  "dense"    transformer.attention over all S slots, the range as a mask: the reference
  "blocked"  jnp on any backend: a lax.while_loop over blocks of `BLOCK` slots, from the block holding min(start) to
             the one holding max(end) - 1, with an online softmax (running max, normaliser and weighted sum in
             float32). It reads the blocks the longest row needs, not the whole cache
  "pallas"   JAX's Pallas GPU kernel (jax.experimental.pallas.ops.gpu.decode_attention.gqa with start_idx and
             kv_seq_len): every row reads only its own range, in parallel over splits of the sequence. On another
             backend it runs in Pallas' interpreter (slow; what the CPU tests check). The cache length must be a
             multiple of PALLAS_BLOCK_K (`cache_multiple`)

All three take q [B, 1, H, D] and the cache's head-major k, v [B, K, S, D] and give [B, 1, H, D] in q's dtype.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

IMPLEMENTATIONS = ("dense", "blocked", "pallas")
BLOCK = 128            # slots per block of "blocked"
PALLAS_BLOCK_K = 64    # slots per block of the Pallas kernel
_NEG = -1e30


def cache_multiple(impl: str) -> int:
  """What a per-row cache's length must be a multiple of for `impl`."""
  check(impl)
  return PALLAS_BLOCK_K if impl == "pallas" else 1


def check(impl: str) -> None:
  if impl not in IMPLEMENTATIONS:
    raise ValueError(f"decode attention must be one of {IMPLEMENTATIONS}, got {impl!r} (rollout.decode_attention)")


def decode_attention(q: jax.Array, k: jax.Array, v: jax.Array, start: jax.Array, end: jax.Array,
                     impl: str = "dense") -> jax.Array:
  """Row b's query over its keys in slots [start[b], end[b]) (module docstring)."""
  check(impl)
  if impl == "dense":
    from explore_jax.models.transformer import attention

    slots = jnp.arange(k.shape[2])[None, :]
    visible = (slots >= start[:, None]) & (slots < end[:, None])
    return attention(q, k, v, visible[:, None, :])
  if impl == "blocked":
    return _blocked(q, k, v, start, end)
  return _pallas(q, k, v, start, end)


def _blocked(q, k, v, start, end):
  B, _, H, D = q.shape
  K, S = k.shape[1], k.shape[2]
  G = H // K
  block = min(BLOCK, S)
  qg = q.reshape(B, K, G, D).astype(jnp.float32) / math.sqrt(D)
  first = jnp.min(start) // block
  last = (jnp.max(end) + block - 1) // block  # one past the last block read

  def body(carry):
    j, m, l, acc = carry
    begin = jnp.minimum(j * block, S - block)  # the last block may overlap the one before: its slots count once
    kb = jax.lax.dynamic_slice_in_dim(k, begin, block, axis=2).astype(jnp.float32)
    vb = jax.lax.dynamic_slice_in_dim(v, begin, block, axis=2).astype(jnp.float32)
    slot = begin + jnp.arange(block)
    valid = (slot >= j * block)[None, :] & (slot >= start[:, None]) & (slot < end[:, None])  # [B, block]
    scores = jnp.einsum("bkgd,bksd->bkgs", qg, kb)
    scores = jnp.where(valid[:, None, None, :], scores, _NEG)
    m_new = jnp.maximum(m, jnp.max(scores, axis=-1))
    p = jnp.exp(scores - m_new[..., None]) * valid[:, None, None, :]
    scale = jnp.exp(m - m_new)
    return (j + 1, m_new, l * scale + jnp.sum(p, axis=-1),
            acc * scale[..., None] + jnp.einsum("bkgs,bksd->bkgd", p, vb))

  init = (first, jnp.full((B, K, G), _NEG, jnp.float32), jnp.zeros((B, K, G), jnp.float32),
          jnp.zeros((B, K, G, D), jnp.float32))
  _, _, l, acc = jax.lax.while_loop(lambda c: c[0] < last, body, init)
  out = acc / jnp.maximum(l, 1e-30)[..., None]
  return out.reshape(B, 1, H, D).astype(q.dtype)


def _pallas(q, k, v, start, end):
  from jax.experimental.pallas.ops.gpu import decode_attention as kernel

  B, _, H, D = q.shape
  S = k.shape[2]
  if S % PALLAS_BLOCK_K:
    raise ValueError(f"the Pallas decode attention needs a cache length that is a multiple of {PALLAS_BLOCK_K}, "
                     f"got {S}")
  blocks = S // PALLAS_BLOCK_K
  splits = max(d for d in range(1, min(16, blocks) + 1) if blocks % d == 0)  # parallel splits of the sequence
  out = kernel.gqa(q[:, 0], k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3), start_idx=start.astype(jnp.int32),
                   kv_seq_len=end.astype(jnp.int32), block_k=PALLAS_BLOCK_K, k_splits=splits,
                   interpret=jax.default_backend() != "gpu")
  return out[:, None].astype(q.dtype)
