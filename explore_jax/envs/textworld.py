"""TextWorld: Microsoft's procedurally generated text adventures, generated offline and cached.

Challenges (`challenge`) and their settings (`settings`: a dict or a "name=value,..." string; names
left out keep the defaults shown; an unknown name or a bad value raises ValueError naming it):

  tw-simple           rewards="dense" (dense|balanced|sparse), goal="detailed" (detailed|brief|
                      none): one house; find the food the objective names, put it on the stove
  tw-cooking          recipe=1 (ingredients, 1-5), take=1 (of them to find, 0-recipe), go=1 (rooms:
                      1, 6, 9 or 12), open, cook, cut, drop (all False: whether containers and doors
                      must be opened, food cooked, food cut, the inventory is limited): read the
                      cookbook, prepare the meal, eat it (the First TextWorld Problems' games)
  tw-coin_collector   level=5 (1-300; levels making more than 100 rooms, e.g. 151, are refused): a
                      chain of rooms with the coin at its end (distractor rooms from level 101)
  tw-treasure_hunter  level=5 (1-30; 5, 10 or 20 rooms; closed doors and containers from level 11,
                      locked ones from 21): take the object the objective names, not the other one

Games and splits: a game is the challenge's generator run with one integer seed. A split has
`num_games` games (at most 10,000) with seeds of its own: train 0, 1, ...; dev 10000, ...; test
20000, .... Where a challenge has held-out distributions of its own they follow the split:
tw-cooking draws its foods and preparations from its "train", "valid" (dev) or "test" subsets, and
tw-simple's test games use its test foods. A seeded reset plays the split's game `seed % num_games`
(`task_index`), `reset(options={"task_index": i})` plays game i, an unseeded reset draws one. The
task id is "<challenge>(<all settings>):<game seed>", e.g. "tw-coin_collector(level=5):3". Small
settings make few distinct games (tw-simple has one map with six foods that swap places and two
places for its key; coin_collector level 1 is one room), so different seeds, of one split or of
two, can make games that play alike.

Generation and the cache: textworld_games.py. A game is generated on first use (by reset, or `prepare()`
for many at once) into `<cache_dir>/textworld/<challenge>-<hash of its settings>/<game seed>/`.

Observation: the raw observation (hashed into `state_key`) is the state without history: the
objective, the current room's description, the inventory and the score, e.g. tw-coin_collector,
level 5, train game 0:

  Objective: You are now playing a fast paced round of TextWorld! First stop, head west. ...

  -= Cellar =-
  You are in a cellar. A normal one.

  You don't like doors? Why not try going west, that entranceway is unguarded.

  You are carrying nothing.
  Score: 0 of 1.

TextWorld's answer to a command says only what the command did, so after a step it is shown above
the raw observation (TextEnv's message), without the prompt and status line and without a copy of
the room description that the raw observation already holds ("look" and moving between rooms
answer with it), e.g. "You take the coin.\n\nYour score has just gone up by one point." The
description and the inventory are the game's own (`EnvInfos(description=True, inventory=True)`:
the game prints them after every turn), so returning to an earlier state gives the same raw
observation and state key.

Response format: exactly one command on one line, as in java.py: surrounding whitespace, runs of
whitespace inside it and letter case are forgiven; an empty response, more than one non-empty line,
characters outside printable ASCII, more than `MAX_ACTION_CHARS` characters, or a "." or "then"
(the game would run each part as a command of its own, and the description and inventory it prints
would be garbled) make an invalid action (TextEnv: nothing changes, format reward 0, the observation
names the expected form). Every other command goes to the game, which answers in its own words
("That's not a verb I recognise.", "You can't see any such thing.", "You can't go that way."):
TextWorld has no cheap list to check commands against, and its answers teach its grammar. Inputs
the game does not understand take no turn and change nothing. Out-of-game commands (restart, quit,
save, restore, undo, again, oops, transcripts, verbosity, score notification, ...) and TextWorld's
debug commands ("tw-...") are refused without reaching the game, with a message above the unchanged
raw observation (format reward 1, reward 0): "restart" and "quit" leave the game waiting for a yes
or a no, and after a restart the description, inventory and score it reports are stale.

Admissible commands: TextWorld lists them by tracking the game's logical state beside it (a
`GameProgression` and Inform 7 event tracing), which makes steps 25-30% slower, so only an
environment made with `admissible=True` asks for them: `info["admissible_actions"]` is then the
sorted list, lower-cased as responses are; otherwise `admissible_actions()` is None. Commands are
never checked against the list.

Reward, success, termination: `info["score"]` is the game's score over its maximum (1.0 once won);
the reward is its change, so a won game returns 1.0 (scores only go up in these games). `success`
is TextWorld's `won`; the episode terminates when the game is won or lost (tw-simple's food eaten,
a cooking ingredient prepared the wrong way, treasure_hunter's other object taken, ...).

Oracle: the game's walkthrough (TextWorld's: the challenge maker's, or its quest's winning policy),
less the commands that were not admissible when the walkthrough reached them (tw-cooking's open
containers that are already open, 0-10 a game), provided it still wins; lower-cased as responses
are. `oracle_action()` gives its next command as long as the episode has followed it: inputs the
game did not understand and refused commands do not count, any other command leaves it. Gold paths:
with the defaults, tw-simple 8-12 commands, tw-cooking 5, coin_collector 5, treasure_hunter 3;
tw-cooking recipe=3,go=9 with every skill 30-49, recipe=5,go=12 42-57; coin_collector level 150:
50; treasure_hunter level 30: 7-20 (give such episodes a larger `max_steps`).

The game runs in this process: TextWorld 1.7 plays .z8 games through jericho, a Z-machine
interpreter in a C library of which each environment loads a copy of its own, so there is no game
process to die. Any failure in play (TextWorld or jericho raising, a game found closed) raises
`TextWorldError` and closes the game; the next reset() loads it again. Measured with the defaults
(random admissible commands, resets included, per CPU second): 230-460 steps (160-350 with
`admissible=True`; tw-coin_collector the fastest, tw-cooking the slowest), a reset 5-11 ms (twice
that when it switches games). Importing this module takes ~0.7 s, after which the process holds
~70 MB; an environment adds ~2 MB.

Nothing here imports jax, and `explore_jax.envs` does not import this module (nor textworld) until
a TextWorld environment is made.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, Iterable

from explore_jax.envs.base import (Outcome, TextEnv, excerpt, next_gold_action, one_line_action, task_index,
                                   with_actions, world_text)
from explore_jax.envs.textworld_games import (EMULATOR_SEED, MAX_GAMES, SPLIT_FIRST_SEED, SPLITS, TextWorldError,
                                              canonical, challenge_settings, default_cache_dir, games_dir,
                                              generate_games, generator_settings, load_game, start_game)

# Out-of-game verbs of Inform 7 and its parser (a command's first word): refused (see above).
META_VERBS = frozenset({
    "quit", "q", "die", "restart", "save", "restore", "undo", "again", "g", "oops", "o", "script",
    "transcript", "unscript", "noscript", "verify", "version", "notify", "brief", "normal", "long",
    "verbose", "superbrief", "short", "score", "full", "fullscore", "pronouns", "nouns"})
_CHAINED = re.compile(r"\.|\bthen\b")
_END_QUESTION = "Would you like to RESTART, RESTORE a saved game, QUIT or UNDO the last command?"


def _clean(text: Any, limit: int = 6_000) -> str:
  """Game text as it goes into an observation (`world_text`), also without spaces at the start of its
  lines and with at most one blank line in a row."""
  lines = [line.strip() for line in str(text or "").replace("\r\n", "\n").split("\n")]
  return world_text(re.sub(r"\n{3,}", "\n\n", "\n".join(lines)), limit)


def _answer(feedback: Any, description: str) -> str:
  """TextWorld's answer to a command, without the prompt and status line, the end-of-game
  question, or a copy of the room description."""
  text = str(feedback or "")
  text = re.sub(r"(?:^|\n)>[^\n]*\s*\Z", "", text)  # the prompt, then the status line
  text = _clean(text.replace(_END_QUESTION, ""))
  if description and description in text:
    text = _clean(text.replace(description, "", 1))
  return text


class TextWorldEnv(TextEnv):
  """One TextWorld challenge with fixed settings, played one generated game per episode.

  Args:
    challenge: one of textworld_games.CHALLENGES.
    settings: the challenge's settings, a dict or "name=value,..." (textworld_games.DEFAULT_SETTINGS).
    split: "train", "dev" or "test": which game seeds resets draw from.
    num_games: the split's number of games (1 to 10,000).
    admissible: whether `info["admissible_actions"]` lists the game's admissible commands.
    list_actions: whether the raw observation ends with them ("Actions: a, b, c."; implies
      `admissible`), as TextWorld-Express's and KeyDoor's can: a small policy picks from the list.
    max_steps: step limit.
    cache_dir: where games are generated and kept (default $EXPLORE_JAX_CACHE or
      ~/.cache/explore_jax; games go under its textworld/ folder).
    render_mode: None or "ansi".
  """

  response_format = 'Reply with exactly one command on one line, e.g. "go east".'

  def __init__(self, challenge: str = "tw-cooking", settings: dict[str, Any] | str = "",
               split: str = "train", num_games: int = 1000, admissible: bool = False,
               list_actions: bool = False, max_steps: int = 100, cache_dir: str | None = None,
               render_mode: str | None = None):
    full = challenge_settings(challenge, settings)
    if split not in SPLITS:
      raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if isinstance(num_games, bool) or not isinstance(num_games, int) or not (
        1 <= num_games <= MAX_GAMES):
      raise ValueError(f"num_games must be an int in [1, {MAX_GAMES}], got {num_games!r}")
    super().__init__(max_steps=max_steps, render_mode=render_mode)
    self.challenge = challenge
    self.settings = full
    self.split = split
    self.list_actions = bool(list_actions)
    self.admissible = bool(admissible) or self.list_actions
    first = SPLIT_FIRST_SEED[split]
    self.split_games = list(range(first, first + num_games))  # the games' generator seeds
    self.made_settings = generator_settings(challenge, full, split)
    self.cache_dir = os.path.abspath(cache_dir) if cache_dir else default_cache_dir()
    self.games_dir = games_dir(self.cache_dir, challenge, self.made_settings)
    self.game_index = 0
    self.game_seed: int | None = None
    self.objective = ""
    self.description = ""
    self.inventory = ""
    self.raw_score = 0
    self.max_score = 1
    self.moves = 0                 # the game's turn counter (inputs it did not understand: none)
    self.won = False
    self.lost = False
    self.history: list[str] = []   # the commands that took a turn this episode
    self.last_answer = ""
    self._admissible: list[str] = []
    self._game: Any = None         # the TextWorld environment (jericho under TextWorld's wrappers)
    self._loaded: str | None = None
    self._meta: dict[int, dict[str, Any]] = {}
    self._gold: list[str] = []
    self._gold_pos: int | None = 0
    self._credited = 0.0
    self._seed: int | None = None

  # ---- games and the cache ----------------------------------------------------------------------

  @property
  def num_tasks(self) -> int:
    return len(self.split_games)

  def game_dir(self, index: int) -> str:
    return os.path.join(self.games_dir, str(self.split_games[index]))

  def game_job(self, index: int) -> tuple[str, str, dict[str, Any], int]:
    """What `generate_games` needs to make game `index`."""
    return self.game_dir(index), self.challenge, self.made_settings, self.split_games[index]

  def has_game(self, index: int) -> bool:
    return os.path.isfile(os.path.join(self.game_dir(index), "meta.json"))

  def game_path(self, index: int) -> str:
    """Game `index`'s story file, generated first if the cache lacks it."""
    if not self.has_game(index):
      generate_games([self.game_job(index)])
    return os.path.join(self.game_dir(index), "game.z8")

  def prepare(self, indices: Iterable[int] | None = None, workers: int = 1) -> int:
    """Generate the split's games that the cache lacks (all, or `indices`) in up to `workers`
    child processes. Returns how many were missing."""
    todo = [i for i in (range(self.num_tasks) if indices is None else indices)
            if not self.has_game(i)]
    generate_games([self.game_job(i) for i in todo], workers)
    return len(todo)

  def _game_meta(self, index: int) -> dict[str, Any]:
    if index not in self._meta:
      with open(os.path.join(self.game_dir(index), "meta.json")) as f:
        self._meta[index] = json.load(f)
    return self._meta[index]

  # ---- the game ---------------------------------------------------------------------------------

  def _load(self, path: str) -> Any:
    if self._game is None:
      self._game = start_game(path, self.admissible)
    elif self._loaded != path:
      load_game(self._game, path)
    self._loaded = path
    frotz = getattr(self._game.unwrapped, "_jericho", None)
    cache = getattr(frotz, "_cache", None)
    if isinstance(cache, dict):  # jericho keeps every story file it loaded: keep only this one
      for other in [p for p in cache if p != path]:
        del cache[other]
    self._game.seed(EMULATOR_SEED)  # a load forgets the seed; reset applies it
    return self._game.reset()

  def _close_game(self) -> None:
    game, self._game, self._loaded = self._game, None, None
    if game is not None:
      try:
        game.close()
      except Exception:  # already broken: it is dropped either way
        pass

  def _update(self, state: Any) -> None:
    self.objective = _clean(state["objective"])
    self.description = _clean(state["description"])
    self.inventory = _clean(state["inventory"])
    self.raw_score = int(state["score"] or 0)
    self.max_score = max(int(state["max_score"] or 0), 1)
    self.moves = int(state["moves"] or 0)
    self.won, self.lost = bool(state["won"]), bool(state["lost"])
    if self.admissible:
      self._admissible = sorted({canonical(c) for c in state["admissible_commands"] or ()})

  @property
  def score(self) -> float:
    return 1.0 if self.won else min(self.raw_score / self.max_score, 1.0)

  # ---- TextEnv ----------------------------------------------------------------------------------

  def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
    self._seed = seed
    return super().reset(seed=seed, options=options)

  def _reset_task(self, options: dict[str, Any]) -> str:
    self.game_index = task_index(options, self._seed, self.num_tasks, self.np_random)
    self.game_seed = self.split_games[self.game_index]
    path = self.game_path(self.game_index)
    meta = self._game_meta(self.game_index)
    self._gold = [canonical(c) for c in meta["walkthrough"]]
    self._gold_pos, self.history, self.last_answer = 0, [], ""
    for attempt in range(2):  # a game found broken is dropped and loaded afresh once
      try:
        state = self._load(path)
        break
      except Exception as e:
        self._close_game()
        if attempt:
          raise TextWorldError(f"TextWorld {self.task_name()}: the game did not start "
                               f"({type(e).__name__}: {e})") from e
    self._update(state)
    self._credited = self.score
    return self.task_name()

  def task_name(self) -> str:
    settings = ",".join(f"{k}={int(v) if isinstance(v, bool) else v}"
                        for k, v in sorted(self.settings.items()))
    return f"{self.challenge}({settings}):{self.game_seed}"

  def raw_observation(self) -> str:
    parts = [f"Objective: {self.objective}"] if self.objective else []
    parts.append(self.description)
    parts.append(f"{self.inventory}\nScore: {self.raw_score} of {self.max_score}.")
    text = "\n\n".join(p for p in parts if p)
    return with_actions(text, self._admissible) if self.list_actions else text

  def parse_action(self, text: str) -> tuple[str | None, str]:
    action, error = one_line_action(text, "command")
    if action is not None and _CHAINED.search(action):
      return None, (f'The command "{excerpt(action)}" chains commands with "." or "then"; send '
                    "one command.")
    return action, error

  def _refusal(self, action: str) -> str:
    verb = action.split()[0]
    if verb.startswith("tw-") or verb in META_VERBS:
      return (f'"{excerpt(action)}" is not passed to the game: out-of-game commands (restart, '
              "save, undo, ...) are not available.")
    return ""

  def _apply(self, action: str) -> Outcome:
    refusal = self._refusal(action)
    if refusal:
      return Outcome(message=refusal)
    if self._game is None:
      raise TextWorldError(f"TextWorld {self.task_id}: no game is running (it failed); reset() "
                           "loads it again")
    moves = self.moves
    try:
      state, _, _ = self._game.step(action)
      self._update(state)
    except Exception as e:
      self._close_game()
      raise TextWorldError(f"TextWorld {self.task_id}: the game failed during step "
                           f"({type(e).__name__}: {e}); the next reset() loads it again") from e
    if self.moves != moves or self.won or self.lost:  # the game took a turn: the command counts
      self.history.append(action)
      if self._gold_pos is not None:
        on_path = self._gold_pos < len(self._gold) and self._gold[self._gold_pos] == action
        self._gold_pos = self._gold_pos + 1 if on_path else None
    self.last_answer = _answer(state["feedback"], self.description)
    score = self.score
    reward, self._credited = score - self._credited, score
    return Outcome(reward=reward, success=self.won, terminated=self.won or self.lost,
                   message=self.last_answer)

  def admissible_actions(self) -> list[str] | None:
    return list(self._admissible) if self.admissible else None

  def _feedback(self, truncated: bool) -> str:
    if self.success:
      return f"Success: the game was won in {self.steps} steps."
    if self.lost:
      return (f"Failure: the game was lost after {self.steps} steps. Its last answer: "
              f"{excerpt(self.last_answer, 200)}")
    return (f"Failure: out of steps with the game unfinished (score {self.raw_score} of "
            f"{self.max_score}).")

  def _extra_info(self) -> dict[str, Any]:
    return {"score": float(self.score)}

  def oracle_action(self) -> str:
    """The walkthrough's next command, as the exact response text (while the episode follows it)."""
    return next_gold_action(self._gold, self._gold_pos, self.task_id, "walkthrough")

  def close(self) -> None:
    self._close_game()
