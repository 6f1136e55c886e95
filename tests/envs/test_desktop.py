"""Desktop-v0: the XWD framebuffer read from its header, key names as X keysyms, and the real X desktop: every
action kind changing the screen as it should, seeded resets giving the same screen, a fresh home per episode,
invalid actions without an X call, a killed X server or program ending only its episode, and nothing left over
after close() or after the owning process is killed.

The live tests need Xvfb, openbox, xdotool, pcmanfm, mousepad, galculator, xterm and scrot (`make desktop`);
one module environment (a desktop starts in about half a second) serves the tests that do not kill it.
"""

import os
import pathlib
import signal
import struct
import subprocess
import sys
import tempfile
import time

import gymnasium
import numpy as np
import pytest

import explore_jax.envs  # noqa: F401  (registers the ids)
from explore_jax.envs.desktop import confine, home
from explore_jax.envs.desktop.actions import xdotool_runs
from explore_jax.envs.desktop.env import DesktopEnv
from explore_jax.envs.desktop.framebuffer import XWD_FIELDS, Framebuffer, parse_header
from explore_jax.envs.desktop.session import DesktopError
from explore_jax.envs.processes import pid_alive
from explore_jax.envs.screen_actions import parse_response
from tests.polling import wait_until

W, H = 640, 480
CELLS = home.item_cells(W, H)
EDITOR = home.icon_centre(CELLS["editor.desktop"])
TERMINAL = home.icon_centre(CELLS["terminal.desktop"])
NOTES = home.icon_centre(CELLS["notes.txt"])
ROOT = pathlib.Path(__file__).resolve().parents[2]


def action(text, width=W, height=H):
  parsed, error = parse_response(text, width, height)
  assert parsed is not None, error
  return parsed


def changed(a, b, box=None):
  """The number of pixels that differ between two screens, inside box (x0, y0, x1, y1) when given."""
  if box is not None:
    x0, y0, x1, y1 = box
    a, b = a[y0:y1, x0:x1], b[y0:y1, x0:x1]
  return int((a != b).any(axis=-1).sum())


def marked_processes(workdir):
  """Pids of the live processes that carry a session's marker (all of a desktop's programs and what they start)."""
  found = []
  for entry in os.listdir("/proc"):
    if not entry.isdigit():
      continue
    try:
      with open(f"/proc/{entry}/environ", "rb") as f:
        if f"EXPLORE_JAX_DESKTOP={workdir}".encode() in f.read().split(b"\0") and pid_alive(int(entry)):
          found.append(int(entry))
    except OSError:
      pass
  return found


def x_socket(display):
  return f"/tmp/.X11-unix/X{display.lstrip(':')}"


# ---- no X server ------------------------------------------------------------------------------------------


def xwd_file(path, pixels, *, byte_order, name=b"a longer window name\0", ncolors=3, pad=8, header_order=">"):
  """An XWD file of RGB `pixels` with a window name, a colour map and padded rows, as a server would write it."""
  height, width, _ = pixels.shape
  bytes_per_line = 4 * width + pad
  masks = (0xFF0000, 0xFF00, 0xFF)
  fields = dict.fromkeys(XWD_FIELDS, 0)
  fields.update(header_size=4 * len(XWD_FIELDS) + len(name), file_version=7, pixmap_format=2, pixmap_depth=24,
                pixmap_width=width, pixmap_height=height, byte_order=byte_order, bitmap_unit=32, bitmap_pad=32,
                bits_per_pixel=32, bytes_per_line=bytes_per_line, visual_class=4, red_mask=masks[0],
                green_mask=masks[1], blue_mask=masks[2], bits_per_rgb=8, colormap_entries=256, ncolors=ncolors)
  words = (pixels[..., 0].astype(np.uint32) << 16) | (pixels[..., 1].astype(np.uint32) << 8) | pixels[..., 2]
  rows = words.astype("<u4" if byte_order == 0 else ">u4").view(np.uint8).reshape(height, 4 * width)
  rows = np.concatenate([rows, np.full((height, pad), 0xAB, np.uint8)], axis=1)
  with open(path, "wb") as f:
    f.write(struct.pack(f"{header_order}{len(XWD_FIELDS)}I", *(fields[k] for k in XWD_FIELDS)) + name)
    f.write(bytes(range(12 * ncolors)))
    f.write(rows.tobytes())


@pytest.mark.parametrize("byte_order, header_order", [(0, ">"), (1, ">"), (0, "<")])
def test_the_framebuffer_is_read_where_its_header_says(tmp_path, byte_order, header_order):
  pixels = np.random.default_rng(0).integers(0, 256, (5, 7, 3), dtype=np.uint8)
  path = tmp_path / "screen.xwd"
  xwd_file(path, pixels, byte_order=byte_order, header_order=header_order)
  header = parse_header(path.read_bytes())
  assert header.header_size == 121 and header.pixels_offset == 121 + 36
  assert header.size == path.stat().st_size
  screen = Framebuffer(str(path)).read()
  assert screen.dtype == np.uint8 and screen.shape == (5, 7, 3)
  np.testing.assert_array_equal(screen, pixels)
  with pytest.raises(ValueError, match="not an XWD file"):
    parse_header(b"\0" * 200)


def test_grammar_keys_become_x_keysyms_and_pointer_actions_xdotool_commands():
  def args(text):
    runs = xdotool_runs(action(text), scroll_clicks=2, type_delay_ms=3)
    assert len(runs) == 1
    return runs[0]

  assert args('Key("Ctrl+s")') == ["key", "ctrl+s"]
  assert args('Key("Ctrl+Shift+Tab")') == ["key", "ctrl+shift+Tab"]
  assert args('Key("Enter")') == ["key", "Return"]
  assert args('Key("PageDown")') == ["key", "Next"]
  assert args('Key("Cmd+Option+z")') == ["key", "alt+super+z"]
  assert args('Key("+")') == ["key", "plus"]
  assert args('Key("Shift")') == ["key", "Shift_L"]
  assert args('Key("K")') == ["key", "K"]
  assert args("Move(3, 4)") == ["mousemove", "3", "4"]
  click = ["click", "--delay", "0"]
  assert args("RightClick(3, 4)") == ["mousemove", "3", "4", *click, "3"]
  assert args("DoubleClick(3, 4)") == ["mousemove", "3", "4", *click, "1", "sleep", "0.06", *click, "1"]
  assert args("ScrollUp(3, 4)")[-5:] == ["--repeat", "2", "--delay", "15", "4"]
  assert args("ScrollDown(3, 4)")[-1] == "5"
  assert args('Text(3, 4, "a b")') == ["mousemove", "3", "4", *click, "1", "type", "--delay", "3", "--", "a b"]
  typed = ["type", "--delay", "4", "--"]
  assert xdotool_runs(action('Text(3, 4, "a\\nb\\n\\tc")')) == [
      ["mousemove", "3", "4", *click, "1", *typed, "a"], ["key", "Return", *typed, "b"],
      ["key", "Return", "key", "Tab", *typed, "c"]]
  assert xdotool_runs(action('Text(3, 4, "name.txt\\n")'))[-1] == ["sleep", "0.25", "key", "Return"]
  assert xdotool_runs(action('Text(3, 4, "\\n")')) == [["mousemove", "3", "4", *click, "1", "key", "Return"]]


def test_importing_the_envs_package_loads_no_desktop_and_the_desktop_no_jax():
  code = ("import sys, explore_jax.envs, gymnasium; "
          "assert 'explore_jax/Desktop-v0' in gymnasium.registry; "
          "before = [m for m in sys.modules if 'desktop' in m]; "
          "import explore_jax.envs.desktop.env; "
          "print(before, 'jax' in sys.modules)")
  result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
  assert result.stdout.strip() == "[] False"


def test_bad_arguments_are_refused_before_a_desktop_starts():
  with pytest.raises(ValueError, match="screen_size"):
    DesktopEnv(screen_size=(100, 100))
  with pytest.raises(ValueError, match="settle_s"):
    DesktopEnv(settle_s=-1)


# ---- the desktop ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def env():
  env = DesktopEnv(settle_s=0.3, max_steps=50)
  yield env
  env.close()


def test_the_framebuffer_is_the_screen_an_x_client_captures(env, tmp_path):
  observation, _ = env.reset(seed=0)
  capture = tmp_path / "scrot.png"
  subprocess.run(["scrot", "-o", str(capture)], env={**os.environ, **env.session.x_env}, check=True,
                 timeout=30)
  from PIL import Image
  with Image.open(capture) as image:
    theirs = np.asarray(image.convert("RGB"))
  ours = observation["screenshot"]
  assert theirs.shape == ours.shape == (H, W, 3)
  # scrot leaves the pointer out; Xvfb draws it into the framebuffer (at the screen's centre at first).
  differ = np.argwhere((theirs != ours).any(axis=-1))
  assert len(differ) > 0 and (differ.min(axis=0) >= (H // 2 - 2, W // 2 - 2)).all()
  assert (differ.max(axis=0) <= (H // 2 + 24, W // 2 + 24)).all()


def test_the_starting_desktop_shows_its_icons_and_seeded_resets_repeat_it(env):
  observation, info = env.reset(seed=3)
  assert env.observation_space.contains(observation)
  screen = observation["screenshot"]
  assert screen.shape == (H, W, 3) and screen.dtype == np.uint8 and not screen.flags.writeable
  assert observation["text"] == "Desktop" == env.raw_observation()
  assert (info["task_id"], info["step"], info["success"], info["feedback"], info["intent"]) == (
      "desktop", 0, False, "", "")
  background = (screen == home.BACKGROUND_RGB).all(axis=-1)
  assert background.mean() > 0.8 and all(not background[y - 8:y + 8, x - 8:x + 8].all()
                                          for x, y in map(home.icon_centre, CELLS.values()))
  env.step(f"DoubleClick({EDITOR[0]}, {EDITOR[1]})")  # an episode that changed the screen
  again, again_info = env.reset(seed=3)
  assert np.array_equal(again["screenshot"], screen), changed(again["screenshot"], screen)
  assert again_info["state_key"] == info["state_key"]
  other = DesktopEnv(settle_s=0.0)
  try:
    assert np.array_equal(other.reset(seed=3)[0]["screenshot"], screen)  # another desktop, the same start
  finally:
    other.close()


def test_every_action_kind_changes_the_screen_as_it_should(env):
  start, _ = env.reset(seed=0)
  start = start["screenshot"]
  moved = env.step("Move(500, 400)")[0]["screenshot"]  # the pointer leaves the centre for (500, 400)
  assert changed(start, moved, (318, 238, 340, 262)) > 0 and changed(start, moved, (498, 398, 520, 422)) > 0
  assert changed(start, moved) < 1000
  clicked = env.step(f"Click({NOTES[0]}, {NOTES[1]})")[0]["screenshot"]  # selects notes.txt: its cell lights up
  x, y = CELLS["notes.txt"]
  assert changed(moved, clicked, (x, y, x + home.CELL_WIDTH, y + home.CELL_HEIGHT)) > 200
  menu = env.step("RightClick(400, 200)")[0]["screenshot"]  # openbox's menu at the point (notes.txt deselected)
  assert changed(clicked, menu, (400, 200, 560, 300)) > 2000 and changed(clicked, menu, (210, 0, 380, 480)) == 0
  closed = env.step('Key("Escape")')[0]["screenshot"]
  assert changed(menu, closed, (400, 200, 560, 300)) > 2000
  editor = env.step(f"DoubleClick({EDITOR[0]}, {EDITOR[1]})")[0]["screenshot"]  # opens mousepad
  assert wait_until(lambda: changed(closed, env.session.screenshot()) > W * H // 2, timeout_s=20)
  blank = env.session.screenshot()
  lines = "".join(f"{i}\\n" for i in range(40))
  typed = env.step(f'Text(300, 250, "{lines}")')[0]["screenshot"]
  assert changed(blank, typed, (0, 70, W, H - 10)) > 1000
  up = env.step("ScrollUp(300, 250)")[0]["screenshot"]  # the view shows earlier lines
  assert changed(typed, up, (0, 70, W, H - 10)) > 500
  down = env.step("ScrollDown(300, 250)")[0]["screenshot"]
  assert changed(up, down, (0, 70, W, H - 10)) > 500
  env.step('Key("Ctrl+a")')
  cleared = env.step('Key("Delete")')[0]["screenshot"]
  assert changed(typed, cleared, (0, 70, W, H - 10)) > 1000
  assert editor.shape == cleared.shape


def test_a_file_saved_or_written_in_one_episode_is_gone_in_the_next(env):
  start = env.reset(seed=0)[0]["screenshot"]
  first_home = pathlib.Path(env.home)
  (first_home / "direct.txt").write_text("written from outside")
  env.step(f"DoubleClick({EDITOR[0]}, {EDITOR[1]})")
  assert wait_until(lambda: changed(start, env.session.screenshot()) > W * H // 2, timeout_s=20)
  typed = env.step('Text(300, 250, "kept only in this episode")')[0]["screenshot"]
  env.step('Key("Ctrl+s")')  # the save dialog, over the whole screen, in the home folder
  assert wait_until(lambda: changed(typed, env.session.screenshot()) > W * H // 10, timeout_s=20)
  env.step('Text(340, 46, "saved.txt\\n")')  # its name field, then Enter
  saved = first_home / "saved.txt"
  assert wait_until(lambda: saved.exists() and saved.read_text() == "kept only in this episode", timeout_s=20)
  _, info = env.reset(seed=0)
  second_home = pathlib.Path(env.home)
  assert not first_home.exists() and not (second_home / "saved.txt").exists()
  assert not (second_home / "direct.txt").exists()
  assert sorted(p.name for p in (second_home / "Desktop").iterdir()) == sorted(i.file for i in home.ITEMS)
  assert info["step"] == 0


def test_invalid_actions_cost_a_step_and_make_no_x_call(env, monkeypatch):
  env.reset(seed=0)
  screen = env.screenshot

  def no_x_call(*args):
    raise AssertionError("an invalid action reached the X server")

  monkeypatch.setattr(env.session, "xdotool", no_x_call)
  for step, response in enumerate(["click it", f"Click({W}, 10)", 'Key("Hyper+x")', 42], start=1):
    observation, reward, terminated, truncated, info = env.step(response)
    assert observation["text"].startswith("Invalid action: ") and observation["text"].endswith("Desktop")
    assert f"x in 0..{W - 1}, y in 0..{H - 1}" in observation["text"]
    assert observation["screenshot"] is screen
    assert (reward, info["format_ok"], info["format_reward"], info["action"], info["step"]) == (
        0.0, False, 0.0, None, step)
  monkeypatch.setattr(env, "max_steps", 5)
  _, reward, terminated, truncated, info = env.step("nothing")
  assert truncated and not terminated and reward == 0.0
  assert info["feedback"] == "Out of steps (5): the desktop has no task to end an episode sooner."


def test_an_x_server_killed_mid_episode_ends_only_that_episode():
  env = DesktopEnv(settle_s=0.1)
  try:
    env.reset(seed=0)
    env.step("Move(10, 10)")
    display, xvfb, workdir = env.session.display, env.session.xvfb_pid, env.session.workdir
    os.kill(xvfb, signal.SIGKILL)
    assert wait_until(lambda: not pid_alive(xvfb))
    with pytest.raises(DesktopError, match=r"Xvfb \(the X server\).* died .*the next reset\(\) starts a new desktop"):
      env.step("Click(10, 10)")
    with pytest.raises(RuntimeError, match="no episode is running"):
      env.step("Click(10, 10)")
    observation, _ = env.reset(seed=0)
    assert env.session.starts == 2 and env.session.xvfb_pid != xvfb
    assert (observation["screenshot"] == home.BACKGROUND_RGB).all(axis=-1).mean() > 0.8
    assert not os.path.exists(workdir) and marked_processes(workdir) == []
    if env.session.display != display:  # (a new server on the same display has bound a socket of its own)
      assert not os.path.exists(x_socket(display))
    assert env.step("Move(20, 20)")[4]["format_ok"]
  finally:
    env.close()


@pytest.mark.parametrize("program", ["desktop_pid", "openbox_pid"])
def test_a_desktop_program_killed_mid_episode_ends_only_that_episode(program):
  env = DesktopEnv(settle_s=0.1)
  try:
    env.reset(seed=0)
    pid = getattr(env.session, program)
    os.kill(pid, signal.SIGKILL)
    assert wait_until(lambda: not pid_alive(pid))
    name = "pcmanfm's desktop" if program == "desktop_pid" else r"openbox \(the window manager\)"
    with pytest.raises(DesktopError, match=f"{name} died"):
      env.step("Move(5, 5)")
    env.reset(seed=0)
    assert pid_alive(getattr(env.session, program)) and env.step("Move(6, 6)")[4]["format_ok"]
  finally:
    env.close()


def test_an_application_the_agent_opened_may_die_without_ending_the_episode(env):
  env.reset(seed=0)
  env.step(f"DoubleClick({EDITOR[0]}, {EDITOR[1]})")
  found = []
  assert wait_until(lambda: found.extend(p for p in marked_processes(env.session.workdir)
                                         if open(f"/proc/{p}/comm").read().strip() == "mousepad") or found,
                    timeout_s=20)
  os.kill(found[0], signal.SIGKILL)
  assert wait_until(lambda: not pid_alive(found[0]))
  _, _, terminated, truncated, info = env.step("Move(7, 7)")  # its window is gone: the desktop shows again
  assert info["format_ok"] and not (terminated or truncated)


def test_nothing_outlives_close_or_the_owning_process(tmp_path):
  env = DesktopEnv(settle_s=0.3)
  env.reset(seed=0)
  workdir, display = env.session.workdir, env.session.display
  # A process that left the desktop's process group and session (as one started from the terminal might).
  env.step(f"DoubleClick({TERMINAL[0]}, {TERMINAL[1]})")
  assert wait_until(lambda: any(open(f"/proc/{p}/comm").read().strip() == "xterm"
                                for p in marked_processes(workdir)), timeout_s=20)
  stray = pathlib.Path(workdir) / "tmp" / "stray"
  for _ in range(3):  # the terminal may still be mapping its window: type until the stray runs
    env.step(f'Text(320, 240, "setsid sh -c \'echo $$ >{stray}; exec sleep 300\' &\\n")')
    if wait_until(lambda: stray.exists() and stray.read_text().strip(), timeout_s=5):
      break
  stray_pid = int(stray.read_text())
  assert pid_alive(stray_pid) and os.getsid(stray_pid) != os.getsid(env.session.xvfb_pid)
  pids = marked_processes(workdir)
  assert len(pids) >= 5
  env.close()
  env.close()
  assert wait_until(lambda: not any(pid_alive(p) for p in pids)) and not pid_alive(stray_pid)
  assert not os.path.exists(workdir) and not os.path.exists(x_socket(display))

  # A process killed outright (SIGKILL: no finalizer runs) takes its desktop and the desktop's files along.
  code = ("from explore_jax.envs.desktop.env import DesktopEnv\n"
          "env = DesktopEnv(); env.reset(seed=0)\n"
          "print(env.session.workdir, env.session.display, flush=True)\n"
          "import time; time.sleep(60)\n")
  child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=ROOT,
                           env={**os.environ, "TMPDIR": tempfile.gettempdir()})
  try:
    workdir, display = child.stdout.readline().split()
    pids = marked_processes(workdir)
    assert len(pids) >= 3 and os.path.exists(x_socket(display))
  finally:
    child.kill()
    child.wait()
  assert wait_until(lambda: marked_processes(workdir) == [], timeout_s=30)
  assert wait_until(lambda: not os.path.exists(workdir), timeout_s=30)
  assert wait_until(lambda: not os.path.exists(x_socket(display)) or  # (or another server holds the display now)
                    os.path.exists(f"/tmp/.X{display.lstrip(':')}-lock"), timeout_s=30)


def terminal_run(env, lines, done, timeout_s=20):
  """Open the terminal, wait until it takes typed input, type `lines` (each Text at most 128 characters, then
  Enter) and wait for the file `done` in the home folder; its text."""
  env.step(f"DoubleClick({TERMINAL[0]}, {TERMINAL[1]})")
  assert wait_until(lambda: any(open(f"/proc/{p}/comm").read().strip() == "xterm"
                                for p in marked_processes(env.session.workdir)), timeout_s=timeout_s)
  ready, home_folder = pathlib.Path(env.home) / "ready", pathlib.Path(env.home)
  for _ in range(4):  # the terminal may still be mapping its window
    env.step('Text(320, 240, "touch ready\\n")')
    if wait_until(ready.exists, timeout_s=timeout_s / 4):
      break
  else:
    raise AssertionError("the terminal took no typed command")
  for line in lines:
    env.step(f'Text(320, 240, "{line}\\n")')
  assert wait_until((home_folder / done).exists, timeout_s=timeout_s), lines
  return (home_folder / done).read_text()


def test_the_terminal_runs_unprivileged_without_network_and_writes_only_its_own_files(env):
  confined = confine.confinement()
  if not (confined.drops_privileges or confined.network or os.getuid() != 0):
    pytest.skip(f"this machine confines nothing: {'; '.join(confined.missing)}")
  env.reset(seed=0)
  workdir, tag = pathlib.Path(env.session.workdir), f"jx{os.getpid()}"
  outside = [pathlib.Path("/root") / tag, pathlib.Path("/etc") / tag]
  if confined.drops_privileges:  # (a user's own desktop may write what that user may)
    outside += [ROOT / tag, workdir / "Xvfb_screen0", workdir / "xserver", workdir / "cookie"]
  made = [path for path in outside if path.name == tag]
  assert not any(path.exists() for path in made)
  before = {path: path.stat().st_size for path in outside if path.exists()}
  # The agent's side: typed lines; each check prints w<touch's status>; the answers are renamed once complete.
  lines = ["t() { (: >>$1) 2>/dev/null; echo w$?; }", "id -u >p.txt"]
  lines += [f"t {path} >>p.txt" for path in outside]
  lines += ["(cat /etc/shadow; echo w$? >>p.txt) >/dev/null 2>&1",
            "cat /proc/net/dev /proc/net/route >>p.txt; mv p.txt probe.txt"]
  try:
    answers = terminal_run(env, lines, "probe.txt").splitlines()
    shell = [p for p in marked_processes(str(workdir)) if open(f"/proc/{p}/comm").read().strip() == "bash"]
    after = {path: path.stat().st_size for path in outside if path.exists()}
  finally:
    for path in made:
      path.unlink(missing_ok=True)
  uid = int(answers[0])
  refused = [int(line[1:]) != 0 for line in answers if line.startswith("w")]
  assert len(refused) == len(outside) + 1 and all(refused), answers  # nothing outside its folders, no shadow
  assert after == before, (before, after)  # (no file made, none grown)
  assert shell and all(os.stat(f"/proc/{p}").st_uid == uid for p in shell)
  if os.getuid() == 0 and confined.drops_privileges:
    assert uid == confined.uid != 0 and (pathlib.Path(env.home) / "probe.txt").stat().st_uid == uid
  if confined.network:
    interfaces = [line.split(":")[0].strip() for line in answers if ":" in line and "|" not in line]
    routes = [line for line in answers if not line.startswith("Iface") and line.count("\t") >= 7]
    assert interfaces == ["lo"] and routes == [], answers  # /proc/net/dev: the loopback only; no route at all
    assert os.readlink(f"/proc/{shell[0]}/ns/net") != os.readlink("/proc/self/ns/net")
  assert env.step("Move(9, 9)")[4]["format_ok"]  # the desktop still serves, to the cookie's holders only
  anyone = {**env.session.x_env, "XAUTHORITY": os.devnull}
  assert subprocess.run(["xdotool", "getmouselocation"], env=anyone, capture_output=True, timeout=30).returncode != 0
  if confined.missing:
    pytest.skip(f"checked what this machine confines; it lacks: {'; '.join(confined.missing)}")


def test_a_machine_that_refuses_a_namespace_or_the_user_gets_one_warning_naming_it(monkeypatch):
  monkeypatch.setattr(confine.shutil, "which", lambda name: None)
  with pytest.warns(RuntimeWarning, match="no network namespace") as caught:
    confined = confine._probe.__wrapped__()
  assert len(caught) == 1 and not confined.network and confined.guardian == ()
  if os.getuid() == 0:
    assert "the programs run as root" in str(caught[0].message) and not confined.drops_privileges


def test_gymnasium_make_builds_it_with_its_screen_size_and_the_oracle_opens_a_program():
  env = gymnasium.make("explore_jax/Desktop-v0", screen_size=(800, 600), settle_s=0.5, max_steps=2,
                       render_mode="rgb_array")
  try:
    observation, _ = env.reset(seed=1)
    assert observation["screenshot"].shape == (600, 800, 3)
    assert np.array_equal(env.render(), observation["screenshot"])
    oracle = env.unwrapped.oracle_action()
    assert oracle.startswith("DoubleClick(")
    observation, reward, terminated, truncated, info = env.step(f'{{"intent": "open the terminal", '
                                                                f'"action": "{oracle}"}}')
    assert reward == 0.0 and not (terminated or truncated) and info["intent"] == "open the terminal"
    assert info["action"] == oracle
    assert wait_until(lambda: any(open(f"/proc/{p}/comm").read().strip() == "xterm"
                                  for p in marked_processes(env.unwrapped.session.workdir)), timeout_s=20)
    _, _, terminated, truncated, info = env.step("Move(1, 1)")
    assert truncated and not terminated and not info["success"]
  finally:
    env.close()
