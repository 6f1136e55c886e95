"""Central inference: the learner process answers the actors' prompt and embedding requests in batches.

`InferenceServer.policy_fn` samples a response for every pending `PromptRequest` of every actor (one
jitted `sampling.generate` call per fixed-shape chunk); `embed_fn` turns `EmbedRequest` texts into
unit vectors with the run's text encoder, so that actors stay free of jax: the policy itself by default (mean
of its final hidden states over the text's tokens), or a sentence encoder (`text_encoder`, e.g. all-MiniLM-L6-v2;
config.embedding.encoder). Both are bound to the parameters and keys of one collection with `bind`; `encode`
embeds texts on the learner's side with the same encoder (the parameters last bound, for the policy's).

A row's randomness is keyed by its (episode, step), so a response does not depend on which requests share
its batch, and neither does its prompt width: prompts are sampled at their own length rounded up to
`width_bucket` tokens (64: a few compiled widths, far less prefill than max_prompt_tokens; a coarser bucket
puts a round's prompts of different lengths into fewer, fuller calls, at the price of more prefill). A
method's generation after the episode (`PromptRequest.final`, EMPO2's tip) is sampled like any step, at step
index = the episode's length, with its own budget of new tokens (`final_len`, rollout.final_max_new_tokens).

With LoRA (`lora`, `base_params`), the params a caller binds are the policy's adapters: `bind` merges them into
the frozen base once (models/lora.py: `merge`), so sampling and embedding run the plain model's computation.

A vision-language policy (a VLModel, with the `image_layout` the actors used) answers requests with images:
each image's merged features come from its own vision-tower call (so a row's response depends only on its own
prompt and images, never on the images of the rows it shares a batch with), the batch's features are
concatenated in row order (padded to a power of two: few compiled shapes) and the rows' multimodal RoPE
positions are computed on the host (`vl.mrope_positions`).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np

from explore_jax import sampling
from explore_jax.actors.protocol import PromptRequest, Response
from explore_jax.images import ImageLayout
from explore_jax.models import Model, positions_from_mask
from explore_jax.models import decode_attention as decode_attention_lib
from explore_jax.models import lora as lora_lib
from explore_jax.models.config import language_config
from explore_jax.models import vision as vision_lib
from explore_jax.models import vl as vl_lib
from explore_jax.parallel import distributed
from explore_jax.sampling import slots as slots_lib


BATCHING = ("fixed", "continuous", "streaming")  # rollout.batching


@dataclasses.dataclass
class InferenceServer:
  """Batched sampling and embedding for the actor pool (see the module docstring)."""
  model: Model
  tokenizer: Any
  pad_id: int
  prompt_len: int
  response_len: int
  max_steps: int
  batch_size: int
  lora: Optional[lora_lib.LoraConfig] = None  # the policy's params are adapters on `base_params`
  base_params: Any = None
  image_layout: Optional[ImageLayout] = None  # a vision-language policy: how prompts lay images out
  # 0: every sampling call has batch_size rows. N > 0: a call has the fewest rows of N, 2N, 4N, ... (at most
  # batch_size) that hold its requests, so a call half full does half the work (more compiled shapes).
  min_rows: int = 0
  width_bucket: int = 64  # prompt widths are multiples of this (at most prompt_len)
  # rollout.batching. "fixed": fixed-shape generate calls per width. "continuous": a call's requests go through
  # batch_size decode slots (sampling/slots.py), a finished row's slot refilled by the next prompt (min_rows is
  # then unused). "streaming": `bind` gives a StreamingPolicy, into whose slots the pool streams requests as
  # actors ask. A row's tokens are the fixed-shape call's; its last bits may move (slots.py).
  batching: str = "fixed"
  # How a slot row attends to its keys (rollout.decode_attention; models/decode_attention.py): "dense", "blocked"
  # (reads only the blocks the longest row needs) or "pallas" (the GPU kernel, each row its own range).
  decode_attention: str = "dense"
  final_len: int = 0  # new tokens of a final generation (PromptRequest.final); 0: response_len
  # What EmbedRequests are answered with: an object whose encode(texts) gives unit rows [N, E] (hf.load_encoder);
  # None: the policy's own mean final hidden state.
  text_encoder: Any = None

  def __post_init__(self):
    if isinstance(self.width_bucket, bool) or not isinstance(self.width_bucket, int) or self.width_bucket < 1:
      raise ValueError(f"width_bucket (rollout.prompt_width_bucket) must be a positive int, got {self.width_bucket!r}")
    if self.batching not in BATCHING:
      raise ValueError(f"rollout.batching must be one of {BATCHING}, got {self.batching!r}")
    decode_attention_lib.check(self.decode_attention)
    if self.final_len < 0:
      raise ValueError(f"final_len (rollout.final_max_new_tokens) must be >= 0, got {self.final_len}")
    self._bound_params = None
    self.slot_stats = slots_lib.SlotStats()  # what the continuous sampler did, summed over calls

  def rows(self, requests: int) -> int:
    """The batch rows of a sampling call that answers `requests` requests (at most batch_size)."""
    if self.min_rows <= 0:
      return self.batch_size
    rows = self.min_rows
    while rows < requests:
      rows *= 2
    return min(rows, self.batch_size)

  def policy_params(self, params: Any) -> Any:
    """The plain params tree of the policy whose trainable params are `params` (merged with LoRA)."""
    return params if self.lora is None else lora_lib.merge(self.base_params, params, self.lora)

  def bind(self, params: Any, key: jax.Array, params_sampling: sampling.SamplingParams, version: int,
           features: bool = False) -> tuple[Callable, Callable]:
    """(policy_fn, embed_fn) for ActorPool.run, sampling with `params` from streams of `key`."""
    params = self.sampling_params(self.policy_params(params))
    self._bound_params = params
    bound = dict(params=params, key=key, params_sampling=params_sampling, version=version, features=features)
    policy = StreamingPolicy(self, **bound) if self.batching == "streaming" else functools.partial(
        self.policy_fn, **bound)
    return policy, functools.partial(self.embed_fn, params=params)

  def sampling_params(self, params: Any) -> Any:
    """`params` as the sampler reads them: floating leaves in the model's compute dtype (bfloat16 on an
    accelerator under model.dtype = "auto"), cast once per rollout instead of at every matmul of every decode
    step; the same values the learner's matmuls cast them to, so sampled and learner log-probs still agree."""
    dtype = language_config(self.model.config).jnp_dtype
    return jax.tree.map(lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) and x.dtype != dtype
                        else x, params)

  def encode(self, texts: list[str]) -> np.ndarray:
    """[len(texts), E] unit rows from the encoder EmbedRequests are answered with (the policy's: with the
    parameters last bound), for the learner's own use (EMPO2's memory keys and state novelty)."""
    if self.text_encoder is None and self._bound_params is None:
      raise RuntimeError("the policy encodes texts with the parameters of a rollout: bind() has not been called")
    return self.embed_fn([_Texts(list(texts))], params=self._bound_params)[0]

  def row_id(self, request: PromptRequest) -> int:
    # Unique per (episode, step); step runs to max_steps inclusive (the generation after the episode).
    return request.episode_id * (self.max_steps + 1) + request.step

  def policy_fn(self, requests: list[PromptRequest], *, params: Any, key: jax.Array,
                params_sampling: sampling.SamplingParams, version: int, features: bool = False) -> list[Response]:
    """A response per request; with `features`, each carries the final hidden state at its last token."""
    out: list[Response] = []
    final = [r for r in requests if r.final]
    steps = [r for r in requests if not r.final]
    for new_tokens, group in ((self.response_len, steps), (self.final_len or self.response_len, final)):
      out += self._sample(group, new_tokens, params=params, key=key, params_sampling=params_sampling,
                          version=version, features=features)
    return out

  def _sample(self, requests: list[PromptRequest], new_tokens: int, *, params: Any, key: jax.Array,
              params_sampling: sampling.SamplingParams, version: int, features: bool) -> list[Response]:
    if self.batching != "fixed":
      return self._sample_slots(requests, new_tokens, params=params, key=key, params_sampling=params_sampling,
                                version=version, features=features)
    out: list[Response] = []
    for P, chunk in self._chunks(requests, lambda r: len(r.prompt_ids)):
      B = self.rows(len(chunk))
      prompt, mask = sampling.left_pad([r.prompt_ids for r in chunk], P, B, self.pad_id)
      row_ids = np.zeros((B,), np.int32)
      row_ids[:len(chunk)] = [self.row_id(r) for r in chunk]
      active = np.arange(B) < len(chunk)  # filler rows start finished: decoding ends with the last request
      images = self._image_inputs(params, chunk, prompt, mask) if any(r.images for r in chunk) else {}
      sample = sampling.generate(self.model, params, prompt, mask, params_sampling, key, row_ids=row_ids,
                                 active=active, max_new_tokens=new_tokens, pad_id=self.pad_id,
                                 return_hidden=features, **images)
      s = distributed.fetch(sample)
      for i, req in enumerate(chunk):
        n = int(s.lengths[i])
        out.append(Response(episode_id=req.episode_id, step=req.step, tokens=s.tokens[i, :n],
                            logprobs=s.logprobs[i, :n], temperatures=s.temperatures[i, :n],
                            segments=s.segments[i, :n], policy_version=version,
                            features=np.asarray(s.hidden[i, max(n - 1, 0)], np.float32) if features else None))
    return out

  def _sample_slots(self, requests: list[PromptRequest], new_tokens: int, *, params: Any, key: jax.Array,
                    params_sampling: sampling.SamplingParams, version: int, features: bool) -> list[Response]:
    """`_sample` through the continuous sampler: requests with equal prompts (and images) share a prefill."""
    if not requests:
      return []
    extras = None
    if any(r.images for r in requests):
      extras = functools.partial(self._slot_extras, params, lambda rows: [requests[i] for i in rows])
    rows = slots_lib.sample(self.model, params, [r.prompt_ids for r in requests], params_sampling, key,
                            row_ids=[self.row_id(r) for r in requests], share=[_share_key(r) for r in requests],
                            extras=extras, **self._engine_options(new_tokens, features))
    return [_response(r, o, version) for r, o in zip(requests, rows)]

  def _engine_options(self, new_tokens: int, features: bool) -> dict[str, Any]:
    return dict(max_new_tokens=new_tokens, slots=self.batch_size, cache_len=self.prompt_len,
                width_bucket=self.width_bucket, pad_id=self.pad_id, return_hidden=features,
                decode_attention=self.decode_attention, stats=self.slot_stats)

  def _slot_extras(self, params: Any, requests_of: Callable[[list], list[PromptRequest]], tags: list,
                   prompt: np.ndarray, mask: np.ndarray) -> dict[str, Any]:
    """A slot prefill's image features and mRoPE positions (a prefill without images: text positions)."""
    chunk = requests_of(tags)
    if any(r.images for r in chunk):
      return self._image_inputs(params, chunk, prompt, mask)
    return {"mrope": (np.asarray(positions_from_mask(mask)), np.zeros((len(mask),), np.int32))}

  def _image_inputs(self, params: Any, chunk: list[PromptRequest], prompt: np.ndarray, mask: np.ndarray
                    ) -> dict[str, Any]:
    """generate's image_features and mrope for a chunk of requests with images (module docstring)."""
    if self.image_layout is None or not isinstance(self.model, vl_lib.VLModel):
      raise ValueError("requests with images need a vision-language policy (a VLModel and its image layout)")
    features, grids = [], []
    for request in chunk:
      for image in request.images:
        patches, grid = self.image_layout.pixel_values([image])
        inputs = vision_lib.vision_inputs(patches, grid, self.model.config.vision)
        features.append(_image_features(self.model, params["vision"], inputs))
        grids.append(grid[0])
    features = jnp.concatenate(features)
    bucket = max(64, 1 << (int(features.shape[0]) - 1).bit_length())
    features = jnp.pad(features, ((0, bucket - features.shape[0]), (0, 0)))
    positions, deltas = vl_lib.mrope_positions(prompt, mask, np.asarray(grids), self.model.config)
    return {"image_features": features, "mrope": (positions, deltas)}

  def embed_fn(self, requests: list[Any], *, params: Any) -> list[np.ndarray]:
    """[len(texts), E] float32 unit vectors per request: the text encoder's, or the policy's mean final hidden
    state over each text's tokens (cut to max_prompt_tokens from the left, like prompts)."""
    if self.text_encoder is not None:  # one call for every request's texts, split back per request
      vectors = np.asarray(self.text_encoder.encode([t for r in requests for t in r.texts]), np.float32)
      bounds = np.cumsum([0] + [len(r.texts) for r in requests])
      return [vectors[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
    texts = [(i, t) for i, r in enumerate(requests) for t in r.texts]
    ids = [self.tokenizer(t, add_special_tokens=False)["input_ids"][-self.prompt_len:] or [self.pad_id]
           for _, t in texts]
    vectors: list[Optional[np.ndarray]] = [None] * len(texts)
    order = list(range(len(texts)))
    for P, chunk in self._chunks(order, lambda j: len(ids[j])):
      tokens, mask = sampling.left_pad([ids[j] for j in chunk], P, self.batch_size, self.pad_id)
      pooled = np.asarray(distributed.fetch(_embed(self.model, params, jnp.asarray(tokens), jnp.asarray(mask))))
      for row, j in enumerate(chunk):
        vectors[j] = pooled[row]
    out: list[list[np.ndarray]] = [[] for _ in requests]
    for (i, _), v in zip(texts, vectors):
      out[i].append(v)
    dim = language_config(self.model.config).hidden_size
    return [np.stack(v).astype(np.float32) if v else np.zeros((0, dim), np.float32) for v in out]

  def _chunks(self, items: list, length: Callable[[Any], int]) -> list[tuple[int, list]]:
    """Items grouped by their width (length rounded up to width_bucket, at most prompt_len), in batches of B."""
    by_width: dict[int, list] = {}
    for item in items:
      width = min(self.prompt_len, -(-max(length(item), 1) // self.width_bucket) * self.width_bucket)
      by_width.setdefault(width, []).append(item)
    B = self.batch_size
    return [(P, rs[i:i + B]) for P, rs in sorted(by_width.items()) for i in range(0, len(rs), B)]


class StreamingPolicy:
  """The policy_fn of rollout.batching = "streaming": callable on a batch as policy_fn is, and a pool that streams
  (actors/pool.py) `submit`s requests as actors ask and calls `advance` while it is `busy`; each advance runs a
  round of decode slots (one SlotEngine per budget of new tokens: steps', final generations') and returns the
  responses done in it."""

  def __init__(self, server: InferenceServer, *, params: Any, key: jax.Array,
               params_sampling: sampling.SamplingParams, version: int, features: bool):
    self.server, self.params, self.key, self.params_sampling = server, params, key, params_sampling
    self.version, self.features = version, features
    self._engines: dict[int, slots_lib.SlotEngine] = {}
    self._requests: dict[tuple[int, int], PromptRequest] = {}

  def __call__(self, requests: list[PromptRequest]) -> list[Response]:
    return self.server.policy_fn(requests, params=self.params, key=self.key, params_sampling=self.params_sampling,
                                 version=self.version, features=self.features)

  @property
  def busy(self) -> bool:
    return any(e.busy for e in self._engines.values())

  def submit(self, requests: list[PromptRequest]) -> None:
    s = self.server
    for r in requests:
      n = (s.final_len or s.response_len) if r.final else s.response_len
      if n not in self._engines:
        extras = functools.partial(s._slot_extras, self.params, lambda tags: [self._requests[t] for t in tags])
        self._engines[n] = slots_lib.SlotEngine(
            s.model, self.params, self.params_sampling, self.key, streaming=True,
            extras=extras if isinstance(s.model, vl_lib.VLModel) else None, **s._engine_options(n, self.features))
      self._requests[(r.episode_id, r.step)] = r
      self._engines[n].submit((r.episode_id, r.step), r.prompt_ids, s.row_id(r), _share_key(r))

  def advance(self) -> list[Response]:
    out = []
    for engine in self._engines.values():
      if engine.busy:
        out += [_response(self._requests.pop(tag), row, self.version) for tag, row in engine.advance()]
    return out


def _response(request: PromptRequest, row: slots_lib.RowOutput, version: int) -> Response:
  return Response(episode_id=request.episode_id, step=request.step, tokens=row.tokens, logprobs=row.logprobs,
                  temperatures=row.temperatures, segments=row.segments, policy_version=version, features=row.hidden)


def _share_key(request: PromptRequest) -> tuple:
  """Requests that may share a slot prefill: the same tokens and the same images."""
  return tuple(request.prompt_ids), tuple(_digest(image) for image in request.images)


def _digest(image: np.ndarray) -> tuple:
  """An image's identity for prefill sharing: its shape and a hash of its bytes."""
  image = np.ascontiguousarray(image)
  return image.shape, hashlib.blake2b(image.tobytes(), digest_size=16).digest()


@dataclasses.dataclass(frozen=True)
class _Texts:
  """The texts of a learner-side `encode`, shaped as the EmbedRequest embed_fn reads."""
  texts: list[str]


@functools.partial(jax.jit, static_argnums=0)
def _image_features(model: vl_lib.VLModel, vision_params: Any, inputs: Any) -> jax.Array:
  """One image's merged features [tokens, E] from the vision tower."""
  return model.vision.apply(vision_params, inputs)


@functools.partial(jax.jit, static_argnums=0)
def _embed(model: Model, params: Any, tokens: jax.Array, mask: jax.Array) -> jax.Array:
  positions = jnp.maximum(jnp.cumsum(mask, axis=-1) - 1, 0)
  hidden = model.apply(params, tokens, positions, attention_mask=mask, return_hidden=True).hidden
  weights = mask.astype(hidden.dtype)[..., None]
  pooled = jnp.sum(hidden * weights, axis=1) / jnp.maximum(jnp.sum(weights, axis=1), 1.0)
  return (pooled / jnp.maximum(jnp.linalg.norm(pooled, axis=-1, keepdims=True), 1e-6)).astype(jnp.float32)
