"""MiniWoB-v0's browser: one headless Chromium, its chromedriver and a selenium session on them.

envs/miniwob.py's environment drives the tasks through `Browser`; this module is its process mechanics.

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

Nothing here imports jax.
"""

from __future__ import annotations

import io
import os
import pathlib
import shutil
import socket
import tempfile
import time
import weakref
from typing import Any

import miniwob
import numpy as np
from PIL import Image
from selenium import webdriver
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.chromium.remote_connection import ChromiumRemoteConnection
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.remote.client_config import ClientConfig
from urllib3.exceptions import HTTPError as Urllib3Error

from explore_jax.envs import processes

HTML_DIR = pathlib.Path(miniwob.__file__).parent / "html" / "miniwob"
TASK_WIDTH, TASK_HEIGHT = 160, 210  # the task area, CSS pixels from the page's top-left corner
WINDOW_SIZE = (800, 600)
DEFAULT_TIMEOUT_S = 30.0
_START_TIMEOUT_S = 30.0
_STDERR_LINES = 20

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
    return processes.log_tail(os.path.join(self._workdir, "chromium.log"), _STDERR_LINES, "Chromium stderr")
