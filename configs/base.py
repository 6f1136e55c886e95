"""Defaults every experiment shares; experiment configs start from `get_config()` and override fields.

Every field can be overridden from the command line, e.g.
  python launch/train.py --config=configs/sge_coding.py --config.optimizer.learning_rate=3e-6
"""

import ml_collections

from explore_jax.parallel.sharding import DEFAULT_RULES


def get_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.seed = 0

  # The policy: "tiny" (built in, no downloads) or a local Hugging Face checkpoint directory.
  c.model = ml_collections.ConfigDict()
  c.model.checkpoint = "tiny"
  c.model.param_dtype = "float32"  # "bfloat16" on accelerators
  c.model.dtype = "float32"        # compute dtype; logits and softmax stay float32
  c.model.remat = False            # rematerialise layers in the backward pass

  # Devices: mesh axes (data, fsdp, tensor), -1 takes the rest; the rules map logical axes to them.
  c.mesh = ml_collections.ConfigDict()
  c.mesh.shape = (-1, 1, 1)
  c.mesh.axes = ("data", "fsdp", "tensor")
  c.sharding_rules = [list(rule) for rule in DEFAULT_RULES]

  # AdamW with global-norm clipping.
  c.optimizer = ml_collections.ConfigDict()
  c.optimizer.learning_rate = 1e-6
  c.optimizer.weight_decay = 0.0
  c.optimizer.b1 = 0.9
  c.optimizer.b2 = 0.999
  c.optimizer.eps = 1e-8
  c.optimizer.max_grad_norm = 1.0
  c.optimizer.warmup_steps = 0

  c.checkpoint = ml_collections.ConfigDict()
  c.checkpoint.every = 10        # iterations between saves
  c.checkpoint.max_to_keep = 3
  return c
