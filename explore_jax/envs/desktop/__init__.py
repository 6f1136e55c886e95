"""Desktop-v0: a real X desktop with no task, for ScreenExplorer's open-ended GUI exploration.

What runs (one set per environment, started afresh at every reset):

- Xvfb, the X server, on a display of its own (the guardian takes the first number without a lock or socket
  in /tmp; Xvfb's lock /tmp/.X<n>-lock settles a race), a `screen_size` screen at 24 bits, no TCP, no screen
  saver, a cookie of its own (MIT-MAGIC-COOKIE-1 in <folder>/cookie), drawing into a memory-mapped XWD file
  (`-fbdir`);
- openbox, the window manager (one virtual desktop, no animations, its right-click menu of the four
  programs), and pcmanfm's desktop: icons at fixed cells for Terminal (xterm), Text Editor (mousepad),
  Calculator (galculator), Files (pcmanfm's file manager), notes.txt and the folder Documents. A double-click
  opens one; the programs open and save files in the episode's home folder (home.py).

Process model (session.py, on envs/processes.py's `Guarded`, as MiniWoB's browser):

- One `sh` guardian per desktop, in a session of its own, starts Xvfb, openbox once the server serves and
  pcmanfm's desktop once openbox manages the screen, prints their pids and the display, and waits on a pipe
  only this process writes to. When the pipe closes -- close(), the next reset(), garbage collection, or this
  process dying in any way, SIGKILL included -- it kills every process that carries the desktop's marker
  variable (EXPLORE_JAX_DESKTOP=<its folder>: every program the desktop started, also those that left its
  process group, as xterm's shell does) and then its own group.
- Everything lives in one temporary folder per desktop: the framebuffer file, the cookie, the session's
  stderr, and the home (HOME, XDG_CONFIG_HOME, XDG_DATA_HOME, XDG_CACHE_HOME), XDG_RUNTIME_DIR and TMPDIR of
  every program, which also start in the home folder. GSETTINGS_BACKEND=memory, no session bus (GLib programs
  then run alone), NO_AT_BRIDGE=1, TZ=UTC, LANG=C.UTF-8. The folder goes on close() and at the next reset;
  should this process die first, a remover waiting on the same pipe removes it once the group is gone, with
  the display's lock /tmp/.X<n>-lock (holding the server's pid) and socket /tmp/.X11-unix/X<n>, which a killed
  Xvfb leaves behind, unless another server holds that display by then.
- The guardian runs as this process's user (in the desktop's network namespace); the programs it starts run
  as the confinement below says. The remover and the cleanup run here, outside both.
- Faults: before and after every action the session checks that Xvfb, openbox and the desktop run (a zombie
  counts as dead); a dead one, or a failing xdotool, raises `DesktopError`, which names what died and ends
  the episode; the next reset() starts a new desktop. A program the agent opened (mousepad, xterm, ...) may
  die or be closed: that is part of the world, not a fault.

The screen: Xvfb renders into `<folder>/Xvfb_screen0`, an XWD image memory-mapped by numpy (framebuffer.py):
its header says where the pixels start (header_size + 12 x ncolors) and how they are laid out (32-bit BGRX
rows of bytes_per_line); a screenshot is a copy of that mapping, pointer included (Xvfb draws it in software),
with no X request and no screenshot program. Reset waits until the desktop is drawn (the background colour in
an empty corner, every icon over it, the same screen for 4 polls 50 ms apart).

Determinism: every reset starts a new X server from the same home template (file times fixed to 2024-01-01),
the pointer at the screen's centre, carets that do not blink (gtk-cursor-blink=false; xterm's does not by
default), no clock anywhere, openbox's deterministic placement, so equal seeds -- all seeds, since there is one
starting desktop -- give byte-identical first screenshots. Later screens can depend on timing: a program that
is slow to open under load may not be drawn yet `settle_s` after the action, and tooltips appear after a delay.

Actions (actions.py): ScreenExplorer's grammar (envs/screen_actions.py) on the screen's own pixel grid (the
screenshot is the screen, no resizing), each as xdotool runs on the display: Move, Click, RightClick,
DoubleClick (two clicks 60 ms apart), ScrollUp / ScrollDown (`scroll_clicks` of wheel buttons 4 / 5), Text
(a click, then the text typed, newlines and tabs as the Return and Tab keys), Key (a chord of X keysyms:
Ctrl, Alt, Shift, Meta as Super). `settle_s` after each action, then the screen is read.

The environment (a TextEnv): the observation is {"screenshot": uint8 [H, W, 3] read-only, "text": str} with
text "Desktop" (after an invalid action preceded by "Invalid action: <what was wrong> <the expected form>";
an invalid action makes no X call and returns the same screenshot); reward 0 always, success False, episodes
truncate after `max_steps` steps; info["intent"] is a JSON reply's intent, info["state_key"] hashes the text
with the screenshot's bytes. `oracle_action()` double-clicks the launchers in turn (a warm start's opening
move). Exploration rewards come from the method (rl/screen_rewards.py).

Confinement (confine.py, probed once per process). The terminal is a real shell a policy types any command
into, so the desktop's programs -- Xvfb and everything on it -- run without this process's privileges and
without network:

- as root, every program starts through `setpriv` as nobody:nogroup (no groups, no capabilities, an empty
  bounding set, no_new_privs: a setuid program gains nothing); the session's folder stays root's (0711) and
  only its home, run and tmp folders are nobody's. The framebuffer file is handed back to root once Xvfb has
  mapped it, and the guardian's bookkeeping (xserver, session.log) is root's, so a program can neither shrink
  the mapping this process reads nor steer the cleanup, which runs as root. So the shell cannot write /root,
  /etc or the checkout, read /etc/shadow, or signal this process;
- the guardian, and so every program, starts in a network namespace of its own (`unshare --net`; as another
  user `unshare --user --map-current-user --net`, else `-rn`): only a loopback that is down, no route. X
  needs no network: clients fall back from the abstract socket (per namespace) to /tmp/.X11-unix/X<n>, which
  xdotool, run here as this process's user with the cookie, reaches from outside;
- the X server takes connections with the cookie only (no `-ac`): a process without the file cannot reach it.
  <folder>/cookie is root's and readable by the group nogroup (Xvfb and the programs read it, none can change
  it), so this process reads no file the programs can write.

Where the machine refuses a part (no setpriv or user nobody, `unshare` denied), the desktop runs without it
and the first desktop of the process warns once (RuntimeWarning) naming what is missing.

What it does not protect against: the programs still read whatever any user may read (the checkout, when it is
world-readable, /etc/passwd) and write where any user may (/tmp, /var/tmp, /dev/shm); all desktops of the
machine share the user nobody, so one desktop's shell can reach another's folders, cookie, X server and
processes, and any other process of nobody's; it can fill the disk or memory and use the CPUs (no quotas,
no cgroup); a program that drops the marker variable and leaves the session (`env -i setsid ...`) outlives
the desktop's cleanup; and a kernel or X server exploit is out of scope. As another user the programs keep
that user's file access. Run the desktop in a container (or a VM) when that matters.

Cost (2 cores under a load average of 4-8, benchmarks/desktop.py; benchmarks/README.md "Desktop-v0"): a reset
(the old desktop stopped, a new one started and drawn) takes 0.5-0.6 s at 640x480 or 1920x1080; a step's X
work is 8-90 ms (Click / Move ~10, Key ~25, ScrollDown ~57, DoubleClick ~70, Text ~85 at 640x480) plus
`settle_s`; a screenshot is a 0.5 ms (640x480) to 2 ms (1920x1080) copy; an invalid action costs no X time.
The first desktop holds about 90 MiB PSS (shared libraries included), each further one 25-35 MiB before the
policy opens programs. At settle_s 0.3, 4 desktops in 4 processes gave 3.7x the steps/s of one (9.2 steps/s):
the settle time dominates a step.

Nothing here imports jax; `explore_jax.envs` does not import this package until a Desktop-v0 environment is
made. Needs Debian's xvfb, openbox, xdotool, x11-utils, pcmanfm, mousepad, galculator and xterm (`make desktop`).
"""
