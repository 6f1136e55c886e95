"""Java worlds under the ActorPool: a JVM killed mid-episode, the heap cap from the config, one JVM per env.

TextWorld-Express coin (the twx config's small house, valid actions listed) on 2 actors x 2 environments.
The central policy is scripted: it reads the prompt's "Actions: ..." line and answers one of those actions
(never "take coin", so every episode runs to its step limit and lengths are known). The JVMs are found as
the java child processes of the actor processes (psutil); each environment's kwargs carry a `heap`, which
shows on its JVM's command line as -Xmx<heap>: an episode whose kwargs differ only in the heap gets an
environment of its own, so its JVM can be told apart from the others'.

The first test plays on a pool of its own and closes it; one module pool (actors and JVMs take seconds to
start) serves the others, and no java process may outlive the module.
"""

import os

import numpy as np
import psutil
import pytest
from transformers import AutoTokenizer

from configs import textworlds
from explore_jax.actors import ActorPool, EpisodeSpec, Response
from explore_jax.train import rollout
from tests.actors import actor_fixtures
from tests.polling import wait_until

TINY = os.path.join(os.path.dirname(__file__), "..", "..", "explore_jax", "hf", "assets", "tiny")
IM_END = 3
HEAP = "200m"
VICTIM_HEAP = "201m"  # only the episode whose JVM gets killed uses it


def config_specs(heap=HEAP, num_tasks=2, group_size=2):
  """The twx config's episodes for iteration 0, with `heap` added to the config's env kwargs."""
  config = textworlds.get_config("grpo", "twx")
  config.env.kwargs.heap = heap
  config.rollout.num_tasks, config.rollout.group_size = num_tasks, group_size
  return rollout.episode_specs(config, None, 0, evaluation=False)


BASE = config_specs()[0]
MAX_STEPS = BASE.env_kwargs["max_steps"]


def make_specs(ids, heaps=None):
  """Episodes of the config's environment; `heaps` maps an episode id to a heap of its own."""
  heaps = heaps or {}
  return [EpisodeSpec(episode_id=i, group_id=i, traj_id=i, env_id=BASE.env_id,
                      env_kwargs={**BASE.env_kwargs, "heap": heaps.get(i, HEAP)}, seed=100 + i)
          for i in ids]


@pytest.fixture(scope="module")
def tokenizer():
  return AutoTokenizer.from_pretrained(TINY, local_files_only=True)


class ValidActions:
  """The scripted central policy: one of the actions the prompt lists, by (episode, step); never "take coin"."""

  def __init__(self, tokenizer, before_answering=None):
    self.tokenizer = tokenizer
    self.before_answering = before_answering
    self.calls = 0

  def __call__(self, requests):
    self.calls += 1
    if self.before_answering is not None:
      self.before_answering(requests)
    responses = []
    for r in requests:
      text = self.tokenizer.decode(r.prompt_ids)
      listed = [line for line in text.splitlines() if line.startswith("Actions: ")]
      assert listed, f"no action list in the prompt of episode {r.episode_id} step {r.step}: {text!r}"
      actions = [a for a in listed[-1][len("Actions: "):].rstrip(".").split(", ") if a != "take coin"]
      action = actions[(r.episode_id + r.step) % len(actions)]
      tokens = np.asarray(self.tokenizer(action, add_special_tokens=False)["input_ids"] + [IM_END], np.int32)
      n = len(tokens)
      responses.append(Response(r.episode_id, r.step, tokens, np.zeros(n, np.float32), np.ones(n, np.float32),
                                np.zeros(n, np.int32), policy_version=0))
    return responses


def _is_java(process):
  try:
    command = process.cmdline()
  except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
    return False
  return bool(command) and os.path.basename(command[0]) == "java"


def jvms_by_actor(pool):
  """{actor pid: [its java child processes]}."""
  found = {}
  for pid in pool.actor_pids():
    try:
      found[pid] = [p for p in psutil.Process(pid).children() if _is_java(p)]
    except psutil.NoSuchProcess:
      found[pid] = []
  return found


def my_jvms():
  """Every java process descended from this test process, however deep."""
  return [p for p in psutil.Process().children(recursive=True) if _is_java(p)]


def gone(pid):
  """True once no process `pid` exists, not even a zombie."""
  try:
    psutil.Process(pid)
  except psutil.NoSuchProcess:
    return True
  return False


def assert_completed(result):
  """Played to its step limit with actions the world took (none refused)."""
  assert result.error is None, result.error
  assert len(result.steps) == MAX_STEPS and result.steps[-1].done
  assert all(s.format_reward == 1.0 for s in result.steps)
  assert not any("is not a valid action" in s.observation for s in result.steps[1:])
  assert not any(s.response_text == "take coin" for s in result.steps)


@pytest.fixture(scope="module")
def pool():
  with ActorPool(num_actors=2, tokenizer_dir=TINY, prompt_hook=actor_fixtures.prompt, envs_per_actor=2) as p:
    yield p


@pytest.fixture(scope="module", autouse=True)
def no_jvm_left():
  """Set up first, torn down last: no java process of this module outlives it."""
  yield
  left = my_jvms()
  assert wait_until(lambda: not my_jvms(), 10.0), [p.cmdline() for p in left]


def test_one_jvm_per_environment_all_in_actors_and_none_after_close(tokenizer):
  """Its own pool, before the module's starts: every java process below this one is this pool's."""
  live, seen = [], set()

  def count_once_all_four_have_asked(requests):
    # Each episode that has asked holds an environment, kept (cached) by its actor even once it is over.
    seen.update(r.episode_id for r in requests)
    if not live and len(seen) == 4:
      live.append({pid: [p.pid for p in found] for pid, found in jvms_by_actor(own).items()})

  with ActorPool(num_actors=2, tokenizer_dir=TINY, prompt_hook=actor_fixtures.prompt, envs_per_actor=2) as own:
    actors = set(own.actor_pids())
    results, _ = own.run(make_specs(range(4)), ValidActions(tokenizer, count_once_all_four_have_asked))
    for result in results:
      assert_completed(result)
    assert live, "not all four episodes asked"
    during = live[0]
    assert set(during) == actors and sorted(len(pids) for pids in during.values()) == [2, 2]
    jvm_pids = {pid for pids in during.values() for pid in pids}
    # After the run the four environments stay cached in their actors, the same JVMs still running.
    assert {p.pid for found in jvms_by_actor(own).values() for p in found} == jvm_pids
    assert {p.pid for p in my_jvms()} == jvm_pids
    assert all(psutil.Process(pid).ppid() in actors for pid in jvm_pids)
  assert wait_until(lambda: all(gone(pid) for pid in jvm_pids), 10.0)
  assert not my_jvms()


def test_the_heap_cap_in_the_configs_env_kwargs_reaches_each_jvm(pool, tokenizer):
  specs = config_specs(heap=HEAP)
  assert len(specs) == 4 and all(s.env_kwargs["heap"] == HEAP for s in specs)
  results, metrics = pool.run(specs, ValidActions(tokenizer))
  for result in results:
    assert_completed(result)
  # The environments stay cached in their actors, JVMs running, after the run.
  jvms = [p for found in jvms_by_actor(pool).values() for p in found]
  assert jvms
  for process in jvms:
    command = process.cmdline()
    assert f"-Xmx{HEAP}" in command, command
    assert not any(arg.startswith("-Xmx") and arg != f"-Xmx{HEAP}" for arg in command), command


def test_a_jvm_killed_mid_episode_drops_only_its_episode_and_the_actor_goes_on(pool, tokenizer):
  victim = 1
  pids = pool.actor_pids()
  killed = {}

  def kill_the_victims_jvm(requests):
    if killed or not any(r.episode_id == victim and r.step == 2 for r in requests):
      return
    # The victim waits for its step-2 action, mid-episode: its JVM is the one with its own heap cap.
    owners = {p.pid: actor for actor, found in jvms_by_actor(pool).items() for p in found
              if f"-Xmx{VICTIM_HEAP}" in p.cmdline()}
    assert len(owners) == 1, owners
    (jvm, owner), = owners.items()
    assert owner == pids[next(r.actor_id for r in requests if r.episode_id == victim)]
    psutil.Process(jvm).kill()
    # Answered at once: the step races the death (py4j's reader thread may still be reaping the JVM, and
    # Popen.poll() would call it running), and must still be told that the JVM died.
    killed.update(pid=jvm, actor=owner)

  specs = make_specs(range(6), heaps={victim: VICTIM_HEAP})
  results, metrics = pool.run(specs, ValidActions(tokenizer, kill_the_victims_jvm))
  assert killed, "the victim never asked for its step-2 action"
  assert [r.spec.episode_id for r in results] == list(range(6))
  dropped = results[victim]
  assert dropped.dropped and dropped.steps == []
  assert "env.step raised JavaWorldError" in dropped.error
  assert "the JVM died (exit code -9)" in dropped.error, dropped.error
  for result in results:
    if result.spec.episode_id != victim:
      assert_completed(result)
  assert metrics["episodes_dropped"] == metrics["dropped_by_env_errors"] == 1
  assert metrics["actor_restarts"] == 0 and pool.actor_pids() == pids
  # The actor reaped the dead JVM and threw its environment away.
  assert gone(killed["pid"])
  assert all(killed["pid"] != p.pid for found in jvms_by_actor(pool).values() for p in found)

  # The next run plays every episode, the victim's kwargs included: a new environment, with a new JVM.
  replacements = []

  def note_the_replacement(requests):
    if any(r.episode_id == 11 and r.step == 1 for r in requests):
      replacements.extend(p.pid for found in jvms_by_actor(pool).values() for p in found
                          if f"-Xmx{VICTIM_HEAP}" in p.cmdline())

  again = make_specs(range(10, 14), heaps={11: VICTIM_HEAP})
  results, metrics = pool.run(again, ValidActions(tokenizer, note_the_replacement))
  for result in results:
    assert_completed(result)
  assert len(replacements) == 1 and replacements[0] != killed["pid"]
  assert metrics["episodes_done"] == 4 and metrics["actor_restarts"] == 0 and pool.actor_pids() == pids


