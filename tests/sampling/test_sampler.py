"""The jitted sampler: greedy parity with full forward passes, sampling distribution, stopping, padding
invariance, mixed-temperature segments, logprob parity with the learner, no recompiles, sharding."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, Mesh

from explore_jax import sampling as sampling_lib
from explore_jax.models import Model, ModelConfig, positions_from_mask
from explore_jax.parallel.sharding import DEFAULT_RULES
from explore_jax.sampling import (FinishReason, advance_segment, ends_with, generate, generate_jit,
                                  make_sampling_params, segment_ids, shard_params, sge_sampling_params,
                                  temperature_per_token, token_logprobs)
from explore_jax.sampling import response_logprobs as _response_logprobs

# Jitted as the learner would call it (eagerly, each small op would compile on its own: slow).
response_logprobs = jax.jit(_response_logprobs, static_argnames=("model", "top_k", "return_entropy"))

CONFIG = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                     num_kv_heads=2, head_dim=8, qk_norm=True, tie_embeddings=True)
MODEL = Model(CONFIG)
N_NEW = 10


@pytest.fixture(scope="module")
def params():
  # A large init std gives peaked, well-separated logits: no near-ties that float noise could flip.
  return jax.jit(MODEL.init, static_argnames="std")(jax.random.key(0), std=0.5)


def left_pad(rows, width):
  return sampling_lib.left_pad(rows, width, len(rows))


PROMPTS = [[5, 6, 7], [1, 2, 3, 4, 5, 6], [9]]


def test_the_library_left_pad_keeps_each_rows_last_tokens_and_gives_fillers_one():
  tokens, mask = sampling_lib.left_pad([[1, 2, 3, 4, 5], [7]], 3, 3, pad_id=9)
  np.testing.assert_array_equal(tokens, [[3, 4, 5], [9, 9, 7], [9, 9, 9]])
  np.testing.assert_array_equal(mask, [[1, 1, 1], [0, 0, 1], [0, 0, 1]])


def sp(temps=(1.0, 1.0), delimiter=(62, 63, 62), eos=(), stops=()):
  """SamplingParams padded to one fixed shape, so every test below shares one compiled sampler."""
  return make_sampling_params(list(temps), [delimiter], eos_ids=list(eos), stop_sequences=list(stops),
                              num_eos=2, num_stop_sequences=2, stop_width=3, delimiter_width=3,
                              num_delimiters=2)


def run(params, sampling, prompts=PROMPTS, width=6, rng=1, row_ids=None, **kw):
  tokens, mask = left_pad(prompts, width)
  # Explicit row ids (default 0..B-1, as `generate`'s own default) keep one pytree structure: one compile.
  row_ids = np.arange(len(prompts), dtype=np.int32) if row_ids is None else row_ids.astype(np.int32)
  return generate(MODEL, params, tokens, mask, sampling, jax.random.key(rng), max_new_tokens=N_NEW,
                  row_ids=row_ids, **kw)


_apply = jax.jit(lambda p, t, pos, m: MODEL.apply(p, t, pos, attention_mask=m, return_hidden=True))


def full_forward(params, prompts, response, width=6, length=None):
  """Logits and hidden states of one full forward pass over prompt + response[:, :length] (no cache).

  The response keeps its full width (masked beyond `length`) so that every call has one shape.
  """
  tokens, mask = left_pad(prompts, width)
  tokens = np.concatenate([tokens, response], 1)
  kept = np.arange(response.shape[1]) < (response.shape[1] if length is None else length)
  mask = np.concatenate([mask, np.broadcast_to(kept, response.shape)], 1)
  out = _apply(params, tokens, positions_from_mask(mask), mask)
  return np.asarray(out.logits), np.asarray(out.hidden)


def test_greedy_equals_argmax_of_repeated_full_forward_passes(params):
  out = run(params, sp(temps=(0.0, 0.0)), return_hidden=True)
  # Reference: grow the sequence one argmax at a time, recomputing everything from scratch each step.
  width = 6
  response = np.zeros((len(PROMPTS), N_NEW), np.int32)
  for i in range(N_NEW):
    logits, _ = full_forward(params, PROMPTS, response, width, length=i)
    response[:, i] = logits[:, width - 1 + i].argmax(-1)
  np.testing.assert_array_equal(out.tokens, response)
  assert (np.asarray(out.finish_reason) == FinishReason.LENGTH).all()
  np.testing.assert_array_equal(out.lengths, N_NEW)

  logits, hidden = full_forward(params, PROMPTS, response, width)
  pred = logits[:, width - 1:-1]
  # At T = 0 the recorded logprob is the untempered (T = 1) model's.
  logp = jax.nn.log_softmax(pred, -1)
  np.testing.assert_allclose(out.logprobs, np.take_along_axis(logp, response[..., None], -1)[..., 0],
                             atol=1e-5)
  # hidden[:, t] is the state after consuming token t: the full pass's hidden at token t's position.
  np.testing.assert_allclose(out.hidden, hidden[:, width:], atol=1e-5)

  # A row that ends early (EOS) still gets its last token's state; past its end the states are 0.
  eos = int(response[0, 3])
  early = run(params, sp(temps=(0.0, 0.0), eos=[eos]), return_hidden=True)
  L = int(early.lengths[0])
  assert L == list(response[0]).index(eos) + 1 < N_NEW
  np.testing.assert_allclose(early.hidden[0, :L], hidden[0, width:width + L], atol=1e-5)
  np.testing.assert_array_equal(early.hidden[0, L:], 0)


# Upper critical values of chi-square at significance 0.001, dof 1..7: NIST/SEMATECH e-Handbook of
# Statistical Methods, section 1.3.6.7.4 "Critical Values of the Chi-Square Distribution".
CHI2_CRIT_0001 = {1: 10.828, 2: 13.816, 3: 16.266, 4: 18.467, 5: 20.515, 6: 22.458, 7: 24.322}
SMALL = Model(ModelConfig(vocab_size=8, hidden_size=16, intermediate_size=32, num_layers=1, num_heads=2,
                          num_kv_heads=1, head_dim=8, tie_embeddings=True))
N_DRAWS = 4000


@pytest.fixture(scope="module")
def small_params():
  # Seed and std chosen so that every token keeps >= 5 expected counts at T = 0.5 (min prob 0.02).
  return jax.jit(SMALL.init, static_argnames="std")(jax.random.key(1), std=0.2)


_small_apply = jax.jit(SMALL.apply)


def _chi2(counts, probs):
  expected = probs * counts.sum()
  assert expected.min() >= 5, "chi-square needs >= 5 expected counts per cell"
  return float(((counts - expected) ** 2 / expected).sum())


@pytest.mark.parametrize("temperature,top_k,top_p", [(0.5, 0, 1.0), (2.0, 0, 1.0), (1.0, 0, 0.7),
                                                     (1.0, 3, 1.0)])
def test_sampled_frequencies_match_tempered_softmax(small_params, temperature, top_k, top_p):
  prompt = np.tile(np.array([[1, 2, 3]], np.int32), (N_DRAWS, 1))
  mask = np.ones_like(prompt, bool)
  sampling = make_sampling_params(temperature, top_p=top_p)
  # The G = N_DRAWS samples of one prompt differ only through their row ids.
  out = generate(SMALL, small_params, prompt, mask, sampling, jax.random.key(7), max_new_tokens=1,
                 top_k=top_k)
  logits = np.asarray(_small_apply(small_params, prompt[:1], positions_from_mask(mask[:1])).logits[0, -1],
                      np.float64)
  probs = np.exp(logits / temperature - np.max(logits / temperature))
  probs /= probs.sum()
  keep = np.ones(8, bool)
  if top_k:
    keep = probs >= np.sort(probs)[-top_k]
  if top_p < 1:
    order = np.argsort(-probs)
    before = np.cumsum(probs[order]) - probs[order]
    keep = np.zeros(8, bool)
    keep[order[before < top_p]] = True
  assert 1 < keep.sum() <= 8
  probs = np.where(keep, probs, 0) / probs[keep].sum()
  counts = np.bincount(np.asarray(out.tokens[:, 0]), minlength=8)
  assert counts[~keep].sum() == 0, "a filtered-out token was sampled"
  assert _chi2(counts[keep], probs[keep]) < CHI2_CRIT_0001[int(keep.sum()) - 1]
  # The recorded logprob is that of the filtered, tempered distribution the token was drawn from.
  np.testing.assert_allclose(out.logprobs[:, 0], np.log(probs[np.asarray(out.tokens[:, 0])]), atol=1e-5)
  # The learner reproduces it when given the same filters.
  rec = response_logprobs(SMALL, small_params, prompt[:64], mask[:64], out.tokens[:64], out.mask[:64],
                          out.temperatures[:64], top_k=top_k, top_p=top_p)
  np.testing.assert_allclose(rec.logprobs, out.logprobs[:64], atol=1e-5)


def _first_new_pair(row, start):
  """Index t >= start such that (row[t-1], row[t]) does not occur earlier in the row."""
  for t in range(start, len(row)):
    pair = (row[t - 1], row[t])
    if all((row[s - 1], row[s]) != pair for s in range(1, t)) and row[t - 1] not in row[:t - 1]:
      return t
  raise AssertionError(f"no fresh pair in {row}")


def test_stop_sequence_spanning_two_tokens_and_eos(params):
  base = np.asarray(run(params, sp()).tokens)
  t = _first_new_pair(list(base[0]), 3)
  stop = [int(base[0, t - 1]), int(base[0, t])]
  out = run(params, sp(stops=[stop]))
  assert int(out.lengths[0]) == t + 1
  assert int(out.finish_reason[0]) == FinishReason.STOP
  np.testing.assert_array_equal(out.tokens[0, :t + 1], base[0, :t + 1])
  # The first token of the stop sequence followed by anything else does not stop.
  other = min(set(range(64)) - set(base[0].tolist()))
  out_half = run(params, sp(stops=[[stop[0], other]]))
  assert int(out_half.lengths[0]) == N_NEW and int(out_half.finish_reason[0]) == FinishReason.LENGTH

  eos = int(base[1, 4])
  first = list(base[1]).index(eos)
  out = run(params, sp(eos=[eos]))
  assert int(out.lengths[1]) == first + 1 and int(out.finish_reason[1]) == FinishReason.EOS
  assert int(out.tokens[1, first]) == eos


def test_finished_rows_stop_changing(params):
  base = run(params, sp())
  eos = int(base.tokens[0, 2])
  others = [b for b in (1, 2) if eos not in list(np.asarray(base.tokens[b]))]
  out = run(params, sp(eos=[eos]))
  L = int(out.lengths[0])
  assert L == list(np.asarray(base.tokens[0])).index(eos) + 1 < N_NEW
  np.testing.assert_array_equal(out.tokens[0, :L], base.tokens[0, :L])
  np.testing.assert_array_equal(out.tokens[0, L:], 0)
  np.testing.assert_array_equal(out.logprobs[0, L:], 0)
  np.testing.assert_array_equal(out.temperatures[0, L:], 0)
  np.testing.assert_array_equal(out.segments[0, L:], -1)
  np.testing.assert_array_equal(out.mask[0], np.arange(N_NEW) < L)
  for b in others:  # rows that never emit the EOS are untouched by another row finishing
    np.testing.assert_array_equal(out.tokens[b], base.tokens[b])
    np.testing.assert_allclose(out.logprobs[b], base.logprobs[b], atol=1e-6)

  # All rows finish early: the loop stops and everything past the lengths is padding.
  # (row 2 repeats row 0's prompt and row id, hence its random stream).
  all_eos = [int(base.tokens[b, 1]) for b in range(2)]
  out = run(params, sp(eos=all_eos), prompts=PROMPTS[:2] + [PROMPTS[0]], row_ids=np.array([0, 1, 0]))
  assert int(np.max(out.lengths)) <= 2 and (np.asarray(out.finish_reason) == FinishReason.EOS).all()
  assert not np.asarray(out.mask)[:, 2:].any()
  np.testing.assert_array_equal(np.asarray(out.tokens)[:, 2:], 0)


def test_inactive_rows_start_finished_and_decoding_ends_with_the_last_active_row(params):
  base = run(params, sp())
  out = run(params, sp(), active=np.array([True, False, True]))
  for b in (0, 2):  # the active rows are those of the full batch, bit for bit
    np.testing.assert_array_equal(out.tokens[b], base.tokens[b])
    np.testing.assert_array_equal(out.logprobs[b], base.logprobs[b])
  assert int(out.lengths[1]) == 0 and not np.asarray(out.mask)[1].any()
  np.testing.assert_array_equal(out.tokens[1], 0)

  # Row 0 stops at its EOS after L tokens. With the other rows as fillers (inactive) the loop ends there:
  # the hidden states of later steps are never computed (they stay zero); with the fillers active it runs on.
  eos = int(base.tokens[0, 2])
  L = list(np.asarray(base.tokens[0])).index(eos) + 1
  only_row0 = run(params, sp(eos=[eos]), active=np.array([True, False, False]), return_hidden=True)
  assert int(only_row0.lengths[0]) == L < N_NEW and np.asarray(only_row0.lengths)[1:].tolist() == [0, 0]
  assert not np.asarray(only_row0.hidden)[:, L + 1:].any() and np.asarray(only_row0.hidden)[0, :L + 1].any()
  all_rows = run(params, sp(eos=[eos]), return_hidden=True)
  assert np.asarray(all_rows.hidden)[:, L + 1:].any()
  np.testing.assert_array_equal(only_row0.tokens[0], all_rows.tokens[0])
  with pytest.raises(ValueError, match=r"active must be \[B\]=3"):
    run(params, sp(), active=np.array([True, False]))


def test_padding_and_batch_do_not_change_a_row(params):
  sampling = sp()
  row = [5, 6, 7]
  row_id = np.array([11, 4, 9])
  ref = run(params, sampling, prompts=[row, [1, 2, 3, 4, 5, 6], [9]], row_ids=row_id)
  # Same row id, different neighbours and more padding (a wider batch) or alone.
  wide = run(params, sampling, prompts=[[3] * 9, [2], row], width=9, row_ids=np.array([0, 1, 11]))
  alone = run(params, sampling, prompts=[row], row_ids=np.array([11]))
  for other, b in ((wide, 2), (alone, 0)):
    np.testing.assert_array_equal(other.tokens[b], ref.tokens[0])
    np.testing.assert_allclose(other.logprobs[b], ref.logprobs[0], atol=1e-5)
  # Distinct row ids give the same prompt distinct samples.
  twins = run(params, sampling, prompts=[row, row, row], row_ids=np.array([11, 12, 13]))
  np.testing.assert_array_equal(twins.tokens[0], ref.tokens[0])
  assert len({tuple(np.asarray(r)) for r in twins.tokens}) == 3


def test_right_padding_is_rejected(params):
  tokens, mask = left_pad(PROMPTS, 6)
  with pytest.raises(ValueError, match="left-padded"):
    generate(MODEL, params, tokens, mask[:, ::-1], sp(), jax.random.key(0), max_new_tokens=N_NEW)


def test_segment_tracking_pure():
  p = make_sampling_params([1.2, 0.7, 0.3], [[[7, 8], [9]], [4, 5, 6]])
  tokens = jnp.array([
      [4, 5, 6, 1, 7, 8, 2, 4, 5, 6, 3, 9],   # seg-1 delimiter early is ignored; 7 8 closes seg 0
      [1, 9, 4, 5, 7, 8, 4, 5, 6, 1, 1, 1],   # alternative delimiter (9); 7 8 in segment 1 is ignored
      [7, 1, 8, 4, 5, 6, 3, 3, 3, 3, 3, 3],   # interrupted delimiter never closes
  ])
  mask = jnp.ones(tokens.shape, bool).at[1, 10:].set(False)
  segs = np.asarray(segment_ids(tokens, mask, p))
  np.testing.assert_array_equal(segs[0], [0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2])
  np.testing.assert_array_equal(segs[1], [0, 0, 1, 1, 1, 1, 1, 1, 1, 2, -1, -1])
  np.testing.assert_array_equal(segs[2], 0)
  np.testing.assert_allclose(temperature_per_token(jnp.asarray(segs), p)[0, [0, 6, 11]], [1.2, 0.7, 0.3])
  # One step at a time, as the sampler does.
  recent = jnp.array([[-1, 7, 8], [7, 8, 9], [4, 5, 6]])
  np.testing.assert_array_equal(advance_segment(jnp.array([0, 0, 0]), recent, p), [1, 1, 0])
  np.testing.assert_array_equal(advance_segment(jnp.array([1, 1, 1]), recent, p), [1, 1, 2])
  np.testing.assert_array_equal(ends_with(jnp.array([[-1, 9]]), p.delimiters), [[False, True, False]])


def test_mixed_temperature_switches_at_delimiter_and_logprobs_match(params):
  # With tau_s = tau the delimiter cannot change the tokens; pick a pair from that run as delimiter.
  flat = run(params, sp(temps=(1.3, 1.3)))
  row = list(np.asarray(flat.tokens[0]))
  t = _first_new_pair(row, 3)
  delim = (int(row[t - 1]), int(row[t]))
  out = run(params, sge_sampling_params(1.3, 0.6, delim, num_eos=2, num_stop_sequences=2, stop_width=3,
                                        delimiter_width=3, num_delimiters=2))
  np.testing.assert_array_equal(out.tokens[0, :t + 1], flat.tokens[0, :t + 1])
  np.testing.assert_allclose(out.temperatures[0], [1.3] * (t + 1) + [0.6] * (N_NEW - t - 1))
  np.testing.assert_array_equal(out.segments[0], [0] * (t + 1) + [1] * (N_NEW - t - 1))
  sampling = sp(temps=(1.3, 0.6), delimiter=delim)
  np.testing.assert_array_equal(segment_ids(out.tokens, out.mask, sampling), out.segments)
  np.testing.assert_allclose(temperature_per_token(out.segments, sampling), out.temperatures)

  # The learner recomputes the same logprobs at the recorded per-token temperatures.
  tokens, mask = left_pad(PROMPTS, 6)
  rec = response_logprobs(MODEL, params, tokens, mask, out.tokens, out.mask, out.temperatures,
                          return_entropy=True)
  np.testing.assert_allclose(rec.logprobs, out.logprobs, atol=1e-5)
  logits, _ = full_forward(params, PROMPTS, np.asarray(out.tokens))
  scaled = logits[:, 5:-1] / np.asarray(out.temperatures)[..., None]
  logp = jax.nn.log_softmax(scaled, -1)
  np.testing.assert_allclose(rec.entropy[0], -(np.exp(logp) * logp).sum(-1)[0], atol=1e-4)

  # A greedy second segment: after the delimiter every token is the argmax of a full forward pass.
  greedy = run(params, sp(temps=(1.3, 0.0), delimiter=delim))
  logits, _ = full_forward(params, PROMPTS, np.asarray(greedy.tokens))
  np.testing.assert_array_equal(greedy.tokens[0, t + 1:], logits[0, 5:-1].argmax(-1)[t + 1:])
  rec = response_logprobs(MODEL, params, tokens, mask, greedy.tokens, greedy.mask, greedy.temperatures)
  np.testing.assert_allclose(rec.logprobs, greedy.logprobs, atol=1e-5)


def test_new_schedule_values_do_not_recompile(params):
  run(params, sp(temps=(1.2, 0.7)))
  before = generate_jit._cache_size()
  run(params, sp(temps=(1.0, 0.7)))
  run(params, sp(temps=(0.0, 0.4), delimiter=(3, 4), eos=[1, 2], stops=[[5, 6, 7]]))
  assert generate_jit._cache_size() == before


def test_sharded_matches_single_device(params):
  assert len(jax.devices()) == 8, "tests/conftest.py sets 8 fake CPU devices"
  mesh = Mesh(np.array(jax.devices()).reshape(2, 2, 2), ("data", "fsdp", "tensor"),
              axis_types=(AxisType.Auto,) * 3)
  sharded = Model(CONFIG, mesh, DEFAULT_RULES)
  prompts = PROMPTS + [[8, 8]]
  tokens, mask = left_pad(prompts, 6)
  sampling = sp(temps=(1.3, 0.6), delimiter=(3, 4))
  single = generate(MODEL, params, tokens, mask, sampling, jax.random.key(5), max_new_tokens=N_NEW)
  placed = shard_params(sharded, params)
  assert placed["layers"]["q"].sharding.spec[2] == "tensor"
  multi = generate(sharded, placed, tokens, mask, sampling, jax.random.key(5), max_new_tokens=N_NEW)
  np.testing.assert_array_equal(multi.tokens, single.tokens)
  np.testing.assert_allclose(multi.logprobs, single.logprobs, atol=1e-5)
  np.testing.assert_array_equal(multi.segments, single.segments)


def test_per_row_temperatures(params):
  # Rows 0 and 2 greedy, row 1 on the SGE schedule: each row equals its run with a batch-wide schedule.
  delim = (3, 4)
  per_row = run(params, sp(temps=np.array([[0.0, 0.0], [1.3, 0.6], [0.0, 0.0]]), delimiter=delim))
  greedy = run(params, sp(temps=(0.0, 0.0), delimiter=delim))
  mixed = run(params, sp(temps=(1.3, 0.6), delimiter=delim))
  for b, ref in ((0, greedy), (1, mixed), (2, greedy)):
    np.testing.assert_array_equal(per_row.tokens[b], ref.tokens[b])
    np.testing.assert_allclose(per_row.temperatures[b], ref.temperatures[b])
    np.testing.assert_allclose(per_row.logprobs[b], ref.logprobs[b], atol=1e-6)


def test_response_scoring_projects_only_the_response_and_agrees_with_full_scoring(params):
  prompt, prompt_mask = left_pad(PROMPTS, 6)
  response = np.random.default_rng(0).integers(0, CONFIG.vocab_size, (3, 5)).astype(np.int32)
  response_mask = np.arange(5)[None] < np.array([[5], [2], [4]])
  temps = np.where(response_mask, np.array([[1.3, 1.3, 0.6, 0.6, 0.6]]), 0.0).astype(np.float32)
  tokens = np.concatenate([prompt, response], 1)
  mask = np.concatenate([prompt_mask, response_mask], 1)

  # The model's tail projection is the tail of its full projection.
  positions = positions_from_mask(mask)
  full = MODEL.apply(params, tokens, positions, attention_mask=mask).logits
  tail = MODEL.apply(params, tokens, positions, attention_mask=mask, logits_to_keep=6).logits
  assert tail.shape == (3, 6, CONFIG.vocab_size)
  np.testing.assert_allclose(tail, full[:, -6:], atol=1e-5)

  # Scoring the response alone equals scoring every token and keeping the response's columns.
  all_temps = np.concatenate([np.zeros(prompt.shape, np.float32), temps], 1)
  everything = token_logprobs(MODEL, params, tokens, all_temps, mask, return_entropy=True)
  rec = response_logprobs(MODEL, params, prompt, prompt_mask, response, response_mask, temps,
                          return_entropy=True)
  np.testing.assert_allclose(rec.logprobs, everything.logprobs[:, 6:], atol=1e-5)
  np.testing.assert_allclose(rec.entropy, everything.entropy[:, 6:], atol=1e-5)
  logprobs = np.asarray(rec.logprobs)
  assert np.all(logprobs[~response_mask] == 0) and np.all(logprobs[response_mask] < 0)
