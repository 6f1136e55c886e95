"""A vision-language policy's update: records that keep their prompts' images (uint8, as the actors sent them)
let the learner recompute the behaviour log-probs the sampler recorded, and the policy gradient reaches the
vision tower."""

import jax
import jax.numpy as jnp
import numpy as np

from explore_jax import sampling
from explore_jax.actors.protocol import PromptRequest
from explore_jax.images import ImageLayout
from explore_jax.models import vl as vl_lib
from explore_jax.rl.losses import PolicyLossConfig
from explore_jax.train import rl_step
from explore_jax.train.inference import InferenceServer

from tests.models.test_vl import CONFIG

R = 5


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

  # The records as the learner packs them: left-padded prompts, right-padded responses, the images.
  B, P = len(requests), 64
  prompt = np.zeros((B, P), np.int32)
  prompt_mask = np.zeros((B, P), bool)
  response = np.zeros((B, R), np.int32)
  response_mask = np.zeros((B, R), bool)
  temperatures = np.zeros((B, R), np.float32)
  behaviour = np.zeros((B, R), np.float32)
  for i, (req, res) in enumerate(zip(requests, responses)):
    prompt[i, P - len(req.prompt_ids):], prompt_mask[i, P - len(req.prompt_ids):] = req.prompt_ids, True
    n = len(res.tokens)
    response[i, :n], response_mask[i, :n] = res.tokens, True
    temperatures[i, :n], behaviour[i, :n] = res.temperatures, res.logprobs
  images = np.zeros((B, 1, 8, 12, 3), np.uint8)
  images[0, 0], images[2, 0] = shots
  grids = np.array([layout.grid(shots[0]), layout.grid(shots[1])])
  positions, _ = vl_lib.mrope_positions(np.concatenate([prompt, response], 1),
                                        np.concatenate([prompt_mask, response_mask], 1), grids, CONFIG)
  batch = {"prompt_tokens": prompt, "prompt_mask": prompt_mask, "response_tokens": response,
           "response_mask": response_mask, "temperatures": temperatures, "behaviour_logprobs": behaviour,
           "images": images, "image_count": np.array([1, 0, 1], np.int32), "positions": positions,
           "advantages": np.array([1.0, -0.5, 0.5], np.float32), "valid": np.ones(B, bool)}

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
