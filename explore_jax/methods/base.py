"""A method is a small object of hooks plugged into the one training loop (DESIGN.md, "Methods are plug-ins").

Once built, the runtime hands the method its BuildContext (setup: the model, the tokenizer, the text encoder).
One training iteration (train/loop.py) asks the method, in this order:

  rollout      prompt_hook()            the function actors build prompts with (picklable, runs without jax;
                                        wrap_prompt_hook: a method's additions around another's, EMPO2's tips);
                                        it may also ask the learner for text embeddings, return prompt
                                        variants, or ask for one generation after the episode (actors/protocol.py)
               episode_context(...)     per-episode data for that hook (SGE reflections, RLAD's dropout, ...)
               temperatures/delimiters  the sampler's per-segment schedule (SGE's tau_s / tau)
  bookkeeping  observe(results)         buffers and memories from the finished episodes
  records      record_fields(ctx)       the extra per-step fields the method needs, with shapes and dtypes;
               step_fields(result)      their values, from what the actors sent back (responses, the raw
                                        observation, the environment's info, prompt variants, final text)
  aux models   aux_models(ctx)          the method's own networks (RND's pair, a world model, a policy-sized
                                        q_phi with a frozen prior), each trained in the phase it names:
                                        "before_rewards" (on the fresh records, before any reward is
                                        computed) or "after_update" (after the policy update)
  rewards      intrinsic_rewards(...)   named exploration terms added to the extrinsic reward (task reward,
                                        format penalty, DAPO's overlong shaping); they may read aux params
                                        and what an aux model computed for each record while it trained
  advantages   the estimator named by config.rl.advantage; DAPO's dynamic sampling keeps a group when its
               outcome (task) returns differ (keep_groups)
               observe_update(...)      what the update is about to learn from: the records and their
                                        advantages (ScreenExplorer keeps its distillation steps)
  update       update_batch(...)        rewrites the update batch (EMPO2's off-policy prompt swap)
               loss_config()            every `rl.losses.PolicyLossConfig` field, read from config.rl.loss
  sft          sft_request(...)         SFT batches on the policy's own parameters during training (EAPO's
                                        rollback, ScreenExplorer's distillation); the warm start is the
                                        same mechanism at iteration 0
               cold_start_request(...)  SFT between the warm start and RL, on the oracle episodes the warm
                                        start imitates (EAPO's rollback stage), cached with the warm start
                                        under a key that adds cold_start_key()
  checkpoint   state_dict()             small JSON-able state (strategy buffers), in checkpoint metadata;
               array_state()            fixed-shape array state (memories of embeddings), in the orbax
                                        checkpoint beside the policy and the aux models

Baselines are methods too; they differ only in these answers. Methods compose: `config.method = "sge+rnd"`
builds `Composite([SGE, RND])` (methods/composite.py), which merges their answers.

This package imports no jax at module level: actor processes unpickle prompt hooks defined here, and
actors never load jax.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional, Union

import numpy as np

from explore_jax.actors.protocol import EpisodeResult, EpisodeSpec, Prompt
from explore_jax.images import IMAGE

# The record field a method's per-step weight W_t travels in to the estimators (StepRecords.step_weights; DPEPO).
STEP_WEIGHT_FIELD = "step_weight"

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
  # The last N actions taken, listed after the observation without their observations: a short memory (where
  # a searching agent has been) at a few tokens per step, where history_steps costs a whole observation each.
  action_history: int = 0

  def __call__(self, observation: Any, history: list[tuple[Any, str]], context: dict[str, Any],
               info: dict[str, Any]) -> Union[list[dict[str, str]], Prompt]:
    shown = history[-self.history_steps:] if self.history_steps else []
    messages = self.chat(observation, history, shown, context)
    images = [observation[SCREENSHOT]] if isinstance(observation, dict) and SCREENSHOT in observation else []
    if not shown:
      return Prompt(messages, images=images) if images else messages
    # Past the prompt budget, the oldest shown steps go first (the system message and the task stay).
    shorter = (self.chat(observation, history, shown[len(shown) - k:], context) for k in range(len(shown) - 1, -1, -1))
    return Prompt(messages, images=images, shorter=shorter)

  def chat(self, observation: Any, history: list[tuple[Any, str]], shown: list[tuple[Any, str]],
           context: dict[str, Any]) -> list[dict[str, str]]:
    """The chat: the system message, the `shown` earlier steps as turns, then the observation (a GUI world's
    screenshot marker first), the last actions of `history` and the instruction."""
    messages = [{"role": "system", "content": self.system}] if self.system else []
    for past_obs, past_response in shown:
      messages += [{"role": "user", "content": observation_text(past_obs)},
                   {"role": "assistant", "content": past_response}]
    text = observation_text(observation)
    if isinstance(observation, dict) and SCREENSHOT in observation:  # a GUI world: the screenshot, then its text
      text = join_text(IMAGE, text)
    messages.append({"role": "user", "content": join_text(text, self.actions_so_far(history),
                                                          self.instruction_for(context))})
    return messages

  def actions_so_far(self, history: list[tuple[str, str]]) -> str:
    """"Your last actions: a; b; c." of the last `action_history` responses (one line each, cut to 60
    characters), "" when there are none or the option is off."""
    recent = [" ".join(str(r).split())[:60] for _, r in history[-self.action_history:]] if self.action_history else []
    return f"Your last actions: {'; '.join(recent)}." if recent else ""

  def instruction_for(self, context: dict[str, Any]) -> str:
    """The text after the observation; subclasses vary it with the episode's context."""
    return self.instruction


SCREENSHOT = "screenshot"  # the image of a GUI world's Dict observation (MiniWoB-v0: {"screenshot", "text"})


def observation_text(observation: Any) -> str:
  """An observation's text: itself, or a Dict observation's "text" (its screenshot shown only for the current
  step, as an image)."""
  return str(observation.get("text", "")) if isinstance(observation, dict) else observation


def join_text(*parts: str) -> str:
  """The non-empty parts, one paragraph each."""
  return "\n".join(p for p in parts if p)


@dataclasses.dataclass(frozen=True)
class BuildContext:
  """What the runtime knows when it asks a method for its record fields and aux models."""
  model_config: Any          # the policy's ModelConfig
  model: Any = None          # the policy's Model (carries the mesh and the sharding rules)
  initial_params: Any = None  # the policy's starting checkpoint (before any warm start)
  tokenizer: Any = None
  mesh: Any = None
  rules: Any = None
  # The run's text encoder on the learner's side: texts -> [N, E] unit rows, the vectors EmbedRequests are
  # answered with (config.embedding.encoder; train/inference.py's InferenceServer.encode).
  encode: Optional[Callable[[list[str]], np.ndarray]] = None
  embedding_dim: int = 0     # E of `encode`'s rows
  workdir: str = ""          # the run's directory (a method's own files: ScreenExplorer's distillation steps)


@dataclasses.dataclass(frozen=True)
class SFTRequest:
  """SFT on the policy's own parameters: `steps` optimizer steps of next-token loss on `demonstrations`
  ({"messages": [...], "response": "..."} each, with "images" for image prompts, as in train/sft_data.py), batches of `batch_size` drawn
  with `seed`, under a fresh AdamW at `learning_rate` (the RL optimizer's moments are kept). A batch's gradient
  is taken in passes of `micro_batch_size` rows (0: the whole batch at once): the same step up to the order of
  float sums, in a fraction of the activation memory."""
  demonstrations: tuple[dict[str, Any], ...]
  steps: int
  batch_size: int
  learning_rate: float
  seed: int = 0
  label: str = "sft"
  micro_batch_size: int = 0


class Method:
  """Base plug-in: plain on-policy group-relative RL. Subclasses override the hooks they change."""

  name = "base"
  # Whether responses carry the policy's final hidden state at their last token (`Response.features`).
  wants_features = False
  # Names of the intrinsic reward terms `intrinsic_rewards` returns (kept per record in the replay).
  intrinsic_names: tuple[str, ...] = ()

  def __init__(self, config: Any):
    self.config = config

  def setup(self, ctx: BuildContext) -> None:
    """Called once the runtime is built, before any hook below: a method keeps what it needs of `ctx` (EMPO2
    its text encoder)."""

  # ---- rollout -------------------------------------------------------------------------------------
  def prompt_hook(self) -> Callable[..., Any]:
    return ObservationPrompt(system=self.config.get("system_prompt", DEFAULT_SYSTEM_PROMPT),
                             history_steps=self.config.get("history_steps", 0),
                             instruction=self.config.get("instruction", ""),
                             action_history=self.config.get("action_history", 0))

  def wrap_prompt_hook(self, hook: Callable[..., Any]) -> Callable[..., Any]:
    """The prompt hook with this method's additions around it (EMPO2's tips), for methods that add to whatever
    prompt the others build rather than own it: a composition wraps its owner's hook with every such part's."""
    return hook

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

  # ---- records -------------------------------------------------------------------------------------
  def record_fields(self, ctx: BuildContext) -> dict[str, Any]:
    """Extra per-step record fields: name -> `replay.ExtraField` (or (shape, dtype[, axes[, pad]]))."""
    return {}

  def step_fields(self, result: EpisodeResult) -> list[dict[str, Any]]:
    """The declared fields' values for each step of a finished episode (one dict per step)."""
    return [{} for _ in result.steps]

  # ---- auxiliary models ----------------------------------------------------------------------------
  def aux_models(self, ctx: BuildContext) -> dict[str, Any]:
    """The method's own networks: name -> `train.aux_models.AuxModelSpec`. The runtime builds each on the
    mesh with its sharding rules and optimizer, trains it in its phase and checkpoints it."""
    return {}

  # ---- learning ------------------------------------------------------------------------------------
  def extrinsic_rewards(self, records: Any) -> np.ndarray:
    """The environment's reward per step record: the task reward, minus a penalty for malformed actions,
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

  def intrinsic_rewards(self, records: Any, aux_params: dict[str, Any],
                        aux_outputs: Optional[dict[str, Any]] = None) -> dict[str, np.ndarray]:
    """Exploration terms per step record, already weighted, by name (`intrinsic_names`); `aux_params`
    holds the current parameters of the method's aux models, `aux_outputs` the per-record outputs of the
    `keep_outputs` ones' last training (train/aux_models.py; ScreenExplorer's world-model predictions)."""
    return {}

  @property
  def advantage_name(self) -> str:
    return self.config.rl.advantage

  def advantage_options(self) -> dict[str, Any]:
    return dict(self.config.rl.advantage_options)

  def loss_config(self):
    """The `rl.losses.PolicyLossConfig` of the clipped-surrogate update: every field from `rl.loss`
    (a field the config does not set keeps its default; a key the loss does not know is an error)."""
    from explore_jax.rl.losses import PolicyLossConfig

    loss = dict(self.config.rl.loss)
    known = {f.name for f in dataclasses.fields(PolicyLossConfig)}
    unknown = sorted(set(loss) - known)
    if unknown:
      raise ValueError(f"rl.loss has unknown field(s) {unknown}; PolicyLossConfig fields: {sorted(known)}")
    for name in ("dual_clip",):  # negative means off where None cannot be written on the command line
      if name in loss:
        loss[name] = optional(loss[name])
    if loss.get("low_prob_mask") in ("", "none", "off"):
      loss["low_prob_mask"] = None
    return PolicyLossConfig(**loss)

  def keep_groups(self, group_returns: dict[int, np.ndarray]) -> set[int]:
    """Task groups that enter the update, given each group's trajectory *outcome* returns (summed task
    rewards). DAPO's dynamic sampling drops groups whose outcomes are all equal: they carry no
    group-relative signal (Yu et al. 2025, eq. 11: 0 < |{o_i : is_equivalent(a, o_i)}| < G). Shaping and
    intrinsic terms do not count: with an exploration bonus, a group that always fails would never look
    uniform."""
    if not self.config.rl.get("drop_uniform_groups", False):
      return set(group_returns)
    return {g for g, r in group_returns.items() if np.ptp(r) > 0}

  def observe_update(self, iteration: int, records: Any, advantages: Any, valid: np.ndarray) -> dict[str, float]:
    """Sees the iteration's records with their advantages (a jax array [N]) and which of them enter the update
    (`valid`, numpy [N]), before the update; returns metrics."""
    return {}

  def update_batch(self, batch: dict[str, Any], records: Any, rng: np.random.Generator) -> dict[str, Any]:
    """Rewrites the update batch (jax arrays keyed as in `train/rl_step.py`) before the minibatch epochs."""
    return batch

  def sft_request(self, iteration: int, results: list[EpisodeResult]) -> Optional[SFTRequest]:
    """SFT to run on the policy after iteration `iteration`'s RL update (None: none)."""
    return None

  def cold_start_key(self) -> Any:
    """What determines `cold_start_request`'s SFT beyond the warm start (JSON-able), or None when the method asks
    for none: the run then starts RL from the warm start itself, under the warm start's own key."""
    return None

  def cold_start_request(self, episodes: list[EpisodeResult]) -> Optional[SFTRequest]:
    """SFT on the policy after the warm start and before RL, given the oracle's episodes of the warm start's seeds
    (train/sft_data.oracle_episode_results); None: nothing to learn from them. Asked only where cold_start_key()
    is not None, and once per cache key: its result is cached as the warm start's is."""
    return None

  # ---- checkpoints ---------------------------------------------------------------------------------
  def state_dict(self) -> dict[str, Any]:
    """Small JSON-able state (buffers of strings), saved in each checkpoint's metadata."""
    return {}

  def load_state_dict(self, state: dict[str, Any]) -> None:
    """Restores what `state_dict` returned."""

  def array_state(self) -> Any:
    """Array state of fixed shapes (e.g. a memory of embeddings with a count), saved in the orbax
    checkpoint; None: none. Its shapes must not change during a run (they are the restore target)."""
    return None

  def load_array_state(self, tree: Any) -> None:
    """Restores what `array_state` returned."""


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
                  "explore_jax.methods.rnd", "explore_jax.methods.empo2", "explore_jax.methods.dpepo",
                  "explore_jax.methods.eapo", "explore_jax.methods.screen_explorer")


def _load_all() -> None:
  import importlib

  for module in METHOD_MODULES:
    importlib.import_module(module)


def make_method(config: Any) -> Method:
  """The method named by `config.method`; "a+b" composes registered methods (methods/composite.py)."""
  _load_all()
  names = [n.strip() for n in str(config.method).split("+")]
  for name in names:
    if name not in _METHODS:
      raise KeyError(f"unknown method {name!r}; registered: {sorted(_METHODS)}")
  if len(names) == 1:
    return _METHODS[names[0]](config)
  if len(set(names)) != len(names):
    raise ValueError(f"method {config.method!r} names a method twice")
  from explore_jax.methods.composite import Composite

  return Composite(config, [_METHODS[n](config) for n in names], names)


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
