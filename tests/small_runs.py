"""A training run small enough for a test to run in its own process: the model in `checkpoint` (conftest's
nano_checkpoint), no SFT, the 8 fake devices as a (2, 1, 4) mesh, 2 tasks x 2 episodes from a pool of 2, one
actor."""


def small_run(c, checkpoint: str):
  """`c` (a config) set to the small run; returns it."""
  c.model.checkpoint = checkpoint
  c.sft.enabled = False
  c.mesh.shape = (2, 1, 4)
  c.rollout.num_tasks, c.rollout.group_size, c.rollout.task_pool = 2, 2, 2
  c.rollout.num_actors, c.rollout.envs_per_actor = 1, 4
  return c
