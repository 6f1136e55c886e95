"""The actor's event loop in-process: prompts, truncation, records, interleaving, and failing episodes."""

import dataclasses
import pathlib
import queue
import sys
import time

import numpy as np
import pytest

from explore_jax.actors.actor import Actor, ActorConfig, PromptTokenizer, _serve
from explore_jax.actors.protocol import STOP, EpisodeResult, EpisodeSpec, PromptRequest, Response
from tests.actors import actor_fixtures

TINY = str(pathlib.Path(__file__).parents[2] / "explore_jax/hf/assets/tiny")
IM_END = 3  # "<|im_end|>", a special token the decoded response text must not contain


@pytest.fixture(scope="module")
def tokenizer():
  return PromptTokenizer.from_dir(TINY, max_prompt_tokens=10_000)


def make_actor(tokenizer, max_prompt_tokens=10_000, hook=actor_fixtures.prompt):
  sent = []
  tok = PromptTokenizer(tokenizer.tokenizer, max_prompt_tokens)
  config = ActorConfig(actor_id=7, tokenizer_dir=TINY, prompt_hook=hook, envs_per_actor=2,
                       max_prompt_tokens=max_prompt_tokens)
  return Actor(config, tok, sent.append), sent


def respond(tokenizer, request, text):
  tokens = np.asarray(tokenizer.tokenizer(text, add_special_tokens=False)["input_ids"] + [IM_END], np.int32)
  n = len(tokens)
  return Response(request.episode_id, request.step, tokens, np.full(n, -0.5, np.float32),
                  np.ones(n, np.float32), np.zeros(n, np.int32), policy_version=3)


def spec(episode_id, env_id="explore_jax/KeyDoor-v0", **reset_options):
  return EpisodeSpec(episode_id=episode_id, group_id=episode_id // 2, traj_id=episode_id + 100, env_id=env_id,
                     env_kwargs={"num_rooms": 3}, seed=episode_id, reset_options=reset_options)


def play(actor, sent, tokenizer, specs, started=()):
  """Starts `specs`, answers (scripted) until nothing is left to answer; `started`: specs already handed."""
  by_id = {s.episode_id: s for s in [*started, *specs]}
  mirrors = {}
  for s in specs:
    actor.handle(s)
  results = {}
  while sent:
    message = sent.pop(0)
    if isinstance(message, EpisodeResult):
      results[message.spec.episode_id] = message
      continue
    if message.step == 0:
      mirrors[message.episode_id] = actor_fixtures.mirror(by_id[message.episode_id])[0]
    env = mirrors[message.episode_id]
    text = actor_fixtures.scripted_action(env, message.episode_id, message.step)
    env.step(text)
    actor.handle(respond(tokenizer, message, text))
  return results


def test_an_episode_is_recorded_step_by_step_as_the_environment_played_it(tokenizer):
  actor, sent = make_actor(tokenizer)
  s = spec(5)
  result = play(actor, sent, tokenizer, [s])[5]
  env, observation, info = actor_fixtures.mirror(s)
  assert result.error is None and result.actor_id == 7 and result.spec == s
  for k, record in enumerate(result.steps):
    assert (record.episode_id, record.group_id, record.traj_id, record.step_index, record.actor_id) == (
        5, 2, 105, k, 7)
    assert tokenizer.tokenizer.decode(record.prompt_ids) == actor_fixtures.chat_text(observation, jax_loaded='jax' in sys.modules)
    assert record.state_key == info["state_key"]  # the key of the observation the prompt showed
    text = actor_fixtures.scripted_action(env, 5, k)
    assert record.response_text == text and record.response.policy_version == 3
    observation, reward, terminated, truncated, info = env.step(text)
    assert (record.task_reward, record.format_reward, record.done, record.success) == (
        reward, info["format_reward"], terminated or truncated, info["success"])
    assert record.info == info and record.truncated_tokens == 0
  assert record.done and [r.format_reward for r in result.steps].count(0.0) >= 1
  assert (result.success, result.total_reward, result.feedback) == (info["success"], reward, info["feedback"])
  assert actor.episodes == {} and actor.envs.created == 1


def test_episodes_interleave_and_reuse_environments(tokenizer):
  actor, sent = make_actor(tokenizer)
  actor.handle(spec(0))
  actor.handle(spec(1))
  assert [(m.episode_id, m.step) for m in sent] == [(0, 0), (1, 0)]  # both ask before either is answered
  results = play(actor, sent, tokenizer, [], started=[spec(0), spec(1)])
  assert sorted(results) == [0, 1] and actor.envs.created == 2
  again = play(actor, sent, tokenizer, [spec(0)])
  assert actor.envs.created == 2  # a finished episode's environment was reset and reused
  fresh_actor, fresh_sent = make_actor(tokenizer)
  fresh = play(fresh_actor, fresh_sent, tokenizer, [spec(0)])
  assert _content(again[0]) == _content(fresh[0]) == _content(results[0])


def _content(result):
  return [(r.step_index, r.prompt_ids, r.response_text, r.task_reward, r.state_key, r.done) for r in result.steps]


def test_a_long_prompt_keeps_its_last_tokens(tokenizer):
  actor, sent = make_actor(tokenizer, max_prompt_tokens=40)
  s = EpisodeSpec(episode_id=1, group_id=0, traj_id=0, env_id="explore_jax/KeyDoor-v0", seed=1,
                  context={"preamble": "A long tip that does not fit. " * 20})
  actor.handle(s)
  request = sent[0]
  _, observation, _ = actor_fixtures.mirror(s)
  full = tokenizer.tokenizer(actor_fixtures.chat_text(observation, s.context["preamble"], "jax" in sys.modules),
                             add_special_tokens=False)["input_ids"]
  assert len(full) > 40 and request.prompt_ids == full[-40:]
  result = play(actor, sent, tokenizer, [], started=[s])[1]
  assert all(r.truncated_tokens > 0 and len(r.prompt_ids) == 40 for r in result.steps)
  assert result.steps[0].truncated_tokens == len(full) - 40
  assert result.truncated_prompts == len(result.steps)


def test_without_a_chat_template_the_contents_are_joined(tokenizer):
  actor, sent = make_actor(tokenizer)
  plain = PromptTokenizer(type(tokenizer.tokenizer).from_pretrained(TINY, local_files_only=True), 10_000)
  plain.tokenizer.chat_template = None
  actor.tokenizer = plain
  actor.handle(spec(3))
  _, observation, _ = actor_fixtures.mirror(spec(3))
  expected = f"{observation}\n[jax loaded: {'jax' in sys.modules}]"
  assert sent[0].prompt_ids == plain.tokenizer(expected)["input_ids"]


def test_a_failing_environment_or_hook_drops_only_its_episode(tokenizer):
  actor, sent = make_actor(tokenizer)
  faulty = actor_fixtures.FAULTY_ENV
  specs = [spec(0, faulty, raise_at_step=2), spec(1, faulty, raise_on_reset=True), spec(2, faulty),
           spec(3, "explore_jax/NoSuchEnv-v0")]
  results = play(actor, sent, tokenizer, specs)
  assert "env.step raised RuntimeError: injected fault at step 2" in results[0].error
  assert "env.reset raised RuntimeError: injected fault on reset" in results[1].error
  assert "gymnasium.make('explore_jax/NoSuchEnv-v0') raised" in results[3].error
  assert all(results[i].steps == [] and results[i].dropped for i in (0, 1, 3))
  assert results[2].error is None and results[2].steps[-1].done
  # The two broken instances were closed, not cached: the next two episodes need new ones.
  created = actor.envs.created
  play(actor, sent, tokenizer, [spec(4, faulty), spec(5, faulty)])
  assert actor.envs.created == created + 1

  hooked, hooked_sent = make_actor(tokenizer, hook=actor_fixtures.failing_prompt)
  dropped = play(hooked, hooked_sent, tokenizer, [spec(6)])[6]
  assert "the prompt hook or the tokenizer raised KeyError" in dropped.error and dropped.steps == []


def test_a_response_for_a_step_the_episode_is_not_at_is_refused(tokenizer):
  actor, sent = make_actor(tokenizer)
  actor.handle(spec(0))
  request = sent.pop()
  with pytest.raises(ValueError, match="waits for step 0"):
    actor.handle(respond(tokenizer, PromptRequest(0, 1, request.prompt_ids), "go left"))
  with pytest.raises(ValueError, match="already running"):
    actor.handle(spec(0))


def test_an_actor_leaves_when_its_learner_stops_answering_or_says_stop(tokenizer):
  actor, sent = make_actor(tokenizer)
  actor.config = dataclasses.replace(actor.config, request_timeout_s=0.2)
  inbox = queue.Queue()
  inbox.put(STOP)
  assert _serve(actor, inbox) is None
  actor.handle(spec(0))
  start = time.monotonic()
  assert "request_timeout_s=0.2" in _serve(actor, inbox)
  assert 0.2 <= time.monotonic() - start < 5
