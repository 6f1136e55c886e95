"""The SFT warm start: an `SFTRequest` at iteration 0 (oracle demonstrations or a JSONL file), cached.

The result depends only on the starting checkpoint, the SFT options and data, and the prompt layout, never
on the RL seed or the method's training-time behaviour, so it is cached under the cache root by a hash of
exactly those and shared by every run that warm-starts the same way.

A method may ask for a cold start between the warm start and RL (Method.cold_start_key / cold_start_request: SFT
on what the oracle's episodes teach). It is the same mechanism on the warm start's params, cached under a key that
adds the method's; without one, RL starts from the warm start under its own key.
"""

from __future__ import annotations

import hashlib
import json
import dataclasses
import os
import shutil
import time
from typing import Any, Callable, Optional

import jax

from explore_jax import cache as cache_lib, hf
from explore_jax.images import ImageLayout
from explore_jax.methods.base import ObservationPrompt, SFTRequest
from explore_jax.models import lora as lora_lib
from explore_jax.train import checkpoint, rollout, sft_data
from explore_jax.train.learner import finetune


def config_hash(*parts: Any) -> str:
  return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:12]


def checkpoint_identity(checkpoint_dir: str) -> str:
  """The starting checkpoint as a warm start's key names it. A built-in checkpoint is written under the cache
  root in a directory named by a digest of its content (hf.tiny_dir), so it is named by that directory alone
  and the key does not depend on where the cache is (a warm start carried to another machine keeps its key);
  any other checkpoint by its absolute path."""
  path = os.path.abspath(checkpoint_dir)
  inside = os.path.relpath(path, cache_lib.root())
  return inside if not inside.startswith(os.pardir) and os.sep not in inside else path


def hook_identity(hook: Any) -> Any:
  """A prompt hook as a warm start's key sees it: None for the plain ObservationPrompt, whose settings are config
  fields the key holds already; for any other hook (EMPO2's tips, EAPO's fields, DPEPO's parallel layout, which
  build other demonstrations from the same oracle episodes) its class and fields, an inner hook's in turn."""
  if hook is None or type(hook) is ObservationPrompt:
    return None
  if not dataclasses.is_dataclass(hook):
    return f"{type(hook).__module__}.{type(hook).__qualname__}"
  fields = {f.name: getattr(hook, f.name) for f in dataclasses.fields(hook)}
  return {"hook": f"{type(hook).__module__}.{type(hook).__qualname__}",
          **{k: hook_identity(v) if dataclasses.is_dataclass(v) else v for k, v in fields.items()}}


def warm_start_key(config: Any, checkpoint_dir: str, prompt_len: int, response_len: int,
                   prompt_hook: Any = None) -> str:
  """What determines the warm start: the checkpoint (checkpoint_identity), the SFT options and data, the prompt
  layout (with the history the prompts show), and with LoRA its adapters' shape and seed (these last parts only
  where set, so the keys of existing warm starts stay what they were; so is `sft.micro_batch_size`, which sums
  the gradient in another order). Oracle demonstrations are prompts the method's hook builds, so a hook other
  than the plain one is part of the key too (hook_identity); a JSONL file's are what the file holds. How often
  the SFT saves its progress changes nothing in its result, so it is not part of the key."""
  lora = lora_lib.from_config(config.model.get("lora"))
  hook = None if config.sft.get("demonstrations") else hook_identity(prompt_hook)
  history = {k: config.get(k, 0) for k in ("history_steps", "action_history") if config.get(k, 0)}
  sft = {k: v for k, v in config.sft.to_dict().items()
         if k != "checkpoint_every" and not (k == "micro_batch_size" and not v)}
  env = config.env.to_dict()
  if not env.get("parallel", {}).get("copies"):
    env.pop("parallel", None)  # the world itself: the hash warm starts had before parallel copies existed
  if not env.get("screen_reading"):
    env.pop("screen_reading", None)  # screens not read: the hash warm starts had before screen reading existed
  return config_hash(checkpoint_identity(checkpoint_dir), sft, env, prompt_len, response_len,
                     config.get("system_prompt"), config.get("instruction", ""),
                     *([dataclasses.asdict(lora)] if lora is not None else []), *([history] if history else []),
                     *([{"prompt_hook": hook}] if hook is not None else []))


def request(config: Any, prompt_hook: Callable) -> SFTRequest:
  """config.sft as an SFT request: a JSONL file's demonstrations or the environment oracle's episodes."""
  c = config.sft
  demos = (sft_data.load_demonstrations(c.demonstrations) if c.demonstrations else
           sft_data.oracle_sft_demos(*rollout.environment(config, {**config.env.kwargs, **c.get("env_kwargs", {})},
                                                          demonstrations=True),
                                     range(c.oracle_seed_offset, c.oracle_seed_offset + c.oracle_episodes),
                                     prompt_hook))
  return SFTRequest(demonstrations=tuple(demos), steps=c.steps, batch_size=c.batch_size,
                    micro_batch_size=c.get("micro_batch_size", 0),
                    learning_rate=c.learning_rate, seed=c.seed, label="sft")


def start_key(warm_key: str, method: Any = None) -> str:
  """The key of the policy RL starts from: the warm start's, or, where the method asks for a cold start before RL
  (Method.cold_start_key), the warm start's and the cold start's together."""
  identity = None if method is None else method.cold_start_key()
  return warm_key if identity is None else config_hash(warm_key, {"cold_start": identity})


def warm_start_params(config: Any, model: Any, initial_params: Any, shardings: Any, tokenizer: Any,
                      prompt_hook: Callable, *, checkpoint_dir: str, prompt_len: int, response_len: int,
                      log: Callable[[str], None] = print, lora: Optional[lora_lib.LoraConfig] = None,
                      base: Any = None, image_layout: Optional[ImageLayout] = None, method: Any = None) -> Any:
  """The policy's parameters after the warm start (the initial ones when config.sft is off), then after the
  `method`'s cold start where it asks for one (`cold_start_params`). With `lora` they are adapters on the frozen
  `base`, and the warm start trains only them. A vision-language policy's image demonstrations are laid out by its
  `image_layout`, as its actors lay out prompts.

  A long SFT saves its progress beside the cache every `config.sft.checkpoint_every` steps, so a killed
  warm start goes on from its last save when any run asks for it again (and ends with the same params)."""
  key = warm_start_key(config, checkpoint_dir, prompt_len, response_len, prompt_hook)
  abstract = checkpoint.abstract_like(jax.eval_shape(lambda: initial_params), shardings)
  params = _sft_params(config, model, initial_params, abstract, tokenizer, prompt_hook, key=key,
                       prompt_len=prompt_len, response_len=response_len, log=log, lora=lora, base=base,
                       image_layout=image_layout)
  if method is None or method.cold_start_key() is None:
    return params
  return cold_start_params(config, method, model, params, abstract, tokenizer, key=start_key(key, method),
                           prompt_len=prompt_len, response_len=response_len, log=log, lora=lora, base=base,
                           image_layout=image_layout)


def cold_start_params(config: Any, method: Any, model: Any, params: Any, abstract: Any, tokenizer: Any, *, key: str,
                      prompt_len: int, response_len: int, log: Callable[[str], None] = print,
                      lora: Optional[lora_lib.LoraConfig] = None, base: Any = None,
                      image_layout: Optional[ImageLayout] = None) -> Any:
  """`params` after the method's cold start (Method.cold_start_request) on the oracle's episodes of the warm
  start's seeds, in the world the warm start plays (config.sft's seeds and env_kwargs), cached under `key`. A
  request of None (nothing the episodes teach) leaves the params as they are, cached all the same."""
  with checkpoint.Checkpointer(cache_lib.warm_start_dir(key), max_to_keep=1) as ck:
    if ck.latest_step() is not None:
      log(f"[cold start] reused from {ck.directory}")
      return ck.restore(abstract).state
    t0 = time.time()
    episodes = sft_data.warm_start_oracle_episodes(config)
    req = method.cold_start_request(episodes)
    if req is None:
      log(f"[cold start] {len(episodes)} oracle episodes gave nothing to learn; RL starts from the warm start")
      losses = []
    else:
      params, losses = finetune(model, params, req, tokenizer, prompt_len, response_len, lora=lora, base=base,
                                image_layout=image_layout)
      log(f"[cold start] {req.label}: {req.steps} steps on {len(req.demonstrations)} demonstrations from "
          f"{len(episodes)} oracle episodes: loss {losses[0]:.3f} -> {losses[-1]:.3f} ({time.time() - t0:.0f}s)")
    ck.save(0, params, metadata={"losses": losses[-10:], "demonstrations": len(req.demonstrations) if req else 0})
    ck.wait()
    return params


def _sft_params(config: Any, model: Any, initial_params: Any, abstract: Any, tokenizer: Any, prompt_hook: Callable,
                *, key: str, prompt_len: int, response_len: int, log: Callable[[str], None],
                lora: Optional[lora_lib.LoraConfig], base: Any, image_layout: Optional[ImageLayout]) -> Any:
  """The warm start's SFT itself (warm_start_params), cached under `key`."""
  if not config.sft.enabled:
    return initial_params
  from tqdm import tqdm

  cache = cache_lib.warm_start_dir(key)
  with checkpoint.Checkpointer(cache, max_to_keep=1) as ck:
    if ck.latest_step() is not None:
      log(f"[sft] warm start reused from {cache}")
      return ck.restore(abstract).state
    log(f"[sft] warm start: demonstrations from {config.sft.demonstrations or 'the environment oracle'}")
    req = request(config, prompt_hook)
    t0 = time.time()
    in_progress = cache + ".in_progress"
    if os.path.isdir(in_progress):
      log(f"[sft] going on from the progress saved in {in_progress}")
    with tqdm(total=req.steps, desc="sft warm start", unit="step", dynamic_ncols=True) as bar:
      def progress(step: int, loss: float) -> None:
        bar.update(step - bar.n)
        bar.set_postfix(loss=f"{loss:.3f}")

      params, losses = finetune(model, initial_params, req, tokenizer, prompt_len, response_len, progress=progress,
                                lora=lora, base=base, image_layout=image_layout, checkpoint_dir=in_progress,
                                checkpoint_every=config.sft.get("checkpoint_every", 0))
    log(f"[sft] {req.steps} steps on {len(req.demonstrations)} demonstrations: loss {losses[0]:.3f} -> "
        f"{sum(losses[-10:]) / len(losses[-10:]):.3f} ({time.time() - t0:.0f}s); cached in {cache}")
    ck.save(0, params, metadata={"losses": losses[-10:], "demonstrations": len(req.demonstrations)})
    ck.wait()
    shutil.rmtree(in_progress, ignore_errors=True)
    return params
