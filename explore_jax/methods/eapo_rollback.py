"""EAPO's rollback transitions (eq. 11): (s', s, a) where action a takes the agent from s' back to a state s it had
visited before, the data of its rollback SFT stage. The paper asks a teacher model for candidates and keeps those
that really recover the state; no code for it is released. Here candidates are mined from recorded episodes:

  returns     a step whose next state is one the episode had visited before (and not the state it left)
  admissible  at each state of an episode, the world's other admissible actions, each a guess that it might lead
              back to an earlier state of the episode (the replay decides which, if any)

and, where a teacher model is at hand (the paper's source, `teacher_rollbacks`), its answer to s' and the state s
before it; every candidate is kept only when a replay verifies it: reset the world to the episode's seed, replay the
episode's responses up to s' (the exact texts the world was given, so a malformed one is refused again and the
replay stays on the episode's path, whatever answer format the world reads), take a, and compare the state key
reached with s's. A candidate action is the world's canonical action; `answer` writes it as a response in the
world's format (EAPO's fields around it, envs/fields.py). Nothing here imports jax.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any, Callable, Iterable, Optional

from explore_jax.actors.protocol import EpisodeResult
from explore_jax.methods.base import observation_text


@dataclasses.dataclass(frozen=True)
class Rollback:
  """One candidate: from the state reached by the responses `prefix` (s', shown as `observation`), `action` (the
  world's canonical action) should reach the earlier state whose key is `target_key` (s). `step` is the index of
  the episode step that stood at s' (its prompt is the demonstration's)."""
  seed: Optional[int]
  prefix: tuple[str, ...]
  observation: str
  action: str
  target_key: int
  step: int = 0


def _trajectory(result: EpisodeResult) -> tuple[list[int], list[str], list[str]]:
  """The episode's state keys (every step's, then the final one), its canonical actions (a malformed step's: its
  response) and its responses."""
  keys = [int(s.state_key) for s in result.steps]
  if result.final_state_key is not None:
    keys.append(int(result.final_state_key))
  actions = [str(s.info.get("action") or s.response_text) for s in result.steps]
  return keys, actions, [str(s.response_text) for s in result.steps]


def mine_rollbacks(results: Iterable[EpisodeResult], *, admissible: bool = True) -> list[Rollback]:
  """Candidates from recorded episodes (module docstring), in episode and step order, without duplicates."""
  out, seen = [], set()
  for r in results:
    if r.dropped or not r.steps:
      continue
    keys, actions, responses = _trajectory(r)
    for t, step in enumerate(r.steps):
      earlier = set(keys[:t])
      guesses = []
      if t + 1 < len(keys) and keys[t + 1] in earlier and keys[t + 1] != keys[t]:
        guesses.append((actions[t], keys[t + 1]))
      if admissible and earlier:
        # A step's info is what its action led to: the admissible actions at its own state are the last step's.
        others = [a for a in r.steps[t - 1].info.get("admissible_actions") or () if a != actions[t]]
        # Back means to another state than s' itself: an action that leaves the agent where it is returns nowhere.
        guesses += [(a, key) for a in others for key in sorted(earlier - {keys[t]})]
      for action, key in guesses:
        candidate = Rollback(r.spec.seed, tuple(responses[:t]), str(step.observation), action, key, t)
        if candidate not in seen:
          seen.add(candidate)
          out.append(candidate)
  return out


def reached_key(env: Any, seed: Optional[int], prefix: tuple[str, ...], action: str) -> Optional[int]:
  """The state key `env` reaches from a reset to `seed` by the responses `prefix` then `action` (None if the
  episode ends before). The caller owns `env`; every replay starts with its own reset."""
  env.reset(seed=seed)
  for a in prefix:
    *_, terminated, truncated, _ = env.step(a)
    if terminated or truncated:
      return None
  *_, info = env.step(action)
  return int(info["state_key"])


def _same(action: str) -> str:
  return action


def verify(env: Any, candidate: Rollback, answer: Callable[[str], str] = _same) -> bool:
  """Whether replaying the candidate in `env` reaches its target state."""
  return reached_key(env, candidate.seed, candidate.prefix, answer(candidate.action)) == candidate.target_key


def verified_rollbacks(env: Any, results: Iterable[EpisodeResult], *, admissible: bool = True,
                       answer: Callable[[str], str] = _same, max_replays: Optional[int] = None,
                       proposed: Iterable[Rollback] = ()) -> list[Rollback]:
  """The `proposed` candidates (a teacher's), then the mined ones, that a replay in `env` verifies: one replay per
  (seed, prefix, action), which reaches one state, so at most one of its candidates is kept; at most `max_replays`
  replays (None: all), in that order: the episodes' own steps back before any admissible guess, and the guesses
  taken from each episode in turn (a world that lists many actions would otherwise spend the replays on the first
  episode's guesses)."""
  results = list(results)
  returns = mine_rollbacks(results, admissible=False)
  guesses = [mine_rollbacks([r]) for r in results] if admissible else []
  in_turn = [c for row in itertools.zip_longest(*guesses) for c in row if c is not None]
  return verify_all(env, [*proposed, *returns, *in_turn], answer, max_replays)


def verify_all(env: Any, candidates: Iterable[Rollback], answer: Callable[[str], str] = _same,
               max_replays: Optional[int] = None) -> list[Rollback]:
  """The candidates (without duplicates, in order) that a replay in `env` verifies (`verified_rollbacks`)."""
  groups: dict[tuple, list[Rollback]] = {}
  for candidate in dict.fromkeys(candidates):
    groups.setdefault((candidate.seed, candidate.prefix, candidate.action), []).append(candidate)
  kept = []
  for n, ((seed, prefix, action), candidates) in enumerate(groups.items()):
    if max_replays is not None and n >= max_replays:
      break
    reached = reached_key(env, seed, prefix, answer(action))
    kept += [c for c in candidates if c.target_key == reached]
  return kept


TEACHER_INSTRUCTION = ("You act in a text world. Which one action takes you from the state you are in back to the "
                       "state you were in just before? Answer with that action only.")


def teacher_prompt(current: str, previous: str, admissible: Iterable[str] = ()) -> list[dict[str, str]]:
  """The question put to a teacher model for one rollback: s' (where the agent is) and s (where it just was), with
  the actions the world admits at s' where it lists them."""
  listed = list(admissible)
  return [{"role": "user", "content": "\n\n".join(
      [TEACHER_INSTRUCTION, f"You are here:\n{current}", f"You were here just before:\n{previous}"]
      + ([f"Actions you can take: {', '.join(listed)}."] if listed else []))}]


def teacher_rollbacks(results: Iterable[EpisodeResult],
                      ask: Callable[[list[list[dict[str, str]]]], list[str]]) -> list[Rollback]:
  """The paper's source of candidates: for every step of an episode that left a state s for another s', one
  question (`teacher_prompt`) to a teacher model, `ask`ed in one batch; the first line of each answer is the
  candidate way back from s' to s. Nothing here is trusted: `verify_all` keeps what a replay confirms."""
  questions, where = [], []
  for r in results:
    if r.dropped or not r.steps:
      continue
    keys, _, responses = _trajectory(r)
    for t in range(1, len(r.steps)):
      if keys[t] == keys[t - 1]:
        continue
      before, here = r.steps[t - 1], r.steps[t]
      questions.append(teacher_prompt(str(observation_text(here.observation)),
                                      str(observation_text(before.observation)),
                                      before.info.get("admissible_actions") or ()))
      where.append((r.spec.seed, tuple(responses[:t]), str(here.observation), keys[t - 1], t))
  answers = ask(questions) if questions else []
  out = []
  for (seed, prefix, observation, key, t), text in zip(where, answers):
    action = text.strip().split("\n")[0].strip()
    if action:
      out.append(Rollback(seed, prefix, observation, action, key, t))
  return out
