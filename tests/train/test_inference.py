"""Central inference (train/inference.py): the actors' embeddings and samples come back in batches, and a
request's answer never depends on which other requests share its batch."""

import dataclasses

import jax
import numpy as np
import pytest

from explore_jax import hf, sampling
from explore_jax.actors.protocol import EmbedRequest, PromptRequest
from explore_jax.models import Model
from explore_jax.parallel import make_mesh
from explore_jax.parallel.sharding import DEFAULT_RULES
from explore_jax.train.inference import InferenceServer


@pytest.fixture(scope="module")
def server_and_params():
  mesh = make_mesh((2, 1, 4), ("data", "fsdp", "tensor"))
  pre = hf.load_pretrained("tiny", mesh=mesh, rules=DEFAULT_RULES)
  tok = pre.tokenizer
  server = InferenceServer(model=Model(pre.config, mesh=mesh, rules=DEFAULT_RULES), tokenizer=tok,
                           pad_id=tok.pad_token_id, prompt_len=128, response_len=6, max_steps=3, batch_size=4)
  return server, pre.params


TEXTS = ["open door", "take key", "go to the red door", "hello world how are you " * 20, "open door"]


def test_embeddings_are_unit_vectors_per_text(server_and_params):
  server, params = server_and_params
  _, embed_fn = server.bind(params, jax.random.key(0), sampling.make_sampling_params(1.0), 0)
  out = embed_fn([EmbedRequest(0, 0, TEXTS[:3]), EmbedRequest(1, 0, []), EmbedRequest(2, 1, TEXTS[3:])])
  hidden = server.model.config.hidden_size
  assert [v.shape for v in out] == [(3, hidden), (0, hidden), (2, hidden)]
  assert all(v.dtype == np.float32 for v in out)
  vectors = np.concatenate([out[0], out[2]])
  np.testing.assert_allclose(np.linalg.norm(vectors, axis=-1), 1.0, atol=1e-5)
  np.testing.assert_allclose(out[2][1], out[0][0], atol=1e-6)         # equal texts, equal vectors
  assert not np.allclose(out[0][0], out[0][1], atol=1e-3)             # different texts differ
  # A text's vector does not depend on its batch-mates (7 texts: two batches of 4 plus a wider bucket).
  for text, vector in zip(TEXTS, vectors):
    alone = embed_fn([EmbedRequest(5, 0, [text])])[0][0]
    np.testing.assert_allclose(alone, vector, atol=1e-5)
  crowd = embed_fn([EmbedRequest(i, 0, ["take key", "a b c", text]) for i, text in enumerate(TEXTS)])
  for request, vector in zip(crowd, vectors):
    np.testing.assert_allclose(request[2], vector, atol=1e-5)


def _ids(server, text):
  return server.tokenizer(text, add_special_tokens=False)["input_ids"]


def test_responses_do_not_depend_on_batch_mates_and_final_requests_are_answered(server_and_params):
  server, params = server_and_params
  params_sampling = sampling.make_sampling_params(1.0, eos_ids=[server.tokenizer.eos_token_id])
  policy_fn, _ = server.bind(params, jax.random.key(3), params_sampling, version=7, features=True)
  final = PromptRequest(episode_id=2, step=3, prompt_ids=_ids(server, "what did you learn?"), final=True)
  target = PromptRequest(episode_id=1, step=1, prompt_ids=_ids(server, "go to the red door"))
  others = [PromptRequest(episode_id=i, step=0, prompt_ids=_ids(server, t))
            for i, t in enumerate(TEXTS[1:], start=3)] + [PromptRequest(9, 2, _ids(server, "open door"))]
  batch = policy_fn([others[0], final, others[1], target, *others[2:]])
  by_key = {(r.episode_id, r.step): r for r in batch}
  assert len(by_key) == len(batch) == 7 and by_key[(2, 3)].policy_version == 7
  for request in (final, target):
    alone = policy_fn([request])[0]
    together = by_key[(request.episode_id, request.step)]
    assert len(alone.tokens) >= 1
    np.testing.assert_array_equal(alone.tokens, together.tokens)
    np.testing.assert_allclose(alone.logprobs, together.logprobs, atol=1e-5)
    np.testing.assert_allclose(alone.features, together.features, atol=1e-4)
    assert alone.features.shape == (server.model.config.hidden_size,)
  # A final request is sampled like a step at (episode, step): the same stream and prompt, the same answer.
  as_step = policy_fn([PromptRequest(2, 3, final.prompt_ids)])[0]
  np.testing.assert_array_equal(as_step.tokens, by_key[(2, 3)].tokens)
  # Streams are per (episode, step): another step of the same prompt samples differently somewhere.
  other_steps = [policy_fn([PromptRequest(1, s, target.prompt_ids)])[0].tokens for s in (0, 2)]
  assert any(not np.array_equal(t, by_key[(1, 1)].tokens) for t in other_steps)


def test_a_final_generation_has_its_own_budget_and_the_same_stream(server_and_params):
  server, params = server_and_params
  longer = dataclasses.replace(server, final_len=20)
  policy_fn, _ = longer.bind(params, jax.random.key(5), sampling.make_sampling_params(1.0), version=0)
  prompt = _ids(server, "what did you learn?")
  by_key = {(r.episode_id, r.step): r for r in policy_fn([PromptRequest(2, 3, prompt, final=True),
                                                          PromptRequest(4, 1, prompt)])}
  final, step = by_key[(2, 3)], by_key[(4, 1)]
  assert final.episode_id == 2 and len(final.tokens) == 20 and len(step.tokens) == server.response_len
  # Its first tokens are those the step budget samples from the same (episode, step) stream: only the budget differs.
  short = server.bind(params, jax.random.key(5), sampling.make_sampling_params(1.0), version=0)[0]
  np.testing.assert_array_equal(short([PromptRequest(2, 3, prompt, final=True)])[0].tokens,
                                final.tokens[:server.response_len])


class _Encoder:
  """A sentence encoder stand-in: a unit vector per text from its characters."""

  def encode(self, texts):
    rows = np.stack([np.bincount(np.frombuffer(t.encode(), np.uint8) % 8, minlength=8) + 1.0 for t in texts]
                    ) if texts else np.zeros((0, 8))
    return (rows / np.linalg.norm(rows, axis=-1, keepdims=True)).astype(np.float32)


def test_a_text_encoder_answers_embedding_requests_and_the_learners_own(server_and_params):
  server, params = server_and_params
  encoder = _Encoder()
  with_encoder = dataclasses.replace(server, text_encoder=encoder)
  _, embed_fn = with_encoder.bind(params, jax.random.key(0), sampling.make_sampling_params(1.0), 0)
  out = embed_fn([EmbedRequest(0, 0, TEXTS[:3]), EmbedRequest(1, 0, []), EmbedRequest(2, 1, TEXTS[3:])])
  assert [v.shape for v in out] == [(3, 8), (0, 8), (2, 8)]
  np.testing.assert_array_equal(np.concatenate(out), encoder.encode(TEXTS))
  np.testing.assert_array_equal(with_encoder.encode(TEXTS[:2]), encoder.encode(TEXTS[:2]))
  # Without one, the learner's side encodes with the policy at the parameters last bound, as the actors' requests.
  fresh = dataclasses.replace(server)
  with pytest.raises(RuntimeError, match="bind"):
    fresh.encode(["take key"])
  _, policy_embed = fresh.bind(params, jax.random.key(0), sampling.make_sampling_params(1.0), 0)
  np.testing.assert_array_equal(fresh.encode(["take key"]), policy_embed([EmbedRequest(0, 0, ["take key"])])[0])


def test_requests_with_images_are_answered_from_their_own_images(tmp_path):
  """A vision-language policy: each request's images (resized uint8, their tokens in the prompt) reach the
  sampler; a response depends only on its own prompt and images (bit for bit alone and among others) and
  equals sampling the same prompt from the model's own image path."""
  from explore_jax.images import ImageLayout
  from explore_jax.models import vision as vision_lib
  from explore_jax.models import vl as vl_lib
  from tests.models.test_vl import CONFIG

  model = vl_lib.VLModel(CONFIG)
  params = jax.jit(model.init, static_argnames="std")(jax.random.key(0), std=0.2)
  layout = ImageLayout.from_config(CONFIG, min_pixels=16, max_pixels=4096)
  server = InferenceServer(model=model, tokenizer=None, pad_id=0, prompt_len=64, response_len=5, max_steps=3,
                           batch_size=4, image_layout=layout)
  rng = np.random.default_rng(0)
  red, blue = (rng.integers(0, 256, shape, dtype=np.uint8) for shape in ((8, 12, 3), (12, 8, 3)))

  def request(episode, images, text=(5, 6)):
    ids = [1, 2]
    for image in images:
      ids += [layout.start_id, layout.pad_id, layout.end_id]
    return PromptRequest(episode_id=episode, step=0, prompt_ids=layout.expand(ids + list(text), images),
                         images=tuple(images))

  params_sampling = sampling.make_sampling_params(1.0)
  policy_fn, _ = server.bind(params, jax.random.key(3), params_sampling, version=0)
  together = policy_fn([request(0, [red]), request(1, []), request(2, [blue, red], text=(7,))])
  for i, req in enumerate([request(0, [red]), request(1, []), request(2, [blue, red], text=(7,))]):
    alone = policy_fn([req])[0]
    np.testing.assert_array_equal(alone.tokens, together[i].tokens)
    np.testing.assert_array_equal(alone.logprobs, together[i].logprobs)
  # The same prompt through generate's VisionInputs path (the tower over all the row's images at once).
  req = request(2, [blue, red], text=(7,))
  patches, grids = layout.pixel_values(req.images)
  width = 64
  tokens = np.zeros((4, width), np.int32)
  mask = np.zeros((4, width), bool)
  tokens[0, width - len(req.prompt_ids):], mask[0, width - len(req.prompt_ids):] = req.prompt_ids, True
  mask[1:, -1] = True
  positions, deltas = vl_lib.mrope_positions(tokens, mask, grids, CONFIG)
  row_ids = np.array([server.row_id(req), 0, 0, 0], np.int32)
  direct = sampling.generate(model, params, tokens, mask, params_sampling, jax.random.key(3), row_ids=row_ids,
                             max_new_tokens=5, images=vision_lib.vision_inputs(patches, grids, CONFIG.vision),
                             mrope=(positions, deltas))
  n = int(direct.lengths[0])
  np.testing.assert_array_equal(together[2].tokens, np.asarray(direct.tokens)[0, :n])
  np.testing.assert_allclose(together[2].logprobs, np.asarray(direct.logprobs)[0, :n], atol=1e-5)
  # Continuous batching: the same answers through two decode slots (the images' prefill, the slots' mRoPE).
  slotted = dataclasses.replace(server, batching="continuous", batch_size=2)
  requests = [request(0, [red]), request(1, []), request(2, [blue, red], text=(7,)), request(3, [red])]
  streamed = slotted.bind(params, jax.random.key(3), params_sampling, version=0)[0](requests)
  for i, req in enumerate(requests[:3]):
    np.testing.assert_array_equal(streamed[i].tokens, together[i].tokens)
    np.testing.assert_allclose(streamed[i].logprobs, together[i].logprobs, atol=1e-5)
  assert slotted.slot_stats.shared == 0  # another episode's image prompt: its own stream, not a shared prefill
  with pytest.raises(ValueError, match="image tokens for 1 images"):
    layout.expand([1, 2, 3], [red])


def _record_prompt_shapes(monkeypatch) -> list:
  """The (rows, width) of every sampling call from now on."""
  shapes = []
  generate = sampling.generate
  monkeypatch.setattr(sampling, "generate", lambda model, params, prompt, *a, **k: (
      shapes.append(prompt.shape), generate(model, params, prompt, *a, **k))[1])
  return shapes


def _two_short_and_one_long(server):
  """Sampling params and three requests: two prompts of width 64, one of width 128."""
  params_sampling = sampling.make_sampling_params(1.0, eos_ids=[server.tokenizer.eos_token_id])
  return params_sampling, [PromptRequest(i, 0, _ids(server, t)) for i, t in enumerate(TEXTS[:2] + TEXTS[3:4])]


def test_min_rows_samples_a_call_on_the_fewest_rows_with_the_same_answers(server_and_params, monkeypatch):
  """rollout.min_sampler_rows: a call holding few requests runs on a smaller batch (N, 2N, ... up to
  batch_size) and answers them as the full batch does (the same tokens; log-probs equal up to rounding)."""
  import dataclasses

  server, params = server_and_params
  small = dataclasses.replace(server, min_rows=2)
  assert [small.rows(n) for n in (1, 2, 3, 4)] == [2, 2, 4, 4] and server.rows(1) == 4
  shapes = _record_prompt_shapes(monkeypatch)
  params_sampling, requests = _two_short_and_one_long(server)
  full = server.bind(params, jax.random.key(5), params_sampling, 0)[0](requests)
  fewer = small.bind(params, jax.random.key(5), params_sampling, 0)[0](requests)
  # Two calls each: 2 requests at width 64, the long one alone at width 128.
  assert [rows for rows, _ in shapes] == [4, 4, 2, 2]
  for a, b in zip(full, fewer):
    np.testing.assert_array_equal(a.tokens, b.tokens)
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)


def test_a_coarser_width_bucket_puts_prompts_of_different_lengths_in_one_call(server_and_params, monkeypatch):
  """rollout.prompt_width_bucket: at 128 the short prompts and the long one share a call at width 128, and
  every request is still answered (a row's last bits may move with its width: a protocol keeps one setting)."""
  import dataclasses

  server, params = server_and_params
  coarse = dataclasses.replace(server, width_bucket=128)
  shapes = _record_prompt_shapes(monkeypatch)
  params_sampling, requests = _two_short_and_one_long(server)
  fine = server.bind(params, jax.random.key(5), params_sampling, 0)[0](requests)
  assert [width for _, width in shapes] == [64, 128]
  shapes.clear()
  answers = coarse.bind(params, jax.random.key(5), params_sampling, 0)[0](requests)
  assert [width for _, width in shapes] == [128]
  assert len(answers) == len(fine) == 3 and all(len(a.tokens) > 0 for a in answers)
  # The long prompt had width 128 either way: its row's answer is the same token for token.
  np.testing.assert_array_equal(answers[2].tokens, fine[2].tokens)
  with pytest.raises(ValueError, match="prompt_width_bucket"):
    dataclasses.replace(server, width_bucket=0)


def test_continuous_batching_gives_the_fixed_shape_answers(server_and_params):
  """rollout.batching = "continuous": the requests stream through the batch's rows as slots (here 7 requests, 3
  widths, through 4 slots); every answer is the fixed-shape call's (tokens, log-probs up to rounding, the
  hidden state at the last token), and the equal prompts of a task group share one prefill."""
  server, params = server_and_params
  slotted = dataclasses.replace(server, batching="continuous")
  params_sampling = sampling.make_sampling_params(1.0, eos_ids=[server.tokenizer.eos_token_id])
  requests = [PromptRequest(i, 0, _ids(server, t)) for i, t in enumerate(TEXTS)]
  requests += [PromptRequest(7, 0, _ids(server, TEXTS[2])), PromptRequest(8, 1, _ids(server, TEXTS[2]))]
  fixed = server.bind(params, jax.random.key(4), params_sampling, version=3, features=True)[0](requests)
  streamed = slotted.bind(params, jax.random.key(4), params_sampling, version=3, features=True)[0](requests)
  assert [(r.episode_id, r.step) for r in streamed] == [(r.episode_id, r.step) for r in requests]
  by_key = {(r.episode_id, r.step): r for r in fixed}  # the fixed-shape calls answer width by width
  for b in streamed:
    a = by_key[(b.episode_id, b.step)]
    np.testing.assert_array_equal(a.tokens, b.tokens)
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)
    np.testing.assert_allclose(a.features, b.features, atol=1e-4)
    assert b.policy_version == 3
  stats = slotted.slot_stats
  # Slots take the short prompts first: "open door" twice shares the first prefill; the two later copies of "go
  # to the red door" refill two slots from one prefill; the long prompt comes last.
  assert (stats.prefills, stats.prefill_rows, stats.shared) == (3, 5, 2)
  with pytest.raises(ValueError, match="rollout.batching"):
    dataclasses.replace(server, batching="slots")


def test_a_streaming_policy_answers_as_the_fixed_shape_calls_do(server_and_params):
  """rollout.batching = "streaming": requests submitted while others decode, final generations with their own
  budget, each response as the fixed-shape call gives it."""
  server, params = server_and_params
  streaming = dataclasses.replace(server, batching="streaming", final_len=3)
  params_sampling = sampling.make_sampling_params(1.0, eos_ids=[server.tokenizer.eos_token_id])
  first = [PromptRequest(i, 0, _ids(server, t)) for i, t in enumerate(TEXTS[:3])]
  later = [PromptRequest(5, 1, _ids(server, TEXTS[3])), PromptRequest(6, 2, _ids(server, "done"), final=True)]
  fixed = dataclasses.replace(server, final_len=3).bind(params, jax.random.key(6), params_sampling, 0)[0](first + later)
  policy = streaming.bind(params, jax.random.key(6), params_sampling, 0)[0]
  policy.submit(first)
  answers = policy.advance()
  assert answers  # a round ends as soon as a row is done
  policy.submit(later)
  while policy.busy:
    answers += policy.advance()
  by_key = {(r.episode_id, r.step): r for r in fixed}
  assert sorted((r.episode_id, r.step) for r in answers) == sorted(by_key)
  for b in answers:
    a = by_key[(b.episode_id, b.step)]
    np.testing.assert_array_equal(a.tokens, b.tokens)
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)
  assert len(by_key[(6, 2)].tokens) <= 3
  np.testing.assert_array_equal(policy(first[:1])[0].tokens, by_key[(0, 0)].tokens)  # and callable on a batch


def test_the_sampler_reads_its_parameters_in_the_compute_dtype_with_the_same_samples():
  """model.dtype = "auto" computes in bfloat16 on an accelerator with float32 master weights: the server casts
  the weights once per rollout, and samples exactly what the per-matmul casts of the float32 weights give."""
  from explore_jax.models import ModelConfig
  from explore_jax.models.config import resolve_dtype

  config = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                       num_kv_heads=2, head_dim=8, param_dtype="float32", dtype="bfloat16")
  model = Model(config)
  params = jax.jit(model.init, static_argnames="std")(jax.random.key(0), std=0.5)
  server = InferenceServer(model=model, tokenizer=None, pad_id=0, prompt_len=8, response_len=5, max_steps=1,
                           batch_size=2)
  cast = server.sampling_params(params)
  assert {x.dtype for x in jax.tree.leaves(cast)} == {np.dtype(jax.numpy.bfloat16)}
  prompt, mask = np.array([[0, 5, 6, 7], [1, 2, 3, 4]], np.int32), np.array([[0, 1, 1, 1], [1, 1, 1, 1]], bool)
  args = (prompt, mask, sampling.make_sampling_params(1.0), jax.random.key(1))
  a = sampling.generate(model, params, *args, max_new_tokens=5)
  b = sampling.generate(model, cast, *args, max_new_tokens=5)
  np.testing.assert_array_equal(a.tokens, b.tokens)
  np.testing.assert_array_equal(a.logprobs, b.logprobs)
  assert resolve_dtype("auto") == ("float32" if jax.default_backend() == "cpu" else "bfloat16")
  with pytest.raises(ValueError, match="unknown dtype"):
    resolve_dtype("fp8")
