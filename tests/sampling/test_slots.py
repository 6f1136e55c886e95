"""Continuous batching (sampling/slots.py): prompts streamed through fewer decode slots than prompts give each
row what `generate` gives it alone at its width (the same tokens, segments and finish reasons; log-probs and the
last hidden state equal up to float rounding), equal prompts share one prefill, the tail shrinks, and the
per-row KV cache decodes as the shared one does."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from explore_jax.models import Model, positions_from_mask
from explore_jax.sampling import generate, make_sampling_params, slots
from tests.sampling.test_sampler import CONFIG, left_pad

MODEL = Model(CONFIG)
N_NEW = 10
CACHE_LEN = 24
BUCKET = 8


@pytest.fixture(scope="module")
def params():
  return jax.jit(MODEL.init, static_argnames="std")(jax.random.key(0), std=0.5)


def schedule(eos=(3,), stops=()):
  # Two segments: T = 1 until the delimiter (token 58), then T = 0.7 (SGE's mixed temperatures).
  return make_sampling_params([1.0, 0.7], [[58]], eos_ids=list(eos), stop_sequences=list(stops),
                              num_eos=2, num_stop_sequences=2, stop_width=3, delimiter_width=3, num_delimiters=2)


def alone(params, prompt, row_id, sampling, rng, hidden=False):
  """`generate` on the one prompt at its own width."""
  width = min(CACHE_LEN, -(-len(prompt) // BUCKET) * BUCKET)
  tokens, mask = left_pad([prompt], width)
  out = generate(MODEL, params, tokens, mask, sampling, rng, max_new_tokens=N_NEW,
                 row_ids=np.array([row_id], np.int32), return_hidden=hidden)
  n = int(out.lengths[0])
  return n, jax.device_get(out)


def assert_same_as_alone(params, prompts, row_ids, outs, sampling, rng, hidden=False):
  for prompt, row_id, o in zip(prompts, row_ids, outs):
    n, g = alone(params, prompt, row_id, sampling, rng, hidden)
    np.testing.assert_array_equal(o.tokens, g.tokens[0, :n])
    np.testing.assert_array_equal(o.segments, g.segments[0, :n])
    np.testing.assert_array_equal(o.temperatures, g.temperatures[0, :n])
    assert o.finish_reason == int(g.finish_reason[0])
    # The row decodes among other rows and over more (masked) cache columns: float sums in another order.
    np.testing.assert_allclose(o.logprobs, g.logprobs[0, :n], atol=1e-5)
    if hidden:
      np.testing.assert_allclose(o.hidden, g.hidden[0, n - 1], atol=1e-5)


PROMPTS = [list(np.random.default_rng(0).integers(4, 60, n)) for n in (3, 17, 1, 9, 24, 6, 12, 2, 20, 5, 8)]


def test_refilled_slots_sample_each_prompt_as_it_is_sampled_alone(params):
  sampling, rng = schedule(eos=(4, 11), stops=([46, 46],)), jax.random.key(7)
  row_ids = [100 + 3 * i for i in range(len(PROMPTS))]
  stats = slots.SlotStats()
  outs = slots.sample(MODEL, params, PROMPTS, sampling, rng, row_ids=row_ids, max_new_tokens=N_NEW, slots=4,
                      cache_len=CACHE_LEN, width_bucket=BUCKET, return_hidden=True, min_prefill_rows=2,
                      tail_rows=1, stats=stats)
  assert_same_as_alone(params, PROMPTS, row_ids, outs, sampling, rng, hidden=True)
  # 11 prompts through 4 slots: several prefills at 3 widths, decode calls between them, and a tail that shrank.
  assert stats.prefills >= 4 and stats.prefill_rows == len(PROMPTS) and stats.chunks > stats.prefills
  assert min(stats.widths) < 4 and max(stats.widths) == 4
  assert stats.live_steps == sum(len(o.tokens) for o in outs) <= stats.slot_steps
  reasons = {o.finish_reason for o in outs}
  assert len(reasons) >= 2, f"the cases should end in more than one way: {reasons}"
  assert any(len(set(o.segments.tolist())) == 2 for o in outs), "some row should cross the delimiter"


def test_a_calls_cache_holds_its_widest_prompt_not_the_whole_budget(params):
  # Every decode step attends over the row's cache: one call's prompts of at most 16 tokens (two width buckets, a
  # power of two) decode in a cache of 16 + N_NEW slots, not CACHE_LEN + N_NEW, and each row is still its
  # `generate` alone; at most 12 tokens (two buckets as well) too.
  sampling, rng = schedule(), jax.random.key(3)
  short = [p for p in PROMPTS if len(p) <= 2 * BUCKET]
  stats = slots.SlotStats()
  outs = slots.sample(MODEL, params, short, sampling, rng, row_ids=list(range(len(short))), slots=4,
                      max_new_tokens=N_NEW, cache_len=CACHE_LEN, width_bucket=BUCKET, stats=stats)
  assert stats.cache_lengths == {2 * BUCKET + N_NEW}
  assert_same_as_alone(params, short, list(range(len(short))), outs, sampling, rng)
  shorter = [p for p in short if len(p) <= 12]
  slots.sample(MODEL, params, shorter, sampling, rng, row_ids=list(range(len(shorter))), slots=4,
               max_new_tokens=N_NEW, cache_len=CACHE_LEN, width_bucket=BUCKET, stats=stats)
  assert stats.cache_lengths == {2 * BUCKET + N_NEW}
  three = [p for p in PROMPTS if len(p) <= 3 * BUCKET]  # 24 tokens, three buckets: four would pass the budget
  slots.sample(MODEL, params, three, sampling, rng, row_ids=list(range(len(three))), slots=4,
               max_new_tokens=N_NEW, cache_len=CACHE_LEN, width_bucket=BUCKET, stats=stats)
  assert stats.cache_lengths == {2 * BUCKET + N_NEW, CACHE_LEN + N_NEW}


def test_greedy_rows_and_a_one_token_prompt(params):
  sampling, rng = make_sampling_params(0.0), jax.random.key(1)
  outs = slots.sample(MODEL, params, [[9], [5, 6, 7]], sampling, rng, row_ids=[0, 1], max_new_tokens=N_NEW,
                      slots=2, cache_len=CACHE_LEN, width_bucket=BUCKET)
  assert_same_as_alone(params, [[9], [5, 6, 7]], [0, 1], outs, sampling, rng)
  assert all(len(o.tokens) == N_NEW for o in outs)


def test_a_task_groups_samples_share_one_prefill_and_keep_their_own_streams(params):
  sampling, rng = schedule(eos=()), jax.random.key(2)
  group = [PROMPTS[1]] * 4 + [PROMPTS[3]]
  row_ids = [10, 11, 12, 13, 14]
  stats = slots.SlotStats()
  outs = slots.sample(MODEL, params, group, sampling, rng, row_ids=row_ids, max_new_tokens=N_NEW, slots=8,
                      cache_len=CACHE_LEN, width_bucket=BUCKET, stats=stats)
  assert stats.prefill_rows == 2 and stats.shared == 3
  assert_same_as_alone(params, group, row_ids, outs, sampling, rng)
  assert len({tuple(o.tokens.tolist()) for o in outs[:4]}) > 1, "distinct row ids draw distinct samples"


def test_bad_inputs_are_refused(params):
  kw = dict(max_new_tokens=N_NEW, slots=2, cache_len=CACHE_LEN)
  with pytest.raises(ValueError, match="row ids"):
    slots.sample(MODEL, params, [[1]], schedule(), jax.random.key(0), row_ids=[0, 1], **kw)
  with pytest.raises(ValueError, match="at least one token"):
    slots.sample(MODEL, params, [[]], schedule(), jax.random.key(0), row_ids=[0], **kw)
  per_row = make_sampling_params(1.0)._replace(temperatures=jnp.ones((2, 1)))
  with pytest.raises(ValueError, match="one sampling schedule"):
    slots.sample(MODEL, params, [[1], [2]], per_row, jax.random.key(0), row_ids=[0, 1], **kw)
  assert slots.sample(MODEL, params, [], schedule(), jax.random.key(0), row_ids=[], **kw) == []


def test_a_cache_indexed_per_row_decodes_as_the_shared_index_does(params):
  """Two rows prefilled together, then decoded one token each: at a shared index, and per row with the rows'
  slots at different places (the second row's prefix moved right by two masked slots)."""
  tokens, mask = left_pad([[5, 6, 7], [1, 2, 3, 4]], 4)
  positions = positions_from_mask(jnp.asarray(mask))
  cache = MODEL.init_cache(2, 8)
  cache = MODEL.apply(params, tokens, positions, cache, attention_mask=mask).cache
  step = jnp.asarray([[11], [12]])
  pos = positions[:, -1:] + 1
  shared = MODEL.apply(params, step, pos, cache).logits
  k = tuple(jnp.concatenate([x[:1], jnp.roll(x[1:], 2, axis=2)]) for x in cache.k)
  v = tuple(jnp.concatenate([x[:1], jnp.roll(x[1:], 2, axis=2)]) for x in cache.v)
  m = jnp.concatenate([cache.mask[:1], jnp.roll(cache.mask[1:], 2, axis=1)])
  per_row = cache._replace(k=k, v=v, mask=m, index=jnp.asarray([4, 6], jnp.int32))
  out = MODEL.apply(params, step, pos, per_row)
  np.testing.assert_allclose(out.logits, shared, atol=1e-5)
  assert out.cache.index.tolist() == [5, 7] and bool(out.cache.mask[1, 6]) and not bool(out.cache.mask[1, 7])
  with pytest.raises(ValueError, match="one new token per row"):
    MODEL.apply(params, tokens, positions, per_row)


def test_the_learner_scores_a_slot_rows_tokens_with_its_recorded_log_probs(params):
  """What PPO's first ratio needs: the learner's log-probs of a row's response (response_logprobs on the prompt
  and response as a record holds them) equal those the slot recorded, within 1e-5."""
  from explore_jax.sampling import response_logprobs

  sampling, rng = schedule(eos=(4, 11)), jax.random.key(9)
  outs = slots.sample(MODEL, params, PROMPTS, sampling, rng, row_ids=list(range(len(PROMPTS))),
                      max_new_tokens=N_NEW, slots=3, cache_len=CACHE_LEN, width_bucket=BUCKET)
  prompt, prompt_mask = left_pad(PROMPTS, CACHE_LEN)
  response = np.zeros((len(PROMPTS), N_NEW), np.int32)
  mask, temps = np.zeros_like(response, bool), np.zeros(response.shape, np.float32)
  for i, o in enumerate(outs):
    n = len(o.tokens)
    response[i, :n], mask[i, :n], temps[i, :n] = o.tokens, True, o.temperatures
  scored = jax.jit(response_logprobs, static_argnames="model")(MODEL, params, prompt, prompt_mask, response, mask,
                                                                temps)
  for i, o in enumerate(outs):
    np.testing.assert_allclose(np.asarray(scored.logprobs)[i, :len(o.tokens)], o.logprobs, atol=1e-5)
