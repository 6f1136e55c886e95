"""Actors in a multi-host run: two CPU processes (4 fake devices each, one 8-device mesh over loopback) each
run an ActorPool with one actor on KeyDoor and sample from the tiny model through the InferenceServer. Each
process's actor plays only its share of the episodes, the pools meet in collective rounds
(explore_jax/parallel/exchange.py), both processes return every result, and the responses (tokens,
log-probs, embeddings shown in prompts, final generations) equal bit for bit those of one process with 8
fake devices playing all of them.

This file is also the worker script: `python tests/parallel/test_multihost_actors.py ROLE ...` (see _worker).
"""

from __future__ import annotations

import json
import os
import sys

import pytest

from tests.parallel.processes import cpu_env, free_port, run_together

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TIMEOUT_S = 420  # generous: the processes compile the sampler on a machine whose cores they share
MESH = (2, 2, 2)  # data, fsdp, tensor
EPISODES = 8
ENVS_PER_ACTOR = 2
BATCH = 2 * ENVS_PER_ACTOR  # both processes' actors' requests fit one sampler call
MAX_STEPS = 6  # KeyDoor's own limit with 2 rooms


def _specs(log_dir: str):
  from explore_jax.actors import EpisodeSpec

  # Embeddings before every step of the even episodes, a final generation after every third one.
  return [EpisodeSpec(episode_id=i, group_id=i // 2, traj_id=i, env_id="explore_jax/KeyDoor-v0",
                      env_kwargs={"num_rooms": 2, "num_distractors": 1}, seed=100 + i // 2,
                      context={"log_dir": log_dir, "episode": i, "embed": i % 2 == 0, "final": i % 3 == 0})
          for i in range(EPISODES)]


# ---- the worker ---------------------------------------------------------------------------------------------
def _worker(role: str, out_dir: str, log_dir: str, coordinator: str = "", num_processes: int = 0,
            process_id: int = -1) -> None:
  sys.path.insert(0, ROOT)
  from explore_jax.parallel import distributed

  multi = distributed.initialize(coordinator, num_processes, process_id)
  assert multi == (role == "worker"), (role, multi)

  import jax
  import numpy as np

  from explore_jax import hf, sampling
  from explore_jax.actors import ActorPool
  from explore_jax.models import Model
  from explore_jax.parallel import DEFAULT_RULES, make_mesh
  from explore_jax.parallel.exchange import ProcessExchange
  from explore_jax.train.inference import InferenceServer
  from tests.actors import actor_fixtures

  mesh = make_mesh(MESH)
  pre = hf.load_pretrained("tiny", mesh=mesh, rules=DEFAULT_RULES)
  tok = pre.tokenizer
  server = InferenceServer(model=Model(pre.config, mesh=mesh, rules=DEFAULT_RULES), tokenizer=tok,
                           pad_id=tok.pad_token_id, prompt_len=128, response_len=8, max_steps=MAX_STEPS,
                           batch_size=BATCH)
  policy_fn, embed_fn = server.bind(pre.params, jax.random.key(5),
                                    sampling.make_sampling_params(1.0, eos_ids=[tok.eos_token_id]), version=3)
  calls = []

  def recorded(fn, kind):
    def call(requests):
      calls.append([kind] + [[r.episode_id, r.step] for r in requests])
      return fn(requests)
    return call

  exchange = ProcessExchange() if multi else None
  result = {"process_index": jax.process_index(), "process_count": jax.process_count()}
  if multi:
    # Objects of different sizes, images among them, come back whole and in process order.
    views = exchange.allgather({"process": exchange.process_index,
                                "image": np.full((3 + exchange.process_index, 5, 3), 7, np.uint8)})
    result["exchange"] = [[v["process"], list(v["image"].shape), int(v["image"].sum())] for v in views]

  finished = []
  with ActorPool(num_actors=1 if multi else 2, tokenizer_dir=hf.resolve("tiny"),
                 prompt_hook=actor_fixtures.LoggedMethodPrompt(), envs_per_actor=ENVS_PER_ACTOR,
                 max_prompt_tokens=server.prompt_len, exchange=exchange) as pool:
    results, metrics = pool.run(_specs(log_dir), recorded(policy_fn, "policy"), recorded(embed_fn, "embed"),
                                on_result=lambda r: finished.append(r.spec.episode_id))
    played = actor_fixtures.played(log_dir, pool.actor_pids())

  def bits(values, dtype):
    return np.asarray(values, dtype).tobytes().hex()

  result.update(
      played=played, on_result=sorted(finished), calls=calls,
      metrics={k: metrics[k] for k in ("episodes", "episodes_done", "episodes_dropped", "actor_restarts", "steps",
                                       "requests", "embed_requests")},
      results=[{"episode": r.spec.episode_id, "error": r.error, "success": r.success, "return": r.total_reward,
                "final_text": r.final_text,
                "final": None if r.final_response is None else [bits(r.final_response.tokens, np.int32),
                                                                bits(r.final_response.logprobs, np.float32)],
                "steps": [[s.step_index, s.prompt_ids, s.response_text, bits(s.response.tokens, np.int32),
                           bits(s.response.logprobs, np.float32), s.response.policy_version] for s in r.steps]}
               for r in results])
  with open(os.path.join(out_dir, f"{role}_{jax.process_index()}.json"), "w") as f:
    json.dump(result, f, indent=1)


# ---- the test -----------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_each_process_plays_its_share_and_all_match_one_process(tmp_path):
  out = tmp_path / "out"
  out.mkdir()
  logs = {role: tmp_path / f"{role}_actors" for role in ("worker", "reference")}
  for d in logs.values():
    d.mkdir()
  me = os.path.abspath(__file__)
  coordinator = f"127.0.0.1:{free_port()}"
  run_together([([sys.executable, me, "worker", str(out), str(logs["worker"]), coordinator, "2", str(i)],
                 cpu_env(4)) for i in range(2)], str(tmp_path), "worker", TIMEOUT_S)
  run_together([([sys.executable, me, "reference", str(out), str(logs["reference"])], cpu_env(8))],
               str(tmp_path), "reference", TIMEOUT_S)

  workers = [json.loads((out / f"worker_{i}.json").read_text()) for i in range(2)]
  ref = json.loads((out / "reference_0.json").read_text())
  assert [(w["process_index"], w["process_count"]) for w in workers] == [(0, 2), (1, 2)]
  assert ref["process_count"] == 1
  assert workers[0]["exchange"] == workers[1]["exchange"] == [[0, [3, 5, 3], 7 * 45], [1, [4, 5, 3], 7 * 60]]
  # (a) Each process's actor played its share, the episodes at positions p, p + 2, ...; the reference all.
  for p, w in enumerate(workers):
    assert w["played"] == list(range(p, EPISODES, 2))
  assert ref["played"] == list(range(EPISODES))
  # (b) Both processes return all results, the same, and report each of them to on_result.
  assert [r["episode"] for r in workers[0]["results"]] == list(range(EPISODES))
  assert workers[0]["results"] == workers[1]["results"]
  assert workers[0]["on_result"] == workers[1]["on_result"] == list(range(EPISODES))
  assert workers[0]["metrics"] == workers[1]["metrics"]
  # Both made the same policy and embedding calls, each holding both processes' requests in (episode, step)
  # order: the SPMD sampler saw one global input sequence.
  assert workers[0]["calls"] == workers[1]["calls"]
  for call in workers[0]["calls"]:
    assert call[1:] == sorted(call[1:])
  assert any({e % 2 for e, _ in call[1:]} == {0, 1} for call in workers[0]["calls"] if call[0] == "policy")
  # (c) Bit for bit what one process with 8 devices samples for all the episodes: prompts (which show the
  # embeddings), tokens, log-probs, final generations, outcomes.
  assert workers[0]["results"] == ref["results"]
  assert workers[0]["metrics"] == ref["metrics"]
  m = ref["metrics"]
  assert m["episodes_done"] == EPISODES and m["episodes_dropped"] == m["actor_restarts"] == 0
  assert m["embed_requests"] > 0 and any(r["final"] for r in ref["results"]) and m["steps"] >= EPISODES


if __name__ == "__main__":
  role, out_dir, log_dir, *rest = sys.argv[1:]
  _worker(role, out_dir, log_dir, *(rest[:1] + [int(x) for x in rest[1:]]))
