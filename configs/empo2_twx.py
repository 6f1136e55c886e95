"""EMPO² (explore_jax/methods/empo2.py) on the tiny TextWorld-Express coin setting of configs/textworlds.py: tips
written by the policy after every episode, memory-augmented rollouts (p = 0.75 memory-free, q = 1/3 on-policy with tips),
off-policy updates without the tips, token-level low-probability masking and the state-novelty reward;
all-MiniLM-L6-v2 embeds the states. `:small` runs SmolLM2-135M-Instruct (it writes tips zero-shot), `:paper` a
local Qwen2.5-7B-Instruct with the paper's ScienceWorld recipe (30 steps, group 8, lr 1e-6, KL 0, clip 0.2/0.3).

  python launch/train.py --config=configs/empo2_twx.py --workdir=runs/empo2_twx
  python launch/train.py --config=configs/empo2_twx.py:paper --config.model.checkpoint=/path/to/Qwen2.5-7B-Instruct

Ablations are overrides: no memory --config.empo2.p_memory_free=1, on-policy only --config.empo2.q_on_policy=1,
no masking --config.rl.loss.low_prob_mask=none, no novelty reward --config.empo2.novelty=off; the released code's
choices: --config.empo2.mode_draw=iteration --config.empo2.entries=step --config.empo2.query=history
--config.empo2.novelty=retrieved --config.rl.loss.low_prob_mask=sequence.
"""

from configs import textworlds


def get_config(variant: str = ""):
  return textworlds.get_config("empo2", "twx", variant)
