"""ScreenReading-v0: a GUI world whose every step also reports what was on the screen before and after it.

ScreenExplorer's rewards compare screens (methods/screen_explorer.py, rl/screen_rewards.py). Reading a screen is
an actor's work, next to the world, so the learner only embeds texts: `ScreenReader` wraps a world with Dict
observations {"screenshot": uint8 [H, W, 3], "text": ...} (MiniWoB-v0, Desktop-v0) and adds to the info

  reset   info["screen"] = {"after": S}                  the first screen
  step    info["screen"] = {"before": S, "after": S'}    the screens around the step's action

with S = {"latent": float32 [D], "boxes": [[x0, y0, x1, y1, text], ...]}: the screenshot's image latent
(`screen_reading.image_latent`, chosen by name) and its line-level OCR boxes in screenshot pixels, bounds
inclusive (`screen_reading.ocr_boxes`; [] with ocr off). A screenshot is read once: a step that leaves it as
it was (an invalid action, a click on nothing) reuses the reading by the screenshot's digest (each info gets
its own copy). Responses, rewards,
the episode's end and the other info keys are the world's own; the response goes to the world as written, so a
JSON reply's intent reaches it (info["intent"]).

`screen_text(boxes)` and `click_hit_text(boxes, kind, x, y)` are the texts ScreenExplorer embeds: the whole
screen after the "Screen OCR: " prefix, and the boxes under a click (Click, RightClick, DoubleClick; inclusive
bounds, joined by spaces).

The oracle (`oracle_action`, what an SFT warm start imitates) replies in ScreenExplorer's JSON form,
{"intent": ..., "action": ...}, so a policy learns the form before it explores:

  "world"  the world's own oracle action, with an intent naming the text under it ("Click "Submit" to see
           what it does"); for worlds with an oracle (MiniWoB-v0's DOM oracle).
  "boxes"  a click at the centre of one OCR box of the current screen, drawn from the episode's seeded stream
           (Click or DoubleClick), with the same intent; a click at a drawn point where the screen has no text.
           For worlds without an oracle (Desktop-v0).

`screen_reading_env(env_id, env_kwargs, reading)` maps a config's env.screen_reading (None: off) to this
wrapper's id and kwargs (train/rollout.environment); open to every method. No jax here: actors run it.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Optional, Sequence

import gymnasium
import numpy as np

from explore_jax.envs import screen_actions, screen_reading
from explore_jax.envs.screen_actions import ScreenAction

SCREEN_READING_ID = "explore_jax/ScreenReading-v0"
SCREEN_PREFIX = "Screen OCR: "
CLICK_KINDS = ("Click", "RightClick", "DoubleClick")  # the actions whose point r_inter looks under
ORACLES = ("world", "boxes")
_OPTIONS = ("latent", "ocr", "ocr_options", "oracle")


def screen_text(boxes: Sequence[Sequence]) -> str:
  """The text a screen is embedded as: "Screen OCR: " + its OCR boxes' texts joined by spaces."""
  return SCREEN_PREFIX + " ".join(str(b[4]) for b in boxes)


def click_hit_text(boxes: Sequence[Sequence], kind: str, x: Optional[int], y: Optional[int]) -> Optional[str]:
  """The text under a click: for Click / RightClick / DoubleClick at (x, y), "Screen OCR: " + the stripped texts
  of every box [x0, y0, x1, y1, text] with x0 <= x <= x1 and y0 <= y <= y1 (bounds inclusive), joined by spaces;
  None for other actions or when no box holds the point."""
  if kind not in CLICK_KINDS or x is None or y is None:
    return None
  hits = [str(b[4]).strip() for b in boxes if b[0] <= x <= b[2] and b[1] <= y <= b[3]]
  return SCREEN_PREFIX + " ".join(hits) if hits else None


def screen_reading_env(env_id: str, env_kwargs: dict[str, Any], reading: Any = None) -> tuple[str, dict[str, Any]]:
  """(id, kwargs) of the world a run plays: `reading` None or empty leaves it as it is; a mapping of this
  wrapper's options (latent, ocr, ocr_options, oracle) wraps it in ScreenReader."""
  options = dict(reading or {})
  if not options:
    return env_id, dict(env_kwargs)
  unknown = sorted(set(options) - set(_OPTIONS))
  if unknown:
    raise ValueError(f"env.screen_reading has unknown option(s) {unknown}; the options are {list(_OPTIONS)}")
  if "ocr_options" in options:
    options["ocr_options"] = dict(options["ocr_options"] or {})
  return SCREEN_READING_ID, {"env": env_id, "env_kwargs": dict(env_kwargs), **options}


class ScreenReader(gymnasium.Wrapper):
  """A GUI world with its screens read at every step (module docstring).

  Args:
    env: a registered gymnasium id (made with `env_kwargs`) or an environment.
    env_kwargs: keyword arguments for `gymnasium.make` when `env` is an id.
    latent: the image latent's name (`screen_reading.LATENTS`).
    ocr: whether to read the screen's text (boxes are [] otherwise).
    ocr_options: keyword arguments of `screen_reading.ocr_boxes` (gray, upscale, psm, lang; its defaults are
      measured in benchmarks/README.md, "OCR").
    oracle: "world" or "boxes" (module docstring).
  """

  def __init__(self, env: Any, env_kwargs: Optional[dict[str, Any]] = None, latent: str = "patch_stats",
               ocr: bool = True, ocr_options: Optional[dict[str, Any]] = None, oracle: str = "world"):
    if isinstance(env, str):
      env = gymnasium.make(env, **dict(env_kwargs or {}))
    elif env_kwargs:
      raise ValueError("env_kwargs applies only when env is a gymnasium id")
    if latent not in screen_reading.LATENTS:
      raise ValueError(f"unknown image latent {latent!r}; the latents are {', '.join(screen_reading.LATENTS)}")
    if oracle not in ORACLES:
      raise ValueError(f"oracle must be one of {ORACLES}, got {oracle!r}")
    space = env.observation_space
    if not isinstance(space, gymnasium.spaces.Dict) or "screenshot" not in space.spaces:
      raise TypeError(f"ScreenReader needs a world with a Dict observation holding a screenshot, got {space}")
    super().__init__(env)
    self.latent, self.ocr, self.oracle = latent, bool(ocr), oracle
    self.ocr_options = dict(ocr_options or {})
    self.height, self.width = space.spaces["screenshot"].shape[:2]
    self._screen: dict[str, Any] = {}
    self._digest = b""
    self._rng = np.random.default_rng()

  def read(self, screenshot: np.ndarray) -> dict[str, Any]:
    """S for one screenshot: the latent and the OCR boxes (reused while the screenshot stays the same)."""
    screenshot = np.asarray(screenshot, np.uint8)
    digest = hashlib.blake2b(screenshot.tobytes(), digest_size=16).digest()
    if digest != self._digest or not self._screen:
      boxes = screen_reading.ocr_boxes(screenshot, **self.ocr_options) if self.ocr else []
      self._screen = {"latent": screen_reading.image_latent(self.latent, screenshot),
                      "boxes": [b.as_list() for b in boxes]}
      self._digest = digest
    return self._screen

  def reset(self, *, seed: Optional[int] = None, options: Optional[dict[str, Any]] = None):
    observation, info = self.env.reset(seed=seed, options=options)
    self._rng = np.random.default_rng(None if seed is None else [int(seed), 0x5C4EE7])
    self._screen, self._digest = {}, b""
    self.read(observation["screenshot"])
    return observation, {**info, "screen": {"after": self._copy()}}

  def step(self, action: Any):
    before = self._copy()
    observation, reward, terminated, truncated, info = self.env.step(action)
    self.read(observation["screenshot"])
    return observation, reward, terminated, truncated, {**info, "screen": {"before": before, "after": self._copy()}}

  def _copy(self) -> dict[str, Any]:
    """The current S as new objects: a caller that keeps one step's info never sees another's change."""
    return {"latent": self._screen["latent"].copy(), "boxes": [list(b) for b in self._screen["boxes"]]}

  # ---- the oracle -----------------------------------------------------------------------------------

  def oracle_action(self) -> str:
    """The oracle's JSON reply (module docstring)."""
    boxes = self._screen.get("boxes", [])
    if self.oracle == "world":
      action, error = screen_actions.parse_action(self.env.unwrapped.oracle_action(), self.width, self.height)
      if action is None:
        raise RuntimeError(f"the world's oracle action does not parse: {error}")
    elif boxes:
      x0, y0, x1, y1, _ = boxes[int(self._rng.integers(len(boxes)))]
      kind = ("Click", "DoubleClick")[int(self._rng.integers(2))]
      action = ScreenAction(kind, (x0 + x1) // 2, (y0 + y1) // 2)
    else:
      action = ScreenAction("Click", int(self._rng.integers(self.width)), int(self._rng.integers(self.height)))
    return json.dumps({"intent": intent_for(action, boxes), "action": screen_actions.format_action(action)})


def intent_for(action: ScreenAction, boxes: Sequence[Sequence]) -> str:
  """A short intent for an action: the text under a click, or the point it acts on."""
  hit = click_hit_text(boxes, action.kind, action.x, action.y)
  if hit is not None:
    return f'{action.kind} "{hit[len(SCREEN_PREFIX):]}" to see what it does'
  if action.kind == "Text":
    return f'Type "{action.text}" at ({action.x}, {action.y})'
  if action.kind == "Key":
    return f"Press {action.chord} to see what changes"
  return f"{action.kind} at ({action.x}, {action.y}) to see what changes"
