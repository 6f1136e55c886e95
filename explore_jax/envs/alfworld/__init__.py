"""ALFWorld-v0: ALFWorld's household tasks in text, on generated or official games.

  generate.py  makes games offline from the alfworld wheel's PDDL domain, grammar and room metadata
               (held-in rooms for train and valid_seen, held-out rooms for valid_unseen), in the
               official json_2.1.1 layout: a game is a pure function of (room, task type, seed)
  games.py     checks each generated game with ALFWorld's planner and writes it into the cache, atomically,
               (EXPLORE_JAX_CACHE), one process per game; `python -m explore_jax.envs.alfworld.games` fills it
  env.py       ALFWorldEnv, the TextEnv (splits, seeds, the state text, the walkthrough oracle)
  worker.py    the game process each environment plays its games in (textworld's PDDL backend)

Importing this package imports neither alfworld nor textworld; env.py imports alfworld's tables (not
textworld), and only the game process and games.py's checks import textworld.
"""
