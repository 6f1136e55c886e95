"""EAPO's rollback stage before RL (Algorithm 1, lines 1-4): the oracle's episodes recorded as an actor records
episodes, the verified ways back they hold, the SFT request they make, and that stage run after the warm start and
cached with it under a key of its own."""

import re

import gymnasium
import jax
import numpy as np
import pytest

from configs import eapo_keydoor
from explore_jax.methods import eapo, make_method
from explore_jax.methods.eapo_fields import parse_fields
from explore_jax.methods.eapo_rollback import verified_rollbacks
from explore_jax.train import rollout, sft_data

WORLD = {"num_rooms": 4, "hints": False, "max_steps": 10}
SEEDS = range(10_000, 10_012)


def config():
  c = eapo_keydoor.get_config()
  c.env.kwargs.update(WORLD)
  c.env.max_steps = 10
  c.sft.oracle_episodes = len(SEEDS)
  return c


def oracle_episodes(c):
  env_id, kwargs = rollout.environment(c, {**c.env.kwargs, **c.sft.env_kwargs}, demonstrations=True)
  return sft_data.oracle_episode_results(env_id, kwargs, SEEDS), env_id, kwargs


def test_oracle_episodes_are_recorded_as_an_actor_records_them():
  c = config()
  episodes, env_id, kwargs = oracle_episodes(c)
  assert len(episodes) == len(SEEDS) and all(e.success for e in episodes)
  env = gymnasium.make(env_id, **kwargs)
  for e in episodes:
    assert e.spec.seed in SEEDS and (e.spec.env_id, e.spec.env_kwargs) == (env_id, kwargs)
    observation, info = env.reset(seed=e.spec.seed)
    for step in e.steps:
      # The state the step stood at, the answer it gave (the oracle's, in EAPO's fields), and what that returned.
      assert step.observation == observation and step.state_key == info["state_key"]
      assert parse_fields(step.response_text)[0] is not None
      observation, _, terminated, truncated, info = env.step(step.response_text)
      assert step.info["admissible_actions"] == info["admissible_actions"]
      assert step.done == (terminated or truncated)
    assert e.final_state_key == info["state_key"] and e.final_observation == observation
    assert e.steps[-1].success and not any(s.success for s in e.steps[:-1])
  env.close()


def test_the_cold_start_teaches_the_verified_ways_back_of_the_searching_oracles_episodes():
  c = config()
  m = make_method(c)
  episodes, env_id, kwargs = oracle_episodes(c)
  request = m.cold_start_request(episodes)
  assert request.label == "eapo_rollback_cold_start" and request.steps == c.eapo.rollback.cold_start_steps
  env = gymnasium.make(env_id, **kwargs)
  kept = verified_rollbacks(env, episodes, answer=eapo.replay_answer,
                            max_replays=c.eapo.rollback.cold_start_max_replays)
  rollbacks, rehearsal = request.demonstrations[:len(kept)], request.demonstrations[len(kept):]
  assert kept and len(rehearsal) == sum(len(e.steps) for e in episodes)
  # Beside the rollbacks, the warm start's own demonstrations again (`rehearsal`; all of them, being fewer than two
  # per rollback): the same prompts and answers, so that the stage adds the ways back without unlearning the fields.
  assert list(rehearsal) == sft_data.oracle_sft_demos(env_id, kwargs, SEEDS, m.prompt_hook())
  # The search sweeps to one end of the corridor and walks back through rooms it has seen: its own steps back are
  # rollbacks, kept beside the admissible guesses the replay confirmed.
  returns = {(r.seed, r.prefix, r.action)
             for r in verified_rollbacks(env, episodes, admissible=False, answer=eapo.replay_answer)}
  assert returns and returns <= {(r.seed, r.prefix, r.action) for r in kept}
  for r in kept:  # each way back reaches a state its episode stood at before s'
    episode = next(e for e in episodes if e.spec.seed == r.seed)
    assert r.target_key in {s.state_key for s in episode.steps[:len(r.prefix)]}
  for demo, r in zip(rollbacks, kept):
    assert parse_fields(demo["response"])[0].action == r.action
  env.close()


def test_the_later_stages_rehearse_a_draw_of_the_oracles_steps_beside_the_iterations_rollbacks():
  c = config()
  m = make_method(c)
  episodes, env_id, kwargs = oracle_episodes(c)
  oracle = sft_data.oracle_sft_demos(env_id, kwargs, SEEDS, m.prompt_hook())
  played = episodes[:2]  # an iteration's episodes: any recorded ones will do
  rollbacks = m.rollback_demonstrations(played)
  request = m.sft_request(0, played)
  assert request.label == "eapo_rollback" and request.demonstrations[:len(rollbacks)] == tuple(rollbacks)
  rehearsal = request.demonstrations[len(rollbacks):]
  assert 0 < len(rehearsal) == 2 * len(rollbacks) < len(oracle)  # eapo.rollback.rehearsal = 2
  drawn = [oracle.index(d) for d in rehearsal]
  assert drawn == sorted(set(drawn))  # without replacement, in the oracle's order
  assert make_method(c).sft_request(0, played).demonstrations == request.demonstrations  # the iteration's draw
  assert make_method(c).sft_request(5, played).demonstrations != request.demonstrations
  assert make_method(config_with(c, rehearsal=0.0)).sft_request(0, played).demonstrations == tuple(rollbacks)


def test_the_ablations_turn_the_stages_off():
  c = config()
  assert make_method(c).cold_start_key() is not None
  c.eapo.rollback.cold_start = False  # the later stages alone
  assert make_method(c).cold_start_key() is None and c.eapo.rollback.every == 5
  c = config()
  c.eapo.rollback.enabled = False  # the no-rollback ablation: neither stage
  m = make_method(c)
  episodes, *_ = oracle_episodes(c)
  assert m.cold_start_key() is None and m.sft_request(0, episodes) is None


@pytest.mark.slow
def test_the_cold_start_runs_after_the_warm_start_and_is_cached_under_its_own_key(tmp_path, monkeypatch,
                                                                                   nano_checkpoint):
  from explore_jax.train import warm_start
  from explore_jax.train.builder import build

  monkeypatch.setenv("EXPLORE_JAX_CACHE", str(tmp_path / "cache"))
  c = config()
  c.model.checkpoint = nano_checkpoint
  c.sft.steps, c.sft.batch_size = 2, 8  # the tests' 8 CPU devices split a batch
  c.eapo.rollback.cold_start_steps, c.eapo.rollback.batch_size = 2, 8
  c.rollout.num_actors = 1
  parts = build(c, str(tmp_path / "run"))
  logs = []
  started = parts.warm_start_params(log=logs.append)
  assert any(line.startswith("[cold start] eapo_rollback_cold_start: 2 steps") for line in logs)
  warm_key = warm_start.warm_start_key(c, parts.checkpoint_dir, parts.server.prompt_len, parts.sft_response_len,
                                       parts.method.prompt_hook())
  assert parts.warm_start_key() == warm_start.start_key(warm_key, parts.method) != warm_key

  c.eapo.rollback.enabled = False  # the ablation starts RL from the warm start itself, the same cached one
  plain = build(c, str(tmp_path / "plain"))
  assert plain.warm_start_key() == warm_key
  logs.clear()
  warm = plain.warm_start_params(log=logs.append)
  assert logs and logs[0].startswith("[sft] warm start reused")
  moved = [not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(started), jax.tree.leaves(warm))]
  assert any(moved)  # the rollback steps changed the policy

  logs.clear()
  again = build(config_with(c, enabled=True), str(tmp_path / "again")).warm_start_params(log=logs.append)
  assert any(line.startswith("[cold start] reused") for line in logs)
  for a, b in zip(jax.tree.leaves(started), jax.tree.leaves(again)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def config_with(c, **rollback):
  c = c.copy_and_resolve_references()
  c.eapo.rollback.update(rollback)
  return c


def test_a_composition_asks_for_its_one_parts_cold_start_and_rejects_two():
  from explore_jax.methods import rnd
  from explore_jax.methods.base import Method
  from explore_jax.methods.composite import Composite

  c = config()
  c.method = "eapo+rnd"
  rnd.add_config(c)
  m = make_method(c)
  assert m.cold_start_key() == {"eapo": make_method(config()).cold_start_key()}
  episodes, *_ = oracle_episodes(c)
  assert m.cold_start_request(episodes).label == "eapo_rollback_cold_start"

  class Other(Method):
    def cold_start_key(self):
      return {"other": 1}

  with pytest.raises(ValueError, match="each ask for a cold start"):
    Composite(c, [eapo.EAPO(c), Other(c)], ["eapo", "other"]).cold_start_key()


def test_with_a_teacher_its_verified_answers_join_the_rollbacks():
  c = config()
  c.eapo.rollback.admissible = False  # the episodes' own steps back, and the teacher's answers
  c.eapo.rollback.teacher = "a checkpoint"
  m = make_method(c)
  assert m.cold_start_key()["rollback"]["teacher"] == "a checkpoint"
  episodes, *_ = oracle_episodes(c)
  without = make_method(config_with(c, teacher="")).cold_start_request(episodes).demonstrations

  class Teacher:  # answers as sampling/text.ChatModel does: here, the way back down the corridor, read off the rooms
    def complete(self, questions, max_new_tokens):
      out = []
      for q in questions:
        here, before = (int(n) for n in re.findall(r"Room (\d+)/", q[0]["content"])[:2])
        out.append("go right" if here < before else "go left" if here > before else "look")
      return out

  m._teacher = Teacher()
  with_teacher = m.cold_start_request(episodes).demonstrations
  assert len(with_teacher) > len(without)


def test_a_chat_model_answers_each_prompt_as_it_would_alone():
  from explore_jax.sampling.text import ChatModel

  chat = ChatModel.load("tiny", batch_size=2)
  prompts = [[{"role": "user", "content": text}] for text in ("go left", "take key and go to the door", "look")]
  answers = chat.complete(prompts, max_new_tokens=6)
  assert len(answers) == 3 and all(isinstance(a, str) for a in answers)
  assert chat.complete(prompts[2:], max_new_tokens=6) == answers[2:]  # greedy, and a row's answer is its own
  assert chat.complete(prompts[1:2], max_new_tokens=6) == answers[1:2]
