"""Benchmark: what ScreenExplorer adds to a step, on real screenshots of Desktop-v0 and MiniWoB-v0.

Prints, asserts nothing; wall times on this machine under its load (printed).

  actor side   ScreenReading-v0's reading of one new screenshot: the image latent (patch_stats) and the OCR boxes
               (tesseract at ocr_boxes' defaults), per world and screen size
  learner side the four texts a step embeds (both screens' OCR text, the intent, the text under a click) through
               all-MiniLM-L6-v2 (explore_jax/hf/encoder.py), per step in batches of --steps steps; and one world-model
               epoch (rl/world_model.py at the configs' sizes) per step of the iteration

  .venv/bin/python benchmarks/screen_explorer_step.py [--shots 8] [--steps 20]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import gymnasium  # noqa: E402

import explore_jax.envs  # noqa: E402,F401
from explore_jax.envs import screen_reading  # noqa: E402
from explore_jax.envs.screen_reader import screen_text  # noqa: E402

ACTIONS = ("DoubleClick(40, 40)", "Click(100, 60)", 'Text(60, 60, "hello")', 'Key("Enter")', "ScrollDown(80, 80)")


def screenshots(env_id: str, kwargs: dict, count: int) -> list[np.ndarray]:
  env = gymnasium.make(env_id, **kwargs)
  try:
    shots = [env.reset(seed=0)[0]["screenshot"]]
    for i in range(count - 1):
      observation, _, terminated, truncated, _ = env.step(ACTIONS[i % len(ACTIONS)])
      shots.append(observation["screenshot"])
      if terminated or truncated:
        shots.append(env.reset(seed=i + 1)[0]["screenshot"])
    return shots[:count]
  finally:
    env.close()


def timed(function, *args, repeat: int = 1) -> float:
  t0 = time.perf_counter()
  for _ in range(repeat):
    out = function(*args)
  return (time.perf_counter() - t0) / repeat, out


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--shots", type=int, default=8)
  parser.add_argument("--steps", type=int, default=20)
  args = parser.parse_args()
  print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
  worlds = (("Desktop-v0 320x240", "explore_jax/Desktop-v0", {"screen_size": (320, 240), "max_steps": 50}),
            ("Desktop-v0 640x480", "explore_jax/Desktop-v0", {"screen_size": (640, 480), "max_steps": 50}),
            ("MiniWoB-v0 160x210", "explore_jax/MiniWoB-v0", {"task": "click-button", "max_steps": 50}))
  texts = []
  print("\n| world | screenshots | latent ms | OCR ms | boxes per screen |\n|---|---|---|---|---|")
  for name, env_id, kwargs in worlds:
    shots = screenshots(env_id, kwargs, args.shots)
    latent = [timed(screen_reading.image_latent, "patch_stats", s)[0] for s in shots]
    ocr = [timed(screen_reading.ocr_boxes, s) for s in shots]
    texts += [screen_text([b.as_list() for b in boxes]) for _, boxes in ocr]
    print(f"| {name} | {len(shots)} | {1e3 * np.mean(latent):.2f} | {1e3 * np.mean([t for t, _ in ocr]):.0f} | "
          f"{np.mean([len(b) for _, b in ocr]):.1f} |")

  from explore_jax.hf.encoder import load_encoder

  encoder = load_encoder("all-minilm-l6-v2")
  batch = [texts[i % len(texts)] + f" {i}" for i in range(4 * args.steps)]  # distinct texts, as steps' are
  encoder.encode(batch)  # compile
  seconds, _ = timed(encoder.encode, batch, repeat=3)
  print(f"\nMiniLM: {4 * args.steps} texts ({args.steps} steps x 4) in {1e3 * seconds:.0f} ms: "
        f"{1e3 * seconds / args.steps:.1f} ms per step")

  import jax

  from explore_jax.rl import world_model

  config = world_model.WorldModelConfig(text_dim=encoder.dim)
  params = world_model.init(jax.random.key(0), config=config)
  batch_size = 2  # the configs' world_model.batch_size
  rows = {"latent": np.zeros((batch_size, config.latent_dim), np.float32),
          "text": np.zeros((batch_size, config.text_dim), np.float32),
          "actions": world_model.action_bytes(["Click(1, 2)"] * batch_size, config.action_len)[0],
          "next_latent": np.zeros((batch_size, config.latent_dim), np.float32),
          "next_text": np.zeros((batch_size, config.text_dim), np.float32),
          "mask": np.ones(batch_size, bool), "row": np.arange(batch_size, dtype=np.int32)}
  grad = jax.jit(jax.grad(lambda p, b: world_model.loss(p, b, config=config)[0]))
  jax.block_until_ready(grad(params, rows))
  seconds, _ = timed(lambda: jax.block_until_ready(grad(params, rows)), repeat=20)
  print(f"world model (hidden {config.hidden}, {config.layers} layers): {1e3 * seconds:.1f} ms per batch of "
        f"{batch_size} (forward + backward): {1e3 * seconds / batch_size:.1f} ms per step per epoch")


if __name__ == "__main__":
  main()
