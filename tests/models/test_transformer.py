"""The transformer's own invariants: KV-cache decoding equals full passes, padding changes nothing."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from explore_jax.models import Model, ModelConfig, positions_from_mask, preset

SMALL = ModelConfig(vocab_size=97, hidden_size=48, intermediate_size=96, num_layers=2, num_heads=4,
                    num_kv_heads=2, head_dim=16, qk_norm=True, qkv_bias=True, rope_type="llama3",
                    rope_scaling=(("factor", 4.0), ("low_freq_factor", 1.0), ("high_freq_factor", 4.0),
                                  ("original_max_position_embeddings", 16.0)))


@pytest.fixture(scope="module")
def model_and_params():
  m = Model(SMALL)
  return m, m.init(jax.random.key(0), std=0.2)


def test_param_count_and_axes_cover_every_leaf(model_and_params):
  m, p = model_and_params
  assert SMALL.num_params() == sum(x.size for x in jax.tree.leaves(p))
  shapes = jax.tree.leaves(m.param_shapes())
  axes = jax.tree.leaves(m.param_axes(), is_leaf=lambda x: isinstance(x, tuple))
  assert len(shapes) == len(axes) and all(len(a) == len(s.shape) for a, s in zip(axes, shapes))
  assert preset("tiny").num_params() > 2_000_000


def test_incremental_decoding_with_cache_equals_full_forward(model_and_params):
  m, p = model_and_params
  tokens = jax.random.randint(jax.random.key(1), (3, 12), 0, SMALL.vocab_size)
  pos = jnp.broadcast_to(jnp.arange(12), (3, 12))
  full = m.apply(p, tokens, pos).logits
  cache = m.init_cache(3, 16)
  out = m.apply(p, tokens[:, :7], pos[:, :7], cache)  # prefill, then one token at a time
  steps = [out.logits]
  cache = out.cache
  for t in range(7, 12):
    out = m.apply(p, tokens[:, t:t + 1], pos[:, t:t + 1], cache)
    cache = out.cache
    steps.append(out.logits)
  np.testing.assert_allclose(np.concatenate(steps, 1), full, atol=2e-5)
  assert int(cache.index) == 12 and bool(cache.mask[:, :12].all()) and not bool(cache.mask[:, 12:].any())


def test_left_padding_does_not_change_a_row(model_and_params):
  m, p = model_and_params
  row = jax.random.randint(jax.random.key(2), (1, 5), 0, SMALL.vocab_size)
  alone = m.apply(p, row, jnp.arange(5)[None]).logits[0]
  padded = jnp.concatenate([jnp.zeros((1, 4), row.dtype), row], axis=1)
  mask = jnp.arange(9)[None] >= 4
  out = m.apply(p, padded, positions_from_mask(mask), attention_mask=mask).logits[0, 4:]
  np.testing.assert_allclose(out, alone, atol=1e-5)
  assert np.isfinite(np.asarray(m.apply(p, padded, positions_from_mask(mask), attention_mask=mask).logits)).all()


def test_hidden_states_give_the_logits(model_and_params):
  m, p = model_and_params
  tokens = jnp.arange(6)[None] % SMALL.vocab_size
  out = m.apply(p, tokens, jnp.arange(6)[None], return_hidden=True)
  assert out.hidden.shape == (1, 6, SMALL.hidden_size)
  np.testing.assert_allclose(out.hidden @ p["embed"].T if SMALL.tie_embeddings else out.hidden @ p["lm_head"],
                             out.logits, atol=1e-4)


def test_bfloat16_compute_stays_close_to_float32(model_and_params):
  m, p = model_and_params
  tokens = jnp.arange(10)[None] % SMALL.vocab_size
  ref = m.apply(p, tokens, jnp.arange(10)[None]).logits
  bf = Model(SMALL.replace(dtype="bfloat16")).apply(p, tokens, jnp.arange(10)[None]).logits
  assert bf.dtype == jnp.float32
  assert float(jnp.max(jnp.abs(bf - ref))) < 0.1 * float(jnp.max(jnp.abs(ref)))


def test_remat_gives_the_same_gradients(model_and_params):
  m, p = model_and_params
  tokens = jnp.arange(8)[None] % SMALL.vocab_size

  def loss(model, params):
    return jnp.mean(model.apply(params, tokens, jnp.arange(8)[None]).logits ** 2)

  g = jax.grad(lambda q: loss(m, q))(p)
  g_remat = jax.grad(lambda q: loss(Model(SMALL.replace(remat=True)), q))(p)
  for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(g_remat)):
    np.testing.assert_allclose(a, b, atol=1e-6)


def test_config_rejects_bad_values():
  with pytest.raises(ValueError, match="dtype"):
    SMALL.replace(dtype="float8")
  with pytest.raises(ValueError, match="rope_type"):
    SMALL.replace(rope_type="yarn")
  with pytest.raises(KeyError, match="unknown model preset"):
    preset("gpt5")
