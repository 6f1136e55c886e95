"""Benchmark: screen reading's OCR settings (envs/screen_reading.py `ocr_boxes`) on this project's own screens.

Prints, asserts nothing. Every time is wall time on this machine under whatever load it carries (the load
average is printed with them).

The screens, each with the words it shows:

  miniwob   MiniWoB-v0 observations (160 x 210, the task area as the policy sees it): the first reset of
            --seeds seeds of each of --tasks. The words shown are read from the page itself: every word of a
            visible text node whose first line box has its centre inside the task area and is the topmost
            element there (not under a dialog, not clipped away), plus the text of visible text fields, the
            chosen option of a select and the labels of input buttons.
  desktop   an X screen of its own (Xvfb 640 x 480 x 24 on the first free display from --display, openbox):
            mousepad filling the screen on a text file (its title, menu bar and, as root, its warning bar are
            known), then xterms (DejaVu Sans Mono, titled) showing files through `less` ("(END)" line
            included): one of size 11, one small (8) in reverse video, and two side by side (8 and 10);
            grabbed with scrot. Every process it starts is ended before it returns.

For every setting (--upscales x --psms x --colours: "gray", the screenshot as 8-bit luma, or "rgb" as it is),
every screen goes through `ocr_boxes`; the words read are the boxes' texts joined by spaces (what `screen_text`
embeds). Words on either side are the lower-cased runs of letters and digits ("@adipiscing," -> "adipiscing"),
compared as multisets: matched = sum over words of min(count read, count shown); recall = matched / words shown,
precision = matched / words read, both over all screens of a kind; ms = mean wall time of one `ocr_boxes` call
(tesseract as a subprocess through pytesseract, the upscale included); cpu ms = the CPU time of that call, this
process's and its tesseract's (user + system; less sensitive to the machine's load than the wall time).

Tesseract's LSTM engine is the only one Debian's eng.traineddata holds (--oem 0, the legacy engine, fails to load),
so the engine is not a setting here. OMP_THREAD_LIMIT=--threads (1 by default, as `ocr_boxes` sets it when unset).
The best --best settings of each kind by recall + precision, and `ocr_boxes`' defaults, are listed with the words
they missed and read in excess per screen; a last table times the defaults at 1 thread and at one thread per core
(tesseract's own OpenMP default).

  .venv/bin/python benchmarks/ocr.py [--tasks click-button,...] [--seeds 2] [--upscales 1,2,3,4] [--psms 3,4,6,11,12]
                                     [--colours gray,rgb]
"""

from __future__ import annotations

import argparse
import collections
import inspect
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
from PIL import Image

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from explore_jax.envs import screen_reading  # noqa: E402

TASKS = ("click-button", "click-dialog", "click-link", "click-option", "click-checkboxes", "click-tab-2",
         "email-inbox", "social-media", "read-table", "login-user", "enter-text", "navigate-tree",
         "search-engine", "book-flight", "choose-list", "click-menu")

# The words a MiniWoB page shows inside the task area (module docstring).
SHOWN_WORDS_JS = r"""
const W = arguments[0], H = arguments[1];
const words = [];
const visible = (el) => {
  for (let e = el; e; e = e.parentElement) {
    const st = getComputedStyle(e);
    if (st.display === 'none' || st.visibility === 'hidden' || parseFloat(st.opacity) === 0) return false;
  }
  return true;
};
const shown = (el, r) => {
  const cx = r.left + r.width / 2, cy = r.top + r.height / 2;
  if (cx < 0 || cy < 0 || cx >= W || cy >= H) return false;
  const hit = document.elementFromPoint(cx, cy);
  return hit !== null && (hit === el || el.contains(hit) || hit.contains(el));
};
const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
for (let n = walker.nextNode(); n; n = walker.nextNode()) {
  const el = n.parentElement;
  if (!el || ['SCRIPT', 'STYLE', 'NOSCRIPT', 'OPTION', 'TITLE'].includes(el.tagName) || !visible(el)) continue;
  const re = /\S+/g;
  for (let m = re.exec(n.textContent); m; m = re.exec(n.textContent)) {
    const range = document.createRange();
    range.setStart(n, m.index); range.setEnd(n, m.index + m[0].length);
    const rects = Array.from(range.getClientRects()).filter((r) => r.width > 0 && r.height > 0);
    if (rects.length && shown(el, rects[0])) words.push(m[0]);
  }
}
for (const el of document.querySelectorAll('input, textarea, select')) {
  const r = el.getBoundingClientRect();
  if (!visible(el) || r.width === 0 || !shown(el, r)) continue;
  let text = '';
  if (el.tagName === 'SELECT') text = el.selectedIndex >= 0 ? el.options[el.selectedIndex].text : '';
  else if (el.tagName === 'TEXTAREA' || ['text', 'search', 'password', 'email', 'number', ''].includes(el.type))
    text = el.value || el.placeholder || '';
  else if (['button', 'submit', 'reset'].includes(el.type)) text = el.value || '';
  words.push(...text.split(/\s+/).filter((w) => w));
}
return words.join(' ');
"""

NOTES = """Quarterly report for the garden project
Tomatoes planted: 42 rows near the north fence
Budget approved by Maria on Tuesday, 3 March
Next meeting moves to the library at noon
Please bring seven blue folders and coffee
"""
LOG = """Backup finished at 07:15 with 1289 files copied
Warning: disk quota reached 91 percent on volume data
Restart the mail service after the upgrade
Contact Jonas Whitfield about invoice 5531
"""
SHOPPING = """Apples 12
Pears 7 ripe
Orange juice 3 litres
Call Dr Patel at 4pm
"""
FILES = {"notes.txt": NOTES, "backup.log": LOG, "list.txt": SHOPPING}
MOUSEPAD_MENUS = "File Edit Search View Document Help"
MOUSEPAD_ROOT_WARNING = "Warning: you are using the root account. You may harm your system."


def words(text: str) -> list[str]:
  return re.findall(r"[0-9a-z]+", text.lower())


def miniwob_screens(tasks: list[str], seeds: int) -> list[tuple[str, np.ndarray, str]]:
  """(name, screenshot, the words shown) of each task's first reset for seeds 0..seeds-1."""
  from explore_jax.envs.miniwob import TASK_HEIGHT, TASK_WIDTH, MiniWoBEnv
  env = MiniWoBEnv(task=tasks)
  screens = []
  try:
    for seed in range(seeds):
      for index, task in enumerate(tasks):
        obs, _ = env.reset(seed=seed, options={"task_index": index})
        shown = env.browser.script("reading the shown words", SHOWN_WORDS_JS, TASK_WIDTH, TASK_HEIGHT)
        screens.append((f"{task}/{seed}", np.array(obs["screenshot"]), str(shown)))
  finally:
    env.close()
  return screens


def _free_display(first: int) -> int:
  for n in range(first, first + 100):
    if not os.path.exists(f"/tmp/.X{n}-lock") and not os.path.exists(f"/tmp/.X11-unix/X{n}"):
      return n
  raise RuntimeError(f"no free X display from :{first}")


def _grab(env: dict, folder: str, name: str) -> np.ndarray:
  path = os.path.join(folder, f"{name}.png")
  subprocess.run(["scrot", "-o", path], env=env, check=True, timeout=30)
  with Image.open(path) as image:
    return np.asarray(image.convert("RGB"))


def desktop_screens(first_display: int, settle_s: float) -> list[tuple[str, np.ndarray, str]]:
  """(name, screenshot, the words shown) of the desktop scenes (module docstring)."""
  for command in ("Xvfb", "openbox", "mousepad", "xterm", "less", "scrot"):
    if shutil.which(command) is None:
      print(f"desktop: {command} is missing (make desktop); no desktop screens")
      return []
  # A folder of a readable name (mousepad's title shows its path): the process id, not random letters.
  folder = os.path.join(tempfile.gettempdir(), f"ocr-bench-{os.getpid()}")
  os.makedirs(folder)
  procs: list[subprocess.Popen] = []
  screens = []

  def start(*argv: str, **kwargs) -> subprocess.Popen:
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=folder, **kwargs)
    procs.append(proc)
    return proc

  def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
      proc.terminate()
      try:
        proc.wait(5)
      except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()

  try:
    for name, text in FILES.items():
      with open(os.path.join(folder, name), "w") as f:
        f.write(text)
    display = _free_display(first_display)
    xvfb = start("Xvfb", f":{display}", "-screen", "0", "640x480x24", "-nolisten", "tcp")
    env = dict(os.environ, DISPLAY=f":{display}", NO_AT_BRIDGE="1")
    for _ in range(100):
      if os.path.exists(f"/tmp/.X11-unix/X{display}") or xvfb.poll() is not None:
        break
      time.sleep(0.05)
    start("openbox", env=env)
    time.sleep(settle_s)

    editor = start("mousepad", "notes.txt", env=env)
    time.sleep(3 * settle_s)
    path = os.path.join(folder, "notes.txt")
    shown = " ".join([f"{path} - Mousepad", MOUSEPAD_MENUS] + ([MOUSEPAD_ROOT_WARNING] if os.geteuid() == 0 else [])
                     + [NOTES])
    screens.append(("mousepad", _grab(env, folder, "mousepad"), shown))
    stop(editor)

    def terminal(title: str, file: str, *options: str) -> tuple[subprocess.Popen, str]:
      """An xterm showing `file` through less, and the words it shows (its title, the file, less's last line)."""
      proc = start("xterm", "-fa", "DejaVu Sans Mono", *options, "-T", title, "-e", "less", file, env=env)
      return proc, f"{title} {FILES[file]} {file} (END)"

    for name, windows in (("xterm", [("Backup log", "backup.log", "-fs", "11", "-geometry", "70x12+10+10")]),
                          ("xterm-small-rv", [("Backup log", "backup.log", "-fs", "8", "-rv", "-geometry",
                                               "90x20+0+0")]),
                          ("two-xterms", [("Garden notes", "notes.txt", "-fs", "8", "-geometry", "50x8+0+0"),
                                          ("Shopping list", "list.txt", "-fs", "10", "-geometry", "26x7+300+220")])):
      opened = [terminal(*window) for window in windows]
      time.sleep(2 * settle_s)
      screens.append((name, _grab(env, folder, name), " ".join(shown for _, shown in opened)))
      for proc, _ in opened:
        stop(proc)
  finally:
    for proc in reversed(procs):
      stop(proc)
    shutil.rmtree(folder, ignore_errors=True)
  return screens


def _cpu_seconds() -> float:
  children = resource.getrusage(resource.RUSAGE_CHILDREN)
  return time.process_time() + children.ru_utime + children.ru_stime


def measure(screens, upscale: int, psm: int, colour: str, repeats: int = 1) -> tuple[float, float, float, float, list]:
  """(recall, precision, mean wall ms and cpu ms per call, per-screen (name, missed, extra)) over `screens`."""
  matched = shown_total = read_total = 0
  seconds = cpu = 0.0
  details = []
  for name, screen, shown in screens:
    for _ in range(repeats):
      t, c = time.perf_counter(), _cpu_seconds()
      boxes = screen_reading.ocr_boxes(screen, upscale=upscale, psm=psm, gray=colour == "gray")
      seconds += time.perf_counter() - t
      cpu += _cpu_seconds() - c
    read = collections.Counter(words(" ".join(b.text for b in boxes)))
    truth = collections.Counter(words(shown))
    matched += sum((read & truth).values())
    shown_total += sum(truth.values())
    read_total += sum(read.values())
    details.append((name, truth - read, read - truth))
  recall = matched / max(shown_total, 1)
  precision = matched / max(read_total, 1)
  calls = len(screens) * repeats
  return recall, precision, 1e3 * seconds / calls, 1e3 * cpu / calls, details


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--tasks", default=",".join(TASKS))
  parser.add_argument("--seeds", type=int, default=2)
  parser.add_argument("--upscales", default="1,2,3,4")
  parser.add_argument("--psms", default="3,4,6,11,12")
  parser.add_argument("--colours", default="gray,rgb")
  parser.add_argument("--display", type=int, default=90, help="the first X display number tried")
  parser.add_argument("--settle", type=float, default=1.0, help="seconds for a window to appear")
  parser.add_argument("--threads", default="1", help="OMP_THREAD_LIMIT for tesseract")
  parser.add_argument("--best", type=int, default=3, help="settings of each kind shown with their misses")
  parser.add_argument("--skip_miniwob", action="store_true")
  parser.add_argument("--skip_desktop", action="store_true")
  args = parser.parse_args()
  upscales = [int(u) for u in args.upscales.split(",")]
  psms = [int(p) for p in args.psms.split(",")]
  colours = args.colours.split(",")
  os.environ["OMP_THREAD_LIMIT"] = args.threads

  kinds = {}
  if not args.skip_miniwob:
    kinds["miniwob"] = miniwob_screens(args.tasks.split(","), args.seeds)
  if not args.skip_desktop:
    kinds["desktop"] = desktop_screens(args.display, args.settle)
  kinds = {k: v for k, v in kinds.items() if v}
  for kind, screens in kinds.items():
    total = sum(len(words(s[2])) for s in screens)
    print(f"{kind}: {len(screens)} screens {screens[0][1].shape[1]}x{screens[0][1].shape[0]}, {total} words shown")

  load = os.getloadavg()
  print(f"\nOMP_THREAD_LIMIT={os.environ.get('OMP_THREAD_LIMIT', '(unset)')}; "
        f"load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")
  results: dict[str, dict[tuple[int, int, str], tuple]] = {k: {} for k in kinds}
  header = "colour upscale psm | " + " | ".join(f"{k:>7} recall precision    ms cpu ms" for k in kinds)
  print(header)
  print("-" * len(header))
  for colour in colours:
    for upscale in upscales:
      for psm in psms:
        cells = []
        for kind, screens in kinds.items():
          results[kind][(upscale, psm, colour)] = measure(screens, upscale, psm, colour)
          r, p, ms, cpu, _ = results[kind][(upscale, psm, colour)]
          cells.append(f"{'':>7} {r:6.3f} {p:9.3f} {ms:5.0f} {cpu:6.0f}")
        print(f"{colour:>6} {upscale:7d} {psm:3d} | " + " | ".join(cells), flush=True)
  load = os.getloadavg()
  print(f"load average after {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")

  signature = inspect.signature(screen_reading.ocr_boxes).parameters
  default = (signature["upscale"].default, signature["psm"].default, "gray" if signature["gray"].default else "rgb")
  for kind, table in results.items():
    best = sorted(table, key=lambda s: -(table[s][0] + table[s][1]))[:args.best]
    for setting in best + ([default] if default in table and default not in best else []):
      r, p, ms, _, details = table[setting]
      print(f"\n{kind}, {setting[2]} upscale {setting[0]} psm {setting[1]}{' (the defaults)' * (setting == default)}: "
            f"recall {r:.3f}, precision {p:.3f}, {ms:.0f} ms; words missed / read in excess, per screen")
      for name, missed, extra in details:
        if missed or extra:
          print(f"  {name:22s} missed {' '.join(sorted(missed.elements()))[:70]!s:70s} "
                f"extra {' '.join(sorted(extra.elements()))[:60]}")

  # Tesseract's threads at the defaults, for comparison.
  cores = os.cpu_count() or 1
  print(f"\nthe defaults at OMP_THREAD_LIMIT 1 and {cores} (one per core), 3 calls per screen:")
  for kind, screens in kinds.items():
    timing = []
    for threads in ("1", str(cores)):
      os.environ["OMP_THREAD_LIMIT"] = threads
      timing.append(measure(screens, *default, repeats=3)[2:4])
    print(f"  {kind}: at 1 thread {timing[0][0]:.0f} ms (cpu {timing[0][1]:.0f}), "
          f"at {cores} {timing[1][0]:.0f} ms (cpu {timing[1][1]:.0f})")
  os.environ["OMP_THREAD_LIMIT"] = args.threads


if __name__ == "__main__":
  main()
