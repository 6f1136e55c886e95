"""Rollout overlapped with learning (train/pipeline.py): which parameters sample each iteration, the replay's
staleness gate, and an overlapped run as a user runs it -- reproducible, and resumed exactly from a checkpoint."""

import signal
import threading

import jax
import numpy as np
import pytest

from explore_jax.replay import RecordSpec, Replay, from_host
from explore_jax.train import pipeline

from tests.polling import wait_until
from tests.train.test_loop import comparable, launch, rows


class _Recording(pipeline.RolloutPipeline):
  """The schedule without actors: a rollout 'plays' by noting its iteration, parameters and thread."""

  def __init__(self, **kwargs):
    super().__init__(parts=None, pool=None, **kwargs)
    self.played: dict[int, tuple] = {}

  def _play(self, iteration, params, version):
    def work():
      self.played[iteration] = (float(params["w"]), version, threading.current_thread().name)
      return [], {}
    return work


def schedule(k, num_iterations, checkpoint_every, start=0):
  """{iteration: (the parameters' value, its version, whether it ran on the background thread)} of a loop
  whose update t turns parameters t into t + 1."""
  with _Recording(max_staleness=k, num_iterations=num_iterations, checkpoint_every=checkpoint_every) as p:
    for it in range(start, num_iterations):
      params = {"w": jax.numpy.asarray(float(it))}
      collected = p.take(it, params)
      assert collected.metrics["rollout/staleness"] == it - collected.version <= k
      p.launch_ahead(it, params)
    return {it: (w, v, name.startswith("rollout")) for it, (w, v, name) in p.played.items()}


def test_synchronous_samples_every_iteration_with_its_own_parameters_on_the_loops_thread():
  assert schedule(0, 6, 4) == {it: (float(it), it, False) for it in range(6)}


def test_one_step_ahead_samples_with_the_previous_parameters_except_at_checkpoints():
  got = schedule(1, 9, 4)
  # Rollouts 0, 4 and 8 start after the update before them (a fresh start, checkpoint iterations); every
  # other one is launched one update earlier, on the background thread, with the parameters of that moment.
  assert got == {0: (0.0, 0, False), 1: (0.0, 0, True), 2: (1.0, 1, True), 3: (2.0, 2, True),
                 4: (4.0, 4, False), 5: (4.0, 4, True), 6: (5.0, 5, True), 7: (6.0, 6, True),
                 8: (8.0, 8, False)}


def test_k_steps_ahead_never_passes_a_checkpoint_and_bounds_the_staleness():
  got = schedule(2, 9, 4)
  assert got == {0: (0.0, 0, False), 1: (0.0, 0, True), 2: (0.0, 0, True), 3: (1.0, 1, True),
                 4: (4.0, 4, False), 5: (4.0, 4, True), 6: (4.0, 4, True), 7: (5.0, 5, True),
                 8: (8.0, 8, False)}
  assert all(it - version <= 2 for it, (_, version, _) in got.items())


@pytest.mark.parametrize("k", [1, 2])
def test_a_run_resumed_at_a_checkpoint_makes_the_same_rollouts(k):
  full = schedule(k, 11, 4)
  assert schedule(k, 11, 4, start=4) == {it: full[it] for it in range(4, 11)}
  assert schedule(k, 11, 4, start=8) == {it: full[it] for it in range(8, 11)}


def test_a_synchronous_run_resumes_exactly_anywhere_an_overlapped_one_at_its_synchronisation_points():
  # Where a SIGTERM's stop may save (train/preemption.py): rollout n of the resumed run must be what it was.
  with _Recording(max_staleness=0, num_iterations=9, checkpoint_every=4) as p:
    assert all(p.resumes_exactly_at(n) for n in range(1, 10))
  for k in (1, 2):
    with _Recording(max_staleness=k, num_iterations=9, checkpoint_every=4) as p:
      assert [n for n in range(1, 10) if p.resumes_exactly_at(n)] == [4, 8]
      full = schedule(k, 9, 4)
      assert all(full[n][1] == n for n in (4, 8))  # rollout n played by theta_n, as a resumed run plays it


def test_an_error_in_a_background_rollout_reaches_the_loop():
  class Failing(_Recording):
    def _play(self, iteration, params, version):
      if iteration == 1:
        def fail():
          raise RuntimeError("actor pool broke")
        return fail
      return super()._play(iteration, params, version)

  with Failing(max_staleness=1, num_iterations=4, checkpoint_every=10) as p:
    p.take(0, {"w": 0.0})
    p.launch_ahead(0, {"w": 0.0})
    p.wait()  # waits without raising: the error belongs to the iteration that takes the rollout
    with pytest.raises(RuntimeError, match="actor pool broke"):
      p.take(1, {"w": 1.0})


def test_negative_staleness_is_a_clear_error():
  with pytest.raises(ValueError, match="max_staleness"):
    pipeline.RolloutPipeline(None, None, max_staleness=-1, num_iterations=3, checkpoint_every=1)


SPEC = RecordSpec(prompt_len=4, response_len=3)


def records(versions, pad_to):
  rows_ = [dict(prompt_tokens=[10 + i, 20 + i][: 1 + i % 2], response_tokens=[i, i + 1][: 1 + i % 2],
                behaviour_logprobs=[-0.5 * i] * (1 + i % 2), task_reward=float(i % 2), group_id=i // 2,
                traj_id=i, step_index=0, policy_version=v, done=True)
           for i, v in enumerate(versions)]
  return from_host(SPEC, rows_, pad_to=pad_to)


def test_admit_passes_fresh_records_through_unchanged_once():
  replay = Replay(SPEC, 16)
  incoming = records([3, 3, 4, 4, 4], pad_to=8)
  taken, m = pipeline.admit(replay, incoming, iteration=4, max_staleness=1)
  for got, want in zip(jax.tree.leaves(taken), jax.tree.leaves(incoming)):
    assert isinstance(got, np.ndarray)
    np.testing.assert_array_equal(got, want)
  assert m == {"replay/rows_taken": 5.0, "replay/rows_left": 0.0, "replay/rows_offered": 5.0}
  # Each record trains one update: the next iteration takes only its own new records.
  taken, m = pipeline.admit(replay, records([5, 5], pad_to=8), iteration=5, max_staleness=1)
  assert np.asarray(taken.valid).sum() == 2 and m["replay/rows_taken"] == 2.0


def test_admit_drops_records_older_than_the_bound():
  replay = Replay(SPEC, 16)
  taken, m = pipeline.admit(replay, records([2, 3, 4, 4], pad_to=4), iteration=4, max_staleness=1)
  assert np.asarray(taken.traj_id)[np.asarray(taken.valid)].tolist() == [1, 2, 3]
  assert m["replay/rows_taken"] == 3.0 and m["replay/rows_offered"] == 4.0


OVERLAP = ["--config.rollout.max_staleness=1", "--config.checkpoint.every=2", "--config.eval.every=3",
           "--config.train.num_iterations=4"]


@pytest.mark.slow
def test_an_overlapped_run_is_reproducible_and_resumes_exactly(tmp_path, nano_checkpoint):
  cache = tmp_path / "cache"
  ref = launch(tmp_path / "ref", *OVERLAP, cache=cache, checkpoint=nano_checkpoint)
  _, err = ref.communicate(timeout=900)
  assert ref.returncode == 0, err[-3000:]
  reference = rows(tmp_path / "ref")
  assert [r["iteration"] for r in reference] == [0, 1, 2, 3, 4]
  # Iterations 0 and 2 start after the update before them (the start, a checkpoint); 1 and 3 were played
  # during the update before them, by the policy one update older, and every record trained once.
  assert [r["rollout/staleness"] for r in reference[1:]] == [0.0, 1.0, 0.0, 1.0]
  for r in reference[1:]:
    assert r["replay/rows_taken"] == r["replay/rows_offered"] > 0 and r["replay/rows_left"] == 0
    assert 0 <= r["throughput/rollout_wait_share"] <= 1 and r["update/minibatches"] >= 1
  # The evaluation after update 2 waited for rollout 3, in flight since iteration 2.
  assert "eval/success_rate" in reference[3] and "eval/success_rate" in reference[4]

  # The same command killed with SIGKILL once iteration 2 is written, then started again: it resumes from its
  # last checkpoint (a synchronisation point of the schedule) and makes the same run.
  run = launch(tmp_path / "run", *OVERLAP, cache=cache, checkpoint=nano_checkpoint)
  written = lambda: (tmp_path / "run" / "metrics.jsonl").exists() and len(rows(tmp_path / "run")) >= 3
  assert wait_until(lambda: written() or run.poll() is not None, timeout_s=900) and run.poll() is None, \
      run.communicate()[1][-3000:]
  run.send_signal(signal.SIGKILL)
  run.communicate()
  resumed = launch(tmp_path / "run", *OVERLAP, cache=cache, checkpoint=nano_checkpoint)
  out, err = resumed.communicate(timeout=900)
  assert resumed.returncode == 0, err[-3000:]
  assert "[resume] from iteration" in out
  assert [comparable(r) for r in rows(tmp_path / "run")] == [comparable(r) for r in reference]
