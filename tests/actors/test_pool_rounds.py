"""ActorPool's multi-process rounds without jax: two pools on two threads stand for two processes, joined by
an in-memory allgather. Each plays its share of the specs, both make the same policy calls, both return
every result, and faults stay with the process whose actor failed.

tests/parallel/test_multihost_actors.py runs the same protocol across real processes with the tiny model.
"""

import concurrent.futures
import dataclasses
import os
import pickle
import signal
import threading

import pytest

from explore_jax.actors import ActorPool
from tests.actors import actor_fixtures
from tests.actors.test_pool import TINY, ScriptedPolicy, adjusted, check_against_replay, content, make_specs

PROCESSES = 2
BARRIER_TIMEOUT_S = 300  # generous: a loaded machine must still pass; a broken protocol fails instead of hanging


class Hub:
  """Where the threads meet: every allgather waits for all of them, then each reads every contribution."""

  def __init__(self, count):
    self.slots = [None] * count
    self.barrier = threading.Barrier(count, timeout=BARRIER_TIMEOUT_S)
    self.calls = [0] * count


@dataclasses.dataclass
class ThreadExchange:
  """The pool's `exchange` for one thread; objects travel pickled, as they would between processes."""
  hub: Hub
  process_index: int

  @property
  def process_count(self):
    return len(self.hub.slots)

  def allgather(self, obj):
    self.hub.calls[self.process_index] += 1
    self.hub.slots[self.process_index] = pickle.dumps(obj)
    self.hub.barrier.wait()
    views = [pickle.loads(blob) for blob in self.hub.slots]
    self.hub.barrier.wait()  # nobody writes the next round before everyone has read this one
    return views


@pytest.fixture(scope="module")
def tokenizer():
  from transformers import AutoTokenizer

  return AutoTokenizer.from_pretrained(TINY, local_files_only=True)


@pytest.fixture(scope="module")
def pools():
  hub = Hub(PROCESSES)
  made = []
  try:
    for i in range(PROCESSES):
      made.append(ActorPool(num_actors=1, tokenizer_dir=TINY, prompt_hook=actor_fixtures.logged_prompt,
                            envs_per_actor=2, max_prompt_tokens=128, exchange=ThreadExchange(hub, i)))
    yield made
  finally:
    for pool in made:
      pool.close()


def logged_specs(n, log_dir, **kwargs):
  return [dataclasses.replace(s, context={"log_dir": str(log_dir), "episode": s.episode_id})
          for s in make_specs(n, **kwargs)]


def run_all(pools, specs, policies, **kwargs):
  """Every pool's run on its own thread; -> [(results, metrics) or the exception it raised]."""
  with concurrent.futures.ThreadPoolExecutor(len(pools)) as threads:
    futures = [threads.submit(pool.run, specs, policy, **kwargs) for pool, policy in zip(pools, policies)]
    outcomes = []
    for future in futures:
      try:
        outcomes.append(future.result())
      except Exception as e:
        outcomes.append(e)
  return outcomes


def calls(policy):
  """The policy's calls: the (episode, step) of each request, in the order it got them."""
  by_call = {}
  for call, episode, step, _ in policy.seen:
    by_call.setdefault(call, []).append((episode, step))
  return [by_call[c] for c in sorted(by_call)]


def test_each_process_plays_its_share_and_returns_every_result(pools, tokenizer, tmp_path):
  specs = logged_specs(9, tmp_path)
  policies = [ScriptedPolicy(tokenizer, specs) for _ in pools]
  (results0, metrics0), (results1, metrics1) = run_all(pools, specs, policies)
  # Shares by position: process p's actors started exactly the specs at p, p + 2, p + 4, ...
  for p, pool in enumerate(pools):
    assert actor_fixtures.played(tmp_path, pool.actor_pids()) == [s.episode_id for s in specs[p::PROCESSES]]
  # Every process returns every result, the same, as a local replay plays it.
  assert [r.spec for r in results0] == specs and content(results0) == content(results1)
  for result in results0:
    check_against_replay(result, tokenizer)
  # The same policy calls in every process, each sorted by (episode, step), holding both processes' requests.
  assert calls(policies[0]) == calls(policies[1])
  assert all(call == sorted(call) for call in calls(policies[0]))
  assert any({e % PROCESSES for e, _ in call} == {0, 1} for call in calls(policies[0]))
  steps = sum(len(r.steps) for r in results0)
  for metrics in (metrics0, metrics1):
    assert metrics["episodes"] == metrics["episodes_done"] == 9 and metrics["steps"] == steps
    assert metrics["requests"] == steps and metrics["episodes_dropped"] == metrics["actor_restarts"] == 0
  assert metrics0["policy_calls"] == metrics1["policy_calls"] == len(calls(policies[0]))
  assert metrics0["rounds"] == metrics1["rounds"] >= metrics0["policy_calls"]


def test_on_result_sees_every_result_and_a_process_may_have_no_share(pools, tokenizer, tmp_path):
  specs = logged_specs(1, tmp_path, first_id=20)
  seen = [[] for _ in pools]
  with concurrent.futures.ThreadPoolExecutor(len(pools)) as threads:
    futures = [threads.submit(pool.run, specs, ScriptedPolicy(tokenizer, specs), on_result=seen[p].append)
               for p, pool in enumerate(pools)]
    outcomes = [future.result() for future in futures]
  assert actor_fixtures.played(tmp_path, pools[1].actor_pids()) == []
  assert content(outcomes[0][0]) == content(outcomes[1][0]) and len(outcomes[1][0]) == 1
  assert [r.spec.episode_id for r in seen[0]] == [r.spec.episode_id for r in seen[1]] == [20]


def test_a_killed_actor_drops_only_its_own_episodes_and_every_process_agrees(pools, tokenizer, tmp_path):
  specs = logged_specs(8, tmp_path)
  victim = pools[1].actor_pids()[0]
  killed = {}

  def kill_from_the_third_call(policy, requests):
    live = {r.episode_id for r in requests if r.episode_id % PROCESSES == 1}
    if policy.calls >= 3 and live and not killed:
      killed["live"] = live
      os.kill(victim, signal.SIGKILL)

  policies = [ScriptedPolicy(tokenizer, specs),
              ScriptedPolicy(tokenizer, specs, before_answering=kill_from_the_third_call)]
  (results0, metrics0), (results1, metrics1) = run_all(pools, specs, policies)
  assert pools[1].actor_pids()[0] != victim
  assert content(results0) == content(results1)
  dropped = {r.spec.episode_id for r in results0 if r.dropped}
  assert killed["live"] and killed["live"] <= dropped and all(e % PROCESSES == 1 for e in dropped)
  assert all("SIGKILL" in r.error for r in results0 if r.dropped)
  for result in results0:
    if not result.dropped:
      check_against_replay(result, tokenizer)
  for metrics in (metrics0, metrics1):
    assert metrics["actor_restarts"] == 1 and metrics["episodes_dropped"] == len(dropped)
    assert metrics["dropped_by_actor_failures"] == len(dropped) and metrics["episodes_done"] == 8 - len(dropped)


def test_a_failure_in_one_process_raises_in_every_process_and_the_next_run_works(pools, tokenizer, tmp_path):
  specs = logged_specs(4, tmp_path)

  def kill_own_actor(policy, requests):
    if policy.calls == 1:
      os.kill(pools[0].actor_pids()[0], signal.SIGKILL)

  policies = [ScriptedPolicy(tokenizer, specs, before_answering=kill_own_actor), ScriptedPolicy(tokenizer, specs)]
  with adjusted(pools[0], max_restarts=0):
    first, second = run_all(pools, specs, policies)
  assert isinstance(first, RuntimeError) and "more than max_restarts=0" in str(first)
  assert isinstance(second, RuntimeError) and "process 0 of 2 failed in this run" in str(second)
  assert "more than max_restarts=0" in str(second)
  (results0, _), (results1, _) = run_all(pools, specs, [ScriptedPolicy(tokenizer, specs) for _ in pools])
  assert content(results0) == content(results1) and not any(r.dropped for r in results0)
