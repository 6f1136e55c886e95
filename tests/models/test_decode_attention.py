"""Decode attention over a cache indexed per row (models/decode_attention.py): the blocked loop and the Pallas
kernel (in Pallas' interpreter on the CPU) against the dense masked reference, and through the slot sampler."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from explore_jax.models import decode_attention as da


def case(S, ranges, H=4, K=2, D=8, seed=0):
  rng = np.random.default_rng(seed)
  B = len(ranges)
  q = jnp.asarray(rng.normal(size=(B, 1, H, D)), jnp.float32)
  k, v = (jnp.asarray(rng.normal(size=(B, K, S, D)), jnp.float32) for _ in range(2))
  start, end = (jnp.asarray(x, jnp.int32) for x in zip(*ranges))
  return q, k, v, start, end


# Ranges that start inside a block, span several, end on a block's edge, hold one key, and fill the cache.
RANGES = [(0, 1), (3, 70), (60, 128), (100, 192), (0, 192)]


@pytest.mark.parametrize("impl", ["blocked", "pallas"])
def test_each_row_attends_to_its_own_range_as_the_dense_reference_does(impl, monkeypatch):
  monkeypatch.setattr(da, "BLOCK", 64)  # 192 slots: three blocks, and the loop starts past the first
  q, k, v, start, end = case(192, RANGES)
  dense = da.decode_attention(q, k, v, start, end, "dense")
  np.testing.assert_allclose(jax.jit(da.decode_attention, static_argnums=5)(q, k, v, start, end, impl), dense,
                             atol=2e-6)
  # Keys outside a row's range change nothing.
  outside = (jnp.arange(192)[None, :] < start[:, None]) | (jnp.arange(192)[None, :] >= end[:, None])
  noisy_k = jnp.where(outside[:, None, :, None], 1e3, k)
  np.testing.assert_allclose(da.decode_attention(q, noisy_k, v, start, end, impl), dense, atol=2e-6)


def test_the_blocked_loop_handles_a_cache_that_is_not_a_whole_number_of_blocks(monkeypatch):
  monkeypatch.setattr(da, "BLOCK", 64)
  q, k, v, start, end = case(150, [(0, 150), (120, 149), (10, 64)])  # the last block overlaps the one before
  np.testing.assert_allclose(da.decode_attention(q, k, v, start, end, "blocked"),
                             da.decode_attention(q, k, v, start, end, "dense"), atol=2e-6)


def test_names_and_the_kernels_cache_length_are_checked():
  assert da.cache_multiple("dense") == da.cache_multiple("blocked") == 1
  assert da.cache_multiple("pallas") == da.PALLAS_BLOCK_K
  with pytest.raises(ValueError, match="rollout.decode_attention"):
    da.check("flash")
  q, k, v, start, end = case(100, [(0, 10)])
  with pytest.raises(ValueError, match="multiple of 64"):
    da.decode_attention(q, k, v, start, end, "pallas")


@pytest.mark.parametrize("impl", ["blocked", "pallas"])
def test_the_slot_sampler_samples_the_same_tokens_with_each_decode_attention(impl):
  from explore_jax.sampling import slots
  from tests.sampling.test_slots import MODEL, PROMPTS, schedule

  params = jax.jit(MODEL.init, static_argnames="std")(jax.random.key(0), std=0.5)
  kw = dict(row_ids=list(range(len(PROMPTS))), max_new_tokens=8, slots=4, cache_len=24, width_bucket=8)
  dense = slots.sample(MODEL, params, PROMPTS, schedule(), jax.random.key(3), **kw)
  other = slots.sample(MODEL, params, PROMPTS, schedule(), jax.random.key(3), decode_attention=impl, **kw)
  for a, b in zip(dense, other):
    np.testing.assert_array_equal(a.tokens, b.tokens)
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)
