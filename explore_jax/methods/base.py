"""A method is a small object of hooks plugged into the one training loop (DESIGN.md, "Methods are plug-ins").

The loop asks the method, in order of an iteration:
  prompt_hook()          the function actors build prompts with (picklable; runs without jax)
  episode_context(...)   per-episode data for that hook (SGE reflections, EMPO2 tips, ...)
  sampling_params(...)   the sampler's schedule (temperatures per segment, stop criteria)
  observe(results)       bookkeeping on finished episodes (buffers, memories)
  step_rewards(...)      the scalar reward per step record the advantage estimator sees
  advantage_name/options the registered estimator and its options
  loss_config            the clipped-surrogate options
  keep_groups(...)       which task groups enter the update (DAPO's dynamic sampling)
  update_aux(...)        updates of the method's own networks (RND, world model, q_phi) after the policy
  init_aux / aux_state   those networks, built from the policy's shapes and checkpointed with it
Baselines are methods too; they differ only in these answers.

This package imports no jax at module level: actor processes unpickle prompt hooks defined here, and
actors never load jax.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

import numpy as np

from explore_jax.actors.protocol import EpisodeResult, EpisodeSpec

DEFAULT_SYSTEM_PROMPT = "You are an agent acting in a text environment. Reply with your next action only."


@dataclasses.dataclass(frozen=True)
class ObservationPrompt:
  """The plain agent prompt: a system message, the last few steps, and the current observation followed by
  the instruction (e.g. SGE's strategy prompt, which every coding baseline shares).

  Picklable, so actor processes can run it.
  """
  system: str = DEFAULT_SYSTEM_PROMPT
  history_steps: int = 0
  instruction: str = ""

  def __call__(self, observation: str, history: list[tuple[str, str]], context: dict[str, Any],
               info: dict[str, Any]) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": self.system}] if self.system else []
    for past_obs, past_response in (history[-self.history_steps:] if self.history_steps else []):
      messages += [{"role": "user", "content": past_obs}, {"role": "assistant", "content": past_response}]
    messages.append({"role": "user", "content": join_text(observation, self.instruction_for(context))})
    return messages

  def instruction_for(self, context: dict[str, Any]) -> str:
    """The text after the observation; subclasses vary it with the episode's context."""
    return self.instruction


def join_text(*parts: str) -> str:
  """The non-empty parts, one paragraph each."""
  return "\n".join(p for p in parts if p)


class Method:
  """Base plug-in: plain on-policy group-relative RL. Subclasses override the hooks they change."""

  name = "base"
  # Whether responses carry the policy's final hidden state at their last token (records' "features").
  wants_features = False

  def __init__(self, config: Any):
    self.config = config

  # ---- rollout -------------------------------------------------------------------------------------
  def prompt_hook(self) -> Callable[..., list[dict[str, str]]]:
    return ObservationPrompt(system=self.config.get("system_prompt", DEFAULT_SYSTEM_PROMPT),
                             history_steps=self.config.get("history_steps", 0),
                             instruction=self.config.get("instruction", ""))

  def episode_context(self, spec: EpisodeSpec, rng: np.random.Generator) -> dict[str, Any]:
    return {}

  def temperatures(self) -> list[float]:
    """Per-segment sampling temperatures (one segment unless the method splits responses)."""
    return [float(self.config.rollout.temperature)]

  def delimiters(self) -> list[str]:
    """Texts that close each segment but the last (SGE: the strategy's end)."""
    return []

  def observe(self, results: list[EpisodeResult], *, training: bool) -> dict[str, float]:
    """Bookkeeping on finished episodes; returns metrics."""
    return {}

  def state_dict(self) -> dict[str, Any]:
    """The method's own state (buffers, memories) as JSON data, saved with each checkpoint."""
    return {}

  def load_state_dict(self, state: dict[str, Any]) -> None:
    """Restores what `state_dict` returned."""

  def init_aux(self, model_config: Any, key: Any) -> None:
    """Builds the method's own networks (RND, world model) once the policy's shapes are known."""

  def aux_state(self) -> Any:
    """The method's networks as a pytree of arrays, saved in the orbax checkpoint beside the policy (None: none)."""
    return None

  def load_aux_state(self, tree: Any) -> None:
    """Restores what `aux_state` returned."""

  # ---- learning ------------------------------------------------------------------------------------
  def step_rewards(self, records: Any) -> np.ndarray:
    """The reward each step record contributes: the task reward, minus a penalty for malformed actions,
    plus DAPO's overlong shaping when `rl.overlong_buffer` > 0 (`records` holds numpy or jax arrays)."""
    task = np.asarray(records.task_reward, np.float32)
    fmt = np.asarray(records.format_reward, np.float32)
    rewards = task - float(self.config.rl.get("format_penalty", 0.0)) * (1.0 - fmt)
    buffer = int(self.config.rl.get("overlong_buffer", 0))
    if buffer > 0:
      lengths = np.asarray(records.response_mask).sum(-1)
      rewards = rewards + overlong_penalty(lengths, self.config.rollout.max_new_tokens, buffer,
                                           float(self.config.rl.get("overlong_factor", 1.0)))
    return rewards

  @property
  def advantage_name(self) -> str:
    return self.config.rl.advantage

  def advantage_options(self) -> dict[str, Any]:
    return dict(self.config.rl.advantage_options)

  def loss_config(self):
    """The `rl.losses.PolicyLossConfig` of the clipped-surrogate update."""
    from explore_jax.rl.losses import PolicyLossConfig

    loss = self.config.rl.loss
    return PolicyLossConfig(
        eps_low=loss.eps_low, eps_high=loss.eps_high, dual_clip=optional(loss.dual_clip), aggregation=loss.aggregation,
        max_len=loss.get("max_len"), kl_type=loss.kl_type, kl_coef=loss.kl_coef, entropy_coef=loss.entropy_coef,
        entropy_advantage=loss.get("entropy_advantage", False), entropy_adv_alpha=loss.get("entropy_adv_alpha", 0.4),
        entropy_adv_kappa=loss.get("entropy_adv_kappa", 2.0))

  def keep_groups(self, group_returns: dict[int, np.ndarray]) -> set[int]:
    """Task groups that enter the update. DAPO's dynamic sampling drops groups whose returns are all equal
    (they carry no group-relative signal)."""
    if not self.config.rl.get("drop_uniform_groups", False):
      return set(group_returns)
    return {g for g, r in group_returns.items() if np.ptp(r) > 0}


  def update_aux(self, records: Any, iteration: int) -> dict[str, float]:
    """Trains the method's auxiliary networks on the iteration's records; returns metrics."""
    return {}


_METHODS: dict[str, type[Method]] = {}


def register_method(name: str) -> Callable[[type[Method]], type[Method]]:
  def decorator(cls: type[Method]) -> type[Method]:
    if name in _METHODS:
      raise ValueError(f"method {name!r} is already registered")
    _METHODS[name] = cls
    return cls
  return decorator


# Modules whose import registers methods; loaded on first use of the registry.
METHOD_MODULES = ("explore_jax.methods.grpo", "explore_jax.methods.sge", "explore_jax.methods.rlad",
                  "explore_jax.methods.rnd")


def _load_all() -> None:
  import importlib

  for module in METHOD_MODULES:
    importlib.import_module(module)


def make_method(config: Any) -> Method:
  """The method named by `config.method`, built from the config."""
  _load_all()
  name = config.method
  if name not in _METHODS:
    raise KeyError(f"unknown method {name!r}; registered: {sorted(_METHODS)}")
  return _METHODS[name](config)


def registered_methods() -> list[str]:
  _load_all()
  return sorted(_METHODS)


def overlong_penalty(lengths: np.ndarray, max_len: int, buffer: int, factor: float = 1.0) -> np.ndarray:
  """DAPO's soft overlong punishment (Yu et al. 2025, eq. 13): 0 up to L_max - L_cache, then falling
  linearly to -1 at L_max (and -1 beyond):  R_len(y) = clip((L_max - L_cache - |y|) / L_cache, -1, 0)."""
  if not 0 < buffer <= max_len:
    raise ValueError(f"overlong buffer must be in (0, max_len={max_len}], got {buffer}")
  lengths = np.asarray(lengths, np.float32)
  return factor * np.clip((max_len - buffer - lengths) / buffer, -1.0, 0.0).astype(np.float32)


def optional(value: Optional[float]) -> Optional[float]:
  """Config values use a negative number for 'off' where None cannot be overridden from the command line."""
  return None if value is None or value < 0 else value
