"""What to sample with: per-segment temperatures, segment delimiters, stop criteria, top-p — all array data.

SGE's mixed-temperature sampling (Strategy-Guided Exploration, Table 2) draws the strategy tokens at
tau_s and the rest of the response at tau. In general a response is a sequence of *segments*: it starts
in segment 0, and each time the delimiter token sequence that closes the current segment completes in the
generated tokens, the segment id advances by one. Every generated token is drawn at the temperature of
the segment it is in; a delimiter's own tokens belong to the segment they close (the strategy segment
of an SGE coding response ends with the tokens of "### Code").

Everything in `SamplingParams` is an array, so new temperatures, delimiters or stop tokens of the same
shapes reuse the compiled sampler. Token sequences (delimiters, stop sequences) are stored right-aligned
in a fixed width and left-padded with -1, which no token id equals, so "the generated tokens end with
this sequence" is one elementwise comparison against the last `width` generated tokens.
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Sequence, Union

import jax
import jax.numpy as jnp
import numpy as np

PAD_ID = -1  # fills unused entries of token-sequence tables; never a token id

TokenSeq = Sequence[int]
# One boundary's delimiter: a token sequence, or several alternative tokenisations of the same text.
Delimiter = Union[TokenSeq, Sequence[TokenSeq]]


class SamplingParams(NamedTuple):
  """Sampling configuration as a pytree of arrays (changing values never recompiles; shapes do).

  temperatures:        [num_segments] or [B, num_segments] float32; 0 means greedy.
  delimiters:          [D, Wd] int32, right-aligned token sequences, -1 padding on the left.
  delimiter_segments:  [D] int32; delimiter d closes segment delimiter_segments[d] (it only counts while
                       the row is in that segment). Several rows with the same segment are alternatives.
  top_p:               [] or [B] float32; 1.0 disables nucleus filtering.
  eos_ids:             [n_eos] int32, -1 padding; generating any of them finishes the row.
  stop_sequences:      [M, Ws] int32, right-aligned like `delimiters`; completing one finishes the row.
  """

  temperatures: jax.Array
  delimiters: jax.Array
  delimiter_segments: jax.Array
  top_p: jax.Array
  eos_ids: jax.Array
  stop_sequences: jax.Array

  @property
  def num_segments(self) -> int:
    return self.temperatures.shape[-1]


def _is_token_seq(x) -> bool:
  return len(x) > 0 and all(isinstance(t, (int, np.integer)) for t in x)


def pack_sequences(seqs: Sequence[TokenSeq], width: Optional[int] = None,
                   count: Optional[int] = None) -> np.ndarray:
  """Token sequences as a right-aligned [count, width] int32 table padded with -1.

  `width` and `count` (default: the longest sequence, the number of sequences) fix the shape, so that
  different stop lists of the same padded shape share one compiled sampler.
  """
  seqs = [list(map(int, s)) for s in seqs]
  if any(len(s) == 0 for s in seqs):
    raise ValueError("empty token sequence: it would match everywhere")
  if any(t < 0 for s in seqs for t in s):
    raise ValueError("token ids must be non-negative")
  w = max([1] + [len(s) for s in seqs]) if width is None else width
  n = len(seqs) if count is None else count
  if any(len(s) > w for s in seqs) or len(seqs) > n:
    raise ValueError(f"{len(seqs)} sequences of lengths {[len(s) for s in seqs]} do not fit [{n}, {w}]")
  table = np.full((n, w), PAD_ID, np.int32)
  for i, s in enumerate(seqs):
    table[i, w - len(s):] = s
  return table


def make_sampling_params(temperatures: Union[float, Sequence[float], np.ndarray] = 1.0,
                         delimiters: Sequence[Delimiter] = (),
                         *,
                         eos_ids: Sequence[int] = (),
                         stop_sequences: Sequence[TokenSeq] = (),
                         top_p: Union[float, Sequence[float], np.ndarray] = 1.0,
                         delimiter_width: Optional[int] = None,
                         num_delimiters: Optional[int] = None,
                         stop_width: Optional[int] = None,
                         num_stop_sequences: Optional[int] = None,
                         num_eos: Optional[int] = None) -> SamplingParams:
  """Build `SamplingParams` from Python values.

  temperatures: a scalar (one segment), a list of per-segment temperatures, or a [B, num_segments] array.
  delimiters: one entry per segment boundary (num_segments - 1 of them); entry k closes segment k and is a
    token sequence or a list of alternative token sequences (the same text can tokenise differently
    depending on what precedes it).
  The width/count arguments pad the tables to fixed shapes (see `pack_sequences`).
  """
  temps = np.asarray(temperatures, np.float32)
  if temps.ndim == 0:
    temps = temps[None]
  if temps.ndim not in (1, 2):
    raise ValueError(f"temperatures must be [num_segments] or [B, num_segments], got shape {temps.shape}")
  if np.any(temps < 0):
    raise ValueError("temperatures must be >= 0 (0 is greedy)")
  if len(delimiters) != temps.shape[-1] - 1:
    raise ValueError(f"{temps.shape[-1]} segments need {temps.shape[-1] - 1} delimiters, got {len(delimiters)}")
  flat, closes = [], []
  for k, d in enumerate(delimiters):
    alternatives = [d] if _is_token_seq(d) else list(d)
    if not alternatives:
      raise ValueError(f"delimiter {k} has no token sequence")
    flat.extend(alternatives)
    closes.extend([k] * len(alternatives))
  n = len(flat) if num_delimiters is None else num_delimiters
  delim_table = pack_sequences(flat, delimiter_width, n)
  # Unused rows close a segment that never exists, so they never fire.
  delim_segments = np.full((n,), np.iinfo(np.int32).max, np.int32)
  delim_segments[:len(closes)] = closes
  eos = np.full((len(eos_ids) if num_eos is None else num_eos,), PAD_ID, np.int32)
  if len(eos_ids) > len(eos):
    raise ValueError(f"{len(eos_ids)} eos ids do not fit num_eos={num_eos}")
  eos[:len(eos_ids)] = eos_ids
  top_p = np.asarray(top_p, np.float32)
  if np.any(top_p <= 0) or np.any(top_p > 1):
    raise ValueError("top_p must be in (0, 1]")
  return SamplingParams(
      temperatures=jnp.asarray(temps), delimiters=jnp.asarray(delim_table),
      delimiter_segments=jnp.asarray(delim_segments), top_p=jnp.asarray(top_p), eos_ids=jnp.asarray(eos),
      stop_sequences=jnp.asarray(pack_sequences(stop_sequences, stop_width, num_stop_sequences)))


def sge_sampling_params(tau_s: float, tau: float, strategy_end: Delimiter, **kwargs) -> SamplingParams:
  """SGE's two-segment schedule: strategy tokens at tau_s up to and including `strategy_end`, then tau.

  Paper defaults (SGE Table 2): coding tau_s=1.2, tau=0.7 with the strategy closed by "### Code".
  """
  return make_sampling_params([tau_s, tau], [strategy_end], **kwargs)


def ends_with(recent: jax.Array, table: jax.Array) -> jax.Array:
  """Whether each row's recent tokens end with each sequence of a right-aligned table.

  recent [B, W] holds the last W generated tokens (oldest first, -1 where fewer were generated);
  table [M, w] with w <= W. Returns [B, M] bool.
  """
  w = table.shape[-1]
  tail = recent[:, recent.shape[-1] - w:]
  hit = (tail[:, None, :] == table[None]) | (table[None] == PAD_ID)
  # A table row of only padding is an unused slot, not an empty sequence that matches everything.
  used = jnp.any(table != PAD_ID, axis=-1)
  return jnp.all(hit, axis=-1) & used[None]


def advance_segment(segment: jax.Array, recent: jax.Array, params: SamplingParams) -> jax.Array:
  """The segment id after the newest token: +1 where the delimiter closing the current segment completed.

  segment [B] int32 (the segment the newest token was drawn in), recent [B, W] as in `ends_with`.
  The id never passes num_segments - 1 because only delimiters of existing segments are listed.
  """
  done = ends_with(recent, params.delimiters) & (params.delimiter_segments[None] == segment[:, None])
  return segment + jnp.any(done, axis=-1).astype(segment.dtype)


def push_token(recent: jax.Array, token: jax.Array) -> jax.Array:
  """Slide the window of recent tokens [B, W] by one, appending `token` [B]."""
  return jnp.concatenate([recent[:, 1:], token[:, None].astype(recent.dtype)], axis=1)


def window_width(params: SamplingParams) -> int:
  """Static width of the recent-token window that matching delimiters and stop sequences needs."""
  return max(1, params.delimiters.shape[-1], params.stop_sequences.shape[-1])


def segment_ids(tokens: jax.Array, mask: jax.Array, params: SamplingParams) -> jax.Array:
  """Per-token segment ids [B, N] of generated `tokens` [B, N] (mask [B, N] marks real ones).

  Recomputes offline what the sampler records, e.g. to derive per-token temperatures for stored
  responses: temperature of token t = temperatures[segment_ids[t]].
  """
  B = tokens.shape[0]
  W = window_width(params)

  def step(carry, xs):
    segment, recent = carry
    tok, m = xs
    new_recent = push_token(recent, tok)
    new_segment = advance_segment(segment, new_recent, params)
    return ((jnp.where(m, new_segment, segment), jnp.where(m[:, None], new_recent, recent)), segment)

  init = (jnp.zeros((B,), jnp.int32), jnp.full((B, W), PAD_ID, jnp.int32))
  _, segs = jax.lax.scan(step, init, (tokens.T.astype(jnp.int32), mask.T.astype(bool)))
  return jnp.where(mask, segs.T, -1)


def temperature_per_token(segments: jax.Array, params: SamplingParams) -> jax.Array:
  """Temperatures [B, N] of tokens with segment ids `segments` [B, N] (0 where the id is -1)."""
  temps = params.temperatures
  if temps.ndim == 1:
    temps = jnp.broadcast_to(temps, (segments.shape[0], temps.shape[0]))
  t = jnp.take_along_axis(temps, jnp.maximum(segments, 0), axis=1)
  return jnp.where(segments >= 0, t, 0.0)
