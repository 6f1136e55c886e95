"""DPEPO's step diversity weight W_t from the parallel copies' action histories (host side).

One DPEPO agent step acts in a subset of K parallel copies of the environment. Actions are strings,
so the weight is computed on the host, once per step record, and handed to the `dpepo` advantage
estimator as `StepRecords.step_weights`. The paper's equations 3-5 were lost from its text; the
definitions follow the authors' released code (METHODS.md, DPEPO section):

  c_dep(i) = #{past actions of copy i equal to a_i}
  p_i      = (last action of copy i, a_i)                    (no pair when copy i has no history)
  c_dtr(i) = #{consecutive pairs of copy i's history equal to p_i}
  c_wtr(i) = sum over the other acted copies j of #{consecutive pairs of history_j + [a_j] equal p_i}
  W_i      = (alpha^c_dep + gamma^c_dtr + beta^c_wtr) / 3
  c_wid    = |L| - |set(L)|, L = this step's actions
  W_t      = (omega^c_wid + mean_i W_i) / 2,  or `no_action_weight` when no action was parsed.

Actions are compared after stripping surrounding whitespace, as the released code does. Unlike the
code, W_t is not rounded to 4 decimals.
"""

from __future__ import annotations

from typing import Hashable, Mapping, Sequence


def _pairs(actions: Sequence[str]) -> list[tuple[str, str]]:
  return list(zip(actions[:-1], actions[1:]))


def dpepo_step_weight(
    histories: Mapping[Hashable, Sequence[str]],
    actions: Mapping[Hashable, str],
    *,
    alpha: float = 0.8,
    gamma: float = 0.95,
    beta: float = 0.95,
    omega: float = 0.95,
    no_action_weight: float = 0.5,
    width_ignore: Sequence[str] = (),
) -> float:
  """Diversity weight W_t of one parallel step (DPEPO, eq. 3-5, as released in the authors' code).

  W_t = (omega^c_wid + mean_i (alpha^c_dep(i) + gamma^c_dtr(i) + beta^c_wtr(i)) / 3) / 2, with the
  counts defined in the module docstring.

  Args:
    histories: copy id -> the actions that copy took at earlier steps (oldest first), not
      including this step. Copies without an entry have an empty history.
    actions: copy id -> the action sent to that copy at this step (only the acted copies).
    alpha: depth action-repeat discount (alpha in the paper).
    gamma: depth transition-repeat discount.
    beta: width transition-repeat discount.
    omega: width action-repeat discount (0.95 default; the released run scripts use 0.8).
    no_action_weight: W_t when no action was parsed at this step.
    width_ignore: actions left out of c_wid; the released ALFWorld code ignores ("look",), the
      paper's definition ignores none.

  Returns:
    W_t in (0, 1].
  """
  if not actions:
    return no_action_weight
  acted = {copy: action.strip() for copy, action in actions.items()}
  past = {copy: [a.strip() for a in histories.get(copy, ())] for copy in acted}

  per_copy = []
  for copy, action in acted.items():
    history = past[copy]
    c_dep = history.count(action)
    if history:
      pair = (history[-1], action)
      c_dtr = _pairs(history).count(pair)
      c_wtr = sum(
          _pairs(past[other] + [acted[other]]).count(pair) for other in acted if other != copy
      )
    else:
      c_dtr = c_wtr = 0
    per_copy.append((alpha**c_dep + gamma**c_dtr + beta**c_wtr) / 3.0)

  counted = [a for a in acted.values() if a not in set(width_ignore)]
  c_wid = len(counted) - len(set(counted))
  return (omega**c_wid + sum(per_copy) / len(per_copy)) / 2.0


def dpepo_trajectory_weights(
    step_actions: Sequence[Mapping[Hashable, str]], **options
) -> list[float]:
  """W_t for every step of one DPEPO trajectory, replaying the copies' histories in order.

  Args:
    step_actions: for each step t, copy id -> action sent at t ({} when nothing was parsed).
    **options: forwarded to `dpepo_step_weight`.

  Returns:
    One W_t per step.
  """
  histories: dict[Hashable, list[str]] = {}
  weights = []
  for actions in step_actions:
    weights.append(dpepo_step_weight(histories, actions, **options))
    for copy, action in actions.items():
      histories.setdefault(copy, []).append(action)
  return weights
