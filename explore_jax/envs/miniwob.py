"""MiniWoB-v0: MiniWoB++'s web tasks in a real, headless Chromium, seen as screenshots, acted on in pixels.

The `miniwob` wheel ships the tasks (HTML + JavaScript, opened as file:// pages, no server) and their
protocol (core.js: Math.seedrandom, core.startEpisodeReal, WOB_DONE_GLOBAL, WOB_RAW_REWARD_GLOBAL); this
module drives them itself through selenium, one browser per environment, and speaks ScreenExplorer's
action grammar (`envs/screen_actions.py`). Only the 130 plain tasks are offered (`TASKS`); the flight.*
tasks need an HTTP server and a live airline site.

The browser:

- Which: MINIWOB_CHROME_BINARY and MINIWOB_CHROMEDRIVER when both are set, else `chromium` (or
  chromium-browser, google-chrome) and `chromedriver` found on PATH (Debian's packages: `make browser`);
  what was found is written back to those variables, and SE_OFFLINE=true is set, so that miniwob's own
  code in this process agrees and selenium never runs its network-fetching driver manager.
- How: one `sh` guardian per browser (`processes.Guarded`), in a session of its own, starts chromedriver and
  Chromium (headless, no sandbox, 800x600 window at scale 1, smooth scrolling, partial raster and the frame-rate
  cap off, all host names unresolvable: the pages reach nothing outside file://), prints their pids and waits on
  its stdin.
  When this process closes the pipe -- `close()`, garbage collection of the environment, or this process
  dying in any way, SIGKILL included -- the guardian kills its whole process group, so no browser outlives
  its environment (a parent-death signal would not do: it fires when the *thread* that started the child
  ends, and EnvServer makes environments in request threads). The browser's files (its profile, its log and
  Chromium's own temporary folders, as Chromium's TMPDIR is that folder) live in one temporary folder, which
  `close()` removes; should this process die first, a remover in a session of its own, waiting on the same
  pipe, removes it once the group is gone. (Chromium's socket, <that folder>/org.chromium.Chromium.<6 random
  characters>/SingletonSocket, must stay under 108 characters: keep TMPDIR short.) selenium talks to that
  chromedriver, which attaches to the running Chromium, with a per-command timeout (`timeout_s`) and no proxy.
- Faults: every browser call goes through `Browser.call`; a failure raises `MiniWoBBrowserError`, which
  says whether Chromium or chromedriver died (with Chromium's last stderr lines). A step that fails ends its episode
  (the error propagates: an actor drops that episode and discards the environment); the next reset()
  starts a new browser when the old one died or failed and works again.
- Cost (2 cores under a load average of 6-13, benchmarks/miniwob_browser.py): a browser starts in 0.5-0.7 s;
  the first holds about 460 MiB PSS (shared libraries included), each further one 180-190 MiB; a reset (a
  page load) takes about 150 ms, a step 30-45 ms (a third to a half of it the screenshot), an invalid
  action no browser time. Plan num_actors x envs_per_actor browsers to fit the machine's memory; on these
  2 cores 4 browsers in 4 processes gave 1.6-2.2x the steps/s of one.

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
- Observation: a gymnasium Dict {"screenshot": uint8 [H, W, 3], "text": str}. The screenshot is the task
  area (160 x 210 CSS pixels at the top-left of the page) resized to `screenshot_size` = (H, W) if given,
  a read-only array (an invalid action returns the same one). "text" is what a TextEnv would return: the raw
  observation "Task: <utterance>", after an invalid action preceded by "Invalid action: <what was
  wrong> <the expected form>". `raw_observation()` is that text; info["state_key"] hashes it together with
  the screenshot's bytes (the utterance alone is constant through an episode). render_mode "rgb_array"
  renders the screenshot, "ansi" the text.
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
import hashlib
import io
import os
import pathlib
import shutil
import socket
import tempfile
import time
import weakref
from typing import Any, Sequence

import miniwob
import numpy as np
from gymnasium import spaces
from PIL import Image
from selenium import webdriver
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.chromium.remote_connection import ChromiumRemoteConnection
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.client_config import ClientConfig
from urllib3.exceptions import HTTPError as Urllib3Error

from explore_jax.envs import processes, screen_actions
from explore_jax.envs.base import Outcome, TextEnv, excerpt, state_key, task_index, text_space, world_text
from explore_jax.envs.screen_actions import ScreenAction

HTML_DIR = pathlib.Path(miniwob.__file__).parent / "html" / "miniwob"
TASKS = tuple(sorted(p.stem for p in HTML_DIR.glob("*.html")))
SPLITS = ("train", "dev", "test")
_DATA_MODES = {"train": "train", "dev": "train", "test": "test"}
TASK_WIDTH, TASK_HEIGHT = 160, 210  # the task area, CSS pixels from the page's top-left corner
WINDOW_SIZE = (800, 600)
DEFAULT_TIMEOUT_S = 30.0
_START_TIMEOUT_S = 30.0
_STDERR_LINES = 20
_EPISODE_MAX_TIME_MS = 2**31 - 1  # setTimeout's largest delay (~25 days): MiniWoB's timer never fires
_READY_POLLS, _READY_POLL_S = 20, 0.05

_CHROME_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
# --disable-frame-rate-limit: a screenshot waits for the compositor's next frame, and without the 60 Hz cap it
# comes sooner (a step measured 63 -> 40 ms; an idle browser's CPU 2 -> 3% of a core). Adding
# --run-all-compositor-stages-before-draw to it made the browser spin (over a core while idle).
# --disable-partial-raster: with it on, a reset's screen differed now and then by one grey level in a few
# anti-aliased pixels of rounded corners (click-dialog: 3 of 105 comparisons; 0 of 385 without it).
_CHROME_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-frame-rate-limit",
    "--disable-partial-raster",
    f"--window-size={WINDOW_SIZE[0]},{WINDOW_SIZE[1]}", "--force-device-scale-factor=1", "--hide-scrollbars",
    "--disable-smooth-scrolling", "--mute-audio", "--no-first-run", "--no-default-browser-check",
    "--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-default-apps",
    "--disable-extensions", "--disable-breakpad", "--disable-features=Translate,MediaRouter,OptimizationHints",
    "--host-resolver-rules=MAP * ~NOTFOUND", "--remote-debugging-port=0",
)
# The guardian: starts chromedriver and Chromium in the background, prints their pids, then waits for its
# stdin to close and kills its process group (itself, chromedriver, Chromium and Chromium's children).
_GUARDIAN = r"""
driver="$1"; port="$2"; log="$3"; shift 3
"$driver" --port="$port" --log-level=OFF </dev/null >/dev/null 2>&1 &
echo "$!"
"$@" </dev/null >/dev/null 2>>"$log" &
echo "$!"
cat >/dev/null
kill -KILL 0
"""
_FAILURES = (WebDriverException, Urllib3Error, OSError, TimeoutError)

_MODIFIER_KEYS = {"Ctrl": Keys.CONTROL, "Alt": Keys.ALT, "Shift": Keys.SHIFT, "Meta": Keys.META}
_NAMED_KEYS = {
    "Enter": Keys.ENTER, "Tab": Keys.TAB, "Space": Keys.SPACE, "Backspace": Keys.BACKSPACE,
    "Delete": Keys.DELETE, "Escape": Keys.ESCAPE, "ArrowUp": Keys.ARROW_UP, "ArrowDown": Keys.ARROW_DOWN,
    "ArrowLeft": Keys.ARROW_LEFT, "ArrowRight": Keys.ARROW_RIGHT, "Home": Keys.HOME, "End": Keys.END,
    "PageUp": Keys.PAGE_UP, "PageDown": Keys.PAGE_DOWN, "Insert": Keys.INSERT, **_MODIFIER_KEYS,
    **{f"F{i}": getattr(Keys, f"F{i}") for i in range(1, 13)},
}
_TYPED_KEYS = {"\n": Keys.ENTER, "\t": Keys.TAB}


class MiniWoBBrowserError(RuntimeError):
  """A browser call failed: Chromium died, hung past the timeout, or the page broke. reset() starts anew."""


def find_browser() -> tuple[str, str]:
  """(Chromium, chromedriver) paths: the MINIWOB_* variables when both are set, else found on PATH; sets
  those variables to what is used and SE_OFFLINE=true (see the module docstring)."""
  chrome, driver = os.environ.get("MINIWOB_CHROME_BINARY"), os.environ.get("MINIWOB_CHROMEDRIVER")
  if bool(chrome) != bool(driver):
    raise RuntimeError("MINIWOB_CHROME_BINARY and MINIWOB_CHROMEDRIVER must be set together (or neither)")
  if not chrome:
    chrome = next((path for path in map(shutil.which, _CHROME_NAMES) if path), None)
    driver = shutil.which("chromedriver")
    if not chrome or not driver:
      missing = " and ".join(n for n, p in (("chromium", chrome), ("chromedriver", driver)) if not p)
      raise RuntimeError(f"MiniWoB needs a Chromium and its chromedriver; {missing} not found on PATH. "
                         f"Run `make browser` (apt-get install chromium chromium-driver) or set "
                         f"MINIWOB_CHROME_BINARY and MINIWOB_CHROMEDRIVER.")
  for path in (chrome, driver):
    if not os.access(path, os.X_OK):
      raise RuntimeError(f"{path} is not an executable file")
  os.environ["MINIWOB_CHROME_BINARY"], os.environ["MINIWOB_CHROMEDRIVER"] = chrome, driver
  os.environ["SE_OFFLINE"] = "true"
  return chrome, driver


class Browser:
  """One headless Chromium, its chromedriver and a selenium session on them (the module docstring).

  Args:
    timeout_s: the longest a browser call may take before it fails.
  """

  def __init__(self, timeout_s: float = DEFAULT_TIMEOUT_S):
    self.chrome, self.chromedriver = find_browser()
    self.timeout_s = float(timeout_s)
    self.starts = 0          # browsers started so far, restarts included
    self.driver: Any = None  # the selenium WebDriver
    self.pid: int | None = None         # Chromium's main process
    self.driver_pid: int | None = None  # chromedriver's
    self.viewport = WINDOW_SIZE
    self.page: str | None = None        # the task whose page is loaded
    self.failed = False                 # a call failed: the next ensure_running() starts a new browser
    self._group: processes.Guarded | None = None  # the guardian of chromedriver and Chromium, and its remover
    self._workdir = ""
    self._finalizer: weakref.finalize | None = None

  @property
  def alive(self) -> bool:
    return (self._group is not None and self._group.alive and processes.pid_alive(self.pid)
            and processes.pid_alive(self.driver_pid))

  def start(self) -> None:
    """Start a fresh browser (closing the current one, if any)."""
    self.close()
    self._workdir = tempfile.mkdtemp(prefix="explore_jax-miniwob-")
    profile, log = os.path.join(self._workdir, "profile"), os.path.join(self._workdir, "chromium.log")
    port = processes.free_port()
    # Chromium's TMPDIR is the folder: its own temporary folders, which SIGKILL leaves, go with it.
    self._group = processes.Guarded(
        _GUARDIAN, [self.chromedriver, str(port), log, self.chrome, *_CHROME_FLAGS, f"--user-data-dir={profile}",
                    "about:blank"], self._workdir, env={**os.environ, "TMPDIR": self._workdir},
        name="explore_jax-browser")
    self._finalizer = weakref.finalize(self, processes.stop, self._group)
    self.starts += 1
    self.failed = False
    try:
      self.driver_pid = self._group.read_pid("chromedriver")
      self.pid = self._group.read_pid("Chromium")
      devtools = self._wait_for_devtools(os.path.join(profile, "DevToolsActivePort"))
      self._wait_for_port(port)
      url = f"http://127.0.0.1:{port}"
      options = webdriver.ChromeOptions()
      options.debugger_address = f"127.0.0.1:{devtools}"
      connection = ChromiumRemoteConnection(
          url, vendor_prefix="goog", browser_name="chrome", ignore_proxy=True,
          client_config=ClientConfig(url, keep_alive=True, timeout=self.timeout_s))
      self.driver = webdriver.Remote(command_executor=connection, options=options)
      self._finalizer.detach()
      # The HTTP pool closes first; chromedriver goes with the group.
      self._finalizer = weakref.finalize(self, processes.stop, self._group, self.driver.command_executor)
      self.driver.set_page_load_timeout(self.timeout_s)
      self.driver.set_script_timeout(self.timeout_s)
      self.viewport = tuple(self.driver.execute_script("return [window.innerWidth, window.innerHeight];"))
    except (*_FAILURES, ValueError) as e:
      error = self._error("start", e)
      self.close()
      raise error from e

  def ensure_running(self) -> bool:
    """Start a browser unless a sound one runs; True when a new one was started."""
    if self.driver is not None and not self.failed and self.alive:
      return False
    self.start()
    return True

  def call(self, what: str, function: Any, *args: Any) -> Any:
    """`function(*args)` on this browser; any failure raises MiniWoBBrowserError (`what` names the call)."""
    if self.driver is None:
      raise MiniWoBBrowserError("no browser is running; reset() starts one")
    try:
      return function(*args)
    except _FAILURES as e:
      self.failed = True
      raise self._error(what, e) from e

  def script(self, what: str, source: str, *args: Any) -> Any:
    return self.call(what, self.driver.execute_script, source, *args)

  def open(self, task: str) -> None:
    """Load `task`'s page afresh and check that MiniWoB's core is there."""
    self.page = None
    self.call(f"loading {task}", self.driver.get, (HTML_DIR / f"{task}.html").as_uri())
    if not self.script(f"loading {task}", "return typeof core === 'object' && typeof genProblem === 'function';"):
      self.failed = True
      raise MiniWoBBrowserError(f"the page of {task} has no MiniWoB task (core.js or genProblem missing)")
    self.page = task

  def screenshot(self) -> np.ndarray:
    """The task area as uint8 [TASK_HEIGHT, TASK_WIDTH, 3] (the viewport's screenshot, cropped)."""
    png = self.call("screenshot", self.driver.get_screenshot_as_png)
    with Image.open(io.BytesIO(png)) as image:
      return np.asarray(image.convert("RGB").crop((0, 0, TASK_WIDTH, TASK_HEIGHT)))

  def actions(self, what: str, build: Any) -> None:
    """Perform WebDriver actions: `build(ActionChains)` queues them, then they run in one call."""
    chain = ActionChains(self.driver, duration=0)
    build(chain)
    self.call(what, chain.w3c_actions.perform)

  def close(self) -> None:
    """Stop the browser (idempotent)."""
    if self._finalizer is not None:
      self._finalizer()  # runs processes.stop at most once
    self._finalizer = None
    self._group = None
    self.driver, self.pid, self.driver_pid, self.page = None, None, None, None

  def _wait_for_devtools(self, path: str) -> int:
    deadline = time.monotonic() + _START_TIMEOUT_S
    while time.monotonic() < deadline:
      try:
        with open(path) as f:
          first = f.readline().strip()
        if first:
          return int(first)
      except FileNotFoundError:
        pass
      if not processes.pid_alive(self.pid):
        raise OSError("Chromium exited while starting")
      time.sleep(0.01)
    raise TimeoutError(f"Chromium did not open its DevTools port in {_START_TIMEOUT_S:g} s")

  def _wait_for_port(self, port: int) -> None:
    deadline = time.monotonic() + _START_TIMEOUT_S
    while time.monotonic() < deadline:
      try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0):
          return
      except OSError:
        if not processes.pid_alive(self.driver_pid):
          raise OSError("chromedriver exited while starting") from None
        time.sleep(0.01)
    raise TimeoutError(f"chromedriver did not listen on port {port} in {_START_TIMEOUT_S:g} s")

  def _error(self, what: str, error: BaseException) -> MiniWoBBrowserError:
    detail = str(getattr(error, "msg", None) or error).strip().splitlines()
    detail = detail[0] if detail else type(error).__name__
    if self.pid is not None and not processes.pid_alive(self.pid):
      return MiniWoBBrowserError(f"Chromium died during {what} ({type(error).__name__}: {detail}); the next "
                                 f"reset() starts a new browser{self._stderr_tail()}")
    if self.driver_pid is not None and not processes.pid_alive(self.driver_pid):
      return MiniWoBBrowserError(f"chromedriver died during {what} ({type(error).__name__}: {detail}); the "
                                 f"next reset() starts a new browser")
    return MiniWoBBrowserError(f"{what} failed in the browser ({type(error).__name__}: {detail}); the next "
                               f"reset() starts a new browser")

  def _stderr_tail(self) -> str:
    try:
      with open(os.path.join(self._workdir, "chromium.log"), errors="replace") as f:
        lines = [line.rstrip() for line in f.readlines()[-_STDERR_LINES:] if line.strip()]
    except OSError:
      return ""
    return ("\nChromium stderr:\n" + "\n".join(lines)) if lines else ""


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


class MiniWoBEnv(TextEnv):
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

  metadata = {"render_modes": ["ansi", "rgb_array"], "render_fps": 1}

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
    super().__init__(max_steps=max_steps, render_mode=render_mode)
    self.tasks, self.split = tasks, split
    self.height, self.width = height, width
    self.scroll_pixels, self.wait_ms = int(scroll_pixels), float(wait_ms)
    self.response_format = screen_actions.response_format(width, height)
    self.observation_space = spaces.Dict({
        "screenshot": spaces.Box(0, 255, (height, width, 3), np.uint8),
        "text": text_space(),
    })
    self.task_name = tasks[0]
    self.page_seed = ""
    self.utterance = ""
    self.screenshot = np.zeros((height, width, 3), np.uint8)
    self.raw_reward = 0.0
    self.intent = ""
    self._screen_digest = ""
    self._seed: int | None = None
    self.browser = Browser(timeout_s)
    self.browser.start()

  @property
  def num_tasks(self) -> int:
    return len(self.tasks)

  # ---- gymnasium ----------------------------------------------------------------------------------------

  def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
    self._seed = seed
    text, info = super().reset(seed=seed, options=options)
    return self._dict(text), info

  def step(self, response: Any):
    self.intent = ""
    try:
      text, reward, terminated, truncated, info = super().step(response)
    except MiniWoBBrowserError:
      self._ended = True  # the episode is lost; reset() starts a new browser
      raise
    return self._dict(text), reward, terminated, truncated, info

  def render(self) -> Any:
    if self.render_mode == "rgb_array":
      return self.screenshot
    return super().render()

  def close(self) -> None:
    self.browser.close()

  # ---- TextEnv ------------------------------------------------------------------------------------------

  def _reset_task(self, options: dict[str, Any]) -> str:
    self.task_name = self.tasks[task_index(options, self._seed, self.num_tasks, self.np_random)]
    seed = self._seed if self._seed is not None else int(self.np_random.integers(2**31))
    self.page_seed = f"{self.split}-{seed}"
    self.raw_reward, self.intent = 0.0, ""
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

  def parse_action(self, text: Any) -> tuple[ScreenAction | None, str]:
    return screen_actions.parse_response(text, self.width, self.height)

  def action_text(self, action: ScreenAction) -> str:
    return screen_actions.format_action(action)

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
            "intent": self.intent}

  def _info(self, *, feedback: str) -> dict[str, Any]:
    info = super()._info(feedback=feedback)
    info["state_key"] = state_key(f"{self.raw_observation()}\nScreen: {self._screen_digest}")
    return info

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
    screen = np.ascontiguousarray(screen, dtype=np.uint8)
    screen.flags.writeable = False
    self.screenshot = screen
    self._screen_digest = hashlib.blake2b(screen.tobytes(), digest_size=16).hexdigest()

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

  def _dict(self, text: str) -> dict[str, Any]:
    return {"screenshot": self.screenshot, "text": text}
