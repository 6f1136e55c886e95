"""The actor's event loop in-process: prompts, truncation, records, interleaving, failing episodes, and the
optional parts of a hook object (embeddings, prompt variants, a final prompt)."""

import dataclasses
import pathlib
import queue
import sys
import threading
import time

import numpy as np
import pytest

from explore_jax.actors.actor import Actor, ActorConfig, PromptTokenizer, _serve
from explore_jax.actors.protocol import (STOP, EmbedRequest, Embeddings, EpisodeResult, EpisodeSpec, Prompt,
                                         PromptRequest, Response)
from tests.actors import actor_fixtures

TINY = str(pathlib.Path(__file__).parents[2] / "explore_jax/hf/assets/tiny")
IM_END = 3  # "<|im_end|>", a special token the decoded response text must not contain


@pytest.fixture(scope="module")
def tokenizer():
  return PromptTokenizer.from_dir(TINY, max_prompt_tokens=10_000)


def make_actor(tokenizer, max_prompt_tokens=10_000, hook=actor_fixtures.prompt, envs_per_actor=2, **config_fields):
  sent = []
  tok = PromptTokenizer(tokenizer.tokenizer, max_prompt_tokens)
  config = ActorConfig(actor_id=7, tokenizer_dir=TINY, prompt_hook=hook, envs_per_actor=envs_per_actor,
                       max_prompt_tokens=max_prompt_tokens, **config_fields)
  return Actor(config, tok, sent.append), sent


def respond(tokenizer, request, text):
  tokens = np.asarray(tokenizer.tokenizer(text, add_special_tokens=False)["input_ids"] + [IM_END], np.int32)
  n = len(tokens)
  return Response(request.episode_id, request.step, tokens, np.full(n, -0.5, np.float32),
                  np.ones(n, np.float32), np.zeros(n, np.int32), policy_version=3)


def spec(episode_id, env_id="explore_jax/KeyDoor-v0", context=None, **reset_options):
  return EpisodeSpec(episode_id=episode_id, group_id=episode_id // 2, traj_id=episode_id + 100, env_id=env_id,
                     env_kwargs={"num_rooms": 3}, seed=episode_id, reset_options=reset_options,
                     context=context or {})


def play(actor, sent, tokenizer, specs, started=()):
  """Starts `specs`, answers (scripted) until nothing is left to answer; `started`: specs already handed.

  Embeddings come from actor_fixtures.embed, a final prompt is answered with actor_fixtures.final_tip.
  """
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
    if isinstance(message, EmbedRequest):
      actor.handle(Embeddings(message.episode_id, message.step, actor_fixtures.embed([message])[0]))
      continue
    if message.final:
      actor.handle(respond(tokenizer, message, actor_fixtures.final_tip(message.episode_id)))
      continue
    if message.episode_id not in mirrors:
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
    assert tokenizer.tokenizer.decode(record.prompt_ids) == actor_fixtures.chat_text(
        observation, jax_loaded="jax" in sys.modules)
    assert record.observation == observation and record.prompt_variants == {} and record.prompt_notes == {}
    assert record.state_key == info["state_key"]  # the key of the observation the prompt showed
    text = actor_fixtures.scripted_action(env, 5, k)
    assert record.response_text == text and record.response.policy_version == 3
    observation, reward, terminated, truncated, info = env.step(text)
    assert (record.task_reward, record.format_reward, record.done, record.success) == (
        reward, info["format_reward"], terminated or truncated, info["success"])
    assert record.info == info and record.truncated_tokens == 0
  assert record.done and [r.format_reward for r in result.steps].count(0.0) >= 1
  assert (result.success, result.total_reward, result.feedback) == (info["success"], reward, info["feedback"])
  assert (result.final_text, result.final_response) == ("", None)  # a plain function hook has no final prompt
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


@pytest.mark.parametrize("kept, created", [(2, 4), (1, 6)])
def test_an_evaluation_between_two_training_rollouts_starts_no_environment_again(tokenizer, kept, created):
  # Training's and evaluation's settings differ in their kwargs (a held-out split): with both kept, the second
  # training rollout finds its environments idle; with one, the evaluation's evicted them.
  actor, sent = make_actor(tokenizer, kept_env_settings=kept)
  held_out = lambda i: dataclasses.replace(spec(i), env_kwargs={"num_rooms": 4})
  first = play(actor, sent, tokenizer, [spec(0), spec(1)])
  evaluation = play(actor, sent, tokenizer, [held_out(2), held_out(3)])
  second = play(actor, sent, tokenizer, [spec(0), spec(1)])
  assert actor.envs.created == created
  assert [_content(r) for _, r in sorted(second.items())] == [_content(r) for _, r in sorted(first.items())]
  assert all(r.error is None for r in evaluation.values())


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


def _long_then_short(observation, history, context, info):
  """A prompt whose full form is long; its shorter forms drop the padding, then the observation's tail."""
  text = str(observation)
  return Prompt([{"role": "user", "content": "pad " * 200 + text}], notes={"form": 0},
                shorter=iter([Prompt([{"role": "user", "content": "pad " * 100 + text}], notes={"form": 1}),
                              [{"role": "user", "content": text}]]))


def test_a_long_prompt_is_sampled_in_its_first_shorter_form_that_fits(tokenizer):
  s = spec(4)
  _, observation, _ = actor_fixtures.mirror(s)
  forms = [tokenizer.encode([{"role": "user", "content": pad + observation}])[0] for pad in ("pad " * 100, "")]
  actor, sent = make_actor(tokenizer, max_prompt_tokens=len(forms[0]), hook=_long_then_short)
  actor.handle(s)
  assert sent[0].prompt_ids == forms[0]  # the second form fits whole; the first would be cut
  # Later observations are longer or shorter; each step's prompt is one of its forms, whole.
  result = play(actor, sent, tokenizer, [], started=[s])[4]
  assert result.shortened_prompts == len(result.steps) and result.truncated_prompts == 0
  assert all(r.truncated_tokens == 0 and len(r.prompt_ids) <= len(forms[0]) for r in result.steps)
  # A form that is a Prompt brings its notes; a message list keeps the prompt's.
  assert result.steps[0].prompt_notes == {"form": 1}
  assert [r.prompt_notes for r in result.steps] == [{"form": 1 if len(r.prompt_ids) >= 100 else 0}  # 100 pads
                                                    for r in result.steps]


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


def _ids(tokenizer, text):
  return tokenizer.tokenizer(text, add_special_tokens=False)["input_ids"]


def test_a_hook_object_gets_embeddings_records_variants_and_asks_a_final_prompt(tokenizer):
  actor, sent = make_actor(tokenizer, hook=actor_fixtures.MethodPrompt())
  jax_loaded = "jax" in sys.modules
  context = {"embed": True, "tip": "keys open doors", "final": True}
  s = spec(4, context=context)
  env, observation, _ = actor_fixtures.mirror(s)
  actor.handle(s)
  # The observation is embedded before the prompt is built; the episode waits for nothing else meanwhile.
  asked = sent.pop()
  assert asked == EmbedRequest(4, 0, [observation], actor_id=7) and not sent
  assert actor.oldest_request() is not None
  with pytest.raises(ValueError, match="waits for step 0's embeddings"):
    actor.handle(respond(tokenizer, PromptRequest(4, 0, [1]), "go left"))
  with pytest.raises(ValueError, match="waits for step 0's embeddings"):
    actor.handle(Embeddings(4, 1, actor_fixtures.embed([asked])[0]))
  actor.handle(Embeddings(4, 0, actor_fixtures.embed([asked])[0]))
  request = sent[0]
  text, variants = actor_fixtures.method_texts(context, observation, jax_loaded)
  assert "[embedding: " in text and request.prompt_ids == _ids(tokenizer, text) and not request.final
  with pytest.raises(ValueError, match="waits for step 0's response"):
    actor.handle(Embeddings(4, 0, actor_fixtures.embed([asked])[0]))

  result = play(actor, sent, tokenizer, [], started=[s])[4]
  assert result.error is None and result.steps[-1].done
  for k, record in enumerate(result.steps):
    text, variants = actor_fixtures.method_texts(context, observation, jax_loaded)
    assert record.observation == observation
    assert record.prompt_ids == _ids(tokenizer, text)
    assert record.prompt_variants == {"no_tip": _ids(tokenizer, variants["no_tip"])}
    assert record.prompt_notes == {"tips": 1, "step": k}  # what the hook noted while building this step's prompt
    observation = env.step(actor_fixtures.scripted_action(env, 4, k))[0]
  assert result.final_text == actor_fixtures.final_tip(4)
  assert result.final_response.step == len(result.steps) and result.final_response.policy_version == 3
  assert result.total_reward == sum(r.task_reward for r in result.steps)


def test_the_final_prompt_comes_after_the_last_step_and_its_environment_is_back_in_the_cache(tokenizer):
  actor, sent = make_actor(tokenizer, max_prompt_tokens=30, hook=actor_fixtures.MethodPrompt())
  s = spec(2, context={"final": True})
  env = actor_fixtures.mirror(s)[0]
  actor.handle(s)
  steps = 0
  while not sent[-1].final:
    request = sent.pop()
    assert request.step == steps and not isinstance(request, EmbedRequest)  # no "embed" in its context
    text = actor_fixtures.scripted_action(env, 2, steps)
    observation = env.step(text)[0]
    actor.handle(respond(tokenizer, request, text))
    steps += 1
  final = sent.pop()
  assert final.step == steps and final.actor_id == 7 and not sent
  # Its prompt sees the whole history and the final observation (cut to 30 tokens, like any prompt).
  full = _ids(tokenizer, f"<|im_start|>user\n{observation}\nThe episode ended after {steps} steps. Write a tip."
                         f"<|im_end|>\n<|im_start|>assistant\n")
  assert final.prompt_ids == full[-30:]
  # The episode is over: its environment serves the next episode while the final answer is awaited.
  assert actor.episodes[2].env is None
  play(actor, sent, tokenizer, [spec(3)])
  assert actor.envs.created == 1
  actor.handle(respond(tokenizer, final, "Keys first."))
  result = sent.pop()
  assert result.final_text == "Keys first." and len(result.steps) == steps and not actor.episodes
  assert result.truncated_prompts == steps + 1  # every step's prompt and the final one were cut


def test_errors_in_embedding_texts_or_final_prompt_drop_only_their_episode(tokenizer):
  actor, sent = make_actor(tokenizer, hook=actor_fixtures.MethodPrompt())
  specs = [spec(0, context={"embed": True, "fail": "embedding_texts"}),
           spec(1, context={"final": True, "fail": "final_prompt"}), spec(2, context={"embed": True, "final": True})]
  results = play(actor, sent, tokenizer, specs)
  assert "the prompt hook's embedding_texts raised KeyError: 'no tip memory'" in results[0].error
  assert "the prompt hook's final_prompt or the tokenizer raised KeyError" in results[1].error
  assert all(results[i].dropped and results[i].steps == [] for i in (0, 1))
  assert results[2].error is None and results[2].final_text == actor_fixtures.final_tip(2)
  # Neither environment was broken: both went back to the cache, each once, and serve again.
  idle = [env for envs in actor.envs._idle.values() for env in envs]
  assert actor.envs.created == 2 and len({id(env) for env in idle}) == len(idle) == 2 and not actor.episodes
  play(actor, sent, tokenizer, [spec(3), spec(4)])
  assert actor.envs.created == 2


# ---- environment calls at once ------------------------------------------------------------------------

def play_rounds(actor, sent, tokenizer, specs, first_round=None):
  """Like `play`, but as the pool answers: every request of a round in one handle_all, in episode order.
  `first_round` runs before the first round of responses is handed over (and is undone after it)."""
  mirrors, results, rounds = {}, {}, 0
  actor.handle_all(list(specs))
  while sent:
    requests = []
    for message in sent:
      if isinstance(message, EpisodeResult):
        results[message.spec.episode_id] = message
      else:
        requests.append(message)
    sent.clear()
    responses = []
    for request in sorted(requests, key=lambda r: r.episode_id):
      if request.episode_id not in mirrors:
        mirrors[request.episode_id] = actor_fixtures.mirror(next(s for s in specs
                                                                 if s.episode_id == request.episode_id))[0]
      text = actor_fixtures.scripted_action(mirrors[request.episode_id], request.episode_id, request.step)
      mirrors[request.episode_id].step(text)
      responses.append(respond(tokenizer, request, text))
    if first_round is not None and rounds == 0:
      with first_round():
        actor.handle_all(responses)
    else:
      actor.handle_all(responses)
    rounds += 1
  return results


class _meeting:
  """Makes the first round's steps of `count` episodes wait for each other (they break it unless all are
  stepped at once)."""

  def __init__(self, count):
    self.count = count

  def __enter__(self):
    actor_fixtures.ConcurrentKeyDoor.barrier = threading.Barrier(self.count, timeout=60)

  def __exit__(self, *exc):
    actor_fixtures.ConcurrentKeyDoor.barrier = None


def _concurrent_spec(i, env_id=actor_fixtures.CONCURRENT_ENV, **reset_options):
  return dataclasses.replace(spec(i, **reset_options), env_id=env_id)


def test_a_round_of_steps_goes_out_at_once_where_the_world_allows_it_and_plays_the_same_episodes(tokenizer):
  calls = actor_fixtures.RecordingKeyDoor.calls
  specs = [_concurrent_spec(i) for i in range(4)]
  calls.clear()
  actor, sent = make_actor(tokenizer, envs_per_actor=4, env_threads=4)
  at_once = play_rounds(actor, sent, tokenizer, specs, first_round=lambda: _meeting(4))
  actor.close()
  assert all(r.error is None and r.steps[-1].done for r in at_once.values()) and sorted(at_once) == [0, 1, 2, 3]
  main = threading.get_ident()
  # The four resets and the first round's four steps went to the actor's threads (a lone call stays home).
  assert [kind for kind, _ in calls[:8]] == ["reset"] * 4 + ["step"] * 4
  assert main not in {thread for _, thread in calls[:8]} and len({thread for _, thread in calls[:8]}) > 1

  calls.clear()
  serial, serial_sent = make_actor(tokenizer, envs_per_actor=4)  # env_threads=1
  one_by_one = play_rounds(serial, serial_sent, tokenizer, specs)
  assert {thread for _, thread in calls} == {main}
  assert {i: _content(r) for i, r in at_once.items()} == {i: _content(r) for i, r in one_by_one.items()}
  # And as `handle` plays them, one message at a time.
  singly, singly_sent = make_actor(tokenizer, envs_per_actor=4, env_threads=4)
  assert {i: _content(r) for i, r in play(singly, singly_sent, tokenizer, specs).items()} == {
      i: _content(r) for i, r in one_by_one.items()}


def test_a_world_that_does_not_allow_it_is_stepped_on_the_actors_thread(tokenizer):
  calls = actor_fixtures.RecordingKeyDoor.calls
  calls.clear()
  actor, sent = make_actor(tokenizer, envs_per_actor=3, env_threads=3)
  specs = [_concurrent_spec(i, actor_fixtures.RECORDING_ENV) for i in range(3)]
  results = play_rounds(actor, sent, tokenizer, specs)
  assert all(r.error is None for r in results.values()) and len(calls) > 6
  assert {thread for _, thread in calls} == {threading.get_ident()}


def test_a_failing_step_among_concurrent_ones_drops_only_its_episode(tokenizer):
  actor, sent = make_actor(tokenizer, envs_per_actor=3, env_threads=3)
  specs = [_concurrent_spec(0, raise_at_step=1), _concurrent_spec(1), _concurrent_spec(2, raise_on_reset=True)]
  created = actor.envs.created
  results = play_rounds(actor, sent, tokenizer, specs, first_round=lambda: _meeting(2))
  assert "env.reset raised RuntimeError: injected fault on reset" in results[2].error
  assert "env.step raised RuntimeError: injected fault at step 1" in results[0].error
  assert results[0].steps == [] and results[1].error is None and results[1].steps[-1].done
  assert actor.episodes == {} and actor.envs.created == created + 3
  # The two that raised were closed: of the three, only the one that finished is idle for the next episode.
  play_rounds(actor, sent, tokenizer, [_concurrent_spec(3)])
  assert actor.envs.created == created + 3


def test_what_a_run_of_messages_sends_follows_their_arrival_order(tokenizer):
  actor, sent = make_actor(tokenizer, envs_per_actor=3, env_threads=3)
  actor.handle_all([_concurrent_spec(0), spec(1, "explore_jax/NoSuchEnv-v0"), _concurrent_spec(2)])
  assert [(type(m).__name__, m.spec.episode_id if isinstance(m, EpisodeResult) else m.episode_id)
          for m in sent] == [("PromptRequest", 0), ("EpisodeResult", 1), ("PromptRequest", 2)]


def test_a_second_spec_or_response_in_one_run_of_messages_is_refused(tokenizer):
  actor, sent = make_actor(tokenizer, envs_per_actor=2, env_threads=2)
  with pytest.raises(ValueError, match="already running"):
    actor.handle_all([_concurrent_spec(0), _concurrent_spec(0)])
  actor, sent = make_actor(tokenizer, envs_per_actor=2, env_threads=2)
  actor.handle_all([_concurrent_spec(0)])
  request = sent.pop()
  answer = respond(tokenizer, request, "go left")
  with pytest.raises(ValueError, match="waits for step 0's environment call"):
    actor.handle_all([answer, answer])


def test_the_actor_hands_what_has_arrived_to_handle_all_together(tokenizer):
  actor, _ = make_actor(tokenizer)
  handed = []
  actor.handle_all = handed.append
  inbox = queue.Queue()
  for message in (spec(0), spec(1), STOP, spec(2)):
    inbox.put(message)
  assert _serve(actor, inbox) is None
  assert handed == [[spec(0), spec(1)]] and inbox.get_nowait() == spec(2)
  with pytest.raises(ValueError, match="env_threads must be at least 1"):
    make_actor(tokenizer, env_threads=0)
