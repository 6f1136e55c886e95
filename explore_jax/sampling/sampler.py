"""The jitted sampler (prefill + `lax.while_loop` decode on a preallocated KV cache) and its training twin.

`generate` samples responses for a batch of prompts in one compiled function:

* Prompts are LEFT-padded: `prompt_mask` [B, P] is False on a prefix of each row and True after it, so
  every row's last prompt token is in column P-1 and generated token t of every row sits in cache slot
  P + t. RoPE positions come from the mask (`positions_from_mask`), so a row's tokens see the same
  positions however much padding its batch adds. Left padding also makes
  `concat([prompt, response])` a gap-free record for `response_logprobs`.
* Prefill writes the first P-1 prompt tokens into the cache; each decode step then consumes one token
  (step 0 the last prompt token, step i the generated token i-1) and draws the next. The loop stops when
  every row has finished: an EOS id, a completed stop sequence (both kept in the output and counted in
  the length), or `max_new_tokens`.
* Randomness is per row: row b uses key fold_in(rng, row_ids[b]) and token t of that row
  fold_in(row key, t). A row's output therefore depends only on its prompt, its row id and the key,
  not on the batch it shares (padding, other prompts, batch size, device mesh). Give the G samples of
  one prompt distinct row ids (e.g. the global sample index); default row ids are 0..B-1.
* Token t is drawn at the temperature of the segment it is in (see `schedule.py`): the per-token
  temperature and segment id are returned with the tokens.

What log-probability is recorded: log pi_T(token), where pi_T = softmax(filter(logits / T)), the
distribution the token was drawn from; `filter` is top-k then top-p (nucleus) on the tempered
distribution (Hugging Face's order), and filtered-out tokens get logit -1e30 (probability 0).
At T = 0 the token is the argmax of the logits and the recorded log-probability is that of the
untempered model, T = 1 (with the same filters): a point mass has no useful log-probability, and
T = 1 keeps greedy rollouts scoreable. `token_logprobs` treats a recorded temperature 0 the same way.
With no top-k/top-p (the default) `token_logprobs` reproduces the recorded values exactly (up to float
rounding), so PPO's ratio starts at 1. With filtering, `token_logprobs` matches only if it is given the
same `top_k`/`top_p`; the plain tempered softmax it computes by default is smaller than the recorded
filtered value (the filtered distribution renormalises over fewer tokens), so the first ratio is <= 1.

Vision-language models (models/vl.py's VLModel) sample the same way from prompts with images: `images` are the
prompts' VisionInputs (their merged features replace the image tokens in prefill) and `mrope` the prompts'
multimodal RoPE positions [B, P, 3] and rope deltas [B] (`vl.mrope_positions`); generated token t of a row
then sits at (prompt length - 1 + t + delta) on all three coordinates, as the model continues a prompt.

Hidden states (`return_hidden=True`): hidden[b, t] is the final-norm hidden state of the model at the
position of generated token t, i.e. the state after consuming token t (the one that predicts token t+1).
For a response's last token this is the "final hidden state at the action's last token" that RND
(i-MENTOR, SGE's baseline) feeds its networks. It costs one extra decode step after the loop.
"""

from __future__ import annotations

import enum
from typing import Any, NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from explore_jax.models import KVCache, Model, positions_from_mask
from explore_jax.models.config import language_config
from explore_jax.parallel import sharding
from explore_jax.sampling import schedule
from explore_jax.sampling.schedule import SamplingParams

Params = dict[str, Any]
_MASKED = -1e30  # logit of a filtered-out token: probability 0 but finite, so entropies and grads stay NaN-free


class FinishReason(enum.IntEnum):
  """Why a row stopped (values of `SampleOutput.finish_reason`)."""
  LENGTH = 0  # reached max_new_tokens
  EOS = 1     # generated an EOS id (included in the output)
  STOP = 2    # completed a stop sequence (included in the output)


class SampleOutput(NamedTuple):
  """What `generate` returns; [B, N] arrays have N = max_new_tokens, entries past `lengths` are padding."""
  tokens: jax.Array         # [B, N] int32, pad_id after the end
  logprobs: jax.Array       # [B, N] float32, log pi_T(token) (see module docstring), 0 after the end
  temperatures: jax.Array   # [B, N] float32, temperature each token was drawn at, 0 after the end
  segments: jax.Array       # [B, N] int32, segment id of each token, -1 after the end
  mask: jax.Array           # [B, N] bool, token is part of the response
  lengths: jax.Array        # [B] int32
  finish_reason: jax.Array  # [B] int32, a FinishReason
  hidden: Optional[jax.Array] = None  # [B, N, embed], state after consuming each token; 0 after the end


class TokenLogprobs(NamedTuple):
  logprobs: jax.Array                 # [B, T] float32
  entropy: Optional[jax.Array] = None  # [B, T] float32, entropy of the distribution each token was drawn from


# ---- the sampling distribution (shared by sampler and learner, so they agree by construction) --------

def _expand_to(x: jax.Array, batch_shape: tuple[int, ...]) -> jax.Array:
  """Right-pad x's shape with singleton axes so it broadcasts against `batch_shape` from the left."""
  return jnp.reshape(x, x.shape + (1,) * (len(batch_shape) - x.ndim))


def _top_k(scaled: jax.Array, k: int) -> jax.Array:
  # Ties with the k-th value are all kept: a threshold, not an index set, keeps this a cheap elementwise op.
  kth = jax.lax.top_k(scaled, k)[0][..., -1:]
  return jnp.where(scaled >= kth, scaled, _MASKED)


def _top_p(scaled: jax.Array, top_p: jax.Array) -> jax.Array:
  """Keep the smallest set of most likely tokens whose probability reaches top_p (ties at the edge kept)."""
  probs = jax.nn.softmax(scaled, axis=-1)
  desc = -jnp.sort(-probs, axis=-1)
  mass_before = jnp.cumsum(desc, axis=-1) - desc
  kept = jnp.sum(mass_before < top_p[..., None], axis=-1, keepdims=True)  # >= 1: the first has mass 0 before
  cutoff = jnp.take_along_axis(desc, kept - 1, axis=-1)
  return jnp.where(probs >= cutoff, scaled, _MASKED)


def sampling_log_probs(logits: jax.Array, temperature: jax.Array, top_k: int = 0,
                       top_p: Optional[jax.Array] = None) -> jax.Array:
  """log softmax(filter(logits / T)) over the vocabulary: the distribution tokens are drawn from.

  logits [..., V] float32; temperature broadcastable to logits.shape[:-1] from the left (0 = greedy,
  scored at T = 1); top_k static (0 = off); top_p broadcastable like temperature (None or 1 = off).
  """
  batch_shape = logits.shape[:-1]
  temperature = jnp.asarray(temperature, jnp.float32)
  t = jnp.where(temperature > 0, temperature, 1.0)
  scaled = logits.astype(jnp.float32) / _expand_to(t, batch_shape)[..., None]
  if top_k and top_k < logits.shape[-1]:
    scaled = _top_k(scaled, top_k)
  if top_p is not None:
    p = jnp.broadcast_to(_expand_to(jnp.asarray(top_p, jnp.float32), batch_shape), batch_shape)
    # A scalar predicate makes this a real branch: the sort is skipped when no row asks for top-p.
    scaled = jax.lax.cond(jnp.any(p < 1.0), lambda s: _top_p(s, p), lambda s: s, scaled)
  return jax.nn.log_softmax(scaled, axis=-1)


def inverse_cdf_sample(logp: jax.Array, u: jax.Array) -> jax.Array:
  """Draw from exp(logp) [B, V] with one uniform u [B] in [0, 1) per row: the first token whose CDF exceeds u.

  One random number per row instead of Gumbel-max's V: on CPU the B x V random bits cost a quarter of
  a tiny model's decode step. Exact up to float32 rounding of the CDF (about 6e-8 of the total mass),
  the same order as the tail Gumbel noise from 24-bit uniforms reaches. Zero-probability (filtered)
  tokens are never drawn: their CDF entry equals the one before.
  """
  probs = jnp.exp(logp)
  cdf = jnp.cumsum(probs, axis=-1)
  target = u * cdf[:, -1]
  index = jnp.sum(cdf <= target[:, None], axis=-1, dtype=jnp.int32)
  # u * total can round up to total; fall back to the last token with mass rather than past the end.
  last = logp.shape[-1] - 1 - jnp.argmax(probs[:, ::-1] > 0, axis=-1).astype(jnp.int32)
  return jnp.minimum(index, last)


def _entropy(logp: jax.Array) -> jax.Array:
  return -jnp.sum(jnp.exp(logp) * logp, axis=-1)


# ---- sharding helpers ------------------------------------------------------------------------------

def _constrain_tree(model: Model, tree: Any, axes: Any) -> Any:
  if model.mesh is None or model.rules is None:
    return tree
  return jax.tree.map(lambda x, a: sharding.constrain(x, a, model.mesh, model.rules), tree, axes,
                      is_leaf=lambda a: isinstance(a, tuple) and all(e is None or isinstance(e, str) for e in a))


def shard_params(model: Model, params: Params) -> Params:
  """Place params on the model's mesh by their logical axes (a no-op for a model without a mesh)."""
  if model.mesh is None or model.rules is None:
    return params
  return jax.device_put(params, sharding.tree_shardings(model.mesh, model.param_axes(), model.rules, params))


# ---- the sampler ----------------------------------------------------------------------------------

class _Loop(NamedTuple):
  step: jax.Array        # [] int32: index of the token drawn in this iteration
  next_input: jax.Array  # [B] int32: token consumed by this iteration's forward pass
  cache: KVCache
  tokens: jax.Array
  logprobs: jax.Array
  temperatures: jax.Array
  segments: jax.Array
  recent: jax.Array      # [B, W] last generated tokens, for delimiters and stop sequences
  segment: jax.Array     # [B] current segment id
  finished: jax.Array    # [B] bool
  reason: jax.Array      # [B] int32
  lengths: jax.Array     # [B] int32
  hidden: Optional[jax.Array]  # [B, N + 1, E]: column i = state after consuming the input of step i


def _generate(model: Model, params: Params, prompt: jax.Array, prompt_mask: jax.Array,
              sampling: SamplingParams, rng: jax.Array, row_ids: Optional[jax.Array],
              active: Optional[jax.Array] = None, images: Any = None, image_features: Optional[jax.Array] = None,
              mrope: Optional[tuple[jax.Array, jax.Array]] = None, *, max_new_tokens: int, top_k: int,
              return_hidden: bool, pad_id: int) -> SampleOutput:
  B, P = prompt.shape
  N = max_new_tokens
  params = _constrain_tree(model, params, model.param_axes())
  prompt = sharding.constrain(prompt.astype(jnp.int32), ("batch", "length"), model.mesh, model.rules)
  prompt_mask = prompt_mask.astype(bool)
  prompt_len = jnp.sum(prompt_mask, axis=-1, dtype=jnp.int32)
  if mrope is None:
    positions, delta = positions_from_mask(prompt_mask), jnp.zeros((B,), jnp.int32)
  else:
    positions, delta = mrope[0].astype(jnp.int32), mrope[1].astype(jnp.int32)
  image_kwargs = {"images": images} if images is not None else (
      {"image_features": image_features} if image_features is not None else {})

  temps = sampling.temperatures.astype(jnp.float32)
  temps = jnp.broadcast_to(temps, (B, temps.shape[-1]))
  top_p = jnp.broadcast_to(sampling.top_p.astype(jnp.float32), (B,))
  if row_ids is None:
    row_ids = jnp.arange(B, dtype=jnp.int32)
  row_keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(rng, row_ids)

  cache = model.init_cache(B, P + N)
  cache = _constrain_tree(model, cache, model.cache_axes())
  if P > 1:
    cache = model.apply(params, prompt[:, :-1], positions[:, :-1], cache,
                        attention_mask=prompt_mask[:, :-1], **image_kwargs).cache

  def forward(token: jax.Array, step: jax.Array, cache: KVCache):
    pos = (prompt_len - 1 + step + delta)[:, None]
    if mrope is not None:
      pos = jnp.broadcast_to(pos[..., None], (B, 1, 3))
    out = model.apply(params, token[:, None], pos, cache, return_hidden=return_hidden)
    return out.logits[:, 0], out.cache, (out.hidden[:, 0] if return_hidden else None)

  def body(s: _Loop) -> _Loop:
    logits, cache, h = forward(s.next_input, s.step, s.cache)
    hidden = s.hidden
    if return_hidden:
      hidden = jax.lax.dynamic_update_slice_in_dim(hidden, h[:, None].astype(hidden.dtype), s.step, axis=1)

    active = ~s.finished
    temp = jnp.take_along_axis(temps, s.segment[:, None], axis=1)[:, 0]
    logp = sampling_log_probs(logits, temp, top_k, top_p)
    greedy = jnp.argmax(logits, axis=-1).astype(jnp.int32)

    def draw(_):
      keys = jax.vmap(jax.random.fold_in, in_axes=(0, None))(row_keys, s.step)
      u = jax.vmap(lambda k: jax.random.uniform(k, (), jnp.float32))(keys)
      return jnp.where(temp > 0, inverse_cdf_sample(logp, u), greedy)

    token = jax.lax.cond(jnp.any(temp > 0), draw, lambda _: greedy, None)
    lp = jnp.take_along_axis(logp, token[:, None], axis=1)[:, 0]

    token = jnp.where(active, token, pad_id)
    recent = jnp.where(active[:, None], schedule.push_token(s.recent, token), s.recent)
    is_eos = jnp.any(token[:, None] == sampling.eos_ids[None], axis=-1) & active
    is_stop = jnp.any(schedule.ends_with(recent, sampling.stop_sequences), axis=-1) & active
    out_of_room = active & (s.step + 1 >= N)
    now = is_eos | is_stop | out_of_room
    reason = jnp.where(now, jnp.where(is_eos, FinishReason.EOS,
                                      jnp.where(is_stop, FinishReason.STOP, FinishReason.LENGTH)), s.reason)
    segment = jnp.where(active, schedule.advance_segment(s.segment, recent, sampling), s.segment)

    def put(buf, col):
      return jax.lax.dynamic_update_slice_in_dim(buf, col[:, None].astype(buf.dtype), s.step, axis=1)

    return _Loop(
        step=s.step + 1, next_input=token, cache=cache,
        tokens=put(s.tokens, token),
        logprobs=put(s.logprobs, jnp.where(active, lp, 0.0)),
        temperatures=put(s.temperatures, jnp.where(active, temp, 0.0)),
        segments=put(s.segments, jnp.where(active, s.segment, -1)),
        recent=recent, segment=segment, finished=s.finished | now, reason=reason,
        lengths=s.lengths + active.astype(jnp.int32), hidden=hidden)

  def cond(s: _Loop) -> jax.Array:
    return (s.step < N) & ~jnp.all(s.finished)

  E = language_config(model.config).hidden_size
  init = _Loop(
      step=jnp.zeros((), jnp.int32), next_input=prompt[:, -1], cache=cache,
      tokens=jnp.full((B, N), pad_id, jnp.int32), logprobs=jnp.zeros((B, N), jnp.float32),
      temperatures=jnp.zeros((B, N), jnp.float32), segments=jnp.full((B, N), -1, jnp.int32),
      recent=jnp.full((B, schedule.window_width(sampling)), schedule.PAD_ID, jnp.int32),
      segment=jnp.zeros((B,), jnp.int32),
      finished=jnp.zeros((B,), bool) if active is None else ~active.astype(bool),
      reason=jnp.full((B,), FinishReason.LENGTH, jnp.int32), lengths=jnp.zeros((B,), jnp.int32),
      hidden=jnp.zeros((B, N + 1, E), model.config.jnp_dtype) if return_hidden else None)
  s = jax.lax.while_loop(cond, body, init)

  mask = jnp.arange(N)[None, :] < s.lengths[:, None]
  hidden = None
  if return_hidden:
    # The last generated token has not been consumed yet; one more step gives its state.
    _, _, h = forward(s.next_input, s.step, s.cache)
    full = jax.lax.dynamic_update_slice_in_dim(s.hidden, h[:, None].astype(s.hidden.dtype), s.step, axis=1)
    hidden = jnp.where(mask[..., None], full[:, 1:], 0)
  return SampleOutput(tokens=s.tokens, logprobs=s.logprobs, temperatures=s.temperatures,
                      segments=s.segments, mask=mask, lengths=s.lengths, finish_reason=s.reason,
                      hidden=hidden)


generate_jit = jax.jit(_generate, static_argnames=("model", "max_new_tokens", "top_k", "return_hidden",
                                                   "pad_id"))
"""The compiled core of `generate`, without its input checks (for callers already under jit)."""


def left_pad(rows: Sequence[Sequence[int]], width: int, batch: int, pad_id: int = 0) -> tuple[np.ndarray, np.ndarray]:
  """`rows` as the [batch, width] left-padded prompt and mask that `generate` takes, each cut to its last `width`
  tokens. Rows past len(rows) are fillers holding one pad token (every mask row needs one real token); callers
  discard their outputs."""
  tokens = np.full((batch, width), pad_id, np.int32)
  mask = np.zeros((batch, width), bool)
  mask[:, -1] = True
  for i, ids in enumerate(rows):
    ids = list(ids)[-width:]
    tokens[i, width - len(ids):], mask[i, width - len(ids):] = ids, True
  return tokens, mask


def generate(model: Model, params: Params, prompt: jax.Array, prompt_mask: jax.Array,
             sampling: SamplingParams, rng: jax.Array, *, max_new_tokens: int,
             row_ids: Optional[jax.Array] = None, active: Optional[jax.Array] = None, images: Any = None,
             image_features: Optional[jax.Array] = None, mrope: Optional[tuple[Any, Any]] = None, top_k: int = 0,
             return_hidden: bool = False, pad_id: int = 0) -> SampleOutput:
  """Sample up to `max_new_tokens` tokens for each left-padded prompt, in one jitted call.

  prompt [B, P] int, prompt_mask [B, P] bool (left padding, >= 1 real token per row); sampling: the
  per-segment temperatures, delimiters, stop criteria and top-p (`make_sampling_params`); rng a PRNG key;
  row_ids [B] int (default 0..B-1) name each row's random stream; active [B] bool (default all) marks the
  rows to sample: the others (filler rows of a fixed batch shape) start finished, with no tokens, so decoding
  stops with the last active row instead of running on for rows whose output is discarded. A row's output
  does not depend on the other rows. images (VisionInputs) or their merged features image_features [M, E], and
  mrope ([B, P, 3] positions, [B] deltas): a VLModel's prompts with images (module docstring). top_k static
  (0 = off). Recompiles only
  for new shapes or static arguments, never for new values in `sampling`. With a `Model` carrying a mesh
  and rules, params, cache and batch are sharded by their logical axes (`shard_params` places params
  once ahead of time so that calls do not re-layout them).
  """
  if prompt.ndim != 2 or prompt_mask.shape != prompt.shape:
    raise ValueError(f"prompt {prompt.shape} and prompt_mask {prompt_mask.shape} must both be [B, P]")
  B = prompt.shape[0]
  if sampling.temperatures.ndim == 2 and sampling.temperatures.shape[0] != B:
    raise ValueError(f"per-row temperatures {sampling.temperatures.shape} do not match batch {B}")
  if sampling.top_p.ndim == 1 and sampling.top_p.shape[0] != B:
    raise ValueError(f"per-row top_p {sampling.top_p.shape} does not match batch {B}")
  if row_ids is not None and np.shape(row_ids) != (B,):
    raise ValueError(f"row_ids must be [B]={B}, got {np.shape(row_ids)}")
  if active is not None and np.shape(active) != (B,):
    raise ValueError(f"active must be [B]={B}, got {np.shape(active)}")
  if images is not None and image_features is not None:
    raise ValueError("give the prompts' images or their image_features, not both")
  if (images is not None or image_features is not None) and mrope is None:
    raise ValueError("prompts with images need their multimodal RoPE positions: pass mrope=(positions, deltas) "
                     "from models.vl.mrope_positions")
  if mrope is not None and (np.shape(mrope[0]) != (B, prompt.shape[1], 3) or np.shape(mrope[1]) != (B,)):
    raise ValueError(f"mrope must be positions [B, P, 3] = {[B, prompt.shape[1], 3]} and deltas [B] = [{B}], got "
                     f"{list(np.shape(mrope[0]))} and {list(np.shape(mrope[1]))}")
  if max_new_tokens < 1:
    raise ValueError("max_new_tokens must be >= 1")
  try:
    m = np.asarray(prompt_mask).astype(bool)
  except jax.errors.TracerArrayConversionError:
    m = None  # under an outer jit the layout cannot be checked here
  if m is not None:
    if not m[:, -1].all() or np.any(m[:, :-1] & ~m[:, 1:]):
      raise ValueError("prompts must be left-padded with at least one real token: each mask row is "
                       "False...False True...True")
  return generate_jit(model, params, prompt, prompt_mask, sampling, rng, row_ids, active, images, image_features,
                      mrope, max_new_tokens=max_new_tokens, top_k=top_k, return_hidden=return_hidden, pad_id=pad_id)


# ---- the learner's side ---------------------------------------------------------------------------

def token_logprobs(model: Model, params: Params, tokens: jax.Array, temperatures: jax.Array,
                   attention_mask: Optional[jax.Array] = None, *, positions: Optional[jax.Array] = None,
                   top_k: int = 0, top_p: Optional[jax.Array] = None,
                   return_entropy: bool = False) -> TokenLogprobs:
  """log pi_T(tokens[t] | tokens[<t]) at each token's recorded temperature, from one full forward pass.

  tokens [B, T] (e.g. prompt and response concatenated), temperatures [B, T] (the temperature token t
  was drawn at; ignored where it does not matter, 0 = greedy is scored at T = 1 like the sampler),
  attention_mask [B, T] marks real tokens (any padding; positions default to `positions_from_mask`).
  Column 0 and padding get 0. Pure and differentiable: call it inside the learner's loss.
  Equals `generate`'s recorded logprobs when top_k/top_p are those of the sampler (default: none).
  """
  B, T = tokens.shape
  if attention_mask is None:
    attention_mask = jnp.ones((B, T), bool)
  attention_mask = attention_mask.astype(bool)
  if positions is None:
    positions = positions_from_mask(attention_mask)
  logits = model.apply(params, tokens, positions, attention_mask=attention_mask).logits
  lp, entropy = _score(logits[:, :-1], tokens[:, 1:], temperatures[:, 1:], attention_mask[:, 1:], top_k,
                       top_p, return_entropy)
  first = ((0, 0), (1, 0))  # column 0 has no prediction
  return TokenLogprobs(logprobs=jnp.pad(lp, first), entropy=None if entropy is None else jnp.pad(entropy, first))


def _score(logits: jax.Array, targets: jax.Array, temperatures: jax.Array, valid: jax.Array, top_k: int,
           top_p: Optional[jax.Array], return_entropy: bool) -> TokenLogprobs:
  """log pi_T(targets) [B, T'] under logits [B, T', V] (and entropies), 0 where not `valid`."""
  if top_p is not None:
    top_p = jnp.asarray(top_p, jnp.float32)
    if top_p.ndim == 1:
      top_p = top_p[:, None]
  logp = sampling_log_probs(logits, temperatures, top_k, top_p)
  lp = jnp.take_along_axis(logp, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]
  entropy = jnp.where(valid, _entropy(logp), 0.0) if return_entropy else None
  return TokenLogprobs(logprobs=jnp.where(valid, lp, 0.0), entropy=entropy)


def response_logprobs(model: Model, params: Params, prompt: jax.Array, prompt_mask: jax.Array,
                      response: jax.Array, response_mask: jax.Array, temperatures: jax.Array, *,
                      top_k: int = 0, top_p: Optional[jax.Array] = None,
                      return_entropy: bool = False, positions: Optional[jax.Array] = None,
                      image_features: Optional[jax.Array] = None) -> TokenLogprobs:
  """`token_logprobs` of a batch of records laid out as the sampler returns them, aligned to the response.

  prompt/prompt_mask [B, P] left-padded, response/response_mask/temperatures [B, N] (`SampleOutput`'s
  tokens, mask, temperatures). Returns [B, N] arrays, 0 where response_mask is False. A VLModel's prompts
  with images: their merged `image_features` (VLModel.image_features) and the multimodal RoPE `positions`
  [B, P + N, 3] of prompt and response (vl.mrope_positions over both).
  """
  N = response.shape[1]
  tokens = jnp.concatenate([prompt, response], axis=1).astype(jnp.int32)
  mask = jnp.concatenate([prompt_mask.astype(bool), response_mask.astype(bool)], axis=1)
  positions = positions_from_mask(mask) if positions is None else positions
  extra = {} if image_features is None else {"image_features": image_features}
  # Only the N + 1 last positions are projected onto the vocabulary: the last prompt token predicts the
  # first response token, response token j predicts j + 1, and the last prediction is not needed.
  logits = model.apply(params, tokens, positions, attention_mask=mask, logits_to_keep=N + 1,
                       **extra).logits[:, :-1]
  return _score(logits, response, temperatures.astype(jnp.float32), response_mask.astype(bool), top_k, top_p,
                return_entropy)
