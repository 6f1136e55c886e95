"""SGE (strategy-guided exploration) on coding tasks: the project's main job (`make run`).

  python launch/train.py --config=configs/sge_coding.py --workdir=runs/sge_coding

The default runs on a 2-core CPU with no downloads: the tiny model is warm-started by SFT on generated
solved tasks (cached for the next run), trained with SGE on 32 held-in tasks, and evaluated on 32 held-out
tasks; the run directory gets summary.md (pass@k of warm start and trained policy, distinct outcomes),
pass_at_k.png and curves.png. `configs/sge_coding.py:paper` is Table 2 with a local Qwen3-4B-Instruct and
LeetCodeDataset files (see configs/coding.py). Ablations are overrides, e.g. no mixed temperature
(--config.sge.strategy_temperature=0.7) or no negative reflection (--config.sge.p_failure=0).
"""

from configs import coding


def get_config(variant: str = ""):
  return coding.get_config("sge", variant)
