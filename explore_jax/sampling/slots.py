"""Continuous batching: a fixed set of decode slots, refilled with waiting prompts between jitted chunks.

`generate` (sampler.py) samples a batch in lock step: every row waits for the longest, rows that finish early
idle, and prompts of different widths go to different calls. A `SlotEngine` instead keeps `slots` rows of
decode state on the device, each row with its own cache index and position (a KV cache indexed per row,
models/transformer.py). Prompts are `submit`ted at any time; each `advance` is one round on the host:

  1. insert   waiting prompts into free slots: one batched prefill per prompt width (`width_bucket`), its rows
              copied into the slots. Prompts that are equal (the G samples of a task group at their first
              step: same tokens, same images) are prefilled once and copied into G slots.
  2. decode   a jitted `lax.while_loop` of decode steps over all slots, which returns as soon as enough slots
              have finished to take the next waiting prompts (or, with none waiting, half of the live rows, so
              that the tail can shrink; with `streaming`, the first row done), or when every slot is done.
  3. harvest  finished rows' outputs to the host; their slots become free.
  4. shrink   with nothing waiting and at most half the slots live, the live rows are gathered into a state of
              half the rows (down to `tail_rows`): the tail decodes at a smaller compiled width instead of
              carrying finished rows. New prompts grow it back to `slots` rows.

`sample` runs a list of prompts through one engine to the end (a call of the inference server under
rollout.batching = "continuous"), its cache cut to the widest of them (in a power of two of width buckets);
train/inference.py's StreamingPolicy keeps engines across the pool's rounds ("streaming").

A row draws exactly as in `generate`: token t of the row with id r from key fold_in(fold_in(rng, r), t), at the
temperature of its segment, filtered by top-k / top-p, with EOS ids and stop sequences ending it; a prompt of
width P is laid out as `generate` lays it at width P (left padding, its last token consumed by the first decode
step), in a cache of `cache_len` + max_new_tokens slots. So a row's tokens and log-probs are those `generate`
gives it alone at that width, up to the last bits of float reductions whose shapes differ (the batch it decodes
in, the masked cache columns beyond its own): tests/sampling/test_slots.py measures them (log-probs within 5e-6
on its cases). Finished rows stay in the batch until harvested, consuming their last token again at the same
slot and position (an idempotent write), which with `return_hidden` gives the state after the last token
(`generate`'s hidden at the last token).

Images: the caller's `extras(tags, prompt, mask)` gives a prefill batch's `image_features` and `mrope`
(positions [n, P, 3], deltas [n]) as `generate` takes them; decode positions then carry each row's delta.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
from typing import Any, Callable, Hashable, NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from explore_jax.models import KVCache, Model, positions_from_mask
from explore_jax.models import decode_attention as decode_attention_lib
from explore_jax.models.config import language_config
from explore_jax.parallel import distributed, sharding
from explore_jax.sampling import schedule
from explore_jax.sampling.sampler import (FinishReason, _constrain_tree, inverse_cdf_sample, left_pad,
                                          sampling_log_probs)
from explore_jax.sampling.schedule import SamplingParams

Params = dict[str, Any]


class Slots(NamedTuple):
  """The decode state of B slots; [B, N] buffers hold each row's tokens, N = max_new_tokens."""
  cache: KVCache            # indexed per row: index [B] = the slot the row's next input is written to
  next_input: jax.Array     # [B] int32: the token the next decode step consumes
  step: jax.Array           # [B] int32: tokens drawn so far (the row's length; frozen once finished)
  prompt_len: jax.Array     # [B] int32: real prompt tokens
  delta: jax.Array          # [B] int32: the row's mRoPE delta (0 for text)
  row_ids: jax.Array        # [B] int32: the row's random stream
  tokens: jax.Array         # [B, N] int32
  logprobs: jax.Array       # [B, N] float32
  temperatures: jax.Array   # [B, N] float32
  segments: jax.Array       # [B, N] int32
  recent: jax.Array         # [B, W] last generated tokens (delimiters, stop sequences)
  segment: jax.Array        # [B] int32
  finished: jax.Array       # [B] bool (a free slot is finished)
  reason: jax.Array         # [B] int32 FinishReason
  pending: jax.Array        # [B] bool: finished, its last token's hidden state not taken yet
  hidden: Optional[jax.Array]  # [B, E]: the state after the row's last consumed input (return_hidden)


@dataclasses.dataclass
class RowOutput:
  """One prompt's sample, as `generate` gives a row (numpy, cut to its length)."""
  tokens: np.ndarray
  logprobs: np.ndarray
  temperatures: np.ndarray
  segments: np.ndarray
  finish_reason: int
  hidden: Optional[np.ndarray] = None  # [E]: the state after consuming the last token (return_hidden)


@dataclasses.dataclass
class SlotStats:
  """What the `sample` calls given this object did, summed (benchmarks/loop_sampler.py prints it)."""
  prefills: int = 0          # insert calls
  prefill_rows: int = 0      # rows prefilled (after sharing equal prompts)
  shared: int = 0            # slots filled from another slot's prefill
  chunks: int = 0            # decode calls
  decode_steps: int = 0      # decode steps run, summed over calls
  slot_steps: int = 0        # decode steps x rows, summed over calls
  live_steps: int = 0        # of those, steps of rows still drawing
  widths: set = dataclasses.field(default_factory=set)  # decode batch sizes used
  cache_lengths: set = dataclasses.field(default_factory=set)  # each row's cache slots, per engine


# ---- the device functions ------------------------------------------------------------------------

def _blank(rows: int, new_tokens: int, window: int, hidden: Optional[int], pad_id: int) -> Slots:
  """`rows` rows in their initial state, without a cache: finished, nothing drawn. `hidden`: the width of the
  final hidden state kept per row (None: not kept)."""
  i32 = lambda v: jnp.full((rows,), v, jnp.int32)  # noqa: E731
  return Slots(
      cache=None, next_input=i32(pad_id), step=i32(0), prompt_len=i32(1), delta=i32(0), row_ids=i32(0),
      tokens=jnp.full((rows, new_tokens), pad_id, jnp.int32), logprobs=jnp.zeros((rows, new_tokens), jnp.float32),
      temperatures=jnp.zeros((rows, new_tokens), jnp.float32),
      segments=jnp.full((rows, new_tokens), -1, jnp.int32),
      recent=jnp.full((rows, window), schedule.PAD_ID, jnp.int32), segment=i32(0),
      finished=jnp.ones((rows,), bool), reason=i32(FinishReason.LENGTH), pending=jnp.zeros((rows,), bool),
      hidden=None if hidden is None else jnp.zeros((rows, hidden), jnp.float32))


def _empty(model: Model, rows: int, length: int, new_tokens: int, window: int, hidden: bool, pad_id: int) -> Slots:
  width = language_config(model.config).hidden_size if hidden else None
  return _blank(rows, new_tokens, window, width, pad_id)._replace(
      cache=model.init_cache(rows, length, per_row=True))


_empty_jit = jax.jit(_empty, static_argnums=(0, 1, 2, 3, 4, 5, 6))


def _state_axes(state: Slots, model: Model) -> Slots:
  """Logical axes of a Slots tree: every leaf's first axis is the batch."""
  batch = lambda x: ("batch",) + (None,) * (x.ndim - 1)  # noqa: E731
  axes = jax.tree.map(batch, state._replace(cache=None))
  return axes._replace(cache=model.cache_axes(per_row=True))


def _insert(model: Model, params: Params, state: Slots, prompt: jax.Array, prompt_mask: jax.Array,
            positions: jax.Array, delta: jax.Array, dest: jax.Array, source: jax.Array, row_ids: jax.Array,
            image_features: Optional[jax.Array] = None, *, pad_id: int = 0) -> Slots:
  """Prefill `prompt` [n, P] (left-padded) and start slot dest[j] on prefill row source[j] with id row_ids[j];
  dest entries out of range (>= B) are ignored."""
  n, P = prompt.shape
  S = state.cache.mask.shape[1]
  params = _constrain_tree(model, params, model.param_axes())
  prompt_mask = prompt_mask.astype(bool)
  if P > 1:
    fresh = model.init_cache(n, P - 1)
    extra = {} if image_features is None else {"image_features": image_features}
    fresh = model.apply(params, prompt[:, :-1], positions[:, :-1], fresh, attention_mask=prompt_mask[:, :-1],
                        **extra).cache
  put = lambda buf, values: buf.at[dest].set(values.astype(buf.dtype), mode="drop")  # noqa: E731
  cache = state.cache
  if P > 1:
    k = tuple(buf.at[dest, :, :P - 1].set(f[source].astype(buf.dtype), mode="drop")
              for buf, f in zip(cache.k, fresh.k))
    v = tuple(buf.at[dest, :, :P - 1].set(f[source].astype(buf.dtype), mode="drop")
              for buf, f in zip(cache.v, fresh.v))
  else:
    k, v = cache.k, cache.v
  row_mask = jnp.pad(prompt_mask[:, :-1], ((0, 0), (0, S - (P - 1))))
  cache = KVCache(k=k, v=v, mask=put(cache.mask, row_mask[source]), index=put(cache.index, jnp.full_like(dest, P - 1)))
  # every other field of a started row is reset to a blank row's, then given its prompt's values
  hidden = None if state.hidden is None else state.hidden.shape[1]
  start = _blank(dest.shape[0], state.tokens.shape[1], state.recent.shape[1], hidden, pad_id)._replace(
      next_input=prompt[source, -1], prompt_len=jnp.sum(prompt_mask, axis=-1)[source], delta=delta[source],
      row_ids=row_ids, finished=jnp.zeros(dest.shape, bool))
  new = jax.tree.map(put, state._replace(cache=None), start)._replace(cache=cache)
  return _constrain_tree(model, new, _state_axes(new, model))


def _decode(model: Model, params: Params, state: Slots, rng: jax.Array, sampling: SamplingParams,
            target: jax.Array, max_steps: jax.Array, *, top_k: int, attention: str) -> tuple[Slots, jax.Array]:
  """Decode steps until `target` slots are done (finished, hidden taken), all are, or `max_steps` ran; also the
  steps run."""
  B, N = state.tokens.shape
  params = _constrain_tree(model, params, model.param_axes())
  temps = sampling.temperatures.astype(jnp.float32)
  top_p = jnp.broadcast_to(sampling.top_p.astype(jnp.float32), (B,))
  rows = jnp.arange(B)
  want_hidden = state.hidden is not None

  def body(carry):
    s, i = carry
    active = ~s.finished
    pos = (s.prompt_len - 1 + s.step + s.delta)[:, None]
    out = model.apply(params, s.next_input[:, None], pos, s.cache, return_hidden=want_hidden,
                      decode_attention=attention)
    logits = out.logits[:, 0]
    temp = temps[s.segment]
    logp = sampling_log_probs(logits, temp, top_k, top_p)
    greedy = jnp.argmax(logits, axis=-1).astype(jnp.int32)

    def draw(_):
      keys = jax.vmap(lambda r, t: jax.random.fold_in(jax.random.fold_in(rng, r), t))(s.row_ids, s.step)
      u = jax.vmap(lambda k: jax.random.uniform(k, (), jnp.float32))(keys)
      return jnp.where(temp > 0, inverse_cdf_sample(logp, u), greedy)

    token = jax.lax.cond(jnp.any(active & (temp > 0)), draw, lambda _: greedy, None)
    lp = jnp.take_along_axis(logp, token[:, None], axis=1)[:, 0]
    token = jnp.where(active, token, s.next_input)  # a finished row consumes its last token again

    col = jnp.where(active, s.step, N)  # out of range: not written
    put = lambda buf, x: buf.at[rows, col].set(x.astype(buf.dtype), mode="drop")  # noqa: E731
    recent = jnp.where(active[:, None], schedule.push_token(s.recent, token), s.recent)
    is_eos = jnp.any(token[:, None] == sampling.eos_ids[None], axis=-1) & active
    is_stop = jnp.any(schedule.ends_with(recent, sampling.stop_sequences), axis=-1) & active
    now = is_eos | is_stop | (active & (s.step + 1 >= N))
    reason = jnp.where(now, jnp.where(is_eos, FinishReason.EOS,
                                      jnp.where(is_stop, FinishReason.STOP, FinishReason.LENGTH)), s.reason)
    hidden = s.hidden
    if want_hidden:
      took = active | s.pending
      hidden = jnp.where(took[:, None], out.hidden[:, 0].astype(jnp.float32), s.hidden)
    cache = out.cache._replace(index=s.cache.index + active.astype(jnp.int32))
    new = s._replace(
        cache=cache, next_input=token, step=s.step + active.astype(jnp.int32),
        tokens=put(s.tokens, token), logprobs=put(s.logprobs, lp), temperatures=put(s.temperatures, temp),
        segments=put(s.segments, s.segment), recent=recent,
        segment=jnp.where(active, schedule.advance_segment(s.segment, recent, sampling), s.segment),
        finished=s.finished | now, reason=reason, pending=now & want_hidden, hidden=hidden)
    return new, i + 1

  def cond(carry):
    s, i = carry
    done = s.finished & ~s.pending
    return ~jnp.all(done) & (jnp.sum(done) < target) & (i < max_steps)

  state, steps = jax.lax.while_loop(cond, body, (state, jnp.zeros((), jnp.int32)))
  return state, steps


def _resize(model: Model, state: Slots, empty: Slots, rows: jax.Array) -> Slots:
  """Row j of the result is row rows[j] of `state`, or of `empty` where rows[j] < 0 (a smaller or larger batch)."""
  take = rows >= 0
  new = jax.tree.map(lambda x, e: jnp.where(take.reshape((-1,) + (1,) * (e.ndim - 1)), x[jnp.maximum(rows, 0)], e),
                     state, empty)
  return _constrain_tree(model, new, _state_axes(new, model))


@functools.cache
def _compiled(name: str) -> Callable:
  """The jitted device function `name`, donating the slot state where the backend can reuse its buffers (an
  accelerator: the cache is updated in place; the CPU backend cannot, and warns)."""
  fn, static, state_arg = {"insert": (_insert, ("model", "pad_id"), 2),
                           "decode": (_decode, ("model", "top_k", "attention"), 2),
                           "resize": (_resize, ("model",), 1)}[name]
  donate = (state_arg,) if jax.default_backend() != "cpu" else ()
  return jax.jit(fn, static_argnames=static, donate_argnums=donate)


# ---- the host loop -------------------------------------------------------------------------------

# extras(tags, prompt, mask): a prefill batch's image_features and mrope for the prompts submitted with `tags`.
Extras = Callable[[list[Any], np.ndarray, np.ndarray], dict[str, Any]]


@dataclasses.dataclass
class _Waiting:
  tag: Any
  prompt: list[int]
  row_id: int
  share: Hashable
  width: int


class SlotEngine:
  """Decode slots that prompts stream into (module docstring): `submit` queues a prompt, `advance` runs one round
  (insert what fits, decode until enough rows are done, harvest, shrink) and returns the finished rows as (tag,
  RowOutput) pairs; `busy` while prompts wait or rows decode.

  `chunk_steps` bounds a round's decode steps (None: a round ends only when rows are done). With `streaming` a
  round with nothing waiting ends as soon as one row is done, so that a caller streaming requests in hands each
  response out at once (and inserts what arrived meanwhile at the next round). The rows start as `slots` slots;
  the tail shrinks to `tail_rows` (default slots // 4; `slots` never shrinks) and grows back to `slots` when
  prompts arrive. `sampling` holds one schedule for all rows. `decode_attention`: how a row attends to its keys
  (models/decode_attention.py).
  """

  def __init__(self, model: Model, params: Params, sampling: SamplingParams, rng: jax.Array, *, slots: int,
               max_new_tokens: int, cache_len: int, width_bucket: int = 64, pad_id: int = 0, top_k: int = 0,
               return_hidden: bool = False, extras: Optional[Extras] = None, min_prefill_rows: int = 4,
               tail_rows: Optional[int] = None, chunk_steps: Optional[int] = None, streaming: bool = False,
               decode_attention: str = "dense", stats: Optional[SlotStats] = None):
    if sampling.temperatures.ndim != 1 or np.ndim(sampling.top_p) != 0:
      raise ValueError("continuous batching takes one sampling schedule for all rows (1-D temperatures, scalar "
                       "top_p)")
    self.model, self.params, self.sampling, self.rng = model, params, sampling, rng
    self.slots, self.new_tokens = int(slots), int(max_new_tokens)
    self.cache_len, self.bucket = int(cache_len), int(width_bucket)
    self.pad_id, self.top_k, self.return_hidden, self.extras = pad_id, top_k, return_hidden, extras
    self.min_prefill_rows = max(1, int(min_prefill_rows))
    self.floor = max(1, min(self.slots, int(tail_rows) if tail_rows is not None else self.slots // 4))
    self.chunk_steps, self.streaming = chunk_steps, streaming
    self.attention = decode_attention
    multiple = decode_attention_lib.cache_multiple(decode_attention)
    self.length = -(-(self.cache_len + self.new_tokens) // multiple) * multiple  # the cache's slots per row
    self.stats = SlotStats() if stats is None else stats
    self.stats.cache_lengths.add(self.length)
    self.waiting: collections.deque[_Waiting] = collections.deque()
    self.state: Optional[Slots] = None
    self.owner: list[Optional[_Waiting]] = []  # what each row holds
    self.drawn = np.zeros((0,), np.int64)      # each row's tokens at the last harvest (stats)

  @property
  def busy(self) -> bool:
    return bool(self.waiting) or any(o is not None for o in self.owner)

  def width(self, prompt: Sequence[int]) -> int:
    return min(self.cache_len, -(-len(prompt) // self.bucket) * self.bucket)

  def submit(self, tag: Any, prompt: Sequence[int], row_id: int, share: Optional[Hashable] = None) -> None:
    """Queue `prompt` (token ids) with random stream `row_id`; prompts with an equal `share` key (default: the
    tokens) may share a prefill, so give equal keys only to equal prompts, images included."""
    if not len(prompt):
      raise ValueError("every prompt needs at least one token")
    prompt = [int(t) for t in prompt]
    self.waiting.append(_Waiting(tag, prompt, int(row_id), tuple(prompt) if share is None else share,
                                 self.width(prompt)))

  def advance(self) -> list[tuple[Any, RowOutput]]:
    """One round (class docstring); the rows that finished in it."""
    if self.waiting:
      self._resize(self.slots)
      self._fill()
    if not any(o is not None for o in self.owner):
      return []
    B = len(self.owner)
    live = sum(o is not None for o in self.owner)
    if self.waiting:  # return when the next prefill's rows are free
      target = (B - live) + min(len(self.waiting), self.min_prefill_rows, live)
    elif self.streaming:  # return each response as soon as it is done
      target = (B - live) + 1
    elif B > self.floor:  # return when half the rows are done, to shrink
      target = B - max(B // 2, self.floor)
    else:
      target = B
    max_steps = self.new_tokens + 1 if self.chunk_steps is None else int(self.chunk_steps)
    self.state, steps = _compiled("decode")(self.model, self.params, self.state, self.rng, self.sampling,
                                            jnp.int32(max(target, 1)), jnp.int32(max_steps), top_k=self.top_k,
                                            attention=self.attention)
    finished, pending, lengths, steps = (np.asarray(x) for x in distributed.fetch(
        (self.state.finished, self.state.pending, self.state.step, steps)))
    occupied = np.array([o is not None for o in self.owner])
    st = self.stats
    st.chunks += 1
    st.decode_steps += int(steps)
    st.slot_steps += int(steps) * B
    st.live_steps += int(np.sum((lengths - self.drawn)[occupied]))
    st.widths.add(B)
    self.drawn = lengths.copy()
    done = [b for b in range(B) if occupied[b] and finished[b] and not pending[b]]
    out = []
    if done:
      s = self.state
      tokens, logprobs, temps, segments, reason, hidden = distributed.fetch(
          (s.tokens, s.logprobs, s.temperatures, s.segments, s.reason, s.hidden))
      for b in done:
        m = int(lengths[b])
        out.append((self.owner[b].tag, RowOutput(
            tokens=np.asarray(tokens[b, :m]), logprobs=np.asarray(logprobs[b, :m]),
            temperatures=np.asarray(temps[b, :m]), segments=np.asarray(segments[b, :m]),
            finish_reason=int(reason[b]), hidden=None if hidden is None else np.asarray(hidden[b], np.float32))))
        self.owner[b] = None
    live = sum(o is not None for o in self.owner)
    if not self.waiting and live and B > self.floor and live <= B // 2:
      self._resize(max(B // 2, self.floor))
    return out

  def _resize(self, rows: int) -> None:
    """`rows` rows: the live ones first, then free ones (a new state's when growing)."""
    if self.state is None:
      self.state = _empty_jit(self.model, rows, self.length, self.new_tokens,
                              schedule.window_width(self.sampling), self.return_hidden, self.pad_id)
      self.owner, self.drawn = [None] * rows, np.zeros((rows,), np.int64)
      return
    B = len(self.owner)
    if rows == B:
      return
    live = [b for b in range(B) if self.owner[b] is not None]
    order = (live + [b for b in range(B) if self.owner[b] is None])[:rows]
    order += [-1] * (rows - len(order))  # new free rows
    empty = _empty_jit(self.model, rows, self.length, self.new_tokens,
                       schedule.window_width(self.sampling), self.return_hidden, self.pad_id)
    self.state = _compiled("resize")(self.model, self.state, empty, jnp.asarray(order, jnp.int32))
    self.owner = [self.owner[b] if b >= 0 else None for b in order]
    self.drawn = np.array([self.drawn[b] if b >= 0 else 0 for b in order], np.int64)

  def _fill(self) -> None:
    """Waiting prompts into the free rows, in order; one prefill per width."""
    free = [b for b, o in enumerate(self.owner) if o is None]
    taken = [self.waiting.popleft() for _ in range(min(len(free), len(self.waiting)))]
    by_width: dict[int, list[_Waiting]] = {}
    for w in taken:
      by_width.setdefault(w.width, []).append(w)
    for P, group in sorted(by_width.items()):
      rows, free = free[:len(group)], free[len(group):]
      self._insert(group, rows, P)
      for b, w in zip(rows, group):
        self.owner[b], self.drawn[b] = w, 0

  def _insert(self, group: list[_Waiting], rows: list[int], P: int) -> None:
    """Prefill `group` (all of width P) into `rows`, equal prompts once."""
    B = len(self.owner)
    unique: dict[Hashable, int] = {}
    source = [unique.setdefault(w.share, len(unique)) for w in group]
    firsts = [group[source.index(j)] for j in range(len(unique))]  # the first prompt of each share key
    n = _bucket(len(firsts), self.min_prefill_rows, B)
    tokens, mask = left_pad([w.prompt for w in firsts], P, n, self.pad_id)
    dest = np.full((B,), B, np.int32)  # out of range: not written
    src, ids = np.zeros((B,), np.int32), np.zeros((B,), np.int32)
    dest[:len(group)], src[:len(group)], ids[:len(group)] = rows, source, [w.row_id for w in group]
    if self.extras is not None:
      more = self.extras([w.tag for w in firsts], tokens, mask)
      positions, delta = more["mrope"]
      image_features = more.get("image_features")
    else:
      positions, delta, image_features = positions_from_mask(jnp.asarray(mask)), np.zeros((n,), np.int32), None
    st = self.stats
    st.prefills += 1
    st.prefill_rows += len(firsts)
    st.shared += len(group) - len(firsts)
    self.state = _compiled("insert")(self.model, self.params, self.state, jnp.asarray(tokens), jnp.asarray(mask),
                                     jnp.asarray(positions), jnp.asarray(delta, jnp.int32), jnp.asarray(dest),
                                     jnp.asarray(src), jnp.asarray(ids), image_features,
                                     pad_id=self.pad_id)


def sample(model: Model, params: Params, prompts: Sequence[Sequence[int]], sampling: SamplingParams,
           rng: jax.Array, *, row_ids: Sequence[int], share: Optional[Sequence[Hashable]] = None,
           **engine: Any) -> list[RowOutput]:
  """Every prompt through a SlotEngine (module docstring); one RowOutput per prompt, in order.

  row_ids name each prompt's random stream (distinct per sample); share[i] (default: the tokens) marks prompts
  that may share a prefill. Prompts are queued by width, so that prefills are full. `engine`: SlotEngine's
  options (slots, max_new_tokens and cache_len are needed; extras get prompt indices as tags).
  """
  if len(row_ids) != len(prompts):
    raise ValueError(f"{len(prompts)} prompts but {len(row_ids)} row ids")
  # A call knows all its prompts, so its cache need hold only the widest of them, not the whole prompt budget that
  # an engine fed over time keeps: every decode step attends over the cache (the dense path over all of it). In a
  # power-of-two number of width buckets, so that calls compile a few cache lengths, not one per width.
  bucket = int(engine.get("width_bucket", 64))
  buckets = -(-max((len(p) for p in prompts), default=1) // bucket)
  engine = {**engine, "cache_len": min(int(engine["cache_len"]), bucket * (1 << (buckets - 1).bit_length()))}
  e = SlotEngine(model, params, sampling, rng, **engine)
  for i in sorted(range(len(prompts)), key=lambda i: (e.width(prompts[i]), i)):
    e.submit(i, prompts[i], row_ids[i], None if share is None else share[i])
  out: list[Optional[RowOutput]] = [None] * len(prompts)
  while e.busy:
    for i, row in e.advance():
      out[i] = row
  return out  # type: ignore[return-value]


def _bucket(n: int, low: int, high: int) -> int:
  """The smallest power-of-two multiple of `low` that holds n, at most max(high, n)."""
  rows = low
  while rows < n:
    rows *= 2
  return max(min(rows, high), n)
