"""DPEPO: one policy acting in K parallel copies of a world, with diversity-weighted advantages (METHODS.md
"DPEPO"; the paper's equations were lost from its text, the definitions follow the authors' released code).

  Copies        config.env.parallel.copies = K (4): every episode plays envs/parallel.py's ParallelCopies of
                the world, identical at reset; one response names an action per copy,
                "<think>...</think><parallel><env_1>a</env_1>...</parallel>". A step's reward is the maximum
                over the copies that acted; the episode succeeds when any copy does, and ends at the first
                success or after the world's step limit. `env.parallel.parser` is "strict" (any defect makes
                the response an invalid action) or the authors' "lenient" one (blocks renumbered by order).
  Prompt        ParallelPrompt: one user message per step with the task, every earlier step grouped per
                copy ("In Environment i: Action k: ... Observation k: ..."), each copy's last action, what
                it shows now and its admissible actions, and "You can explore up to K different
                environments, ranging from 1 to K". It wraps whatever prompt the run builds (the system
                prompt, SGE's strategy instruction in "dpepo+sge"), so the layout is the observation. Past
                the prompt budget it gives up the earlier steps' observations, then their actions, oldest
                first; the task, the instruction and where each copy is stay.
  Weight        W_t = (omega^c_wid + mean_i (alpha^c_dep + gamma^c_dtr + beta^c_wtr) / 3) / 2 from the
                copies' action histories (rl/diversity.py), computed from what the actors sent back
                (`info["parsed_actions"]` of each step) into the record field `step_weight`; 0.5 for a step
                that names no action. The update never needs the world.
  Advantage     the `dpepo` estimator: A_traj normalised over the task group's step records, then
                A_t = A_traj W_t where A_traj >= 0 and A_traj (2 - W_t) where it is negative.
  Cold start    the SFT warm start plays `env.parallel.sft_oracle` = "diverse": copy 1 follows the world's
                oracle while the others take admissible alternatives (envs/parallel.py), so a demonstration
                shows diverse parallel actions and still ends in success (the authors sampled a large model
                at temperature 1.5 and filtered; no such model is at hand here).

Ablations are config values: K = 1 (env.parallel.copies=1, the same pipeline without parallelism), no weight
(dpepo.weight="off"), depth-only or width-only weights ("depth", "width"), no cold start (sft.steps=0).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from explore_jax.actors.protocol import EpisodeResult, as_prompt
from explore_jax.envs.base import ACTIONS_LINE, state_key
from explore_jax.methods import grpo
from explore_jax.methods.base import STEP_WEIGHT_FIELD, Method, ObservationPrompt, register_method

# W_t's forms (config dpepo.weight).
WEIGHTS = ("full", "off", "depth", "width", "scripts")

RESPONSE_FORMAT = ("Think inside <think>...</think>, then give one action for each environment you act in, as "
                   "<parallel><env_1>action</env_1><env_2>action</env_2></parallel>.")


def configure(c: Any) -> Any:
  """DPEPO's recipe on a config: GRPO's loss settings, the `dpepo` estimator and the method's own fields."""
  grpo.configure(c, "grpo")
  c.method = "dpepo"
  c.rl.loss.aggregation = "token-mean"
  return add_config(c)


def add_config(c: Any) -> Any:
  """DPEPO's own fields, for a config whose method includes it ("dpepo", "dpepo+sge")."""
  import ml_collections

  c.env.parallel.copies = 4          # K (the paper and its scripts: 4)
  c.rl.advantage = "dpepo"
  # A_traj over every step record of the task group, as the released code computes it.
  c.rl.advantage_options = {"eps": 1e-6, "normalize_std": True, "per_step_statistics": True}
  d = c.dpepo = ml_collections.ConfigDict()
  # "full": W_t as above; "off": W_t = 1 (GRPO's advantage over the copies); "depth": the mean of the copies'
  # W_i alone; "width": omega^c_wid alone; "scripts": as the released ScienceWorld scripts ran, W_t = 1 at every
  # step: they set parallel_reward=false, and the invalid-action weight 0.95^#invalid they compute is written
  # over by a later loop before it is used.
  d.weight = "full"
  d.alpha = 0.8                  # alpha: depth action-repeat discount (c_dep)
  d.gamma = 0.95                 # gamma: depth transition-repeat discount (c_dtr)
  d.beta = 0.95                  # beta: width transition-repeat discount (c_wtr)
  d.omega = 0.95                 # omega: width action-repeat discount (c_wid); the released run scripts use 0.8
  d.no_action_weight = 0.5       # W_t of a step that names no action (the released code's)
  d.width_ignore = ""            # comma-separated actions c_wid leaves out (the released ALFWorld code: "look")
  d.round_to = -1                # decimals W_t is rounded to (the released code: 4); -1 keeps it exact
  # The earlier steps of each copy that show their observation, the last ones (-1: all; the paper's layout).
  # Older steps keep their action only. Past rollout.max_prompt_tokens a step's prompt gives up more: the
  # remaining earlier observations, oldest first, then the earlier actions, oldest first (ParallelPrompt's
  # shorter forms); the actor cuts it from the left only when even the last form, without earlier steps, is
  # too long (counted in `truncated_prompts`, the shortened ones in `shortened_prompts`).
  d.history_steps = -1
  # List each copy's admissible actions (the paper's layout) where the world reports them and its observation
  # does not already list them; off where only the cold start's world reports them (the prompts a policy is
  # trained on must be those it acts on).
  d.show_admissible = True
  return c


@dataclasses.dataclass(frozen=True)
class ParallelPrompt:
  """The actors' prompt in parallel copies: the step's layout (module docstring) built from the copies' info,
  handed to `inner` (the run's own prompt: its system message and instruction) as the observation, with no
  history of its own (the layout holds it). Past the prompt budget its shorter forms (Prompt.shorter) give up the
  earlier steps' observations, oldest first, then their actions, oldest first; the task, the instruction and
  where each copy is now stay. Picklable, jax-free."""
  inner: Any = dataclasses.field(default_factory=ObservationPrompt)
  history_steps: int = -1  # the earlier steps per copy that show their observation (the last ones); -1: all
  admissible: bool = True  # list each copy's admissible actions where its observation does not

  def __call__(self, observation, history, context, info):
    prompt = as_prompt(self.inner(self.layout(info), [], context, info))
    steps = max((len(actions) - 1 for actions in info["histories"]), default=0)  # earlier steps of a copy
    observed = steps if self.history_steps < 0 else min(self.history_steps, steps)
    forms = [(o, steps) for o in range(observed - 1, -1, -1)] + [(0, n) for n in range(steps - 1, -1, -1)]
    shorter = (as_prompt(self.inner(self.layout(info, o, n), [], context, info)).messages for o, n in forms)
    return dataclasses.replace(prompt, shorter=shorter)

  def layout(self, info: dict[str, Any], observed: int | None = None, listed: int = -1) -> str:
    """The step's text: of each copy's earlier steps the last `listed` (-1: all) are listed, under their own
    numbers (a list that starts at "Action 4" left out three), the last `observed` of them with their
    observation (None: `history_steps`; -1: all)."""
    if "histories" not in info or "copy_observations" not in info:
      raise ValueError("DPEPO's prompt needs the world in parallel copies: set env.parallel.copies to K >= 1")
    observed = self.history_steps if observed is None else observed
    histories, observations = info["histories"], info["copy_observations"]
    k = len(histories)
    admissible = info.get("copy_admissible_actions") or [None] * k
    ended = info.get("copy_ended") or [False] * k
    lines = [f"Your task and where you start:\n{info.get('initial_observation', '')}"]
    earlier = []
    for i, (actions, shown) in enumerate(zip(histories, observations)):
      steps = list(zip(actions, shown))[:-1]  # the last one is shown below, as where the copy is now
      first = len(steps) - listed if 0 <= listed < len(steps) else 0  # steps before `first` are left out
      if len(steps) == first:
        continue
      earlier.append(f"In Environment {i + 1}:")
      with_observation = len(steps) - observed if observed >= 0 else 0
      for n, (action, seen) in enumerate(steps[first:], start=first + 1):
        earlier.append(f"Action {n}: {action}")
        if n > with_observation:
          earlier.append(f"Observation {n}: {seen}")
    if earlier:
      lines += ["Your earlier steps:", *earlier]
    lines.append("Where each environment is now:")
    for i in range(k):
      now = observations[i][-1] if observations[i] else info.get("initial_observation", "")
      last = f'Your last action: {histories[i][-1]}\n' if histories[i] else "No action taken yet.\n"
      block = f"In Environment {i + 1}:\n{last}Observation: {now}"
      if ended[i]:
        block += "\nThis environment's episode has ended."
      elif self.admissible and admissible[i] is not None and ACTIONS_LINE not in now:
        block += f"\nAdmissible actions: {', '.join(admissible[i])}."
      lines.append(block)
    lines.append(f"You can explore up to {k} different environments, ranging from 1 to {k}. {RESPONSE_FORMAT}")
    return "\n".join(lines)


def diversity(results: list[EpisodeResult]) -> dict[str, float]:
  """The diversity DPEPO reports, over finished episodes in parallel copies (their steps' info):

    distinct_actions_per_step        distinct actions among the copies that acted at a step (mean over such steps)
    copies_acting_per_step           how many copies acted (mean over every step)
    distinct_transitions_per_group   distinct (copy's state, action) pairs over a task group's episodes and
                                     copies (mean over groups): how much of the world the group tried
    steps_to_success                 steps of the episodes that succeeded (mean; 0 when none did)
  """
  distinct, acting, groups, wins = [], [], {}, []
  for r in results:
    if r.dropped or not r.steps:
      continue
    first = r.steps[0].info
    before = [state_key(first.get("initial_observation", ""))] * len(first.get("actions", ()))
    transitions = groups.setdefault(r.spec.group_id, set())
    for s in r.steps:
      actions = s.info.get("actions") or []
      acted = [(i, a) for i, a in enumerate(actions) if a is not None]
      acting.append(len(acted))
      if acted:
        distinct.append(len({a for _, a in acted}))
      transitions.update((before[i], a) for i, a in acted)
      before = list(s.info.get("copy_state_keys", before))
    if r.success:
      wins.append(len(r.steps))
  mean = lambda v: float(sum(v) / len(v)) if v else 0.0  # noqa: E731
  return {"distinct_actions_per_step": mean(distinct), "copies_acting_per_step": mean(acting),
          "distinct_transitions_per_group": mean([len(t) for t in groups.values()]),
          "steps_to_success": mean(wins)}


def _named_actions(result: EpisodeResult) -> list[dict[int, str]]:
  """Per step, the actions it named (copy number from 1 -> action), as ParallelCopies reported them."""
  return [{int(n): str(a) for n, a in s.info.get("parsed_actions", ())} for s in result.steps]


@register_method("dpepo")
class DPEPO(Method):
  """The parallel prompt around the run's prompt, W_t per step record, the `dpepo` estimator (config)."""

  name = "dpepo"

  def __init__(self, config: Any):
    super().__init__(config)
    d = config.dpepo
    if d.weight not in WEIGHTS:
      raise ValueError(f"dpepo.weight must be one of {WEIGHTS}, got {d.weight!r}")
    if int(config.env.parallel.copies) < 1:
      raise ValueError("DPEPO acts in parallel copies: set env.parallel.copies to K >= 1")

  def prompt_hook(self) -> ParallelPrompt:
    return self.wrap_prompt_hook(super().prompt_hook())

  def wrap_prompt_hook(self, hook: Any) -> ParallelPrompt:
    d = self.config.dpepo
    return ParallelPrompt(inner=hook, history_steps=int(d.history_steps), admissible=bool(d.show_admissible))

  def observe(self, results: list[EpisodeResult], *, training: bool) -> dict[str, float]:
    if not training:
      return {}
    weights = [w for r in results if not r.dropped for w in self.weights(_named_actions(r))]
    return {**{f"dpepo/{k}": v for k, v in diversity(results).items()},
            "dpepo/step_weight_mean": float(sum(weights) / len(weights)) if weights else 0.0}

  def record_fields(self, ctx) -> dict[str, Any]:
    from explore_jax.replay import ExtraField

    return {STEP_WEIGHT_FIELD: ExtraField((), "float32")}

  def step_fields(self, result: EpisodeResult) -> list[dict[str, Any]]:
    return [{STEP_WEIGHT_FIELD: w} for w in self.weights(_named_actions(result))]

  def weights(self, step_actions: list[dict[int, str]]) -> list[float]:
    """W_t of each step of one episode, from the actions each step named (copy number from 1 -> action)."""
    from explore_jax.rl.diversity import dpepo_trajectory_weights  # the learner's side (explore_jax.rl loads jax)

    d = self.config.dpepo
    if d.weight in ("off", "scripts"):
      return [1.0] * len(step_actions)
    k = int(self.config.env.parallel.copies)
    options = dict(alpha=float(d.alpha), gamma=float(d.gamma), beta=float(d.beta), omega=float(d.omega),
                   no_action_weight=float(d.no_action_weight), num_copies=k,
                   width_ignore=tuple(a.strip() for a in str(d.width_ignore).split(",") if a.strip()),
                   round_to=None if int(d.round_to) < 0 else int(d.round_to), form=d.weight)
    return dpepo_trajectory_weights(step_actions, **options)
