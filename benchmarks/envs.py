"""Benchmark: environment steps/s, alone and under the ActorPool, and the learner's wait for environments.

For each world (prints, asserts nothing):

  alone      one environment in this process: reset, then step with the driver's action until the episode
             ends, again and again (resets included in the time; the environment's start, e.g. a JVM's, is
             not: it is printed apart as "start s")
  pool N     ActorPool with N actor processes of --envs_per_actor environments each and a policy_fn that
             answers at once; steps/s over all actors, from the pool's wall time of one run of about
             --steps steps per actor (fewer for a slow world: about --max_seconds at N times its alone
             rate), after a warm-up run that starts the environments; a run that dropped episodes
             prints "-" (the Problems list says why)
  waiting    the same pool (N = --wait_actors) with a stand-in for sampling: policy_fn sleeps --sample_ms
             per call; the share of pool.run's wall time the learner is not inside policy_fn (it waits
             for environments, and moves messages)

The driver: no model chooses actions, and the learner cannot (it sees only prompt token ids), so the
actor side does. Every environment is wrapped (`Driven`, registered as DRIVEN_ID) so that each reset and
step also picks the next action: a random one from info["admissible_actions"] where the environment
lists them, the environment's oracle otherwise, and writes it into info["bench_action"]. The prompt hook
(`action_prompt`) puts that action alone in the prompt, and policy_fn (`Echo`) answers by cutting the
chat template's fixed head and tail off the prompt ids: list slicing, no sampling, no decoding. So the
pool's time is the environments' time plus the actor's fixed cost per step (templating and tokenising a
one-line prompt, decoding the answer, pickling the step record, two pipe messages) and the learner's
loop. `Driven` also times its own calls (inner reset/step plus picking the action) and reports the sum
per episode in info["bench_env_s"]; "env share" is that sum over N x wall, the fraction of actor time
spent inside the environments. Actions picked by the oracle (Coding, ScienceWorld without admissible
actions) include the oracle's own cost (ScienceWorld generates its gold path once per episode).

Serialisation: the pool's steps/s at N=2 over N=1 ("N2/N1") says whether two actors step in parallel
on this machine (2.0: fully; 1.0: as if on one core). The CPU count, the cores this process may use and
the load average are printed with it.

  .venv/bin/python benchmarks/envs.py [--worlds keydoor,twx-coin] [--steps 300] [--actors 1,2,4]
      [--envs_per_actor 2] [--sample_ms 20] [--wait_actors 2] [--max_seconds 20]
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import math
import os
import random
import sys
import time
import traceback
from typing import Any, Optional

import gymnasium
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import explore_jax.envs  # noqa: E402,F401  (registers the worlds' ids)
from explore_jax.actors import ActorPool, EpisodeSpec, Response  # noqa: E402

TINY = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "explore_jax", "hf", "assets",
                    "tiny")
DRIVEN_ID = "explore_jax_bench/Driven-v0"


@dataclasses.dataclass(frozen=True)
class World:
  env_id: str
  kwargs: dict[str, Any]
  module: str  # imported first: a world whose module does not import is skipped


WORLDS = {
    "keydoor": World("explore_jax/KeyDoor-v0", {}, "explore_jax.envs.keydoor"),
    "coding": World("explore_jax/Coding-v0", {"dataset": "procedural"}, "explore_jax.envs.coding.env"),
    "twx-coin": World("explore_jax/TextWorldExpress-v0", {"game": "coin"}, "explore_jax.envs.twx"),
    "sciworld-find-plant": World("explore_jax/ScienceWorld-v0", {"task": "find-plant"},
                                 "explore_jax.envs.scienceworld"),
    "sciworld-find-plant-adm": World("explore_jax/ScienceWorld-v0", {"task": "find-plant", "admissible": True},
                                     "explore_jax.envs.scienceworld"),
    "textworld-coin": World("explore_jax/TextWorld-v0",
                            {"challenge": "tw-coin_collector", "num_games": 4, "admissible": True},
                            "explore_jax.envs.textworld"),
    "alfworld-pick": World("explore_jax/ALFWorld-v0",
                           {"task_types": ["pick_and_place_simple"], "num_games": 4, "admissible": True},
                           "explore_jax.envs.alfworld.env"),
    # The eight MiniWoB tasks with an oracle (1-2 steps an episode: resets weigh); the screenshots travel in the
    # step records as they would once actors carry images. benchmarks/miniwob_browser.py measures the browser alone.
    "miniwob-oracle": World("explore_jax/MiniWoB-v0",
                            {"task": ["click-test", "click-test-2", "click-button", "click-link", "click-dialog",
                                      "focus-text", "click-button-sequence", "enter-text"]},
                            "explore_jax.envs.miniwob"),
}


class Driven(gymnasium.Wrapper):
  """A world (with `overrides` of its kwargs) that also picks its next action (info["bench_action"]) and times
  itself (info["bench_env_s"])."""

  def __init__(self, world: str, **overrides: Any):
    spec = WORLDS[world]
    super().__init__(gymnasium.make(spec.env_id, **{**spec.kwargs, **overrides}))
    self.rng = random.Random(0)
    self.env_seconds = 0.0
    self.picker = "?"

  def reset(self, *, seed: Optional[int] = None, options: Optional[dict[str, Any]] = None):
    start = time.perf_counter()
    self.rng.seed(seed)
    observation, info = self.env.reset(seed=seed, options=options)
    self._pick(info)
    self.env_seconds = time.perf_counter() - start
    info["bench_env_s"] = self.env_seconds
    return observation, info

  def step(self, action: Any):
    start = time.perf_counter()
    observation, reward, terminated, truncated, info = self.env.step(action)
    if not (terminated or truncated):
      self._pick(info)
    self.env_seconds += time.perf_counter() - start
    info["bench_env_s"] = self.env_seconds
    return observation, reward, terminated, truncated, info

  def _pick(self, info: dict[str, Any]) -> None:
    listed = info.get("admissible_actions")
    if listed:
      self.picker = "random listed"
      info["bench_action"] = self.rng.choice(listed)
    else:
      self.picker = "oracle"
      info["bench_action"] = self.env.unwrapped.oracle_action()


if DRIVEN_ID not in gymnasium.registry:
  # Spawned actors import this file again (as __mp_main__), which registers the id in them too.
  gymnasium.register(id=DRIVEN_ID, entry_point=Driven)


def action_prompt(observation, history, context, info):
  """The prompt hook: the action the driver picked, alone."""
  return [{"role": "user", "content": info["bench_action"]}]


class Echo:
  """policy_fn: the action in the prompt as the response (the template's head and tail cut off), after an
  optional sleep per call that stands in for sampling."""

  def __init__(self, head: int, tail: int, end_id: int, sleep_s: float = 0.0):
    self.head, self.tail, self.end_id, self.sleep_s = head, tail, end_id, sleep_s

  def __call__(self, requests):
    if self.sleep_s:
      time.sleep(self.sleep_s)
    responses = []
    for r in requests:
      tokens = np.asarray(r.prompt_ids[self.head:len(r.prompt_ids) - self.tail] + [self.end_id], np.int32)
      n = len(tokens)
      responses.append(Response(r.episode_id, r.step, tokens, np.zeros(n, np.float32), np.ones(n, np.float32),
                                np.zeros(n, np.int32), policy_version=0))
    return responses


def template_cut(tokenizer_dir: str) -> tuple[int, int, int]:
  """(head, tail, end id): the chat template's tokens before and after a user message's content."""
  from transformers import AutoTokenizer

  tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True)
  content = "move north"
  text = tokenizer.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True,
                                       tokenize=False)
  ids = tokenizer(text, add_special_tokens=False)["input_ids"]
  inner = tokenizer(content, add_special_tokens=False)["input_ids"]
  heads = [i for i in range(len(ids)) if ids[i:i + len(inner)] == inner]
  if not heads:
    raise SystemExit(f"the chat template's tokens merge with the content's: {ids} has no {inner}")
  head = heads[0]
  end_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
  return head, len(ids) - head - len(inner), end_id


@dataclasses.dataclass
class Row:
  world: str
  picker: str = ""
  start_s: float = math.nan
  alone: float = math.nan        # steps/s
  ms_per_step: float = math.nan
  episode_len: float = math.nan
  pool: dict[int, float] = dataclasses.field(default_factory=dict)        # N -> steps/s
  env_share: dict[int, float] = dataclasses.field(default_factory=dict)   # N -> env time / (N x wall)
  waiting: Optional[dict[str, float]] = None
  problems: list[str] = dataclasses.field(default_factory=list)


def measure_alone(world: str, steps: int, max_seconds: float, warmup: int, row: Row) -> None:
  start = time.perf_counter()
  env = gymnasium.make(DRIVEN_ID, world=world)
  row.start_s = time.perf_counter() - start
  try:
    for seed in range(warmup):  # games generated on first use (TextWorld, ALFWorld) are made here
      play(env, seed)
    done_steps = episodes = 0
    start = time.perf_counter()
    while done_steps < steps and time.perf_counter() - start < max_seconds:
      done_steps += play(env, 1000 + episodes)
      episodes += 1
    wall = time.perf_counter() - start
    row.picker = driver(env).picker
  finally:
    env.close()
  row.alone = done_steps / wall
  row.ms_per_step = 1e3 * wall / done_steps
  row.episode_len = done_steps / episodes


def driver(env: gymnasium.Env) -> Driven:
  while not isinstance(env, Driven):
    env = env.env
  return env


def play(env: gymnasium.Env, seed: int) -> int:
  _, info = env.reset(seed=seed)
  steps, done = 0, False
  while not done:
    _, _, terminated, truncated, info = env.step(info["bench_action"])
    steps += 1
    done = terminated or truncated
  return steps


def specs(world: str, count: int, first_seed: int, first_id: int = 0, **overrides: Any) -> list[EpisodeSpec]:
  """`count` driven episodes of `world` (its kwargs with `overrides`), seeds from `first_seed`."""
  return [EpisodeSpec(episode_id=first_id + i, group_id=first_id + i, traj_id=i, env_id=DRIVEN_ID,
                      env_kwargs={"world": world, **overrides}, seed=first_seed + i) for i in range(count)]


def pool_run(pool: ActorPool, world: str, count: int, first_seed: int, policy: Echo, row: Row, label: str):
  results, metrics = pool.run(specs(world, count, first_seed), policy)
  dropped = [r for r in results if r.dropped]
  if dropped:
    row.problems.append(f"{label}: {len(dropped)} episodes dropped, e.g. {dropped[0].error.splitlines()[0]}")
  invalid = sum(s.format_reward == 0 for r in results for s in r.steps)
  if invalid:
    row.problems.append(f"{label}: {invalid} responses did not parse")
  # Each response must be the action the driver picked in the state before (the step before's info).
  garbled = sum(b.response_text != a.info.get("bench_action") for r in results for a, b in zip(r.steps, r.steps[1:]))
  if garbled:
    row.problems.append(f"{label}: {garbled} responses differ from the driver's action")
  env_seconds = sum(r.steps[-1].info.get("bench_env_s", 0.0) for r in results if r.steps)
  return metrics, env_seconds


def fmt(value: float, digits: int = 0) -> str:
  return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:,.{digits}f}"


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  parser.add_argument("--worlds", default=",".join(WORLDS), help=f"comma-separated, of {', '.join(WORLDS)}")
  parser.add_argument("--steps", type=int, default=300, help="steps per measurement (per actor in a pool)")
  parser.add_argument("--max_seconds", type=float, default=20.0,
                      help="cap per measurement: fewer steps where a world is slow")
  parser.add_argument("--actors", default="1,2,4", help="actor counts N")
  parser.add_argument("--envs_per_actor", type=int, default=2)
  parser.add_argument("--sample_ms", type=float, default=20.0, help="the stand-in sampler's sleep per call")
  parser.add_argument("--wait_actors", type=int, default=2, help="N for the learner-wait measurement")
  parser.add_argument("--warmup", type=int, default=4, help="episodes (seeds 0..) played before timing alone")
  args = parser.parse_args()
  names = [w for w in args.worlds.split(",") if w]
  unknown = [w for w in names if w not in WORLDS]
  if unknown:
    raise SystemExit(f"unknown worlds {unknown}; known: {', '.join(WORLDS)}")
  actor_counts = sorted({int(n) for n in args.actors.split(",")})
  load_start = os.getloadavg()
  rows = {}
  for name in names:
    row = rows[name] = Row(name)
    try:
      importlib.import_module(WORLDS[name].module)
    except Exception as e:  # a world that is not installed (or not written yet) is skipped
      row.problems.append(f"skipped: {WORLDS[name].module} does not import ({type(e).__name__}: {e})")
      continue
    try:
      measure_alone(name, args.steps, args.max_seconds, args.warmup, row)
    except Exception as e:
      row.problems.append(f"alone failed: {type(e).__name__}: {e}")
      traceback.print_exc()
    print(f"alone  {name}: {fmt(row.alone)} steps/s, {fmt(row.ms_per_step, 2)} ms/step, episodes of "
          f"{fmt(row.episode_len, 1)} steps, start {fmt(row.start_s, 2)} s ({row.picker})", flush=True)

  head, tail, end_id = template_cut(TINY)
  instant = Echo(head, tail, end_id)
  sampling = Echo(head, tail, end_id, sleep_s=args.sample_ms / 1e3)
  live = [n for n in names if not math.isnan(rows[n].alone)]
  for count in sorted(set(actor_counts) | {args.wait_actors}):
    start = time.perf_counter()
    with ActorPool(num_actors=count, tokenizer_dir=TINY, prompt_hook=action_prompt,
                   envs_per_actor=args.envs_per_actor, episode_timeout_s=300.0) as pool:
      print(f"pool of {count} actors started in {time.perf_counter() - start:.1f} s", flush=True)
      for name in live:
        row = rows[name]
        slots = count * args.envs_per_actor
        try:
          pool_run(pool, name, slots, 0, instant, row, f"N={count} warm-up")  # starts every slot's env
          # About `steps` steps per actor, fewer where N times the alone rate would take more than max_seconds
          # (a slow world; the pool is never faster per actor than the world alone), but 2 episodes per slot.
          rate = count * row.alone
          target = min(count * args.steps, rate * args.max_seconds)
          episodes = max(2 * slots, math.ceil(target / row.episode_len))
          if count in actor_counts:
            metrics, env_seconds = pool_run(pool, name, episodes, 1000, instant, row, f"N={count}")
            if not metrics["episodes_dropped"]:  # a rate with dropped episodes would mislead: "-"
              row.pool[count] = metrics["steps"] / metrics["wall_seconds"]
              row.env_share[count] = env_seconds / (count * metrics["wall_seconds"])
            print(f"pool   {name} N={count}: {metrics['steps'] / metrics['wall_seconds']:,.0f} steps/s over "
                  f"{metrics['steps']} steps, env share {env_seconds / (count * metrics['wall_seconds']):.2f}, "
                  f"mean batch {metrics['mean_batch_size']:.1f}, dropped {metrics['episodes_dropped']}", flush=True)
          if count == args.wait_actors:
            # Calls answer one to two requests each at these rates (measured), so the sleeps bound the rate
            # at about `count` requests per call.
            bound = count / (args.sample_ms / 1e3) if args.sample_ms > 0 else math.inf
            target = min(count * args.steps, min(rate, bound) * args.max_seconds)
            waited = max(slots, math.ceil(target / row.episode_len))
            metrics, env_seconds = pool_run(pool, name, waited, 5000, sampling, row, f"N={count} sampling")
            wall = metrics["wall_seconds"]
            if metrics["episodes_dropped"]:
              continue
            row.waiting = dict(wall=wall, policy=metrics["policy_seconds"], waited=metrics["wait_seconds"],
                               calls=metrics["policy_calls"], batch=metrics["mean_batch_size"],
                               steps=metrics["steps"], env_share=env_seconds / (count * wall))
            print(f"sample {name} N={count}: wall {wall:.2f} s, in policy_fn {metrics['policy_seconds']:.2f} s "
                  f"({metrics['policy_calls']} calls), waiting {metrics['wait_seconds']:.2f} s", flush=True)
        except Exception as e:
          row.problems.append(f"N={count} failed: {type(e).__name__}: {e}")
          traceback.print_exc()
  load_end = os.getloadavg()

  cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
  print()
  print(f"CPUs: os.cpu_count()={os.cpu_count()}, usable by this process={cores}; load average (1 min) "
        f"{load_start[0]:.1f} at the start, {load_end[0]:.1f} at the end; envs_per_actor={args.envs_per_actor}, "
        f"steps={args.steps}, max_seconds={args.max_seconds:g}")
  print()
  columns = "".join(f" pool N={n} |" for n in actor_counts)
  print(f"| world | actions | start s | alone steps/s | ms/step | episode len |{columns} N2/N1 | env share "
        f"N={'/'.join(map(str, actor_counts))} |")
  print("|---" * (8 + len(actor_counts)) + "|")
  for name, row in rows.items():
    ratio = row.pool[2] / row.pool[1] if 1 in row.pool and 2 in row.pool else math.nan
    pools = "".join(f" {fmt(row.pool.get(n, math.nan))} |" for n in actor_counts)
    shares = "/".join(fmt(row.env_share.get(n, math.nan), 2) for n in actor_counts)
    print(f"| {name} | {row.picker or '-'} | {fmt(row.start_s, 1)} | {fmt(row.alone)} | {fmt(row.ms_per_step, 2)} | "
          f"{fmt(row.episode_len, 1)} |{pools} {fmt(ratio, 2)} | {shares} |")
  print()
  print(f"Learner waiting, N={args.wait_actors} actors x {args.envs_per_actor} envs, policy_fn sleeping "
        f"{args.sample_ms:g} ms per call:")
  print()
  print("| world | steps | wall s | in policy_fn s | calls | mean batch | learner not sampling | "
        "learner blocked waiting | env steps/s | env share |")
  print("|---" * 10 + "|")
  for name, row in rows.items():
    w = row.waiting
    if w is None:
      print(f"| {name} |" + " - |" * 9)
      continue
    print(f"| {name} | {w['steps']} | {w['wall']:.2f} | {w['policy']:.2f} | {w['calls']} | {w['batch']:.1f} | "
          f"{1 - w['policy'] / w['wall']:.0%} | {w['waited'] / w['wall']:.0%} | {w['steps'] / w['wall']:,.0f} | "
          f"{w['env_share']:.2f} |")
  problems = [f"{name}: {p}" for name, row in rows.items() for p in row.problems]
  if problems:
    print()
    print("Problems:")
    for line in problems:
      print(f"  {line}")


if __name__ == "__main__":
  main()
