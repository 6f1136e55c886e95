"""DPEPO's cold start in each world it has a config for: the warm start's parallel demonstrations (copy 1 follows
the world's oracle, the others take other admissible actions) replay to success in a fresh instance of the world
the run trains in, and their copies do act differently."""

import importlib

import gymnasium
import pytest

from explore_jax.envs import oracle_demonstrations
from explore_jax.train import rollout

SEEDS = {"dpepo_keydoor": range(10_000, 10_008), "dpepo_twx": range(500, 502),
         "dpepo_scienceworld": range(46, 47), "dpepo_alfworld": range(500, 502)}


@pytest.mark.parametrize("name", list(SEEDS))
def test_the_cold_start_demonstrations_replay_to_success_and_diverge_across_copies(name, tmp_path, monkeypatch):
  monkeypatch.setenv("EXPLORE_JAX_CACHE", str(tmp_path))  # ALFWorld generates its games there
  c = importlib.import_module(f"configs.{name}").get_config()
  sft_kwargs = {**c.env.kwargs, **c.sft.get("env_kwargs", {})}
  env_id, kwargs = rollout.environment(c, sft_kwargs, demonstrations=True)
  assert kwargs["oracle"] == "diverse" and kwargs["num_copies"] == 4
  demo_env = gymnasium.make(env_id, **kwargs)
  replay_id, replay_kwargs = rollout.environment(c, dict(c.env.kwargs))  # as the run plays it, strict parser
  replay = gymnasium.make(replay_id, **replay_kwargs)
  try:
    demos = oracle_demonstrations(demo_env, list(SEEDS[name]))
    assert all(d.success for d in demos)
    diverse_steps = 0
    for d in demos:
      replay.reset(seed=d.seed)
      for action in d.actions:
        _, _, terminated, truncated, info = replay.step(action)
        assert info["format_ok"], info
        named = [a for a in info["actions"] if a is not None]
        diverse_steps += len(set(named)) > 1
      assert info["success"] and (terminated or truncated)
    assert diverse_steps >= len(demos)  # at least one step per demonstration, on average
  finally:
    demo_env.close()
    replay.close()
