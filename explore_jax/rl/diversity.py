"""DPEPO's step diversity weight W_t from the parallel copies' action histories (host side).

One DPEPO agent step acts in a subset of K parallel copies of the environment. Actions are strings,
so the weight is computed on the host, once per step record, and handed to the `dpepo` advantage
estimator as `StepRecords.step_weights`. The paper's equations 3-5 were lost from its text; the
definitions follow the authors' released code (METHODS.md, DPEPO section):

  c_dep(i) = #{past actions of copy i equal to a_i}
  p_i      = (last action of copy i, a_i)                    (no pair when copy i has no history)
  c_dtr(i) = #{consecutive pairs of copy i's history equal to p_i}
  c_wtr(i) = sum over the other acting copies j of #{consecutive pairs of history_j + [a_j] equal p_i}
  W_i      = (alpha^c_dep + gamma^c_dtr + beta^c_wtr) / 3
  c_wid    = |L| - |set(L)|, L = every action parsed at this step, minus `width_ignore` ones
  W_t      = (omega^c_wid + mean over acting copies of W_i) / 2,
             or `no_action_weight` when no action was parsed (or, with `num_copies`, none acts).

Which copies act: the model names copies by index (<env_i>) and may name one that does not exist
(<env_5> with K = 4). With `num_copies` = K, only ids 1..K act: only they get a W_i, a history and
a part in c_wtr, while c_wid still counts every parsed action, out-of-range ones included, as the
released code does. Without `num_copies` every named copy acts (the paper's definition).

Actions are compared after stripping surrounding whitespace, as the released code does. The code
also rounds W_t to 4 decimals; `round_to=4` reproduces that, the default leaves W_t unrounded.
"""

from __future__ import annotations

from typing import Hashable, Mapping, Sequence

WEIGHT_FORMS = ("full", "depth", "width")


def _pairs(actions: Sequence[str]) -> list[tuple[str, str]]:
  return list(zip(actions[:-1], actions[1:]))


def _acting(actions: Mapping[Hashable, str], num_copies: int | None) -> dict[Hashable, str]:
  """The copies that really step: all named ones, or with num_copies = K those with id in 1..K."""
  if num_copies is None:
    return dict(actions)
  if num_copies < 1:
    raise ValueError(f"num_copies must be at least 1, got {num_copies}")
  for copy in actions:
    if not isinstance(copy, int) or isinstance(copy, bool):
      raise TypeError(f"with num_copies, copy ids are the ints of <env_i>, got {copy!r}")
  return {copy: action for copy, action in actions.items() if 1 <= copy <= num_copies}


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
    num_copies: int | None = None,
    round_to: int | None = None,
    form: str = "full",
) -> float:
  """Diversity weight W_t of one parallel step (DPEPO, eq. 3-5, as released in the authors' code).

  W_t = (omega^c_wid + mean_i (alpha^c_dep(i) + gamma^c_dtr(i) + beta^c_wtr(i)) / 3) / 2, the mean
  over the acting copies, with the counts defined in the module docstring.

  A step whose parsed actions all name copies outside 1..K has no acting copy, and the released
  code divides by zero there. Such a step gets `no_action_weight`, as a step with nothing parsed:
  in both, no environment steps and the state stays the same, so they are the same non-action.
  Keeping only the width term would instead give up to the maximum weight 1 to a step that acted
  nowhere (two distinct out-of-range actions have c_wid = 0).

  Args:
    histories: copy id -> the actions that copy took at earlier steps (oldest first), not
      including this step. Copies without an entry have an empty history.
    actions: copy id -> the action parsed for that copy at this step (only the named copies).
    alpha: depth action-repeat discount (alpha in the paper).
    gamma: depth transition-repeat discount.
    beta: width transition-repeat discount.
    omega: width action-repeat discount (0.95 default; the released run scripts use 0.8).
    no_action_weight: W_t when no action was parsed, or none names a copy in 1..num_copies.
    width_ignore: actions left out of c_wid; the released ALFWorld code ignores ("look",), the
      paper's definition ignores none.
    num_copies: K, the number of environment copies; copy ids are then the ints 1..K and only
      those act (the released code). None: every named copy acts.
    round_to: decimals W_t is rounded to with Python's round (the released code: 4); None keeps
      it exact. `no_action_weight` is returned as given.
    form: "full" (the weight above), or one of its two terms alone for the ablations: "depth",
      the mean over acting copies of W_i; "width", omega^c_wid.

  Returns:
    W_t in (0, 1].
  """
  if form not in WEIGHT_FORMS:
    raise ValueError(f"form must be one of {WEIGHT_FORMS}, got {form!r}")
  if not actions:
    return no_action_weight
  acted = {copy: action.strip() for copy, action in _acting(actions, num_copies).items()}
  if not acted:
    return no_action_weight
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

  ignored = {a.strip() for a in width_ignore}
  counted = [a.strip() for a in actions.values() if a.strip() not in ignored]
  c_wid = len(counted) - len(set(counted))
  width, depth = omega**c_wid, sum(per_copy) / len(per_copy)
  weight = {"full": (width + depth) / 2.0, "depth": depth, "width": width}[form]
  return weight if round_to is None else round(weight, round_to)


def dpepo_trajectory_weights(
    step_actions: Sequence[Mapping[Hashable, str]], **options
) -> list[float]:
  """W_t for every step of one DPEPO trajectory, replaying the copies' histories in order.

  Only acting copies gain history: with `num_copies` = K, an action sent to a copy outside 1..K
  is counted in that step's c_wid but never enters a history, since the copy does not exist (the
  released code keeps one history per environment instance, and there are K of them). Later
  steps therefore never see it in c_dep, c_dtr or c_wtr.

  Args:
    step_actions: for each step t, copy id -> action parsed at t ({} when nothing was parsed).
    **options: forwarded to `dpepo_step_weight` (num_copies, round_to, width_ignore, ...).

  Returns:
    One W_t per step.
  """
  histories: dict[Hashable, list[str]] = {}
  weights = []
  for actions in step_actions:
    weights.append(dpepo_step_weight(histories, actions, **options))
    for copy, action in _acting(actions, options.get("num_copies")).items():
      histories.setdefault(copy, []).append(action)
  return weights
