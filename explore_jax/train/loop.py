"""The RL training loop: the algorithm box every method shares (DESIGN.md's iteration).

  for iteration t = start .. T-1:
    episodes  <- actors play B task groups x G episodes with pi_theta (and the method's prompts)
    method observes the finished episodes (buffers, memories)
    records   <- the episodes' steps, with the method's fields
    aux models of phase "before_rewards" train on the records
    rewards   <- extrinsic + the method's intrinsic terms
    A         <- the configured advantage estimator (groups kept on their outcome rewards)
    theta     <- minibatch epochs of the clipped policy loss on the (method-rewritten) batch
    aux models of phase "after_update" train on the records
    theta     <- SFT on the method's demonstrations, if it asks
    evaluate every eval.every iterations; checkpoint every checkpoint.every (and where a SIGTERM asks it to
    stop: train/preemption.py)

Every method is the same loop with different hook answers (methods/base.py); no method is named here.
With config.rollout.max_staleness = k > 0 the episodes of iterations t+1..t+k are played while update t
runs (train/pipeline.py: which parameters sample what, the replay's staleness gate, exact resume).
Reproducibility: every random choice is a function of (seed, iteration, episode, step), so a run killed
at any moment and started again with the same command resumes from its last checkpoint and produces the
same metrics.
"""

from __future__ import annotations

import functools
import os
import time
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np

from explore_jax.parallel import distributed
from explore_jax.replay import Replay
from explore_jax.train import evaluation
from explore_jax.train import evaluator as evaluator_lib
from explore_jax.train import metrics as metrics_lib
from explore_jax.train import pipeline
from explore_jax.train import preemption
from explore_jax.train import provenance
from explore_jax.train import rollout
from explore_jax.train import samples as samples_lib
from explore_jax.train import throughput
from explore_jax.train.builder import Parts, build


def train(config: Any, workdir: str) -> list[dict[str, Any]]:
  """Builds the run's parts and runs the whole job; returns the metrics history."""
  return run(build(config, workdir))


def run(parts: Parts) -> list[dict[str, Any]]:
  c, learner, evaluator = parts.config, parts.learner, parts.evaluator
  start = restore_or_init(parts)
  # Every process computes (the sampling, updates and evaluations are one SPMD program over the global mesh);
  # process 0 alone writes the run's files: metrics, provenance, summaries, curves. Checkpoints are collective.
  primary = distributed.is_primary()
  # The machine, and at iteration 0 the bits of the starting policy: which runs share a warm start.
  provenance.record(parts.workdir, start, learner.state.params if start == 0 else None,
                    warm_start=parts.warm_start_key() if c.sft.enabled else None, write=primary)
  writer = metrics_lib.MetricsWriter(parts.workdir, resume_from=start if start > 0 else None, write=primary)
  samples = samples_lib.SampleWriter(parts.workdir, c.train.get("log_samples", 0),
                                           resume_from=start if start > 0 else None, write=primary)
  passk = c.eval.get("passk_samples", 0) > 0
  from tqdm import tqdm

  bar = tqdm(range(start, c.train.num_iterations), initial=start, total=c.train.num_iterations,
             desc=f"{c.method}", unit="it", dynamic_ncols=True)
  try:
    with (parts.make_pool() as pool, pipeline.RolloutPipeline.from_config(parts, pool) as rollouts,
          preemption.StopRequest() as stop):
      replay = pipeline.make_replay(parts)
      if passk and (start == 0 or evaluator.lacks_warm_pass_at_k(parts.workdir)):
        evaluator.warm_start_pass_at_k(pool, learner.state.params if start == 0 else start_params(parts),
                                       parts.workdir, parts.warm_start_key(), bar.write, write=primary,
                                       before_each=functools.partial(_leave_if_asked, stop, start))
      if start == 0 and c.eval.every > 0:
        writer.write(0, evaluator.periodic(pool, learner.state.params, 0))
      for it in bar:
        t0 = time.time()
        m = iterate(parts, rollouts, it, replay, samples)
        n = it + 1
        if c.eval.every > 0 and (n % c.eval.every == 0 or n == c.train.num_iterations):
          rollouts.wait()  # the evaluation takes the actor pool
          m.update(evaluator.periodic(pool, learner.state.params, n))
        m["time_iteration_s"] = time.time() - t0
        writer.write(n, m)
        if n % c.checkpoint.every == 0 or n == c.train.num_iterations:
          save(parts, n)
        if rollouts.resumes_exactly_at(n) and stop.agreed():  # a SIGTERM: keep this iteration, then leave
          save(parts, n)  # (a no-op where the line above saved it)
          raise preemption.Stopped(n)
        bar.set_postfix(success=f"{m['success_rate']:.2f}", reward=f"{m['return']:.2f}",
                        tok_s=f"{m['sample_tokens_per_s']:.0f}", sample=f"{m['time_sampling_s']:.1f}s",
                        env=f"{m['time_environment_s']:.1f}s", update=f"{m['time_update_s']:.1f}s",
                        **_throughput_postfix(m))
      if passk:
        bar.write(f"[pass@k] trained policy: {c.eval.passk_samples} samples of each {evaluator.task_sets_text()}")
        trained = evaluator.pass_at_k_sets(pool, learner.state.params, evaluation.TRAINED,
                                           before_each=functools.partial(_leave_if_asked, stop,
                                                                         c.train.num_iterations))
  finally:
    bar.close()
    writer.close()
  if not primary:
    return writer.history
  if passk:
    warm = evaluator_lib.load_warm_pass_at_k(parts.workdir)
    text = evaluator.write_summary(evaluator_lib.before_and_after(warm, trained), parts.workdir,
                                   note=evaluator_lib.ONE_RUN_NOTE)
    print(f"\n{text}\n[summary] {os.path.join(parts.workdir, 'summary.md')}, "
          f"{os.path.join(parts.workdir, 'pass_at_k.png')}")
  history = writer.history
  metrics_lib.plot_curves(history, ["success_rate", "eval/success_rate", "return", "format_ok",
                                    "update/loss", "update/entropy"],
                          os.path.join(parts.workdir, "curves.png"), title=f"{c.method} on {c.env.id}")
  return history


def _leave_if_asked(stop: preemption.StopRequest, saved: int) -> None:
  """Before each task set of a pass@k, whose sampling takes minutes: a SIGTERM leaves there, at the iteration last
  saved (step 0 is saved before any pass@k, the last iteration before the trained policy's)."""
  if stop.agreed():
    raise preemption.Stopped(saved)


def iterate(parts: Parts, rollouts: pipeline.RolloutPipeline, it: int, replay: Optional[Replay] = None,
            samples: Optional[samples_lib.SampleWriter] = None) -> dict[str, float]:
  """One pass of the algorithm box (module docstring); returns the iteration's metrics. With overlap
  (train/pipeline.py), the next rollouts start once this one's episodes are observed, and the records pass
  through `replay`'s staleness bound."""
  c, method, learner = parts.config, parts.method, parts.learner
  collected = rollouts.take(it, learner.state.params)
  results, m = collected.results, collected.metrics
  if samples is not None:
    samples.write(it + 1, results)
  m.update(method.observe(results, training=True))
  rollouts.launch_ahead(it, learner.state.params)
  records = rollout.to_records(parts.spec, method, results, max_steps=int(c.env.max_steps),
                               pad_to=parts.records_per_iteration)
  if replay is not None:
    records, admitted = pipeline.admit(replay, records, it, rollouts.max_staleness)
    m.update(admitted)
  t0 = time.time()
  m.update(learner.train_aux("before_rewards", records))
  t_rewards = time.time()
  records, rewards, reward_metrics = learner.rewards(records)
  m.update(reward_metrics)
  m["time_rewards_s"] = time.time() - t_rewards  # the intrinsic terms' (an aux model's scoring: EAPO's q_phi)
  advantages, valid = learner.advantages(records, rewards)
  m.update(method.observe_update(it, records, advantages, valid))
  m.update(learner.update(learner.update_batch(records, advantages, valid, it), it))
  m.update(learner.train_aux("after_update", records))
  request = method.sft_request(it, results)
  if request is not None:
    m.update(learner.sft(request))
  m["time_update_s"] = time.time() - t0
  devices = list(parts.model.mesh.devices.flat) if parts.model.mesh is not None else jax.devices()
  m.update(throughput.iteration_metrics(m, parts.model.config,
                                        throughput.peak_tflops(c.train.get("peak_tflops", 0.0), devices)))
  m["advantage_abs_mean"] = float(jnp.sum(jnp.abs(advantages)) / max(valid.sum(), 1))
  m["groups_kept"] = float(len(set(np.asarray(records.group_id)[valid].tolist())))
  return m


def _throughput_postfix(m: dict[str, float]) -> dict[str, str]:
  """The progress bar's learner figures: tokens/s, and MFU where the devices' peak is known."""
  out = {}
  if "throughput/learner_tokens_per_s" in m:
    out["learn_tok_s"] = f"{m['throughput/learner_tokens_per_s']:.0f}"
  if "throughput/mfu" in m:
    out["mfu"] = f"{100 * m['throughput/mfu']:.1f}%"
  return out


# ---- checkpoints -------------------------------------------------------------------------------------

def save(parts: Parts, iteration: int) -> None:
  """Policy, aux models and method arrays in one orbax step; the method's JSON state in its metadata."""
  if parts.checkpointer.latest_step() == iteration:
    return
  parts.checkpointer.save(iteration, parts.learner.checkpoint_tree(), rng=parts.key,
                          metadata={"iteration": iteration, "method": parts.method.state_dict()})
  parts.checkpointer.wait()


def restore_or_init(parts: Parts) -> int:
  """Restores the latest checkpoint (returns its iteration) or warm-starts and saves step 0 (returns 0)."""
  learner = parts.learner
  latest = parts.checkpointer.latest_step()
  if latest is None:
    learner.init(parts.warm_start_params())
    save(parts, 0)
    return 0
  restored = parts.checkpointer.restore(learner.abstract_checkpoint(), latest)
  learner.load_checkpoint_tree(restored.state)
  parts.method.load_state_dict((restored.metadata or {}).get("method", {}))
  if learner.reference_logprobs is not None:  # the KL term is measured against the policy RL started from
    learner.reference_params = start_params(parts)
  print(f"[resume] from iteration {latest} in {parts.checkpointer.directory}")
  return latest


def start_params(parts: Parts) -> Any:
  """The policy RL started from (a KL term's reference, the warm start's pass@k): step 0 of this run, or, where
  step 0 is gone (rotated away; KL runs keep it), the warm start again, which is what step 0 held (cached;
  recomputed to the same params if not)."""
  if 0 in parts.checkpointer.all_steps():
    return load_params(parts, 0)
  print(f"[resume] step 0 is not in {parts.checkpointer.directory}; the policy RL started from is the warm start "
        "again")
  return parts.warm_start_params()


def load_params(parts: Parts, step: Optional[int] = None) -> Any:
  """The policy parameters of this run's checkpoint `step` (default: the latest)."""
  step = parts.checkpointer.latest_step() if step is None else step
  if step is None:
    raise FileNotFoundError(f"no checkpoint in {parts.checkpointer.directory}")
  return parts.checkpointer.restore(parts.learner.abstract_checkpoint(), step).state["train"].params
