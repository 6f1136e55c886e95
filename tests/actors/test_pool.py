"""ActorPool end to end with spawned actors: results, determinism, no jax, truncation, faults, and a hook
object's embeddings, prompt variants and final prompts.

One pool with a plain function hook serves most of the module (starting an actor costs seconds), a second
one the hook object; the fault tests tighten settings for their run. Every actor process either ever
started must be reaped by the end.
"""

import contextlib
import dataclasses
import os
import pathlib
import random
import signal
import time

import numpy as np
import pytest
from transformers import AutoTokenizer

from explore_jax.actors import ActorPool, EpisodeSpec, Response
from tests.actors import actor_fixtures

TINY = str(pathlib.Path(__file__).parents[2] / "explore_jax/hf/assets/tiny")
IM_END = 3
MAX_PROMPT_TOKENS = 128
KEYDOOR = "explore_jax/KeyDoor-v0"
STARTED_PIDS = set()


@pytest.fixture(scope="module")
def tokenizer():
  return AutoTokenizer.from_pretrained(TINY, local_files_only=True)


def _children():
  """(pid, state, command line) of every child process of this one, zombies included."""
  children = []
  for entry in os.listdir("/proc"):
    if not entry.isdigit():
      continue
    try:
      with open(f"/proc/{entry}/stat") as f:
        state, parent = f.read().rsplit(")", 1)[1].split()[:2]
      with open(f"/proc/{entry}/cmdline", "rb") as f:
        command = f.read().replace(b"\0", b" ").decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError):
      continue
    if int(parent) == os.getpid():
      children.append((int(entry), state, command))
  return children


def _reaped(pids):
  """True when none of `pids` is still a child of this process (alive or zombie)."""
  return not {pid for pid, _, _ in _children()} & set(pids)


def _track(pool):
  STARTED_PIDS.update(pid for pid in pool.actor_pids() if pid is not None)


@pytest.fixture(scope="module", autouse=True)
def no_stray_processes():
  """Set up first, torn down last: after both pools closed, no actor process may be left, nor a zombie."""
  yield
  strays = [c for c in _children() if c[1] == "Z" or "spawn_main" in c[2]]
  assert not strays and _reaped(STARTED_PIDS), strays


@pytest.fixture(scope="module")
def pool():
  with ActorPool(num_actors=2, tokenizer_dir=TINY, prompt_hook=actor_fixtures.prompt, envs_per_actor=3,
                 max_prompt_tokens=MAX_PROMPT_TOKENS) as p:
    _track(p)
    yield p


@pytest.fixture(scope="module")
def method_pool():
  """A pool whose hook is an object with embedding_texts, prompt variants and final_prompt."""
  with ActorPool(num_actors=2, tokenizer_dir=TINY, prompt_hook=actor_fixtures.MethodPrompt(), envs_per_actor=2,
                 max_prompt_tokens=MAX_PROMPT_TOKENS) as p:
    _track(p)
    yield p


@contextlib.contextmanager
def adjusted(pool, **settings):
  """The pool with some settings changed for one test (they are read afresh by every run)."""
  saved = {name: getattr(pool, name) for name in settings}
  for name, value in settings.items():
    setattr(pool, name, value)
  try:
    yield pool
  finally:
    for name, value in saved.items():
      setattr(pool, name, value)


class ScriptedPolicy:
  """The fake central policy: each episode's scripted action (a local mirror tracks its state), and
  actor_fixtures.final_tip for a final prompt."""

  def __init__(self, tokenizer, specs, before_answering=None, jitter_s=0.0):
    self.tokenizer = tokenizer
    self.specs = {s.episode_id: s for s in specs}
    self.mirrors = {}
    self.before_answering = before_answering
    self.jitter = random.Random(0) if jitter_s else None
    self.jitter_s = jitter_s
    self.calls = 0
    self.seen = []  # (call, episode_id, step, actor_id) of every request
    self.requests = []  # every request, as it came

  def __call__(self, requests):
    self.calls += 1
    self.seen += [(self.calls, r.episode_id, r.step, r.actor_id) for r in requests]
    self.requests += requests
    if self.before_answering is not None:
      self.before_answering(self, requests)
    if self.jitter is not None:
      time.sleep(self.jitter.uniform(0, self.jitter_s))  # different timings, same answers
    responses = []
    for r in requests:
      if r.step == 0:
        self.mirrors[r.episode_id] = actor_fixtures.mirror(self.specs[r.episode_id])[0]
      env = self.mirrors[r.episode_id]
      assert env.steps == r.step
      if r.final:
        text = actor_fixtures.final_tip(r.episode_id)
      else:
        text = actor_fixtures.scripted_action(env, r.episode_id, r.step)
        env.step(text)
      tokens = np.asarray(self.tokenizer(text, add_special_tokens=False)["input_ids"] + [IM_END], np.int32)
      n = len(tokens)
      responses.append(Response(r.episode_id, r.step, tokens, np.zeros(n, np.float32), np.ones(n, np.float32),
                                np.zeros(n, np.int32), policy_version=0))
    return responses[::-1]  # the pool must route by episode and step, not by position


def make_specs(n, env_id=KEYDOOR, faults=None, first_id=0):
  faults = faults or {}
  return [EpisodeSpec(episode_id=i, group_id=i // 2, traj_id=i, env_id=env_id,
                      env_kwargs={"num_rooms": 3 + i % 2}, seed=1000 + i // 2, reset_options=faults.get(i, {}))
          for i in range(first_id, first_id + n)]


def check_against_replay(result, tokenizer):
  """Every record as a local replay of the same environment, seed and scripted policy has it."""
  spec = result.spec
  assert result.error is None
  env, observation, info = actor_fixtures.mirror(spec)
  for k, record in enumerate(result.steps):
    assert (record.episode_id, record.group_id, record.traj_id, record.step_index) == (
        spec.episode_id, spec.group_id, spec.traj_id, k)
    # `prompt` and MethodPrompt write the same text for a context that switches none of the latter's parts.
    text, variants = actor_fixtures.method_texts(spec.context, observation)
    full = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert record.prompt_ids == full[-MAX_PROMPT_TOKENS:]
    assert record.truncated_tokens == max(0, len(full) - MAX_PROMPT_TOKENS)
    assert record.prompt_variants == {
        name: tokenizer(v, add_special_tokens=False)["input_ids"][-MAX_PROMPT_TOKENS:] for name, v in variants.items()}
    assert record.observation == observation
    assert record.state_key == info["state_key"]
    text = actor_fixtures.scripted_action(env, spec.episode_id, k)
    assert record.response_text == text
    observation, reward, terminated, truncated, info = env.step(text)
    assert (record.task_reward, record.format_reward, record.done, record.success) == (
        reward, info["format_reward"], terminated or truncated, info["success"])
  assert result.steps and result.steps[-1].done
  assert (result.success, result.total_reward, result.feedback) == (
      info["success"], sum(r.task_reward for r in result.steps), info["feedback"])
  if spec.context.get("final"):
    assert result.final_text == actor_fixtures.final_tip(spec.episode_id)
    assert (result.final_response.episode_id, result.final_response.step) == (spec.episode_id, len(result.steps))
  else:
    assert (result.final_text, result.final_response) == ("", None)


def content(results):
  """Everything in the results except which actor happened to run an episode."""
  return [(r.spec, r.error, r.success, r.total_reward, r.feedback, r.truncated_prompts,
           [(s.step_index, s.prompt_ids, s.response.tokens.tolist(), s.response_text, s.task_reward,
             s.format_reward, s.state_key, s.done, s.success, s.info) for s in r.steps]) for r in results]


def test_every_episode_finishes_as_a_local_replay_plays_it(pool, tokenizer):
  specs = make_specs(8)
  results, metrics = pool.run(specs, ScriptedPolicy(tokenizer, specs))
  assert [r.spec for r in results] == specs
  for result in results:
    check_against_replay(result, tokenizer)
  assert {r.actor_id for r in results} == {0, 1}
  assert {s.actor_id for r in results for s in r.steps} == {0, 1}
  steps = sum(len(r.steps) for r in results)
  assert metrics["episodes_done"] == 8 and metrics["episodes_dropped"] == 0 and metrics["actor_restarts"] == 0
  assert metrics["steps"] == metrics["requests"] == steps and metrics["truncated_prompts"] == 0
  assert metrics["max_batch_size"] <= 6 and metrics["policy_calls"] >= steps / 6
  assert metrics["policy_seconds"] + metrics["wait_seconds"] <= metrics["wall_seconds"]
  assert (metrics["embed_calls"], metrics["embed_requests"], metrics["embed_seconds"]) == (0, 0, 0.0)


def test_results_do_not_depend_on_timing_or_batching(pool, tokenizer):
  specs = make_specs(8)
  first, _ = pool.run(specs, ScriptedPolicy(tokenizer, specs, jitter_s=0.005))
  pool.batch_wait_s = float("inf")  # lock-step: every batch holds every live episode
  try:
    second, metrics = pool.run(specs, ScriptedPolicy(tokenizer, specs))
  finally:
    pool.batch_wait_s = 0.0
  assert metrics["max_batch_size"] == 6  # 2 actors x 3 episodes each, all in one call
  assert content(first) == content(second)


class StreamedPolicy:
  """A streaming policy (the pool's submit / advance / busy protocol): ScriptedPolicy's answers, one request
  per advance, oldest first; it records how often requests came in while others were still being decoded."""

  def __init__(self, tokenizer, specs):
    self.scripted = ScriptedPolicy(tokenizer, specs)
    self.queue = []
    self.advances = 0
    self.joined_busy = 0  # requests submitted while earlier ones were still in the policy

  def __call__(self, requests):
    raise AssertionError("a streaming pool submits; it does not call the policy on a batch")

  @property
  def busy(self):
    return bool(self.queue)

  def submit(self, requests):
    self.joined_busy += len(requests) if self.queue else 0
    self.queue += requests

  def advance(self):
    self.advances += 1
    time.sleep(0.02)  # a round of decoding takes a while: answered actors step and ask again meanwhile
    return self.scripted([self.queue.pop(0)])


def test_a_streaming_policy_gets_requests_as_they_come_and_answers_each_when_done(pool, tokenizer):
  specs = make_specs(8)
  batched, _ = pool.run(specs, ScriptedPolicy(tokenizer, specs))
  policy = StreamedPolicy(tokenizer, specs)
  streamed, metrics = pool.run(specs, policy)
  assert content(streamed) == content(batched)
  for result in streamed:
    check_against_replay(result, tokenizer)
  steps = sum(len(r.steps) for r in streamed)
  assert metrics["requests"] == steps and metrics["policy_calls"] == policy.advances == steps
  # Each answer went out alone, and its episode's next request joined the ones still waiting.
  assert policy.joined_busy > 0


def test_actors_never_import_jax(pool, tokenizer):
  hellos = pool.actor_info()
  assert [h.actor_id for h in hellos] == [0, 1] and [h.pid for h in hellos] == pool.actor_pids()
  assert not any(h.jax_imported for h in hellos)
  # The prompt hook looks again after episodes ran (gymnasium.make imports environments lazily).
  specs = make_specs(2)
  results, _ = pool.run(specs, ScriptedPolicy(tokenizer, specs))
  assert all("[jax loaded: False]" in tokenizer.decode(r.steps[-1].prompt_ids) for r in results)


def test_a_prompt_over_the_limit_keeps_its_end(pool, tokenizer):
  long = EpisodeSpec(episode_id=40, group_id=0, traj_id=0, env_id=KEYDOOR, seed=3,
                     context={"preamble": "Tip: doors open with keys. " * 30})
  specs = [long] + make_specs(1, first_id=41)
  results, metrics = pool.run(specs, ScriptedPolicy(tokenizer, specs))
  for result in results:
    check_against_replay(result, tokenizer)
  assert all(len(s.prompt_ids) == MAX_PROMPT_TOKENS and s.truncated_tokens > 0 for s in results[0].steps)
  assert results[0].truncated_prompts == len(results[0].steps) == metrics["truncated_prompts"]
  assert results[1].truncated_prompts == 0


def test_a_killed_actor_is_replaced_and_only_its_unfinished_episodes_are_dropped(pool, tokenizer):
  specs = make_specs(10)  # more than the 6 the actors hold at once: one of them starts a 4th episode
  pids = pool.actor_pids()
  killed = {}

  def kill_the_first_to_start_a_4th_episode(policy, requests):
    for actor in (0, 1):
      started = {e for _, e, step, a in policy.seen if a == actor and step == 0}
      # It holds at most envs_per_actor: one of its first episodes has finished and been received.
      if not killed and len(started) > pool.envs_per_actor:
        os.kill(pids[actor], signal.SIGKILL)
        killed.update(actor=actor, started=started, live={r.episode_id for r in requests if r.actor_id == actor})

  policy = ScriptedPolicy(tokenizer, specs, before_answering=kill_the_first_to_start_a_4th_episode)
  results, metrics = pool.run(specs, policy)
  _track(pool)
  victim, other = killed["actor"], 1 - killed["actor"]
  dropped = [r for r in results if r.dropped]
  done = [r for r in results if not r.dropped]
  assert metrics["actor_restarts"] == 1 and pool.actor_pids()[victim] != pids[victim]
  assert pool.actor_pids()[other] == pids[other]
  assert metrics["episodes_dropped"] == metrics["dropped_by_actor_failures"] == len(dropped)
  assert metrics["episodes_done"] == len(done) == 10 - len(dropped)
  # Dropped: exactly the victim's live episodes (those it was asking for, and any not yet asked).
  assert killed["live"] and killed["live"] <= {r.spec.episode_id for r in dropped}
  assert len(dropped) <= pool.envs_per_actor
  asked_by_other = {e for _, e, _, a in policy.seen if a == other}
  for r in dropped:
    assert r.actor_id == victim and r.steps == [] and "SIGKILL" in r.error
    assert r.spec.episode_id not in asked_by_other
  # Kept: everything finished, including the victim's episodes from before the kill.
  assert any(r.spec.episode_id in killed["started"] and r.steps[0].actor_id == victim for r in done)
  for result in done:
    check_against_replay(result, tokenizer)
  assert _reaped([pids[victim]])


def test_an_actor_hung_in_a_step_is_replaced_after_the_timeout(pool, tokenizer):
  specs = make_specs(6, env_id=actor_fixtures.FAULTY_ENV, faults={2: {"hang_at_step": 2}})
  start = time.monotonic()
  with adjusted(pool, episode_timeout_s=2.0):
    results, metrics = pool.run(specs, ScriptedPolicy(tokenizer, specs))
  elapsed = time.monotonic() - start
  _track(pool)
  assert metrics["actor_restarts"] == 1 and 2.0 <= elapsed < 60
  assert results[2].dropped and "hung" in results[2].error and "episode_timeout_s=2.0" in results[2].error
  hung_actor = results[2].actor_id
  for r in results:
    if r.dropped:
      assert r.actor_id == hung_actor and "hung" in r.error
    else:
      check_against_replay(r, tokenizer)
  assert metrics["episodes_done"] >= 6 - pool.envs_per_actor  # at most the hung actor's live episodes


def test_an_environment_that_raises_drops_only_its_episode(pool, tokenizer):
  faults = {1: {"raise_at_step": 2}, 4: {"raise_on_reset": True}}
  specs = make_specs(6, env_id=actor_fixtures.FAULTY_ENV, faults=faults)
  pids = pool.actor_pids()
  results, metrics = pool.run(specs, ScriptedPolicy(tokenizer, specs))
  assert pool.actor_pids() == pids and metrics["actor_restarts"] == 0
  assert metrics["dropped_by_env_errors"] == metrics["episodes_dropped"] == 2
  assert "env.step raised RuntimeError: injected fault at step 2" in results[1].error
  assert "env.reset raised RuntimeError: injected fault on reset" in results[4].error
  for i in (0, 2, 3, 5):
    check_against_replay(results[i], tokenizer)


def test_too_many_restarts_raise_and_the_next_run_starts_afresh(pool, tokenizer):
  specs = make_specs(4)

  def kill_both(policy, requests):
    if policy.calls == 1:
      for pid in pool.actor_pids():
        os.kill(pid, signal.SIGKILL)

  before = pool.actor_pids()
  with adjusted(pool, max_restarts=1), pytest.raises(RuntimeError, match="more than max_restarts=1"):
    pool.run(specs, ScriptedPolicy(tokenizer, specs, before_answering=kill_both))
  _track(pool)
  assert _reaped(before)
  results, metrics = pool.run(specs, ScriptedPolicy(tokenizer, specs))
  _track(pool)
  assert metrics["episodes_done"] == 4 and metrics["actor_restarts"] == 0
  for result in results:
    check_against_replay(result, tokenizer)


def test_a_world_whose_steps_go_out_at_once_plays_the_same_episodes(pool, tokenizer):
  # The pool's actors keep envs_per_actor threads (env_threads 0); this world lets them step at once.
  specs = make_specs(8)
  at_once = make_specs(8, env_id=actor_fixtures.CONCURRENT_ENV)
  pool.batch_wait_s = float("inf")  # lock-step rounds: each actor gets its responses together
  try:
    serial, _ = pool.run(specs, ScriptedPolicy(tokenizer, specs))
    results, metrics = pool.run(at_once, ScriptedPolicy(tokenizer, at_once))
  finally:
    pool.batch_wait_s = 0.0
  # (How many requests share a call depends on which actors are up: an earlier test's restarts may still be
  # starting one. The episodes may not depend on it.)
  assert metrics["episodes_dropped"] == 0
  for result in results:
    check_against_replay(result, tokenizer)
  assert [c[1:] for c in content(results)] == [c[1:] for c in content(serial)]


def test_the_pool_checks_its_arguments_and_the_policy(pool, tokenizer):
  with pytest.raises(ValueError, match="unique"):
    pool.run(make_specs(2) + make_specs(1), ScriptedPolicy(tokenizer, []))
  specs = make_specs(2, first_id=50)
  pids = pool.actor_pids()
  with pytest.raises(ValueError, match="one Response per PromptRequest"):
    pool.run(specs, lambda requests: [])
  with pytest.raises(FileNotFoundError):
    ActorPool(num_actors=1, tokenizer_dir="/no/such/dir", prompt_hook=actor_fixtures.prompt)
  with pytest.raises(ValueError, match="envs_per_actor"):
    ActorPool(num_actors=1, tokenizer_dir=TINY, prompt_hook=actor_fixtures.prompt, envs_per_actor=0)
  with pytest.raises(ValueError, match="env_threads"):
    ActorPool(num_actors=1, tokenizer_dir=TINY, prompt_hook=actor_fixtures.prompt, env_threads=-1)
  # After a failed run the same actors serve again: they dropped its episodes when told to.
  results, _ = pool.run(specs, ScriptedPolicy(tokenizer, specs))
  assert pool.actor_pids() == pids and [r.error for r in results] == [None, None]


def with_context(specs, *contexts):
  return [dataclasses.replace(s, context=c) for s, c in zip(specs, contexts)]


def test_a_hook_object_gets_batched_embeddings_records_variants_and_a_final_tip(method_pool, tokenizer):
  specs = with_context(make_specs(4), {"embed": True, "tip": "keys open doors", "final": True}, {"embed": True},
                       {"final": True}, {})
  policy = ScriptedPolicy(tokenizer, specs)
  embed_batches = []

  def embed_fn(requests):
    embed_batches.append(list(requests))
    return actor_fixtures.embed(requests)

  # Lock-step: episodes 0 and 1 (one on each actor) ask for their embeddings in the same batches.
  with adjusted(method_pool, batch_wait_s=5.0):
    results, metrics = method_pool.run(specs, policy, embed_fn)
  for result in results:
    check_against_replay(result, tokenizer)  # prompts with embedding values and tips, variants, final texts
  steps = [len(r.steps) for r in results]
  # Every step of the embedding episodes asked once, for its observation, in few batches; final prompts never.
  embedded = sorted((r.episode_id, r.step) for batch in embed_batches for r in batch)
  assert embedded == [(e, k) for e in (0, 1) for k in range(steps[e])]
  assert all(r.texts == [results[r.episode_id].steps[r.step].observation] for b in embed_batches for r in b)
  assert max(len(b) for b in embed_batches) == 2
  assert metrics["embed_requests"] == len(embedded) and metrics["embed_calls"] == len(embed_batches) < len(embedded)
  assert 0 <= metrics["embed_seconds"] <= metrics["wall_seconds"]
  # The policy sampled from the prompts that show the embedding (and the tip, not the variant without it).
  seen = {(r.episode_id, r.step): r for r in policy.requests}
  for e in (0, 1):
    for record in results[e].steps:
      prompt = tokenizer.decode(seen[(e, record.step_index)].prompt_ids)
      assert f"[embedding: {actor_fixtures.embed_text(record.observation)[0]:g}]" in prompt
      assert ("Tip: keys open doors" in prompt) == (e == 0)
  # One final request per episode that asks for it, one past its last step, after its whole history.
  assert sorted((r.episode_id, r.step) for r in policy.requests if r.final) == [(0, steps[0]), (2, steps[2])]
  assert f"ended after {steps[2]} steps" in tokenizer.decode(seen[(2, steps[2])].prompt_ids)
  assert metrics["requests"] == sum(steps) + 2 and metrics["steps"] == sum(steps)


def test_embeddings_without_an_embed_fn_fail_the_run_and_the_pool_serves_the_next(method_pool, tokenizer):
  specs = with_context(make_specs(3, first_id=10), *[{"embed": True}] * 3)
  pids = method_pool.actor_pids()
  with pytest.raises(ValueError, match=r"defines embedding_texts.*but run\(\) got no embed_fn"):
    method_pool.run(specs, ScriptedPolicy(tokenizer, specs))
  with pytest.raises(ValueError, match=r"an array \[len\(texts\), E\] per EmbedRequest"):
    method_pool.run(specs, ScriptedPolicy(tokenizer, specs), lambda requests: [np.zeros((2, 4))] * len(requests))
  plain = make_specs(3, first_id=20)
  results, metrics = method_pool.run(plain, ScriptedPolicy(tokenizer, plain))
  assert metrics["episodes_done"] == 3 and metrics["embed_calls"] == 0
  results += method_pool.run(specs, ScriptedPolicy(tokenizer, specs), actor_fixtures.embed)[0]
  for result in results:
    check_against_replay(result, tokenizer)
  assert method_pool.actor_pids() == pids  # the failed runs' episodes were cancelled, no actor replaced
