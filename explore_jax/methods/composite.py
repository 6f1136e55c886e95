"""Methods compose: `config.method = "sge+rnd"` runs SGE's prompts, schedule and reflections with RND's bonus.

`Composite` answers every hook by merging its parts' answers, in the order the config names them:

  prompt hook, temperatures, delimiters   the one part that defines them (two that both do are an error:
                                          there is one prompt and one sampling schedule per response); parts
                                          with wrap_prompt_hook (EMPO2) wrap that prompt, in order
  episode context, record fields, step    merged dicts; the same key from two parts is an error
    fields, aux models, intrinsic terms
  setup, observe                          every part (observe's metrics merged)
  update_batch                            chained in order
  sft_request                             the one part that asks at this iteration (two at once: error)
  cold_start_key / cold_start_request     the one part that asks for a cold start before RL (two: error)
  state_dict / array_state                one entry per part, under the part's name
  wants_features                          any part

Advantages, the loss and dynamic sampling come from the config, as for a single method. The episode
context's random stream is shared: parts draw from it in order, so a part's draws do not depend on what a
later part does.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

from explore_jax.actors.protocol import EpisodeResult, EpisodeSpec
from explore_jax.methods.base import BuildContext, Method, SFTRequest


# Hooks whose answer comes from the config for every method, so a composition cannot merge them.
_FROM_CONFIG = ("extrinsic_rewards", "keep_groups", "loss_config", "advantage_name", "advantage_options")


def _overrides(method: Method, hook: str) -> bool:
  return getattr(type(method), hook) is not getattr(Method, hook)


def _merge(parts: Sequence[tuple[str, dict[str, Any]]], what: str) -> dict[str, Any]:
  out: dict[str, Any] = {}
  owner: dict[str, str] = {}
  for name, d in parts:
    for k, v in d.items():
      if k in out:
        raise ValueError(f"methods {owner[k]!r} and {name!r} both define {what} {k!r}")
      out[k], owner[k] = v, name
  return out


class Composite(Method):
  """Several registered methods acting as one (see the module docstring for how each hook merges)."""

  def __init__(self, config: Any, methods: Sequence[Method], names: Sequence[str]):
    super().__init__(config)
    self.methods = list(methods)
    self.names = list(names)
    self.name = "+".join(self.names)
    self.wants_features = any(m.wants_features for m in self.methods)
    self.intrinsic_names = tuple(n for m in self.methods for n in m.intrinsic_names)
    if len(set(self.intrinsic_names)) != len(self.intrinsic_names):
      raise ValueError(f"the parts of {self.name!r} repeat intrinsic reward names: {self.intrinsic_names}")
    self._wrappers = [m for m in self.methods if _overrides(m, "wrap_prompt_hook")]
    self._schedule = self._single_owner("prompt_hook", "temperatures", "delimiters")
    for n, m in self._named():
      shared = [h for h in _FROM_CONFIG if _overrides(m, h)]
      if shared:
        raise ValueError(f"method {n!r} overrides {shared}, which a composition takes from the config alone; "
                         "compose it only where those answers can be config fields")

  def _single_owner(self, *hooks: str) -> Method:
    """The part that defines these hooks (or the first part, when none does)."""
    # A part that wraps the prompt (wrap_prompt_hook) adds to the owner's prompt rather than owning one.
    owners = [(n, m) for n, m in zip(self.names, self.methods)
              if any(_overrides(m, h) and not (h == "prompt_hook" and m in self._wrappers) for h in hooks)]
    if len(owners) > 1:
      raise ValueError(f"methods {[n for n, _ in owners]} each define {'/'.join(hooks)}; one response has one "
                       "prompt and one sampling schedule, so at most one part of a composition may set them")
    return owners[0][1] if owners else self.methods[0]

  def _named(self):
    return zip(self.names, self.methods)

  # ---- rollout -------------------------------------------------------------------------------------
  def prompt_hook(self):
    owner = self._schedule
    hook = Method.prompt_hook(owner) if owner in self._wrappers else owner.prompt_hook()
    for m in self._wrappers:
      hook = m.wrap_prompt_hook(hook)
    return hook

  def temperatures(self) -> list[float]:
    return self._schedule.temperatures()

  def delimiters(self) -> list[str]:
    return self._schedule.delimiters()

  def episode_context(self, spec: EpisodeSpec, rng: np.random.Generator) -> dict[str, Any]:
    return _merge([(n, m.episode_context(spec, rng)) for n, m in self._named()], "episode context key")

  def observe(self, results: list[EpisodeResult], *, training: bool) -> dict[str, float]:
    return _merge([(n, m.observe(results, training=training)) for n, m in self._named()], "metric")

  def observe_update(self, iteration: int, records: Any, advantages: Any, valid: np.ndarray) -> dict[str, float]:
    return _merge([(n, m.observe_update(iteration, records, advantages, valid)) for n, m in self._named()],
                  "metric")

  # ---- records, aux models, rewards ----------------------------------------------------------------
  def setup(self, ctx: BuildContext) -> None:
    for m in self.methods:
      m.setup(ctx)

  def record_fields(self, ctx: BuildContext) -> dict[str, Any]:
    return _merge([(n, m.record_fields(ctx)) for n, m in self._named()], "record field")

  def step_fields(self, result: EpisodeResult) -> list[dict[str, Any]]:
    per_part = [(n, m.step_fields(result)) for n, m in self._named()]
    return [_merge([(n, rows[i]) for n, rows in per_part], "record field") for i in range(len(result.steps))]

  def aux_models(self, ctx: BuildContext) -> dict[str, Any]:
    return _merge([(n, m.aux_models(ctx)) for n, m in self._named()], "aux model")

  def intrinsic_rewards(self, records: Any, aux_params: dict[str, Any],
                        aux_outputs: Optional[dict[str, Any]] = None) -> dict[str, np.ndarray]:
    return _merge([(n, m.intrinsic_rewards(records, aux_params, aux_outputs)) for n, m in self._named()], "intrinsic reward")

  # ---- learning ------------------------------------------------------------------------------------
  def update_batch(self, batch: dict[str, Any], records: Any, rng: np.random.Generator) -> dict[str, Any]:
    for m in self.methods:
      batch = m.update_batch(batch, records, rng)
    return batch

  def sft_request(self, iteration: int, results: list[EpisodeResult]) -> Optional[SFTRequest]:
    asks = [(n, r) for n, m in self._named() if (r := m.sft_request(iteration, results)) is not None]
    if len(asks) > 1:
      raise ValueError(f"methods {[n for n, _ in asks]} each ask for SFT after iteration {iteration}")
    return asks[0][1] if asks else None

  def cold_start_key(self) -> Any:
    keys = {n: k for n, m in self._named() if (k := m.cold_start_key()) is not None}
    if len(keys) > 1:
      raise ValueError(f"methods {sorted(keys)} each ask for a cold start before RL")
    return keys or None

  def cold_start_request(self, episodes: list[EpisodeResult]) -> Optional[SFTRequest]:
    asks = [m for _, m in self._named() if m.cold_start_key() is not None]
    return asks[0].cold_start_request(episodes) if asks else None

  # ---- checkpoints ---------------------------------------------------------------------------------
  def state_dict(self) -> dict[str, Any]:
    return {n: m.state_dict() for n, m in self._named()}

  def load_state_dict(self, state: dict[str, Any]) -> None:
    for n, m in self._named():
      m.load_state_dict(state.get(n, {}))

  def array_state(self) -> Any:
    trees = {n: t for n, m in self._named() if (t := m.array_state()) is not None}
    return trees or None

  def load_array_state(self, tree: Any) -> None:
    for n, m in self._named():
      if n in (tree or {}):
        m.load_array_state(tree[n])
