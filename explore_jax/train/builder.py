"""Wiring: one place builds every part of a run from its config (the Acme builder's role).

  parts = build(config, workdir)
  parts.server      InferenceServer   the actors' sampler and embedder (train/inference.py)
  parts.learner     Learner           policy + aux models + their updates (train/learner.py)
  parts.evaluator   Evaluator         held-out success and pass@k (train/evaluator.py)
  parts.make_pool() ActorPool         actor processes with the method's prompt hook (actors/pool.py)

Everything here is construction: which model, mesh, sharding rules, method, record layout, sampling
schedules and checkpoint directory. What happens each iteration is train/loop.py.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Optional

import jax

from explore_jax import hf, sampling, storage
from explore_jax.actors.pool import ActorPool
from explore_jax.methods import Method, make_method
from explore_jax.methods.base import BuildContext
from explore_jax.images import ImageLayout
from explore_jax.models import Model
from explore_jax.models.config import VLConfig, language_config, resolve_dtype
from explore_jax.models.vl import VLModel
from explore_jax.models import lora as lora_lib
from explore_jax.parallel import make_mesh
from explore_jax.parallel.exchange import ProcessExchange
from explore_jax.parallel.sharding import rules_from_config
from explore_jax.replay import RecordSpec
from explore_jax.train import checkpoint, rollout, warm_start
from explore_jax.train.evaluator import Evaluator
from explore_jax.train.inference import InferenceServer
from explore_jax.train.learner import Learner

# Named seeds folded into the run's key.
AUX_INIT_STREAM = 17


@dataclasses.dataclass
class Parts:
  """A run's parts, built once (see the module docstring)."""
  config: Any
  workdir: str                 # absolute, or a bucket path (gs://...)
  checkpoint_dir: str          # the policy's starting checkpoint (a Hugging Face directory)
  tokenizer: Any
  model: Model
  method: Method
  spec: RecordSpec
  server: InferenceServer
  learner: Learner
  evaluator: Evaluator
  train_sampling: sampling.SamplingParams
  checkpointer: checkpoint.Checkpointer
  key: jax.Array
  image_layout: Optional[ImageLayout] = None  # a vision-language policy's: how prompts lay images out

  @property
  def records_per_iteration(self) -> int:
    r = self.config.rollout
    return r.num_tasks * r.group_size * int(self.config.env.max_steps)

  @property
  def sft_response_len(self) -> int:
    """The warm start's response columns: a step's budget, or a final generation's where that is longer (EMPO2's
    warm start also teaches tips)."""
    return max(self.server.response_len, self.server.final_len)

  def warm_start_key(self) -> str:
    """The key of the policy RL starts from: the warm start's, with the method's cold start where it has one."""
    return warm_start.start_key(warm_start.warm_start_key(self.config, self.checkpoint_dir, self.server.prompt_len,
                                                          self.sft_response_len, self.method.prompt_hook()),
                                self.method)

  def warm_start_params(self, log=print) -> Any:
    """The SFT warm start of the config (cached), or the learner's initial parameters without one (with LoRA,
    adapters: the warm start then trains only them); then the method's cold start, where it asks for one."""
    return warm_start.warm_start_params(
        self.config, self.model, self.learner.initial_params, self.learner.shardings.params, self.tokenizer,
        self.method.prompt_hook(), checkpoint_dir=self.checkpoint_dir, prompt_len=self.server.prompt_len,
        response_len=self.sft_response_len, log=log, lora=self.learner.lora, base=self.learner.base_params,
        image_layout=self.image_layout, method=self.method)

  def make_pool(self) -> ActorPool:
    """This process's actors; in a multi-host run they play its share of each run's episodes, and the
    policy calls are collective rounds with the other processes' pools (actors/pool.py)."""
    c = self.config.rollout
    return ActorPool(num_actors=c.num_actors, tokenizer_dir=self.checkpoint_dir,
                     prompt_hook=self.method.prompt_hook(), envs_per_actor=c.envs_per_actor,
                     max_prompt_tokens=self.server.prompt_len, episode_timeout_s=c.episode_timeout_s,
                     batch_wait_s=c.batch_wait_s, image_layout=self.image_layout,
                     kept_env_settings=c.kept_env_settings, env_threads=c.env_threads,
                     exchange=ProcessExchange() if jax.process_count() > 1 else None)


def build(config: Any, workdir: str) -> Parts:
  """Every part of a run, on the mesh of `config.mesh`, starting from `config.model.checkpoint`; `workdir` is a
  local directory or a bucket path (explore_jax/storage.py)."""
  workdir = storage.resolve(workdir)
  storage.makedirs(workdir)
  mesh = make_mesh(tuple(config.mesh.shape), tuple(config.mesh.axes))
  rules = rules_from_config(config.sharding_rules)
  checkpoint_dir = hf.resolve(config.model.checkpoint)
  pre = hf.load_pretrained(checkpoint_dir, param_dtype=resolve_dtype(config.model.param_dtype),
                           dtype=resolve_dtype(config.model.dtype), mesh=mesh, rules=rules)
  layout = None
  if isinstance(pre.config, VLConfig):  # a vision-language checkpoint: prompts may carry images
    vl_config = pre.config.replace(text=pre.config.text.replace(remat=config.model.remat))
    model = VLModel(vl_config, mesh=mesh, rules=rules)
    layout = ImageLayout.from_config(vl_config)
  else:
    model = Model(pre.config.replace(remat=config.model.remat), mesh=mesh, rules=rules)
  lora = lora_lib.from_config(config.model.get("lora"))  # None: every weight trains
  method = make_method(config)
  check_environments(config)
  tokenizer = pre.tokenizer
  key = jax.random.key(config.seed)

  r = config.rollout
  max_steps = int(config.env.max_steps)
  pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
  text_encoder = make_text_encoder(config)
  # `encode` reaches the server built below: the run's one text encoder, on the learner's side.
  ctx = BuildContext(model_config=model.config, model=model, initial_params=pre.params, tokenizer=tokenizer,
                     mesh=mesh, rules=rules, encode=lambda texts: server.encode(texts), workdir=workdir,
                     embedding_dim=text_encoder.dim if text_encoder is not None else language_config(model.config).hidden_size)
  method.setup(ctx)
  extras = dict(method.record_fields(ctx))
  if layout is not None:  # records keep their prompts' images: at most rollout.max_images of the env's size
    H, W, C = (int(v) for v in r.get("image_shape", (0, 0, 3)))
    if not H or not W:
      raise ValueError("a vision-language policy needs config.rollout.image_shape: the (height, width, channels) "
                       "of the environment's images")
    resized = layout.target_size(H, W)
    extras.update(rollout.image_record_fields(r.get("max_images", 1), (*resized, C)))
  spec = RecordSpec(prompt_len=r.max_prompt_tokens, response_len=r.max_new_tokens, pad_id=pad_id,
                    intrinsic_names=method.intrinsic_names, extras=extras)
  # rollout.num_actors is per process: one sampler call holds every process's requests of a round.
  server = InferenceServer(model=model, tokenizer=tokenizer, pad_id=pad_id, prompt_len=r.max_prompt_tokens,
                           response_len=r.max_new_tokens, max_steps=max_steps,
                           batch_size=r.num_actors * r.envs_per_actor * jax.process_count(), lora=lora,
                           base_params=pre.params if lora is not None else None, image_layout=layout,
                           min_rows=r.min_sampler_rows, width_bucket=r.prompt_width_bucket,
                           batching=r.get("batching", "fixed"), decode_attention=r.get("decode_attention", "dense"),
                           final_len=int(r.get("final_max_new_tokens", 0)), text_encoder=text_encoder)
  eos = [tokenizer.eos_token_id] + [tokenizer.convert_tokens_to_ids(t) for t in r.get("extra_stop_tokens", ())]
  delimiters = [tokenizer(d, add_special_tokens=False)["input_ids"] for d in method.delimiters()]
  train_sampling = sampling.make_sampling_params(method.temperatures(), delimiters, eos_ids=eos, top_p=r.top_p)
  eval_sampling = sampling.make_sampling_params([config.eval.temperature] * len(method.temperatures()), delimiters,
                                                eos_ids=eos, top_p=r.top_p)
  learner = Learner(config, model, method, pre.params, ctx, jax.random.fold_in(key, AUX_INIT_STREAM),
                    tokenizer=tokenizer, prompt_len=r.max_prompt_tokens, response_len=r.max_new_tokens,
                    max_steps=max_steps, lora=lora)
  return Parts(config=config, workdir=workdir, checkpoint_dir=checkpoint_dir, tokenizer=tokenizer, model=model,
               method=method, spec=spec, server=server, learner=learner,
               evaluator=Evaluator(config, server, eval_sampling, key), train_sampling=train_sampling,
               checkpointer=checkpoint.Checkpointer(
                   os.path.join(workdir, "checkpoints"), max_to_keep=config.checkpoint.max_to_keep,
                   # the KL term's reference is the policy RL started from: step 0 outlives the rotation
                   keep_steps=(0,) if learner.reference_logprobs is not None else ()),
               key=key, image_layout=layout)


def make_text_encoder(config: Any) -> Any:
  """The sentence encoder config.embedding.encoder names, or None for the policy's own embedding."""
  name = config.get("embedding", {}).get("encoder", "policy")
  if name == "policy":
    return None
  return hf.load_encoder(name)


def check_environments(config: Any) -> None:
  """Builds the training and evaluation environments once here, so a bad id or kwarg (a missing dataset
  file, say) stops the run with the environment's own message instead of failing inside every actor."""
  import gymnasium

  import explore_jax.envs  # noqa: F401  (registers the environment ids)

  from explore_jax.train.rollout import environment

  for kwargs in (dict(config.env.kwargs), {**config.env.kwargs, **config.eval.get("env_kwargs", {})}):
    env_id, kwargs = environment(config, kwargs)
    try:
      gymnasium.make(env_id, **kwargs).close()
    except Exception as e:
      raise ValueError(f"environment {env_id} with {kwargs} cannot be built: {e}") from e
