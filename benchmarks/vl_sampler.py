"""Benchmark: a vision-language policy's sampler with an image in every prompt, through the central inference
server the RL loop uses (train/inference.py: one vision-tower call per image, host-side mRoPE positions, the
jitted sampler), against the same prompts with the image tokens replaced by text tokens (the text-only cost
at the same prompt length). Prints, asserts nothing; wall time, best of --repeats after a compiling call.

  .venv/bin/python benchmarks/vl_sampler.py [--preset tiny-vl] [--batch 16] [--image 160x210] [--text 64]
      [--new_tokens 32] [--dtype float32]

Per configuration: new tokens/s (B x new_tokens over the call), the vision tower's time per image (its own
jitted call), and the image prompts' cost over the text-only ones. Random weights; the image is random pixels
resized by the processor's rule (a 160 x 210 MiniWoB screenshot becomes 168 x 224: 192 patches, 48 tokens).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from explore_jax import sampling  # noqa: E402
from explore_jax.actors.protocol import PromptRequest  # noqa: E402
from explore_jax.images import ImageLayout  # noqa: E402
from explore_jax.models.config import VL_PRESETS  # noqa: E402
from explore_jax.models.vl import VLModel  # noqa: E402
from explore_jax.train import inference  # noqa: E402


def best(fn, repeats: int) -> float:
  fn()
  out = math.inf
  for _ in range(repeats):
    t0 = time.perf_counter()
    fn()
    out = min(out, time.perf_counter() - t0)
  return out


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--preset", default="tiny-vl")
  parser.add_argument("--batch", type=int, default=16)
  parser.add_argument("--image", default="160x210", help="HxW of the raw image")
  parser.add_argument("--text", type=int, default=64, help="text tokens around the image")
  parser.add_argument("--new_tokens", type=int, default=32)
  parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
  parser.add_argument("--repeats", type=int, default=3)
  args = parser.parse_args()

  config = VL_PRESETS[args.preset]
  config = config.replace(text=config.text.replace(dtype=args.dtype, param_dtype=args.dtype))
  model = VLModel(config)
  params = jax.jit(model.init, static_argnames="std")(jax.random.key(0), std=0.02)
  layout = ImageLayout.from_config(config)
  H, W = (int(v) for v in args.image.split("x"))
  rng = np.random.default_rng(0)
  image = layout.resize(rng.integers(0, 256, (H, W, 3), dtype=np.uint8))
  n_image = layout.num_tokens(image)
  B = args.batch
  prompt_len = -(-(args.text + n_image + 2) // 64) * 64
  server = inference.InferenceServer(model=model, tokenizer=None, pad_id=0, prompt_len=prompt_len,
                                     response_len=args.new_tokens, max_steps=1, batch_size=B, image_layout=layout)
  no_stop = sampling.make_sampling_params(1.0)  # no EOS: every row makes new_tokens tokens
  policy_fn, _ = server.bind(params, jax.random.key(1), no_stop, version=0)

  def text(n):
    return [int(t) for t in rng.integers(10, 4000, n)]

  half = args.text // 2
  with_images = [PromptRequest(episode_id=i, step=0, images=(image,), prompt_ids=text(half) + layout.expand(
      [layout.start_id, layout.pad_id, layout.end_id], [image]) + text(args.text - half)) for i in range(B)]
  text_only = [PromptRequest(episode_id=i, step=0, prompt_ids=text(len(r.prompt_ids))) for i, r in enumerate(with_images)]

  t_image = best(lambda: policy_fn(with_images), args.repeats)
  t_text = best(lambda: policy_fn(text_only), args.repeats)
  patches, grid = layout.pixel_values([image])
  inputs = inference.vision_lib.vision_inputs(patches, grid, config.vision)
  tower = best(lambda: jax.block_until_ready(inference._image_features(model, params["vision"], inputs)),
               args.repeats)
  new = B * args.new_tokens
  print(f"{args.preset} {args.dtype}, {jax.devices()[0].device_kind}: batch {B}, prompt {len(with_images[0].prompt_ids)} "
        f"tokens ({n_image} image tokens of a {H}x{W} image at {image.shape[0]}x{image.shape[1]}, "
        f"{len(patches)} patches), {args.new_tokens} new tokens, load {os.getloadavg()[0]:.1f}")
  print(f"image prompts   {new / t_image:8,.0f} new tok/s ({t_image * 1e3:7.1f} ms per call; vision tower "
        f"{tower * 1e3:.1f} ms per image, {B * tower / t_image:.0%} of the call)")
  print(f"text prompts    {new / t_text:8,.0f} new tok/s ({t_text * 1e3:7.1f} ms per call)")
  print(f"image / text    {t_image / t_text:.2f}x the time")


if __name__ == "__main__":
  main()
