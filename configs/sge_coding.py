"""SGE (strategy-guided exploration) on coding tasks.

  python launch/train.py --config=configs/sge_coding.py --workdir=runs/sge_coding

Variants: `configs/sge_coding.py` is the built-in default (the tiny model on generated tasks, a 2-core
CPU); `configs/sge_coding.py:paper` follows the paper's Table 2 with a local Qwen3-4B-Instruct directory:
  python launch/train.py --config=configs/sge_coding.py:paper --config.model.checkpoint=/path/to/Qwen3-4B
"""

import ml_collections

from configs import base


def get_config(variant: str = "") -> ml_collections.ConfigDict:
  c = base.get_config()
  c.method = "sge"

  c.sge = ml_collections.ConfigDict()
  c.sge.temperature = 0.7           # tau: everything after the strategy
  c.sge.strategy_temperature = 1.2  # tau_s: the strategy segment
  c.sge.strategy_delimiter = "### Code"

  c.sampling = ml_collections.ConfigDict()
  c.sampling.max_new_tokens = 96
  c.sampling.top_p = 1.0

  c.optimizer.learning_rate = 1e-4  # the tiny model; the paper's 1e-6 is in the `paper` variant
  if variant == "paper":
    c.model.param_dtype = c.model.dtype = "bfloat16"
    c.optimizer.learning_rate = 1e-6
    c.sampling.max_new_tokens = 2048
  elif variant:
    raise ValueError(f"configs/sge_coding.py: unknown variant {variant!r}; known: '', 'paper'")
  return c
