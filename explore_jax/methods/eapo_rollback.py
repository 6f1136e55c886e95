"""EAPO's rollback transitions (eq. 11): (s', s, a) where action a takes the agent from s' back to a state s it had
visited before, the data of its rollback SFT stage. The paper asks a teacher model for candidates and keeps those
that really recover the state; no code for it is released. Here candidates are mined from recorded episodes:

  returns     a step whose next state is one the episode had visited before (and not the state it left)
  admissible  at each state of an episode, the world's other admissible actions, each a guess that it might lead
              back to an earlier state of the episode (the replay decides which, if any)

and every candidate is kept only when a replay verifies it: reset the world to the episode's seed, replay the
episode's actions up to s', take a, and compare the state key reached with s's. Nothing here imports jax.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable, Optional

from explore_jax.actors.protocol import EpisodeResult


@dataclasses.dataclass(frozen=True)
class Rollback:
  """One candidate: from the state reached by `prefix` (s', shown as `observation`), `action` should reach the
  earlier state whose key is `target_key` (s)."""
  seed: Optional[int]
  prefix: tuple[str, ...]
  observation: str
  action: str
  target_key: int


def _trajectory(result: EpisodeResult) -> tuple[list[int], list[str]]:
  """The episode's state keys (every step's, then the final one) and its canonical actions (None-free)."""
  keys = [int(s.state_key) for s in result.steps]
  if result.final_state_key is not None:
    keys.append(int(result.final_state_key))
  actions = [str(s.info.get("action") or s.response_text) for s in result.steps]
  return keys, actions


def mine_rollbacks(results: Iterable[EpisodeResult], *, admissible: bool = True) -> list[Rollback]:
  """Candidates from recorded episodes (module docstring), in episode and step order, without duplicates."""
  out, seen = [], set()
  for r in results:
    if r.dropped or not r.steps:
      continue
    keys, actions = _trajectory(r)
    for t, step in enumerate(r.steps):
      earlier = set(keys[:t])
      guesses = []
      if t + 1 < len(keys) and keys[t + 1] in earlier and keys[t + 1] != keys[t]:
        guesses.append((actions[t], keys[t + 1]))
      if admissible and earlier:
        others = [a for a in step.info.get("admissible_actions") or () if a != actions[t]]
        guesses += [(a, key) for a in others for key in sorted(earlier)]
      for action, key in guesses:
        candidate = Rollback(r.spec.seed, tuple(actions[:t]), str(step.observation), action, key)
        if candidate not in seen:
          seen.add(candidate)
          out.append(candidate)
  return out


def reached_key(make_env: Callable[[], Any], seed: Optional[int], prefix: tuple[str, ...], action: str
                ) -> Optional[int]:
  """The state key a fresh world reaches from `seed` by `prefix` then `action` (None if it ends before)."""
  env = make_env()
  try:
    env.reset(seed=seed)
    for a in prefix:
      *_, terminated, truncated, _ = env.step(a)
      if terminated or truncated:
        return None
    *_, info = env.step(action)
    return int(info["state_key"])
  finally:
    env.close()


def verify(make_env: Callable[[], Any], candidate: Rollback) -> bool:
  """Whether replaying the candidate in a fresh world reaches its target state."""
  return reached_key(make_env, candidate.seed, candidate.prefix, candidate.action) == candidate.target_key


def verified_rollbacks(make_env: Callable[[], Any], results: Iterable[EpisodeResult], *,
                       admissible: bool = True) -> list[Rollback]:
  """The mined candidates a replay verifies: one replay per (seed, prefix, action), which reaches one state, so
  at most one of its candidates is kept."""
  groups: dict[tuple, list[Rollback]] = {}
  for candidate in mine_rollbacks(results, admissible=admissible):
    groups.setdefault((candidate.seed, candidate.prefix, candidate.action), []).append(candidate)
  kept = []
  for (seed, prefix, action), candidates in groups.items():
    reached = reached_key(make_env, seed, prefix, action)
    kept += [c for c in candidates if c.target_key == reached]
  return kept
