"""Protocol files for launch/sweep.py: each lists its arms as (name, config file, overrides) and returns
`protocol(ARMS, seeds=..., warm_starts=...)` from get_protocol()."""


def protocol(arms, *, seeds: int, warm_starts: int, overrides=()) -> dict:
  """The sweep dict of `arms` ((name, config, overrides) triples), each run over warm starts 0..warm_starts-1
  and RL seeds 0..seeds-1, with `overrides` common to every arm."""
  return {
      "arms": [{"name": name, "config": config, "overrides": list(arm_overrides)}
               for name, config, arm_overrides in arms],
      "seeds": list(range(seeds)),
      "warm_starts": list(range(warm_starts)),
      "overrides": list(overrides),
  }
