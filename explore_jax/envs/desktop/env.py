"""DesktopEnv: Desktop-v0, an open-ended X desktop to explore with ScreenExplorer's actions (no task, no reward).

See the package docstring (envs/desktop/__init__.py).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Sequence

from explore_jax.envs import screen_actions
from explore_jax.envs.base import Outcome, excerpt
from explore_jax.envs.desktop import home
from explore_jax.envs.desktop.actions import xdotool_runs
from explore_jax.envs.desktop.session import DEFAULT_TIMEOUT_S, DesktopError, Session, check_programs
from explore_jax.envs.screen_actions import ScreenAction
from explore_jax.envs.screen_world import ScreenWorld

DEFAULT_SCREEN_SIZE = (640, 480)
MIN_SCREEN_SIZE = (320, 240)
TASK_ID = "desktop"


class DesktopEnv(ScreenWorld):
  """A real X desktop (Xvfb, openbox, pcmanfm's desktop, xterm, mousepad, galculator): screenshots in, mouse and
  keyboard actions out; reward 0, episodes end after `max_steps` steps.

  Args:
    screen_size: (width, height) of the screen in pixels, which is the screenshot's size (the paper: 1920x1080).
    settle_s: the pause after each action before the screen is read (the paper: 1 s).
    max_steps: the step limit of an episode.
    scroll_clicks: wheel clicks of one ScrollUp / ScrollDown.
    type_delay_ms: the pause between two typed characters.
    timeout_s: the longest the desktop's start or one X call may take.
    render_mode: None, "ansi" (the text) or "rgb_array" (the screenshot).
  """

  fault = DesktopError  # a dead server, window manager or desktop: the next reset() starts a new desktop

  def __init__(self, screen_size: Sequence[int] = DEFAULT_SCREEN_SIZE, settle_s: float = 0.3, max_steps: int = 20,
               scroll_clicks: int = 3, type_delay_ms: int = 4, timeout_s: float = DEFAULT_TIMEOUT_S,
               render_mode: str | None = None):
    width, height = (int(v) for v in screen_size)
    if width < MIN_SCREEN_SIZE[0] or height < MIN_SCREEN_SIZE[1]:
      raise ValueError(f"screen_size must be (width, height) of at least {MIN_SCREEN_SIZE}, got {screen_size!r}")
    if settle_s < 0 or scroll_clicks < 1 or type_delay_ms < 0:
      raise ValueError(f"settle_s and type_delay_ms must be >= 0 and scroll_clicks >= 1, got {settle_s!r}, "
                       f"{type_delay_ms!r}, {scroll_clicks!r}")
    check_programs()
    super().__init__(width, height, max_steps=max_steps, render_mode=render_mode)
    self.settle_s, self.scroll_clicks, self.type_delay_ms = float(settle_s), int(scroll_clicks), int(type_delay_ms)
    self.session = Session(width, height, timeout_s)

  @property
  def home(self) -> str:
    """The running desktop's home folder (a fresh copy of the template every episode)."""
    return self.session.home

  # ---- gymnasium ----------------------------------------------------------------------------------------

  def close(self) -> None:
    self.session.close()

  # ---- TextEnv ------------------------------------------------------------------------------------------

  def _reset_task(self, options: dict[str, Any]) -> str:
    for attempt in range(2):  # a desktop that fails to start is tried once more
      try:
        self.session.start()  # a new X server and home folder every episode: nothing carries over
        break
      except DesktopError:
        if attempt:
          raise
    self._read_screen()
    return TASK_ID

  def raw_observation(self) -> str:
    return "Desktop"

  def _apply(self, action: ScreenAction) -> Outcome:
    self.intent = action.intent
    what = screen_actions.format_action(dataclasses.replace(action, text=excerpt(action.text or "", 20)))
    for run in xdotool_runs(action, scroll_clicks=self.scroll_clicks, type_delay_ms=self.type_delay_ms):
      self.session.xdotool(what, run)
    if self.settle_s:
      time.sleep(self.settle_s)
    self.session.check(what)  # a program the step killed (or that died meanwhile) ends the episode here
    self._read_screen()
    return Outcome()

  def _feedback(self, truncated: bool) -> str:
    return f"Out of steps ({self.max_steps}): the desktop has no task to end an episode sooner."

  # ---- the oracle ---------------------------------------------------------------------------------------

  def oracle_action(self) -> str:
    """A double-click on a launcher's icon, the launchers in turn by step (a warm start's opening move; once a
    window is open it may cover the icons)."""
    launcher = home.LAUNCHERS[self.steps % len(home.LAUNCHERS)]
    x, y = home.icon_centre(home.item_cells(self.width, self.height)[launcher.file])
    return screen_actions.format_action(ScreenAction("DoubleClick", x, y))

  # ---- the screen ---------------------------------------------------------------------------------------

  def _read_screen(self) -> None:
    self._set_screen(self.session.screenshot())
