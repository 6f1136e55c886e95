"""LoRA (Hu et al., 2021, arXiv:2106.09685): low-rank adapters trained on a frozen checkpoint.

A target weight W [in, out] is used as  W' = W + (alpha / r) A B  (the paper's eq. 3, h = W0 x + B A x, with its
alpha / r scaling of §4.1, written for our row vectors: our A [in, r] and B [r, out] are the paper's A^T and
B^T). A starts uniform in +-1/sqrt(in) (PEFT's default) and B at zero, so the adapted model starts as the
base model, bit for bit.

Adapters are a pytree of their own, keyed by our leaf names (models/transformer.py), layers first:

  {"q": {"a": [L, E, r], "b": [L, r, q_heads, head_dim]}, "o": {"a": [L, q_heads, head_dim, r], "b": [L, r, E]},
   "gate": {"a": [L, E, r], "b": [L, r, mlp]}, "down": {"a": [L, mlp, r], "b": [L, r, E]}, ...}

They are float32 whatever the base's dtype: they are small, and Adam's small steps on a bf16 B would round
away. Only they train: gradients, optimizer state and a run's checkpoints hold them and nothing of the base
(train/sft.py, train/learner.py). Targets are named as in Hugging Face / PEFT (`q_proj` ... `down_proj`, or
"all-linear" for all seven). On a vision-language model (models/vl.py) they adapt its language model's layers and
the vision tower stays frozen: a VLConfig stands for its language model here. There is no adapter dropout (PEFT's lora_dropout): RL recomputes the sampler's
log-probs in the update, and dropout there would move the importance ratio of a fresh batch off 1.

The adapters are used in two forms, each where it is cheaper:

  training  `adapted(base, adapters)` puts the scaled adapters beside the base params and `Model.apply` adds
            (x A) B to each target's output. The gradient then reaches the adapters through rank-r products
            only: no [in, out] weight gradient is formed, and nothing of the size of W is kept for the
            backward pass. (Merging inside the loss would form both, for every layer.)
  sampling  `merge(base, adapters)` once per policy version gives a plain params tree, so the sampler runs
            exactly the base model's computation per token; decoding is bound by reading weights, and the
            unmerged form would add two small dots per target, layer and token. The price is one copy of
            the targeted matrices while that version samples.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Optional

import jax
import jax.numpy as jnp

from explore_jax.models.config import ModelConfig, language_config
from explore_jax.models.transformer import Model

Adapters = dict[str, dict[str, jax.Array]]

# Hugging Face module name -> our leaf under params["layers"], in the order Hugging Face lists them.
MODULES = {"q_proj": "q", "k_proj": "k", "v_proj": "v", "o_proj": "o", "gate_proj": "gate", "up_proj": "up",
           "down_proj": "down"}
ALL_LINEAR = "all-linear"  # PEFT's shorthand: every linear layer but the output head
# Leading axes of a leaf (after the layer axis) that are its input; the rest are its output.
_INPUT_AXES = {"q": 1, "k": 1, "v": 1, "o": 2, "gate": 1, "up": 1, "down": 1}


@dataclasses.dataclass(frozen=True)
class LoraConfig:
  """Rank r, alpha (the update is scaled by alpha / r), the Hugging Face names of the target modules, and the
  seed of A's initialisation (part of the starting policy, like the checkpoint: not the RL seed)."""
  rank: int
  alpha: float
  target_modules: tuple[str, ...]
  seed: int = 0

  def __post_init__(self):
    if self.rank < 1:
      raise ValueError(f"LoRA rank must be positive, got {self.rank} (rank 0 means no LoRA: use from_config)")
    names = tuple(self.target_modules)
    if ALL_LINEAR in names:
      names = tuple(MODULES)
    unknown = [n for n in names if n not in MODULES]
    if unknown or not names:
      raise ValueError(f"LoRA target_modules {list(self.target_modules)}: unknown {unknown}; "
                       f"expected some of {list(MODULES)} or {ALL_LINEAR!r}")
    # Canonical order and no repeats, so equal choices give equal (hashable, jit-static) configs.
    object.__setattr__(self, "target_modules", tuple(n for n in MODULES if n in names))

  @property
  def scale(self) -> float:
    return self.alpha / self.rank

  @property
  def leaves(self) -> tuple[str, ...]:
    """Our leaf names of the targets."""
    return tuple(MODULES[n] for n in self.target_modules)


def from_config(c: Any) -> Optional[LoraConfig]:
  """The LoraConfig of `config.model.lora` (rank, alpha, target_modules, seed); None when absent or rank 0."""
  if c is None or int(c.get("rank", 0)) == 0:
    return None
  modules = c["target_modules"]
  modules = (modules,) if isinstance(modules, str) else tuple(modules)
  return LoraConfig(rank=int(c["rank"]), alpha=float(c["alpha"]), target_modules=modules, seed=int(c.get("seed", 0)))


def _split(shape: tuple[int, ...], leaf: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
  """(input dims, output dims) of a stacked leaf's shape [L, *in, *out]."""
  n = _INPUT_AXES[leaf]
  return tuple(shape[1:1 + n]), tuple(shape[1 + n:])


def init(model_config: Any, lora: LoraConfig) -> Adapters:
  """Fresh adapters: A ~ U(-1/sqrt(in), 1/sqrt(in)) (PEFT's kaiming_uniform(a=sqrt(5))), B = 0."""
  shapes = Model(language_config(model_config)).param_shapes()["layers"]
  key = jax.random.key(lora.seed)
  out = {}
  for i, leaf in enumerate(lora.leaves):
    L = shapes[leaf].shape[0]
    ins, outs = _split(shapes[leaf].shape, leaf)
    bound = 1.0 / math.sqrt(math.prod(ins))
    a = jax.random.uniform(jax.random.fold_in(key, i), (L, *ins, lora.rank), jnp.float32, -bound, bound)
    out[leaf] = {"a": a, "b": jnp.zeros((L, lora.rank, *outs), jnp.float32)}
  return out


def shapes(model_config: Any, lora: LoraConfig) -> Adapters:
  """The adapters' jax.ShapeDtypeStructs (no memory)."""
  return jax.eval_shape(lambda: init(model_config, lora))


def axes(model_config: Any, lora: LoraConfig) -> Adapters:
  """Logical axis names of the adapters: A shards like W's input, B like W's output, the rank replicated."""
  base = Model(language_config(model_config)).param_axes()["layers"]
  out = {}
  for leaf in lora.leaves:
    ins, outs = _split(base[leaf], leaf)
    out[leaf] = {"a": ("layers", *ins, None), "b": ("layers", None, *outs)}
  return out


def adapted(base: Any, adapters: Adapters, lora: LoraConfig) -> Any:
  """The params tree `Model.apply` adds the adapters' outputs from: base plus {"lora": {leaf: {a, (alpha/r) b}}}.

  The scale multiplies B here, inside whatever function is differentiated, so the adapters' gradients and
  Adam's updates are those of the standard parametrisation (alpha acts as a learning-rate factor on B A)."""
  scaled = {leaf: {"a": adapters[leaf]["a"], "b": adapters[leaf]["b"] * lora.scale} for leaf in lora.leaves}
  return {**base, "lora": scaled}


def merge(base: Any, adapters: Adapters, lora: LoraConfig) -> Any:
  """The plain params tree with W' = W + (alpha / r) A B for every target, in W's dtype. Only the targets are
  computed (under jit); every other leaf is the base's own array, shared rather than copied."""
  targets = _merged_targets({leaf: base["layers"][leaf] for leaf in lora.leaves}, adapters, lora)
  return {**base, "layers": {**base["layers"], **targets}}


@functools.partial(jax.jit, static_argnums=2)
def _merged_targets(weights: dict[str, jax.Array], adapters: Adapters, lora: LoraConfig) -> dict[str, jax.Array]:
  out = {}
  for leaf, w in weights.items():
    a, b = adapters[leaf]["a"], adapters[leaf]["b"]
    L, r = a.shape[0], a.shape[-1]
    ab = jnp.matmul(a.reshape(L, -1, r), b.reshape(L, r, -1), precision=jax.lax.Precision.HIGHEST)
    out[leaf] = (w.astype(jnp.float32) + lora.scale * ab.reshape(w.shape)).astype(w.dtype)
  return out
