"""MiniWoB-v0: MiniWoB++'s web tasks in a real, headless Chromium, seen as screenshots, acted on in pixels.

The `miniwob` wheel ships the tasks (HTML + JavaScript, opened as file:// pages, no server) and their
protocol (core.js: Math.seedrandom, core.startEpisodeReal, WOB_DONE_GLOBAL, WOB_RAW_REWARD_GLOBAL); this
module drives them itself through selenium, one browser per environment, and speaks ScreenExplorer's
action grammar (`envs/screen_actions.py`). Only the 130 plain tasks are offered (`TASKS`); the flight.*
tasks need an HTTP server and a live airline site.

The browser (envs/miniwob_browser.py: `Browser`, `find_browser`, `MiniWoBBrowserError`): one headless
Chromium per environment, with its chromedriver, under a guardian (`processes.Guarded`) that kills both when
the environment closes or this process dies; a failed browser call raises MiniWoBBrowserError and ends its
episode, and the next reset() starts a new browser. A browser starts in 0.5-0.7 s and holds 180-460 MiB PSS;
a reset takes about 150 ms, a step 30-45 ms (the costs: that module's docstring).

The environment (a TextEnv: grammar, invalid actions, info keys and step limit as everywhere):

- Tasks: `task` is a task name ("click-button") or a list of them; a seeded reset plays
  `task[seed % len(task)]` (`options={"task_index": i}` plays task i), an unseeded one draws. The
  page is loaded afresh at every reset (many tasks keep state across episodes otherwise: jQuery widgets,
  scroll offsets, focus), the task's random generator is seeded with "<split>-<seed>", and the screen is
  made independent of what came before: the pointer is parked outside the task and clicks there first (a
  new element under a left-over pointer is drawn hovered, and a fresh browser drew click-dialog's focused
  close button lighter than one that had seen a click), the page's images are loaded and painted before
  every screenshot, and text carets do not blink (CSS caret-animation: manual).
- Splits: "train", "dev" and "test" seed the generator with different strings, so their instances come
  from disjoint random streams (a task with few distinct instances can still repeat one across splits);
  "test" also sets MiniWoB's data mode to "test", which the *-transfer and *-nl tasks read (train and
  dev use "train"). The same split and seed give the same utterance and the same screenshot for the
  static tasks (those MiniWoB does not mark nondeterministic: animations, clocks and dates differ).
- No clock: MiniWoB's 10-second episode timer is stopped (a model's thinking time depends on the
  inference server's batching, not on the policy), so an episode ends when the task ends it or after
  `max_steps` steps. The reward is the task's raw reward, without MiniWoB's time decay, paid at the step
  that ends the task (in [-1, 1]; some tasks give partial credit); `success` is raw reward > 0.
- Observation (a ScreenWorld, envs/screen_world.py, as Desktop-v0's): a gymnasium Dict {"screenshot": uint8
  [H, W, 3], "text": str}. The screenshot is the task area (160 x 210 CSS pixels at the top-left of the
  page) resized to `screenshot_size` = (H, W) if given, a read-only array (an invalid action returns the
  same one). "text" is what a TextEnv would return: the raw observation "Task: <utterance>", after an
  invalid action preceded by "Invalid action: <what was wrong> <the expected form>". `raw_observation()`
  is that text; info["state_key"] hashes it together with the screenshot's bytes (the utterance alone is
  constant through an episode). render_mode "rgb_array" renders the screenshot, "ansi" the text.
- Actions: the model's response, parsed by `screen_actions.parse_response` on the screenshot's pixel grid
  (0 <= x < W, 0 <= y < H, mapped to CSS pixels by the resize factor). Click, RightClick, DoubleClick and
  Move are WebDriver pointer actions; ScrollUp/ScrollDown turn the wheel by `scroll_pixels` at the point;
  Text clicks at the point, then types (\\n as Enter, \\t as Tab); Key presses the modifiers, the key, and
  releases them in reverse. An unparsable response is an invalid action (TextEnv: no browser call, format
  reward 0, the same screenshot). info["intent"] is the JSON reply's intent ("" otherwise).
- Oracle: `oracle_action()` reads the target element's rectangle from the page and returns the grammar's
  action at its centre, for the tasks in `ORACLE_TASKS` (click-test, click-test-2, click-button,
  click-link, click-dialog, focus-text, click-button-sequence: two clicks, enter-text: Text then Click);
  other tasks raise.
- Images in the runtime: the plain prompt hook (methods/base.py) puts observation["text"] in the messages
  and the screenshot in `Prompt.images`; actors lay it out as the policy's image tokens, records keep it
  (rollout.image_record_fields), and the SFT warm start takes the oracle's steps with their screenshots
  (train/sft_data.py).

Nothing here imports jax; `explore_jax.envs` does not import this module (nor selenium) until a MiniWoB
environment is made.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Sequence

import numpy as np
from PIL import Image
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.keys import Keys

from explore_jax.envs import screen_actions
from explore_jax.envs.base import Outcome, excerpt, task_index, world_text
from explore_jax.envs.miniwob_browser import (  # noqa: F401  (the browser's names, importable from here too)
    DEFAULT_TIMEOUT_S, HTML_DIR, TASK_HEIGHT, TASK_WIDTH, WINDOW_SIZE, Browser, MiniWoBBrowserError, find_browser)
from explore_jax.envs.screen_actions import ScreenAction
from explore_jax.envs.screen_world import ScreenWorld

TASKS = tuple(sorted(p.stem for p in HTML_DIR.glob("*.html")))
SPLITS = ("train", "dev", "test")
_DATA_MODES = {"train": "train", "dev": "train", "test": "test"}
_EPISODE_MAX_TIME_MS = 2**31 - 1  # setTimeout's largest delay (~25 days): MiniWoB's timer never fires
_READY_POLLS, _READY_POLL_S = 20, 0.05

_MODIFIER_KEYS = {"Ctrl": Keys.CONTROL, "Alt": Keys.ALT, "Shift": Keys.SHIFT, "Meta": Keys.META}
_NAMED_KEYS = {
    "Enter": Keys.ENTER, "Tab": Keys.TAB, "Space": Keys.SPACE, "Backspace": Keys.BACKSPACE,
    "Delete": Keys.DELETE, "Escape": Keys.ESCAPE, "ArrowUp": Keys.ARROW_UP, "ArrowDown": Keys.ARROW_DOWN,
    "ArrowLeft": Keys.ARROW_LEFT, "ArrowRight": Keys.ARROW_RIGHT, "Home": Keys.HOME, "End": Keys.END,
    "PageUp": Keys.PAGE_UP, "PageDown": Keys.PAGE_DOWN, "Insert": Keys.INSERT, **_MODIFIER_KEYS,
    **{f"F{i}": getattr(Keys, f"F{i}") for i in range(1, 13)},
}
_TYPED_KEYS = {"\n": Keys.ENTER, "\t": Keys.TAB}


# ---- oracles -------------------------------------------------------------------------------------------

# Per oracle task, the body of a JavaScript function of (utterance, quoted) -- `quoted` is the first
# "..." in the utterance -- that returns [kind, element] for the next action ("Click" or "Text"; for
# "Text" a third entry, the text to type), or null when it sees no target.
ORACLE_SCRIPTS = {
    "click-test": "return ['Click', document.getElementById('subbtn')];",
    "click-test-2": "return ['Click', document.getElementById('subbtn')];",  # ONE is #subbtn, TWO #subbtn2
    "click-button": "return ['Click', byText('#area button', quoted)];",
    "click-link": "return ['Click', byText('#area .alink', quoted)];",
    "click-dialog": "return ['Click', document.querySelector('.ui-dialog-titlebar-close')];",
    "focus-text": "return ['Click', document.getElementById('tt')];",
    "click-button-sequence": ("return ['Click', document.getElementById("
                              "buttonsPushed.length === 0 ? 'subbtn' : 'subbtn2')];"),
    "enter-text": ("var field = document.getElementById('tt');"
                   "return field.value === quoted ? ['Click', document.getElementById('subbtn')]"
                   " : ['Text', field, quoted];"),
}
ORACLE_TASKS = tuple(ORACLE_SCRIPTS)
_ORACLE_PRELUDE = """
var utterance = arguments[0];
var found = utterance.match(/"([^"]*)"/);
var quoted = found ? found[1] : null;
var byText = function (selector, text) {
  return Array.from(document.querySelectorAll(selector)).find(function (e) { return e.textContent.trim() === text; });
};
var target = (function () { %s })();
if (!target || !target[1]) return null;
var r = target[1].getBoundingClientRect();
return [target[0], r.left, r.top, r.right, r.bottom, target.length > 2 ? target[2] : null];
"""

_RESET_SCRIPT = """
var seed = arguments[0], mode = arguments[1], maxTime = arguments[2];
var style = document.createElement('style');
style.textContent = '* { caret-animation: manual !important; }';
document.head.appendChild(style);
Math.seedrandom(seed);
core.setDataMode(mode);
core.EPISODE_MAX_TIME = maxTime;
core.startEpisodeReal();
"""
# Before every screenshot: the images the page shows (CSS backgrounds such as jQuery UI's icon sprite, <img>)
# are loaded and decoded (the screenshot's own frame then paints them). Elements made by a reset or an action
# start fetching their images then, and a screenshot taken at once sometimes lacked them (click-dialog's close
# icon, 1 reset in 105). About 4 ms a step; a timer ends the wait should an image never settle.
_SETTLE_SCRIPT = """
var done = arguments[arguments.length - 1], finished = false;
var finish = function () { if (!finished) { finished = true; done(true); } };
var urls = new Set();
document.querySelectorAll('*').forEach(function (e) {
  var background = getComputedStyle(e).backgroundImage, re = /url\\("?([^")]+)"?\\)/g, m;
  while (background && (m = re.exec(background))) urls.add(m[1]);
  if (e.tagName === 'IMG' && e.currentSrc) urls.add(e.currentSrc);
});
var decoded = Array.from(urls).map(function (url) {
  var image = new Image();
  image.src = url;
  return image.decode().catch(function () {});
});
setTimeout(finish, 1000);
Promise.all(decoded).then(finish);
"""
_STATE_SCRIPT = """
var u = core.getUtterance();
return [WOB_TASK_READY, WOB_DONE_GLOBAL, WOB_RAW_REWARD_GLOBAL, typeof u === 'string' ? u : u.utterance];
"""


@dataclasses.dataclass
class _PageState:
  ready: bool
  done: bool
  raw_reward: float
  utterance: str


class MiniWoBEnv(ScreenWorld):
  """MiniWoB++ tasks in headless Chromium: screenshot + utterance in, ScreenExplorer actions out.

  Args:
    task: a task name of `TASKS` (e.g. "click-button") or a sequence of them.
    split: "train", "dev" or "test" (disjoint seed streams; "test" also MiniWoB's test data mode).
    max_steps: the step limit of an episode (ScreenExplorer uses 10).
    screenshot_size: (height, width) of the observed screenshot; None keeps the task area's own
      (210, 160). Action coordinates are pixels of this screenshot.
    scroll_pixels: how far ScrollUp / ScrollDown turn the wheel.
    wait_ms: a pause after each action before the screen is read (for tasks that animate).
    timeout_s: the longest one browser call may take.
    render_mode: None, "ansi" (the text) or "rgb_array" (the screenshot).
  """

  fault = MiniWoBBrowserError  # a failed browser call: the next reset() starts a new browser

  def __init__(self, task: str | Sequence[str] = "click-button", split: str = "train", max_steps: int = 10,
               screenshot_size: Sequence[int] | None = None, scroll_pixels: int = 50, wait_ms: float = 0.0,
               timeout_s: float = DEFAULT_TIMEOUT_S, render_mode: str | None = None):
    tasks = (task,) if isinstance(task, str) else tuple(task)
    unknown = [t for t in tasks if t not in TASKS]
    if not tasks or unknown:
      raise ValueError(f"unknown MiniWoB tasks {unknown or tasks!r}; the tasks are {', '.join(TASKS)}")
    if split not in SPLITS:
      raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    height, width = (TASK_HEIGHT, TASK_WIDTH) if screenshot_size is None else map(int, screenshot_size)
    if height < 1 or width < 1:
      raise ValueError(f"screenshot_size must be two positive sizes (height, width), got {screenshot_size!r}")
    super().__init__(width, height, max_steps=max_steps, render_mode=render_mode)
    self.tasks, self.split = tasks, split
    self.scroll_pixels, self.wait_ms = int(scroll_pixels), float(wait_ms)
    self.task_name = tasks[0]
    self.page_seed = ""
    self.utterance = ""
    self.raw_reward = 0.0
    self._seed: int | None = None
    self.browser = Browser(timeout_s)
    self.browser.start()

  @property
  def num_tasks(self) -> int:
    return len(self.tasks)

  # ---- gymnasium ----------------------------------------------------------------------------------------

  def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
    self._seed = seed
    return super().reset(seed=seed, options=options)

  def close(self) -> None:
    self.browser.close()

  # ---- TextEnv ------------------------------------------------------------------------------------------

  def _reset_task(self, options: dict[str, Any]) -> str:
    self.task_name = self.tasks[task_index(options, self._seed, self.num_tasks, self.np_random)]
    seed = self._seed if self._seed is not None else int(self.np_random.integers(2**31))
    self.page_seed = f"{self.split}-{seed}"
    self.raw_reward = 0.0
    for attempt in range(2):  # a browser found dead or failing is replaced once
      try:
        self.browser.ensure_running()
        self._begin_episode()
        break
      except MiniWoBBrowserError:
        if attempt:
          raise
        self.browser.close()
    return f"{self.task_name}:{self.page_seed}"

  def raw_observation(self) -> str:
    return f"Task: {self.utterance}"

  def _apply(self, action: ScreenAction) -> Outcome:
    self.intent = action.intent
    self._perform(action)
    if self.wait_ms:
      time.sleep(self.wait_ms / 1e3)
    state = self._page_state()
    self._read_screen(state)
    if not state.done:
      return Outcome()
    self.raw_reward = state.raw_reward
    return Outcome(reward=state.raw_reward, success=state.raw_reward > 0, terminated=True)

  def _feedback(self, truncated: bool) -> str:
    if self.success:
      return f"Success: the task was completed in {self.steps} steps (reward {self.raw_reward:.2f})."
    if truncated:
      return f"Failure: out of steps ({self.max_steps}) with the task unfinished."
    return f"Failure: the task ended with reward {self.raw_reward:.2f} after {self.steps} steps."

  def _extra_info(self) -> dict[str, Any]:
    return {"task_name": self.task_name, "seed": self.page_seed, "raw_reward": float(self.raw_reward),
            **super()._extra_info()}

  # ---- the oracle ---------------------------------------------------------------------------------------

  def oracle_action(self) -> str:
    """The next action of the task's own solution, read from its page (tasks of ORACLE_TASKS only)."""
    script = ORACLE_SCRIPTS.get(self.task_name)
    if script is None:
      raise RuntimeError(f"MiniWoB has an oracle for {', '.join(ORACLE_TASKS)}; not for {self.task_name}")
    target = self.browser.script("the oracle", _ORACLE_PRELUDE % script, self.utterance)
    if target is None:
      raise RuntimeError(f"the oracle of {self.task_name} found no target for {self.utterance!r}")
    kind, left, top, right, bottom, typed = target
    # The centre of the element's part inside the task area, in screenshot pixels.
    cx = (max(left, 0.0) + min(right, TASK_WIDTH)) / 2
    cy = (max(top, 0.0) + min(bottom, TASK_HEIGHT)) / 2
    x = min(self.width - 1, max(0, int(cx * self.width / TASK_WIDTH)))
    y = min(self.height - 1, max(0, int(cy * self.height / TASK_HEIGHT)))
    if kind == "Text":
      return screen_actions.format_action(ScreenAction("Text", x, y, text=typed))
    return screen_actions.format_action(ScreenAction(kind, x, y))

  # ---- the browser side ---------------------------------------------------------------------------------

  def _begin_episode(self) -> None:
    browser = self.browser
    # The pointer clicks outside the task first: a pointer left over a new element would draw it hovered, and
    # a fresh browser drew click-dialog's focused close button lighter than one that had seen a click.
    park_x, park_y = browser.viewport[0] - 1, browser.viewport[1] - 1
    browser.actions("parking the pointer",
                    lambda chain: chain.w3c_actions.pointer_action.move_to_location(park_x, park_y).click())
    browser.open(self.task_name)
    browser.script("starting the episode", _RESET_SCRIPT, self.page_seed, _DATA_MODES[self.split],
                   _EPISODE_MAX_TIME_MS)
    for _ in range(_READY_POLLS):
      state = self._page_state()
      if state.ready:
        break
      time.sleep(_READY_POLL_S)
    else:
      raise MiniWoBBrowserError(f"{self.task_name} did not become ready in {_READY_POLLS * _READY_POLL_S:g} s")
    self._read_screen(state)

  def _page_state(self) -> _PageState:
    ready, done, raw_reward, utterance = self.browser.script("reading the task's state", _STATE_SCRIPT)
    return _PageState(bool(ready), bool(done), float(raw_reward or 0.0), str(utterance or ""))

  def _read_screen(self, state: _PageState) -> None:
    self.utterance = world_text(state.utterance, limit=1000)
    self.browser.call("waiting for the page's images", self.browser.driver.execute_async_script, _SETTLE_SCRIPT)
    screen = self.browser.screenshot()
    if (self.height, self.width) != (TASK_HEIGHT, TASK_WIDTH):
      with Image.fromarray(screen) as image:
        screen = np.asarray(image.resize((self.width, self.height), Image.Resampling.BILINEAR))
    self._set_screen(screen)

  def _perform(self, action: ScreenAction) -> None:
    """Execute a parsed action in the browser (CSS pixels = screenshot pixels x the resize factor)."""
    kind = action.kind
    if kind == "Key":
      keys = [_MODIFIER_KEYS[m] for m in action.modifiers]
      key = _NAMED_KEYS.get(action.key, action.key)

      def press(chain: ActionChains) -> None:
        board = chain.w3c_actions.key_action
        for k in (*keys, key):
          board.key_down(k)
        for k in reversed((*keys, key)):
          board.key_up(k)

      self.browser.actions(screen_actions.format_action(action), press)
      return
    # WebDriver points are whole CSS pixels; a resized screenshot's pixel maps to the CSS pixel it starts in.
    x, y = action.x * TASK_WIDTH // self.width, action.y * TASK_HEIGHT // self.height
    what = screen_actions.format_action(dataclasses.replace(action, text=excerpt(action.text or "", 20)))

    def point(chain: ActionChains) -> None:
      if kind in ("ScrollUp", "ScrollDown"):
        delta = -self.scroll_pixels if kind == "ScrollUp" else self.scroll_pixels
        chain.w3c_actions.wheel_action.scroll(x=x, y=y, delta_x=0, delta_y=delta, duration=0)
        return
      pointer = chain.w3c_actions.pointer_action
      pointer.move_to_location(x, y)
      if kind in ("Click", "Text"):
        pointer.click()
      elif kind == "RightClick":
        pointer.context_click()
      elif kind == "DoubleClick":
        pointer.double_click()

    self.browser.actions(what, point)
    if kind == "Text":
      def type_text(chain: ActionChains) -> None:
        board = chain.w3c_actions.key_action
        for c in action.text:
          k = _TYPED_KEYS.get(c, c)
          board.key_down(k)
          board.key_up(k)

      self.browser.actions(what, type_text)
