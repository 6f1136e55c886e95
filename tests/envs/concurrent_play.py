"""What an actor relies on in a world that declares `concurrent_instances` (actors/actor.py): its instances,
reset and stepped from threads at once, play as they do one after another."""

import concurrent.futures


def play(envs, resets, act, pool=None):
  """Resets envs[i] with resets[i], then steps every live one with act(env, its last info) a round at a time,
  each round's calls at once on `pool` (None: one after another); returns each env's trail of (observation,
  reward, state key)."""
  call = (lambda f, items: list(pool.map(f, items))) if pool else (lambda f, items: [f(x) for x in items])
  starts = call(lambda i: envs[i].reset(**resets[i]), range(len(envs)))
  trails = [[(observation, 0.0, info["state_key"])] for observation, info in starts]
  infos = [info for _, info in starts]
  live = list(range(len(envs)))
  while live:
    steps = call(lambda i: envs[i].step(act(envs[i], infos[i])), live)
    for i, (observation, reward, _, _, info) in zip(live, steps):
      trails[i].append((observation, reward, info["state_key"]))
      infos[i] = info
    live = [i for i, step in zip(live, steps) if not (step[2] or step[3])]
  return trails


def assert_played_alike_at_once(envs, resets, act):
  """The envs declare concurrent instances and play the same at once as one after another; returns the trails."""
  assert all(env.metadata["concurrent_instances"] for env in envs)
  with concurrent.futures.ThreadPoolExecutor(len(envs)) as pool:
    at_once = play(envs, resets, act, pool)
  assert at_once == play(envs, resets, act)
  return at_once
