"""EAPO (explore_jax/methods/eapo.py) on the generated ALFWorld household games of configs/textworlds.py: answers
in EAPO's four fields, q_phi a copy of the policy scoring them, (state, visitation depth) groups, rollback SFT on
verified ways back. The warm start is the searching agent's episodes answered in the fields (envs/fields.py).
`:small` runs SmolLM2-135M-Instruct; `:paper` table 3's settings (group 16, lr 1e-4 for the policy and q_phi, KL
0.01, gamma 0.9) on a local Qwen3 directory.

  python launch/train.py --config=configs/eapo_alfworld.py --workdir=runs/eapo_alfworld
  python launch/train.py --config=configs/eapo_alfworld.py:paper --config.model.checkpoint=/path/to/Qwen3-1.7B

Ablations as in configs/eapo_keydoor.py: --config.eapo.alpha2=0, --config.rl.advantage=grpo, and
--config.eapo.rollback.enabled=False (neither the cold start before RL nor the later stages).
"""

from configs import textworlds


def get_config(variant: str = ""):
  return textworlds.get_config("eapo", "alfworld", variant)
