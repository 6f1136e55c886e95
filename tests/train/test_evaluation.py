"""pass@k's unbiased estimator against brute-force enumeration, per-task grouping, the summary table."""

import itertools
import math

import numpy as np
import pytest

from explore_jax.actors.protocol import EpisodeResult, EpisodeSpec, Response, StepRecord
from explore_jax.train import evaluation


@pytest.mark.parametrize("n, c", [(5, 0), (5, 1), (5, 3), (6, 6), (8, 2)])
def test_pass_at_k_equals_the_fraction_of_k_subsets_with_a_success(n, c):
  outcomes = [1] * c + [0] * (n - c)
  for k in range(1, n + 1):
    subsets = list(itertools.combinations(range(n), k))
    brute = sum(any(outcomes[i] for i in s) for s in subsets) / len(subsets)
    assert evaluation.pass_at_k(n, c, k) == pytest.approx(brute, abs=1e-12)
    assert evaluation.pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k), abs=1e-12)


def test_pass_at_k_needs_enough_samples():
  with pytest.raises(ValueError, match="pass@4 needs at least 4 samples"):
    evaluation.pass_at_k(3, 1, 4)


def _result(seed, success, outcomes, dropped=False, states=None, final_state=0):
  """An attempt whose steps carry `outcomes` (None: the world names none) and state keys `states`."""
  resp = Response(0, 0, np.zeros(1, np.int32), np.zeros(1, np.float32), np.ones(1, np.float32),
                  np.zeros(1, np.int32), 0)
  states = states or [0] * len(outcomes)
  steps = [StepRecord(0, 0, 0, i, 0, [1], resp, "", 0.0, 1.0, k, False, success, {} if o is None else {"outcome": o})
           for i, (o, k) in enumerate(zip(outcomes, states))]
  return EpisodeResult(spec=EpisodeSpec(0, 0, 0, "x", seed=seed), steps=steps, success=success,
                       total_reward=float(success), feedback="", error="died" if dropped else None,
                       final_state_key=final_state)


def test_summarize_groups_by_task_and_counts_distinct_outcomes():
  results = [_result(0, False, [["t1"], ["t1", "t2"]]), _result(0, True, [["t1"], []]),
             _result(1, False, [["t0"]]), _result(1, False, [["t0"]]), _result(1, True, [[]], dropped=True)]
  e = evaluation.summarize("x", results)
  assert e.task_ids == [0, 1]
  np.testing.assert_array_equal(e.samples, [2, 2])
  np.testing.assert_array_equal(e.successes, [1, 0])
  np.testing.assert_array_equal(e.outcomes, [3, 1])
  assert e.pass_at(1) == pytest.approx(0.25) and e.pass_at(2) == pytest.approx(0.5)
  text = evaluation.table([e], [1, 2])
  assert "| x | 2 | 2 | 0.250 | 0.500 | 1 | 2.00 | 1.00 |" in text
  assert evaluation.powers_of_two(16) == [1, 2, 4, 8, 16]


def test_a_text_world_attempt_ends_in_its_final_state_and_success_and_its_states_count_every_observation():
  """Without a named outcome, two attempts ending in one state with one success share their outcome; states
  count every step's key and the final one, over the task's attempts."""
  results = [_result(0, False, [None, None], states=[1, 2], final_state=7),
             _result(0, False, [None], states=[1], final_state=7),     # same end, same outcome
             _result(0, True, [None, None], states=[1, 3], final_state=7),  # same end, won: another outcome
             _result(1, False, [None], states=[1], final_state=1)]      # ends where it began
  e = evaluation.summarize("x", results)
  np.testing.assert_array_equal(e.outcomes, [2, 1])
  np.testing.assert_array_equal(e.states, [4, 1])   # {1, 2, 3, 7}; {1}
  d = e.to_dict([1])
  assert d["distinct_states_per_task"] == 2.5 and d["distinct_outcomes_per_task"] == 1.5
  np.testing.assert_array_equal(e.success_steps, [2, 0])
  assert d["steps_to_success"] == 2.0
  back = evaluation.TaskSetEval.from_json(e.to_json())
  np.testing.assert_array_equal(back.states, e.states)
  older = {k: v for k, v in e.to_json().items() if k not in ("states", "success_steps")}  # an older summary
  old = evaluation.TaskSetEval.from_json(older)
  assert old.states is None and old.success_steps is None
  assert not {"distinct_states_per_task", "steps_to_success"} & set(old.to_dict([1]))
  np.testing.assert_array_equal(evaluation.TaskSetEval.from_json(e.to_json()).success_steps, e.success_steps)
  assert evaluation.table([old], [1]).splitlines()[-1].endswith("| - |")


class _Server:
  def bind(self, params, key, sampling_params, iteration):
    return None, None


class _Pool:
  """Plays every episode as a success on even seeds; records the seeds and environment kwargs it was asked for."""

  def __init__(self):
    self.seeds, self.kwargs = [], []

  def run(self, specs, policy_fn, embed_fn=None, on_result=None):
    self.seeds.append(sorted({s.seed for s in specs}))
    self.kwargs.append(specs[0].env_kwargs)
    results = [EpisodeResult(spec=s, steps=[], success=s.seed % 2 == 0, total_reward=0.0, feedback="")
               for s in specs]
    for r in results:
      on_result(r)
    return results, {}


@pytest.mark.parametrize("task_pool", [3, 0])
def test_pass_at_k_sets_have_no_held_in_set_when_every_group_draws_a_fresh_task(task_pool):
  """rollout.task_pool N: the held-in set is seeds 0..N-1, then the held-out set; 0 (a fresh task per group):
  no task recurs, so the held-out set alone, and asking for the held-in one is a clear error."""
  import jax
  import ml_collections

  from explore_jax.train.evaluator import Evaluator, before_and_after

  config = ml_collections.ConfigDict({
      "env": {"id": "explore_jax/KeyDoor-v0", "kwargs": {}}, "rollout": {"task_pool": task_pool},
      "eval": {"env_kwargs": {}, "seed_offset": 100, "passk_held_out_tasks": 2, "passk_samples": 2}})
  evaluator, pool = Evaluator(config, _Server(), None, jax.random.key(0)), _Pool()
  sets = evaluator.pass_at_k_sets(pool, None, "trained")
  held_out = ("trained / held-out", [100, 101])
  expected = [("trained / train", list(range(task_pool))), held_out] if task_pool else [held_out]
  assert [(s.label, list(s.task_ids)) for s in sets] == expected
  assert pool.seeds == [seeds for _, seeds in expected]
  assert [list(s.successes) for s in sets][-1] == [2, 0]
  if not task_pool:
    with pytest.raises(ValueError, match="task_pool is 0"):
      evaluator.pass_at_k(pool, None, "train", policy="trained")
  # The run's summary rows: each set before RL, then after.
  warm = evaluator.pass_at_k_sets(pool, None, "warm start")
  rows = [s.label for s in before_and_after(warm, sets)]
  splits = ["train", "held-out"] if task_pool else ["held-out"]
  assert rows == [f"{policy} / {split}" for split in splits for policy in ("warm start", "trained")]
  with pytest.raises(ValueError, match="do not match"):
    before_and_after(warm, sets + sets)


class _KeyServer:
  """Records the sampling key of every bind."""

  def __init__(self):
    self.keys = []

  def bind(self, params, key, sampling_params, iteration):
    import jax
    self.keys.append(np.asarray(jax.random.key_data(key)).tolist())
    return None, None


def test_the_warm_start_is_sampled_from_its_own_stream_whatever_the_rl_seed(tmp_path, monkeypatch):
  """Every run of one warm start (sft.seed) samples its pass@k from the same key, whatever its RL seed
  (config.seed: the run's key), so the run that computes it and the runs that read the cache report the same
  episodes; another warm start samples others, and the trained policy keeps the run's own streams."""
  import jax
  import ml_collections

  from explore_jax.train.evaluator import Evaluator

  def evaluator(seed, sft_seed):
    config = ml_collections.ConfigDict({
        "seed": seed, "env": {"id": "explore_jax/KeyDoor-v0", "kwargs": {}},
        "rollout": {"task_pool": 0, "max_new_tokens": 8, "top_p": 1.0}, "sft": {"seed": sft_seed, "enabled": True},
        "eval": {"env_kwargs": {}, "seed_offset": 100, "passk_held_out_tasks": 2, "passk_samples": 2}})
    server = _KeyServer()
    return Evaluator(config, server, None, jax.random.key(seed)), server

  keys = {}
  for seed, sft_seed in ((0, 0), (1, 0), (0, 1)):
    ev, server = evaluator(seed, sft_seed)
    workdir = tmp_path / f"run{seed}{sft_seed}"
    workdir.mkdir()
    monkeypatch.setenv("EXPLORE_JAX_CACHE", str(workdir / "cache"))  # each run computes its warm start's pass@k
    ev.warm_start_pass_at_k(_Pool(), None, str(workdir), "ws", log=lambda _: None)
    assert (workdir / "pass_at_k_warm_start.json").exists()
    ev.pass_at_k_sets(_Pool(), None, "trained")
    keys[seed, sft_seed] = server.keys
  (warm00, trained00), (warm10, trained10), (warm01, _) = keys[0, 0], keys[1, 0], keys[0, 1]
  assert warm00 == warm10 != warm01
  assert trained00 != trained10


def _split_evaluator(more_splits, task_pool=2, server=None):
  import jax
  import ml_collections

  from explore_jax.train.evaluator import Evaluator

  config = ml_collections.ConfigDict({
      "seed": 0, "env": {"id": "explore_jax/KeyDoor-v0", "kwargs": {"split": "train", "size": 5}},
      "rollout": {"task_pool": task_pool, "max_new_tokens": 8, "top_p": 1.0}, "sft": {"seed": 0, "enabled": True},
      "eval": {"env_kwargs": {"split": "valid_unseen"}, "seed_offset": 100, "passk_held_out_tasks": 2,
               "passk_samples": 2, "more_splits": tuple(more_splits)}})
  return Evaluator(config, server or _Server(), None, jax.random.key(0))


def test_more_splits_are_task_sets_of_the_held_out_seeds_sampled_from_their_own_streams():
  """eval.more_splits adds a task set per split after held-out: the held-out seeds, the held-out kwargs with
  `split` replaced, labelled by the split; its samples come from a stream of its own, so adding one moves none
  of the other sets' samples."""
  server = _KeyServer()
  evaluator, pool = _split_evaluator(["valid_seen", "test"], server=server), _Pool()
  assert evaluator.task_sets() == ["train", "held-out", "valid_seen", "test"]
  assert evaluator.task_sets_text() == "task of train, held-out, valid_seen and test"
  sets = evaluator.pass_at_k_sets(pool, None, "trained")
  assert [s.label for s in sets] == ["trained / train", "trained / held-out", "trained / valid_seen",
                                     "trained / test"]
  assert pool.seeds == [[0, 1], [100, 101], [100, 101], [100, 101]]
  assert [k["split"] for k in pool.kwargs] == ["train", "valid_unseen", "valid_seen", "test"]
  assert all(k["size"] == 5 for k in pool.kwargs)
  assert len({str(k) for k in server.keys}) == 4
  fewer = _KeyServer()
  _split_evaluator(["test"], server=fewer).pass_at_k_sets(_Pool(), None, "trained")
  assert fewer.keys == [server.keys[0], server.keys[1], server.keys[3]]
  with pytest.raises(ValueError, match="unknown task set 'dev'"):
    evaluator.pass_at_k(pool, None, "dev", policy="trained")


@pytest.mark.parametrize("more_splits", [["valid_unseen"], ["held-out"], ["train"], ["valid_seen", "valid_seen"]])
def test_a_more_split_that_repeats_a_task_set_is_named(more_splits):
  with pytest.raises(ValueError, match=r"eval.more_splits .* named once"):
    _split_evaluator(more_splits).task_sets()


def test_the_warm_start_pass_at_k_cache_is_kept_per_prompt_width(tmp_path, monkeypatch):
  """A sampled row's bits depend on its prompt width bucket, so a warm start's pass@k cached at one width is
  not read by a run at another; at 64, the width of every entry cached before the width was keyed, a run reads
  the entries cached without it."""
  monkeypatch.setenv("EXPLORE_JAX_CACHE", str(tmp_path / "cache"))

  def evaluate(run, width=None):
    evaluator, pool = _split_evaluator([]), _Pool()
    if width is not None:
      evaluator.config.rollout.prompt_width_bucket = width
    (tmp_path / run).mkdir()
    evaluator.warm_start_pass_at_k(pool, None, str(tmp_path / run), "ws", log=lambda _: None)
    return len(pool.seeds)  # the task sets it sampled: 0 where it read the cache

  assert evaluate("unkeyed") == 2  # train and held-out
  assert evaluate("at64", 64) == 0
  assert evaluate("at128", 128) == 2
  assert evaluate("at128again", 128) == 0 and evaluate("again", None) == 0


def test_a_resumed_run_computes_the_warm_start_pass_at_k_of_a_task_set_its_file_lacks(tmp_path, monkeypatch):
  """A run whose warm-start file predates a split added to eval.more_splits lacks it; computed again, the file
  has every set, and the sets it had keep their numbers (the same streams)."""
  monkeypatch.setenv("EXPLORE_JAX_CACHE", str(tmp_path / "cache"))
  from explore_jax.train.evaluator import load_warm_pass_at_k

  before, after = _split_evaluator([]), _split_evaluator(["valid_seen"])
  assert before.lacks_warm_pass_at_k(str(tmp_path))
  before.warm_start_pass_at_k(_Pool(), None, str(tmp_path), "ws", log=lambda _: None)
  old = load_warm_pass_at_k(str(tmp_path))
  assert not before.lacks_warm_pass_at_k(str(tmp_path)) and after.lacks_warm_pass_at_k(str(tmp_path))
  after.warm_start_pass_at_k(_Pool(), None, str(tmp_path), "ws", log=lambda _: None)
  new = load_warm_pass_at_k(str(tmp_path))
  assert not after.lacks_warm_pass_at_k(str(tmp_path))
  assert [e.label for e in new] == ["warm start / train", "warm start / held-out", "warm start / valid_seen"]
  assert [e.to_json() for e in new[:2]] == [e.to_json() for e in old]


def test_screen_diversity_is_eqs_5_and_6_over_the_screens_after_each_step():
  import types

  e1, e2, e3 = np.eye(3, dtype=np.float32)

  def episode(seed, latents):
    steps = [types.SimpleNamespace(info={"screen": {"after": {"latent": x}}}) for x in latents]
    return types.SimpleNamespace(spec=types.SimpleNamespace(seed=seed), steps=steps)

  # Task 0: one episode on three orthogonal screens, one that never leaves its screen. Task 1: one step.
  tasks = [[episode(0, [e1, e2, e3]), episode(0, [e1, e1])], [episode(1, [e2])]]
  d = evaluation.screen_diversity(tasks)
  # d_seq: 3 pairs x 1 / (3 x 2) = 0.5; 0 for the unchanged one and the single step.
  assert d["d_seq_vis"] == pytest.approx((0.5 + 0.0 + 0.0) / 3)
  # D_grp of task 0's five screens [e1, e2, e3, e1, e1]: 7 of its 10 pairs differ, / (5 x 4); task 1: 0.
  assert d["d_grp_vis"] == pytest.approx((7 / 20 + 0.0) / 2)
  assert evaluation.screen_diversity([[types.SimpleNamespace(steps=[types.SimpleNamespace(info={})])]]) is None
