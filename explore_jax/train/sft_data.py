"""Supervised fine-tuning data: JSONL demonstrations, oracle demonstrations, and their token arrays.

A demonstration line is `{"messages": [{"role": ..., "content": ...}, ...], "response": "..."}`: the chat
the model sees and the reply it should give. Prompts are tokenised by the actors' own `PromptTokenizer`,
so a warm-started policy sees at training time exactly what it will see when acting.

A vision-language policy's demonstrations add `"images"`: the prompt's images in the order its
`images.IMAGE` markers name them. In memory they are uint8 arrays [H, W, C]; in a JSONL file they are PNG
paths relative to the file (write_demonstrations writes them into `<file>.images/`).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import itertools
import json
import os
import queue
from typing import Any, Callable, Iterable, Optional, Sequence

import gymnasium
import numpy as np

from explore_jax.actors.actor import PromptTokenizer
from explore_jax.actors.protocol import EpisodeResult, EpisodeSpec, Prompt, Response, StepRecord, as_prompt
from explore_jax.envs import Demonstration, oracle_demonstrations, oracle_episode
from explore_jax.envs.base import state_key as observation_key
from explore_jax.images import ImageLayout
from explore_jax.train import rollout


def load_demonstrations(path: str) -> list[dict[str, Any]]:
  """Reads a JSONL file of demonstrations, or every *.jsonl file of a directory in name order (ScreenExplorer's
  distillation steps, one file per iteration); a malformed line is an error naming its line number."""
  if os.path.isdir(path):
    files = sorted(f for f in os.listdir(path) if f.endswith(".jsonl"))
    if not files:
      raise FileNotFoundError(f"no *.jsonl demonstrations in {path}")
    return [d for f in files for d in load_demonstrations(os.path.join(path, f))]
  if not os.path.exists(path):
    raise FileNotFoundError(f"no demonstrations file {path}")
  out = []
  with open(path) as f:
    for n, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        d = json.loads(line)
      except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{n}: not JSON ({e.msg})") from None
      if not isinstance(d, dict) or not isinstance(d.get("messages"), list) or not isinstance(d.get("response"), str):
        raise ValueError(f"{path}:{n}: expected {{\"messages\": [...], \"response\": \"...\"}}")
      if "images" in d:
        d["images"] = [_read_image(os.path.join(os.path.dirname(os.path.abspath(path)), p), f"{path}:{n}")
                       for p in d["images"]]
      out.append(d)
  return out


def _read_image(path: str, where: str) -> np.ndarray:
  from PIL import Image

  if not isinstance(path, str) or not os.path.exists(path):
    raise ValueError(f"{where}: no image file {path}")
  with Image.open(path) as image:
    return np.asarray(image.convert("RGB"))


def write_demonstrations(path: str, demos: Iterable[dict[str, Any]]) -> int:
  """Writes demonstrations as JSONL (atomically; images as PNG files in `<path>.images/`); returns how many."""
  from PIL import Image

  tmp = f"{path}.tmp"
  root = os.path.dirname(os.path.abspath(path))
  image_dir = os.path.basename(path) + ".images"  # beside the file; names in the file are relative to it
  n = 0
  with open(tmp, "w") as f:
    for d in demos:
      if d.get("images"):
        os.makedirs(os.path.join(root, image_dir), exist_ok=True)
        names = [os.path.join(image_dir, f"{n:06d}_{k}.png") for k in range(len(d["images"]))]
        for name, image in zip(names, d["images"]):
          Image.fromarray(np.asarray(image, np.uint8)).save(os.path.join(root, name))
        d = {**d, "images": names}
      f.write(json.dumps(d) + "\n")
      n += 1
  os.replace(tmp, path)
  return n


def oracle_sft_demos(env_id: str, env_kwargs: dict[str, Any], seeds: Sequence[int],
                     prompt_hook: Callable[..., list[dict[str, str]]],
                     workers: Optional[int] = None) -> list[dict[str, Any]]:
  """(prompt, oracle action) demonstrations from an environment's oracle, one per step, with the
  prompts built by the method's hook from the same history and info the actor would hold. A hook with a `final_prompt` and
  an `oracle_final_text` (EMPO2's tip) also gets, per episode, its final prompt answered with the text it makes of
  the oracle's episode: a policy learns to write what the final prompt asks for.

  A world that declares both `concurrent_instances` and `seeded_oracle` (envs/base.py: each instance its own
  process, and a seed's oracle episode the same on any instance, whatever it played before) is played on
  `workers` instances at once (default: one per core, at most 8), one thread each; the demonstrations are those
  of one instance, in seed order. Any other world is played on one instance, seed after seed: a JVM world's gold
  path can depend on what its JVM played before."""
  demos = []
  for d in _oracle_episodes(env_id, env_kwargs, list(seeds), workers):
    history: list[tuple[str, str]] = []
    for t, (obs, action) in enumerate(zip(d.observations, d.actions)):
      demos.append(demonstration(prompt_hook(obs, list(history), {}, d.infos[t] if d.infos else {}), action))
      history.append((obs, action))
    final_prompt, final_text = (getattr(prompt_hook, name, None) for name in ("final_prompt", "oracle_final_text"))
    if final_prompt is not None and final_text is not None:
      messages = final_prompt(d.final_observation, list(history), {"tip": True}, {})
      if messages is not None:
        demos.append(demonstration(messages, final_text(d.observations, d.actions, d.final_observation, d.success)))
  return demos


def oracle_episode_results(env_id: str, env_kwargs: dict[str, Any], seeds: Sequence[int],
                           workers: Optional[int] = None) -> list[EpisodeResult]:
  """The oracle's episodes of `seeds` as an actor records episodes (`episode_result`): what a method's cold start
  (Method.cold_start_request) learns from before RL, the episodes its warm start imitates."""
  spec = EpisodeSpec(0, 0, 0, env_id, env_kwargs)
  return [episode_result(d, dataclasses.replace(spec, episode_id=i, group_id=i, traj_id=i, seed=d.seed))
          for i, d in enumerate(_oracle_episodes(env_id, env_kwargs, list(seeds), workers))]


def warm_start_oracle_episodes(config: Any) -> list[EpisodeResult]:
  """`oracle_episode_results` of the warm start's seeds, in the world it plays (config.sft's oracle seeds and
  env_kwargs): the episodes a method's cold start learns from, and what its later stages may rehearse."""
  c = config.sft
  return oracle_episode_results(
      *rollout.environment(config, {**config.env.kwargs, **c.get("env_kwargs", {})}, demonstrations=True),
      range(c.oracle_seed_offset, c.oracle_seed_offset + c.oracle_episodes))


def episode_result(demo: Demonstration, spec: EpisodeSpec) -> EpisodeResult:
  """An oracle episode as the EpisodeResult an actor would have recorded playing its actions: step t's
  observation, its action as the response text, the state key of the state it stood at, and the info its action
  returned (what the next prompt is built with). No tokens (nothing was sampled) and no rewards (a Demonstration
  keeps none): success is the episode's, on its last step."""
  infos = list(demo.infos) + [demo.final_info]
  observations = list(demo.observations) + [demo.final_observation]
  keys = [int(info.get("state_key", observation_key(str(obs)))) for info, obs in zip(infos, observations)]
  empty = Response(spec.episode_id, 0, np.zeros(0, np.int32), np.zeros(0, np.float32), np.zeros(0, np.float32),
                   np.zeros(0, np.int32), 0)
  steps = []
  for t, (obs, action) in enumerate(zip(demo.observations, demo.actions)):
    last = t == len(demo.actions) - 1
    steps.append(StepRecord(spec.episode_id, spec.group_id, spec.traj_id, t, -1, [], dataclasses.replace(empty, step=t),
                            action, 0.0, 1.0, keys[t], last, bool(demo.success) and last, dict(infos[t + 1]),
                            observation=obs))
  return EpisodeResult(spec, steps, bool(demo.success), 0.0, "",
                       final_observation=str(demo.final_observation), final_state_key=keys[-1])


def episode_demos(episodes: Iterable[EpisodeResult], prompt_hook: Callable[..., Any]) -> list[dict[str, Any]]:
  """Every step of recorded episodes as a demonstration of its own answer, from the prompt `prompt_hook` builds
  there as an actor does; on `oracle_episode_results`, the demonstrations `oracle_sft_demos` makes."""
  demos = []
  for e in episodes:
    for t, step in enumerate(e.steps):
      history = [(s.observation, s.response_text) for s in e.steps[:t]]
      prompt = prompt_hook(step.observation, history, {}, e.steps[t - 1].info if t else {})
      demos.append(demonstration(prompt, step.response_text))
  return demos


def demonstration(prompt: Prompt | list[dict[str, str]], response: str) -> dict[str, Any]:
  """One demonstration: a prompt hook's output (a Prompt, whose images and shorter forms come along, or a message
  list) and the reply it should get, as `write_demonstrations` and `sft_request` take them. Past the prompt
  budget, SFT trains on the form an actor would sample from (tokenize_demos)."""
  prompt = as_prompt(prompt)
  shorter = [list(messages) for messages, _ in itertools.islice(prompt.forms(), 1, None)]
  return {"messages": prompt.messages, "response": response,
          **({"shorter": shorter} if shorter else {}),
          **({"images": [np.asarray(image) for image in prompt.images]} if prompt.images else {})}


MAX_ORACLE_WORKERS = 8


def _oracle_episodes(env_id: str, env_kwargs: dict[str, Any], seeds: list[int],
                     workers: Optional[int]) -> list[Demonstration]:
  envs = [gymnasium.make(env_id, **env_kwargs)]
  try:
    declared = envs[0].unwrapped.metadata
    n = min(workers or min(os.cpu_count() or 1, MAX_ORACLE_WORKERS), len(seeds))
    if n <= 1 or not (declared.get("concurrent_instances") and declared.get("seeded_oracle")):
      return oracle_demonstrations(envs[0], seeds)
    envs += [gymnasium.make(env_id, **env_kwargs) for _ in range(n - 1)]
    idle: queue.SimpleQueue = queue.SimpleQueue()
    for env in envs:
      idle.put(env)

    def play(seed: int) -> Demonstration:
      env = idle.get()
      try:
        return oracle_episode(env, seed=seed)
      finally:
        idle.put(env)

    with concurrent.futures.ThreadPoolExecutor(n, thread_name_prefix="oracle") as pool:
      return list(pool.map(play, seeds))
  finally:
    for env in envs:
      env.close()


def tokenize_demos(tokenizer: Any, demos: Sequence[dict[str, Any]], prompt_len: int, response_len: int,
                   image_layout: Optional[ImageLayout] = None) -> dict[str, np.ndarray]:
  """Token arrays for the next-token step: [prompt | response + EOS], prompt left-padded to
  `prompt_len` (a longer prompt is taken in its first shorter form that fits, else cut to its end, as actors
  do), loss on the response only.

  Demonstrations with images need the policy's `image_layout`: their images are resized and laid out as
  the actors do, and the arrays add "images" uint8 [N, K, H, W, C] (K the most any prompt holds, all of
  one size after resizing; the first "image_count" [N] of each row real)."""
  eos = tokenizer.eos_token_id
  pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
  encoder = PromptTokenizer(tokenizer, prompt_len, image_layout)
  n, width = len(demos), prompt_len + response_len
  tokens = np.full((n, width), pad, np.int32)
  attention = np.zeros((n, width), bool)
  loss = np.zeros((n, width), bool)
  images = [encoder.resize(d.get("images", ())) for d in demos]
  for i, d in enumerate(demos):
    prompt, _, _ = encoder.encode_fitting([d["messages"], *d.get("shorter", ())], images[i])
    response = tokenizer(d["response"], add_special_tokens=False)["input_ids"] + [eos]
    if len(response) > response_len:
      raise ValueError(f"demonstration {i}: response of {len(response)} tokens exceeds response_len={response_len}")
    start = prompt_len - len(prompt)
    tokens[i, start:prompt_len] = prompt
    tokens[i, prompt_len:prompt_len + len(response)] = response
    attention[i, start:prompt_len + len(response)] = True
    loss[i, prompt_len:prompt_len + len(response)] = True
  arrays = {"tokens": tokens, "attention_mask": attention, "loss_mask": loss}
  if any(images):
    arrays.update(_stack_images(images))
  return arrays


def _stack_images(images: list[tuple[np.ndarray, ...]]) -> dict[str, np.ndarray]:
  shapes = {image.shape for row in images for image in row}
  if len(shapes) > 1:
    raise ValueError(f"the demonstrations' images have {len(shapes)} sizes after resizing ({sorted(shapes)}); "
                     f"one batch holds images of one size")
  K, shape = max(len(row) for row in images), shapes.pop()
  stacked = np.zeros((len(images), K, *shape), np.uint8)
  for i, row in enumerate(images):
    for k, image in enumerate(row):
      stacked[i, k] = image
  return {"images": stacked, "image_count": np.array([len(row) for row in images], np.int32)}
