"""A vision-language policy's update: records keep their prompts' images (uint8, as the actors sent them),
survive the device replay bit for bit, and let the learner recompute the behaviour log-probs the sampler
recorded; the policy gradient reaches the vision tower."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from explore_jax import sampling
from explore_jax.actors.protocol import EpisodeResult, EpisodeSpec, PromptRequest, Response, StepRecord
from explore_jax.images import ImageLayout
from explore_jax.models import vl as vl_lib
from explore_jax.rl.losses import PolicyLossConfig
from explore_jax.replay import RecordSpec, Replay
from explore_jax.train import rl_step, rollout
from explore_jax.train.inference import InferenceServer

from tests.models.test_vl import CONFIG

R = 5


class _NoFields:
  """A method without record fields of its own."""
  name = "none"

  def step_fields(self, result):
    return [{} for _ in result.steps]


def test_recomputed_log_probs_equal_the_recorded_ones_and_the_gradient_reaches_the_tower():
  model = vl_lib.VLModel(CONFIG)
  params = jax.jit(model.init, static_argnames="std")(jax.random.key(0), std=0.2)
  layout = ImageLayout.from_config(CONFIG, min_pixels=16, max_pixels=4096)
  server = InferenceServer(model=model, tokenizer=None, pad_id=0, prompt_len=64, response_len=R, max_steps=3,
                           batch_size=4, image_layout=layout)
  rng = np.random.default_rng(1)
  shots = [rng.integers(0, 256, (8, 12, 3), dtype=np.uint8) for _ in range(2)]
  placeholder = [layout.start_id, layout.pad_id, layout.end_id]
  requests = [PromptRequest(0, 0, layout.expand([1, 2] + placeholder + [5, 6], shots[:1]), images=tuple(shots[:1])),
              PromptRequest(1, 0, [3, 4, 5, 6, 7]),
              PromptRequest(2, 1, layout.expand([2] + placeholder + [7], shots[1:]), images=tuple(shots[1:]))]
  policy_fn, _ = server.bind(params, jax.random.key(3), sampling.make_sampling_params(1.0), version=0)
  responses = policy_fn(requests)

  # The steps as actors send them back, packed into records as the loop packs them (the records keep the
  # images), through the device replay, and laid out as the learner's update batch.
  steps = [StepRecord(episode_id=req.episode_id, group_id=0, traj_id=i, step_index=req.step, actor_id=0,
                      prompt_ids=req.prompt_ids, response=res, response_text="", task_reward=1.0, format_reward=1.0,
                      state_key=0, done=True, success=True, info={}, images=req.images)
           for i, (req, res) in enumerate(zip(requests, responses))]
  results = [EpisodeResult(spec=EpisodeSpec(episode_id=i, group_id=0, traj_id=i, env_id="screen"), steps=[step],
                           success=True, total_reward=1.0, feedback="") for i, step in enumerate(steps)]
  spec = RecordSpec(prompt_len=64, response_len=R, extras=rollout.image_record_fields(1, (8, 12, 3)))
  records = rollout.to_records(spec, _NoFields(), results, max_steps=3, pad_to=4)
  assert np.asarray(records.extras["image_count"]).tolist() == [1, 0, 1, 0]
  replay = Replay(spec, 8)
  replay.insert(records)
  drawn = jax.device_get(replay.take_latest(4, since_version=0).records)
  for got, want in zip(jax.tree.leaves(drawn), jax.tree.leaves(records)):  # image records survive the replay
    np.testing.assert_array_equal(got, want)
  np.testing.assert_array_equal(drawn.extras["images"][2, 0], shots[1])

  B = len(requests)
  prompt, prompt_mask = np.asarray(records.prompt_tokens)[:B], np.asarray(records.prompt_mask)[:B]
  response, response_mask = np.asarray(records.response_tokens)[:B], np.asarray(records.response_mask)[:B]
  temperatures, behaviour = np.asarray(records.temperatures)[:B], np.asarray(records.behaviour_logprobs)[:B]
  batch = {"prompt_tokens": prompt, "prompt_mask": prompt_mask, "response_tokens": response,
           "response_mask": response_mask, "temperatures": temperatures, "behaviour_logprobs": behaviour,
           "advantages": np.array([1.0, -0.5, 0.5], np.float32), "valid": np.ones(B, bool),
           **rl_step.image_batch_fields(CONFIG, prompt, prompt_mask, response, response_mask,
                                        np.asarray(records.extras["images"])[:B],
                                        np.asarray(records.extras["image_count"])[:B])}
  positions = batch["positions"]

  def logprobs(p):
    return sampling.response_logprobs(model, p, prompt, prompt_mask, response, response_mask, temperatures,
                                      **rl_step.image_inputs(model, p, batch)).logprobs

  recomputed = np.asarray(jax.jit(logprobs)(params))
  np.testing.assert_allclose(recomputed[response_mask], behaviour[response_mask], atol=2e-5)
  # Without the images (text embeddings at the image tokens) the image rows are scored differently.
  text_only = np.asarray(sampling.response_logprobs(model, params, prompt, prompt_mask, response, response_mask,
                                                    temperatures, positions=positions).logprobs)
  assert np.abs(text_only[0] - behaviour[0]).max() > 1e-3

  loss, metrics = jax.jit(lambda p: rl_step.rl_loss(model, p, batch, PolicyLossConfig()))(params)
  assert np.isfinite(float(loss))
  grads = jax.grad(lambda p: rl_step.rl_loss(model, p, batch, PolicyLossConfig())[0])(params)
  vision = jax.tree.leaves(grads["vision"])
  assert any(float(jnp.abs(g).max()) > 0 for g in vision)


def test_records_refuse_images_they_cannot_keep():
  spec = RecordSpec(prompt_len=8, response_len=2, extras=rollout.image_record_fields(1, (8, 12, 3)))
  plain = RecordSpec(prompt_len=8, response_len=2)
  response = Response(0, 0, np.array([3], np.int32), np.array([-0.5], np.float32), np.ones(1, np.float32),
                      np.zeros(1, np.int32), policy_version=0)

  def result(images):
    step = StepRecord(episode_id=0, group_id=0, traj_id=0, step_index=0, actor_id=0, prompt_ids=[1, 2],
                      response=response, response_text="", task_reward=0.0, format_reward=1.0, state_key=0,
                      done=True, success=False, info={}, images=tuple(images))
    return [EpisodeResult(spec=EpisodeSpec(0, 0, 0, "screen"), steps=[step], success=False, total_reward=0.0,
                          feedback="")]

  image = np.zeros((8, 12, 3), np.uint8)
  with pytest.raises(ValueError, match=r"an image of shape \[12, 8, 3\], but records keep images of \[8, 12, 3\]"):
    rollout.to_records(spec, _NoFields(), result([image.transpose(1, 0, 2)]), max_steps=1, pad_to=1)
  with pytest.raises(ValueError, match="2 images, more than the 1"):
    rollout.to_records(spec, _NoFields(), result([image, image]), max_steps=1, pad_to=1)
  with pytest.raises(ValueError, match="the records keep none"):
    rollout.to_records(plain, _NoFields(), result([image]), max_steps=1, pad_to=1)


@pytest.mark.slow
def test_an_sft_warm_start_learns_from_the_screenshot():
  """Image demonstrations through the SFT path (sft_data.tokenize_demos, learner.finetune): two prompts with
  the same text and different screenshots, each with its own answer. After the warm start each answer is
  the more likely one under its own screenshot, which only the image can tell apart."""
  from explore_jax import hf
  from explore_jax.images import IMAGE
  from explore_jax.methods.base import SFTRequest
  from explore_jax.models.config import VL_PRESETS
  from explore_jax.train import learner as learner_lib, sft, sft_data

  from explore_jax.parallel import make_mesh, sharding

  config = VL_PRESETS["tiny-vl"]
  model = vl_lib.VLModel(config, mesh=make_mesh((2, 1, 4), ("data", "fsdp", "tensor")),
                         rules=sharding.DEFAULT_RULES)
  params = jax.jit(model.init)(jax.random.key(0))
  tokenizer = hf.tiny_vl_tokenizer()
  left, right = np.zeros((56, 56, 3), np.uint8), np.zeros((56, 56, 3), np.uint8)
  left[:, :28], right[:, 28:] = 255, 255
  messages = [{"role": "user", "content": f"{IMAGE} Click the white half."}]
  demos = [{"messages": messages, "response": "Click(14, 28)", "images": [left]},
           {"messages": messages, "response": "Click(42, 28)", "images": [right]}]
  swapped = [{**demos[0], "images": [right]}, {**demos[1], "images": [left]}]

  def losses(p, ds):
    arrays = sft_data.tokenize_demos(tokenizer, ds, 48, 12, ImageLayout.from_config(config))
    arrays.update(sft.image_fields(config, arrays["tokens"], arrays["attention_mask"], arrays["images"],
                                   arrays["image_count"]))
    return [float(sft.next_token_loss(model, p, {k: v[i:i + 1] for k, v in arrays.items()})[0]) for i in range(2)]

  before, before_swapped = losses(params, demos), losses(params, swapped)
  assert max(abs(a - b) for a, b in zip(before, before_swapped)) < 0.05  # untrained: the image barely matters
  request = SFTRequest(demonstrations=tuple(demos), steps=100, batch_size=2, learning_rate=3e-3)
  trained, history = learner_lib.finetune(model, params, request, tokenizer, 48, 12)
  assert history[-1] < history[0]
  after, after_swapped = losses(trained, demos), losses(trained, swapped)
  # Each answer is likelier under its own screenshot than under the other one.
  assert all(a + 0.5 < b for a, b in zip(after, after_swapped)), (after, after_swapped)
