"""ScreenWorld: the shared part of the GUI worlds (MiniWoB-v0's browser, Desktop-v0's X desktop).

A GUI world is a TextEnv seen as screenshots and acted on in pixels with ScreenExplorer's action grammar
(`envs/screen_actions.py`). `ScreenWorld` does what they do alike:

- Observation: a gymnasium Dict {"screenshot": uint8 [height, width, 3], "text": str}; "text" is what the
  TextEnv returns. The screenshot is the last one `_set_screen` was given, a read-only array (an invalid
  action returns the same one). render_mode "rgb_array" renders the screenshot, "ansi" the text.
- Actions: parsed by `screen_actions.parse_response` on the screenshot's pixel grid (0 <= x < width,
  0 <= y < height) and written back by `screen_actions.format_action`; `response_format` says so.
  info["intent"] is the JSON reply's intent of the step ("" after a reset or an invalid action; a world's
  `_apply` sets `self.intent = action.intent`).
- info["state_key"] hashes the raw observation together with the screenshot's bytes (blake2b).
- Faults: a `fault` (the world's own exception type) raised by a step ends the episode before it goes on
  to the caller; the next reset() is the world's chance to start anew.

A world still defines its task (`_reset_task`, `raw_observation`, `_apply`, `_feedback`), reads its screen
into `_set_screen`, and closes what it runs (`close`).

Nothing here imports jax.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
from gymnasium import spaces

from explore_jax.envs import screen_actions
from explore_jax.envs.base import TextEnv, state_key, text_space
from explore_jax.envs.screen_actions import ScreenAction


class ScreenWorld(TextEnv):
  """A TextEnv seen as screenshots of `width` x `height` pixels and acted on with ScreenExplorer's grammar.

  Args:
    width, height: the screenshot's size in pixels, which is the grid actions point at.
    max_steps: the step limit of an episode.
    render_mode: None, "ansi" (the text) or "rgb_array" (the screenshot).
  """

  metadata = {"render_modes": ["ansi", "rgb_array"], "render_fps": 1}
  fault: type[Exception] = Exception  # the world's error: it ends the episode, then goes on to the caller

  def __init__(self, width: int, height: int, *, max_steps: int, render_mode: str | None = None):
    super().__init__(max_steps=max_steps, render_mode=render_mode)
    self.width, self.height = width, height
    self.response_format = screen_actions.response_format(width, height)
    self.observation_space = spaces.Dict({
        "screenshot": spaces.Box(0, 255, (height, width, 3), np.uint8),
        "text": text_space(),
    })
    self.screenshot = np.zeros((height, width, 3), np.uint8)
    self.screenshot.flags.writeable = False
    self.intent = ""
    self._screen_digest = ""

  # ---- gymnasium ----------------------------------------------------------------------------------------

  def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
    self.intent = ""
    text, info = super().reset(seed=seed, options=options)
    return self._dict(text), info

  def step(self, response: Any):
    self.intent = ""
    try:
      text, reward, terminated, truncated, info = super().step(response)
    except self.fault:
      self._ended = True  # the episode is lost; the next reset() starts the world anew
      raise
    return self._dict(text), reward, terminated, truncated, info

  def render(self) -> Any:
    if self.render_mode == "rgb_array":
      return self.screenshot
    return super().render()

  # ---- TextEnv ------------------------------------------------------------------------------------------

  def parse_action(self, text: Any) -> tuple[ScreenAction | None, str]:
    return screen_actions.parse_response(text, self.width, self.height)

  def action_text(self, action: ScreenAction) -> str:
    return screen_actions.format_action(action)

  def _extra_info(self) -> dict[str, Any]:
    return {"intent": self.intent}

  def _info(self, *, feedback: str) -> dict[str, Any]:
    info = super()._info(feedback=feedback)
    info["state_key"] = state_key(f"{self.raw_observation()}\nScreen: {self._screen_digest}")
    return info

  # ---- the screen ---------------------------------------------------------------------------------------

  def _set_screen(self, screen: np.ndarray) -> None:
    """Make `screen` (uint8 [height, width, 3]) the observed screenshot: read-only, with its digest."""
    screen = np.ascontiguousarray(screen, dtype=np.uint8)
    screen.flags.writeable = False
    self.screenshot = screen
    self._screen_digest = hashlib.blake2b(screen.tobytes(), digest_size=16).hexdigest()

  def _dict(self, text: str) -> dict[str, Any]:
    return {"screenshot": self.screenshot, "text": text}
