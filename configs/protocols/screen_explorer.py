"""The ScreenExplorer protocol: the method against its three ablations (configs/screen_explorer_miniwob.py, the
tiny-vl policy exploring MiniWoB++ pages with no task reward), every arm from one shared warm start (the DOM
oracle's clicks as JSON replies) over three RL seeds, reported by launch/compare.py. Fixed before any run:

  endpoint   the paper's claim, that the world-model reward overcomes the cold start so that exploration diversity
             keeps rising instead of collapsing: the change of D_grp of the screens (diversity/d_grp_vis, eq. 6
             over every after-state of the iteration) from the first 5 to the last 5 iterations of each run
             (compare.md's training-curve section; curve_compare.py), screen_explorer against
             se_no_world the primary comparison; beside it the same for the text embeddings (d_grp_text), the
             trained policy's D_grp on held-out pages (summary.json) and the pages' own success, which the
             method never trains on
  arms       screen_explorer (all eight terms), se_no_world (no r_world), se_no_intent (no r_des, r_inter),
             se_no_sequence (no r_seq); 20 iterations, the actor updated from iteration 6 (the released delay)
  runs       1 warm start x 3 seeds per arm; the power this buys is stated with the results
  distilled  the first screen_explorer run's stream (iterations 10-19) fine-tuned into the base policy
             (`:distill`), evaluated with launch/eval.py beside the base and that run's RL policy

  make protocol PROTOCOL=configs/protocols/screen_explorer.py SWEEP_ARGS="--only=screen_explorer,se_no_world"

The `:paper` arms (Qwen2.5-VL-3B, 1000 iterations) are for a device loan and a user's checkpoint.
"""

from configs import protocols

WARM_STARTS = 1
SEEDS = 3

CONFIG = "configs/screen_explorer_miniwob.py"
# The experience stream from iteration 10 on, so that each run leaves steps to distil (the paper's 30 is past 20).
COMMON = ("--config.train.num_iterations=20", "--config.checkpoint.every=5",
          "--config.screen_explorer.distill.from_iteration=10")
TERMS = "--config.screen_explorer.terms"
ARMS = (("screen_explorer", CONFIG, COMMON),
        ("se_no_world", CONFIG, (*COMMON, f"{TERMS}.world_vis=False", f"{TERMS}.world_text=False")),
        ("se_no_intent", CONFIG, (*COMMON, f"{TERMS}.des=False", f"{TERMS}.inter=False")),
        ("se_no_sequence", CONFIG, (*COMMON, f"{TERMS}.seq_vis=False", f"{TERMS}.seq_text=False")))

# Recipe round 1, after the first runs: at the paper's lr 4e-5 the tiny policy barely moves in 14 updates (k3 KL to
# the warm start ~1e-3, the trained policy's greedy held-out success equal to its warm start's), so every arm would
# measure the same policy. The same two arms at 5x the learning rate.
LR = "--config.optimizer.learning_rate=2e-4"
ARMS += (("screen_explorer_lr2e-4", CONFIG, (*COMMON, LR)),
         ("se_no_world_lr2e-4", CONFIG, (*COMMON, LR, f"{TERMS}.world_vis=False", f"{TERMS}.world_text=False")))


def get_protocol() -> dict:
  return protocols.protocol(ARMS, seeds=SEEDS, warm_starts=WARM_STARTS)
