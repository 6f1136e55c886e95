"""launch/sweep_file.py: sweep files (explicit arms, product / zip grids, the errors a bad one gets) and the runs
each of the project's protocols and sweep files plans (no test here trains)."""

import importlib
import itertools
import os
import sys

import pytest

from tests.launch.sweep_helpers import REPO, sweep, write_sweep_file

sys.path.insert(0, os.path.join(REPO, "launch"))
import sweep as sweep_py  # noqa: E402
import sweep_file  # noqa: E402
import sweep_records  # noqa: E402


def _overrides_name_fields(protocol):
  """Every override of every arm of `protocol` (a module with ARMS) names a field of its config."""
  for _, config, overrides in protocol.ARMS:
    sweep_file.check_fields(config, [o.removeprefix("--").partition("=")[0] for o in overrides])


def test_the_text_world_protocol_plans_every_world_and_method():
  from configs.protocols import textworlds as protocol
  out = sweep("--protocol=configs/protocols/textworlds.py", "--root=/nonexistent/root", "--dry_run", "--machine=m1")
  assert out.returncode == 0, out.stderr[-2000:]
  lines = [line for line in out.stdout.splitlines() if "launch/train.py" in line]
  assert len(lines) == len(protocol.ARMS) * protocol.WARM_STARTS * protocol.SEEDS
  assert protocol.WARM_STARTS * protocol.SEEDS >= 3
  for world in ("twx", "alfworld"):
    for method in ("gigpo", "grpo"):  # each world and method is an arm of its own (and the base of variants)
      assert sum(f"/{method}_{world}/ws" in line for line in lines) == protocol.WARM_STARTS
      assert sum(f"--config=configs/{method}_{world}.py" in line for line in lines) >= protocol.WARM_STARTS
  # The ALFWorld arms keep the tiny config they were planned on (every room, the short warm start), whatever
  # the config's default now is.
  first = [line for line in lines if "/gigpo_alfworld/" in line or "/grpo_alfworld/" in line]
  assert first and all(line.endswith(" ".join(protocol.ALFWORLD_FIRST_TINY)) for line in first)
  _overrides_name_fields(protocol)


def test_the_gui_protocol_plans_three_runs_of_fresh_instances():
  from configs.protocols import miniwob as protocol
  out = sweep("--protocol=configs/protocols/miniwob.py", "--root=/nonexistent/root", "--dry_run", "--machine=m1")
  assert out.returncode == 0, out.stderr[-2000:]
  lines = [line for line in out.stdout.splitlines() if "launch/train.py" in line]
  assert len(lines) == len(protocol.ARMS) * protocol.WARM_STARTS * protocol.SEEDS >= 3
  assert all("--config=configs/grpo_miniwob.py" in line and "--config.rollout.task_pool=0" in line for line in lines)
  _overrides_name_fields(protocol)


def test_the_scienceworld_protocol_plans_three_seeds_of_40_iterations_from_one_warm_start():
  from configs.protocols import scienceworld as protocol
  out = sweep("--protocol=configs/protocols/scienceworld.py", "--root=/nonexistent/root", "--dry_run",
              "--machine=m1")
  assert out.returncode == 0, out.stderr[-2000:]
  lines = [line for line in out.stdout.splitlines() if "launch/train.py" in line]
  assert len(lines) == 12 and all("--config.sft.seed=0" in line for line in lines)
  for method, scale in itertools.product(("gigpo", "grpo"), ("", "_small")):
    mine = [line for line in lines if f"/{method}_scienceworld{scale}_it40/" in line]
    variant = ":small" if scale else ""
    assert len(mine) == 3 and all(f"--config=configs/{method}_scienceworld.py{variant} " in line for line in mine)
    assert sorted(line.split("--config.seed=")[1].split()[0] for line in mine) == ["0", "1", "2"]
  assert all(line.endswith("--config.train.num_iterations=40") for line in lines)
  _overrides_name_fields(protocol)


def test_the_alfworld_protocol_plans_three_seeds_of_each_arm_from_one_warm_start():
  from configs.protocols import alfworld as protocol
  out = sweep("--protocol=configs/protocols/alfworld.py", "--root=/nonexistent/root", "--dry_run", "--machine=m1")
  assert out.returncode == 0, out.stderr[-2000:]
  lines = [line for line in out.stdout.splitlines() if "launch/train.py" in line]
  arms = ("gigpo_alfworld_small_ws512", "grpo_alfworld_small_ws512", "gigpo_alfworld_small_ws512_it60",
          "gigpo_alfworld_small_ws512_fresh_kl_it60", "gigpo_alfworld_small_ws2048_fresh_kl_it60",
          "gigpo_alfworld_small_listed_ws512_fresh_kl_it60", "gigpo_alfworld_small_ws2048_fresh_kl_it60_games128",
          "gigpo_alfworld_smollm2_ws512_fresh_kl_it30")
  assert len(lines) == 3 * len(arms) and all("--config.sft.seed=0" in line for line in lines)
  for arm in arms:
    mine = [line for line in lines if f"/{arm}/" in line]
    assert sorted(line.split("--config.seed=")[1].split()[0] for line in mine) == ["0", "1", "2"]
  longer = [line for line in lines if "/gigpo_alfworld_small_ws512_it60/" in line]
  assert all(line.endswith("--config.train.num_iterations=60 --config.rl.micro_batch_size=8") for line in longer)
  fresh = [line for line in lines if "/gigpo_alfworld_small_ws512_fresh_kl_it60/" in line]
  assert all(line.endswith("--config.train.num_iterations=60 --config.rl.micro_batch_size=8 "
                           "--config.rollout.task_pool=0 --config.rl.loss.kl_coef=0.01") for line in fresh)
  bigger = [line for line in lines if "/gigpo_alfworld_small_ws2048_fresh_kl_it60/" in line]
  assert all("--config.sft.steps=1200 --config.sft.oracle_episodes=2048" in line and line.endswith(
      "--config.rollout.task_pool=0 --config.rl.loss.kl_coef=0.01") for line in bigger)
  games128 = [line for line in lines if "/gigpo_alfworld_small_ws2048_fresh_kl_it60_games128/" in line]
  assert all(line.endswith("--config.rollout.task_pool=0 --config.rl.loss.kl_coef=0.01 "
                           "--config.eval.passk_held_out_tasks=128") for line in games128)
  listed = [line for line in lines if "/gigpo_alfworld_small_listed_ws512_fresh_kl_it60/" in line]
  assert all("--config.env.kwargs.list_actions=True" in line and "--config.sft.oracle_episodes=512" in line
             and f"--config.rollout.max_prompt_tokens={protocol.PROMPT_TOKENS_LISTED}" in line for line in listed)
  # The longer arms change nothing their warm start depends on: they start from the shorter one's. Listing the
  # actions changes the prompts the warm start learns from: that arm computes its own.
  args = {run.arm: sweep_records.warm_start_args(run) for run in sweep_py.plan(protocol.get_protocol(), "/r", "m1")}
  assert args["gigpo_alfworld_small_ws512_it60"] == args["gigpo_alfworld_small_ws512_fresh_kl_it60"] == args[
      "gigpo_alfworld_small_ws512"] != args["gigpo_alfworld_small_ws2048_fresh_kl_it60"]
  # Scoring more games changes no warm start either: the 128-game arm starts from the ws2048 arm's.
  assert args["gigpo_alfworld_small_ws2048_fresh_kl_it60_games128"] == args["gigpo_alfworld_small_ws2048_fresh_kl_it60"]
  assert len({args["gigpo_alfworld_small_listed_ws512_fresh_kl_it60"], args["gigpo_alfworld_small_ws512"],
              args["gigpo_alfworld_small_ws2048_fresh_kl_it60"]}) == 3
  _overrides_name_fields(protocol)


def test_product_and_zip_make_named_arms_with_their_overrides(tmp_path):
  grid = sweep_file.load_protocol(write_sweep_file(tmp_path, {
      "config": "configs/sge_coding.py", "seeds": 2,
      "arms": [{"name": "grpo", "config": "configs/grpo_coding.py"}, {"name": "sge"}],
      "product": {"config.sge.p_failure": [0, 0.25], "config.rl.loss.eps_high": [0.2, 0.28]},
      "overrides": ["--config.train.num_iterations=3"]}))
  assert [a["name"] for a in grid["arms"]] == ["grpo", "sge", "p_failure=0_eps_high=0.2", "p_failure=0_eps_high=0.28",
                                               "p_failure=0.25_eps_high=0.2", "p_failure=0.25_eps_high=0.28"]
  assert grid["arms"][1] == {"name": "sge", "config": "configs/sge_coding.py", "overrides": []}  # the default config
  assert grid["arms"][3] == {"name": "p_failure=0_eps_high=0.28", "config": "configs/sge_coding.py",
                             "overrides": ["--config.sge.p_failure=0", "--config.rl.loss.eps_high=0.28"]}
  assert grid["seeds"] == [0, 1] and grid["overrides"] == ["--config.train.num_iterations=3"]

  # zip: rows of values that go together; with a product, one more axis (the last). Labels name values;
  # characters a directory name should not hold become "-".
  both = sweep_file.load_protocol(write_sweep_file(tmp_path, {
      "config": "configs/sge_coding.py", "seeds": [5],
      "product": {"config.sge.strategy_temperature": {"mixed": 1.2, "flat": 0.7}},
      "zip": {"config.rl.loss.eps_low": [0.2, 0.3], "config.rl.loss.eps_high": [0.28, 0.4],
              "config.sge.strategy_delimiter": ["### Code", "a/b|c"]}}))
  names = [a["name"] for a in both["arms"]]
  assert names == ["mixed_eps_low=0.2_eps_high=0.28_strategy_delimiter=----Code",
                   "mixed_eps_low=0.3_eps_high=0.4_strategy_delimiter=a-b-c",
                   "flat_eps_low=0.2_eps_high=0.28_strategy_delimiter=----Code",
                   "flat_eps_low=0.3_eps_high=0.4_strategy_delimiter=a-b-c"]
  assert both["arms"][3]["overrides"] == ["--config.sge.strategy_temperature=0.7", "--config.rl.loss.eps_low=0.3",
                                          "--config.rl.loss.eps_high=0.4", "--config.sge.strategy_delimiter=a/b|c"]
  # A key whose last part two axes share keeps more of its path.
  assert sweep_file._short_keys(["config.rl.loss.clip", "config.x.clip", "config.clip", "config.sge.tau"]) == {
      "config.rl.loss.clip": "loss.clip", "config.x.clip": "x.clip", "config.clip": "clip", "config.sge.tau": "tau"}
  only_zip = sweep_file.grid_arms("configs/sge_coding.py", {}, {"config.a": [1, 2, 3], "config.b": [True, False, True]})
  assert [a["name"] for a in only_zip] == ["a=1_b=True", "a=2_b=False", "a=3_b=True"]


@pytest.mark.parametrize("body, message", [
    ({"zip": {"config.sge.p_failure": [0, 0.1], "config.sge.p_success": [0]}},
     "zip needs lists of one length: config.sge.p_failure has 2, config.sge.p_success has 1"),
    ({"prodcut": {"config.sge.p_failure": [0]}}, "unknown protocol keys ['prodcut']"),
    ({"product": {"config.sge.p_fail": [0, 1]}}, "config.sge.p_fail is not a field of configs/sge_coding.py"),
    ({"product": {"config.sgee.p_failure": [0]}}, "(it has no config.sgee)"),
    ({"product": {"sge.p_failure": [0]}}, "'sge.p_failure' is not a config field path"),
    ({"product": {"config.seed": [0, 1]}}, "config.seed is set by the sweep"),
    ({"product": {"config.sge.p_failure": [0]}, "zip": {"config.sge.p_failure": [1]}}, "in both product and zip"),
    ({"product": {"config.train.num_iterations": [2, 4]}, "overrides": ["--config.train.num_iterations=3"]},
     "config.train.num_iterations is set by both the common overrides and product/zip"),
    ({"product": {"config.sge.p_failure": []}}, "config.sge.p_failure has no values"),
    ({"product": {"config.sge.p_failure": 0.5}}, "needs a list of values or a {label: value} dict"),
    ({"product": {"config.model.mesh": [(1, 2)]}}, "(1, 2) is not a bool, int, float or str"),
    ({"product": {"config.sge.p_failure": {"no/neg": 0}}}, "label 'no/neg' is not a name"),
    ({"product": {"config.sge.p_failure": [0.5, 0.5]}}, "arm names repeat: ['p_failure=0.5']"),
    ({"product": {"config.sge.strategy_delimiter": ["x" * 200]}}, "give the axes labels"),
    ({"config": None, "product": {"config.sge.p_failure": [0]}}, "product and zip make arms of `config`"),
    ({"config": "configs/nope.py", "product": {"config.sge.p_failure": [0]}}, "config: no config file"),
    ({"config": "configs/grpo_coding.py", "product": {}, "arms": [{"name": "compare"}]}, "bad arm name 'compare'"),
])
def test_bad_sweep_files_are_named(tmp_path, body, message):
  body = {"config": "configs/sge_coding.py", "seeds": 1, **body}
  with pytest.raises(sweep_file.ProtocolError) as e:
    sweep_file.load_protocol(write_sweep_file(tmp_path, {k: v for k, v in body.items() if v is not None}))
  assert message in str(e.value)


def test_a_bad_sweep_file_is_a_one_line_error(tmp_path):
  grid = write_sweep_file(tmp_path, {"config": "configs/sge_coding.py", "seeds": 1,
                                "zip": {"config.sge.p_failure": [0, 0.1], "config.sge.p_success": [0]}})
  out = sweep(f"--sweep={grid}", f"--root={tmp_path}", "--dry_run", "--machine=m1")
  assert out.returncode != 0 and out.stdout == "" and out.stderr.strip() == (
      "error: zip needs lists of one length: config.sge.p_failure has 2, config.sge.p_success has 1")


@pytest.mark.parametrize("protocol", ["sge_coding", "textworlds", "miniwob", "alfworld", "scienceworld"])
def test_the_protocols_plan_the_same_runs_as_before_grids(protocol):
  """The arms form of configs/protocols/ plans what it planned before product/zip existed: every run's
  directory and command, from the file's own constants by the rule it always had."""
  module = importlib.import_module(f"configs.protocols.{protocol}")
  common = module.get_protocol()["overrides"]
  root = os.path.join(REPO, "runs", "protocol", protocol)
  expected = [sweep_records.Run(name, ws, seed, os.path.join(root, "m1", name, f"ws{ws}_seed{seed}"), [
      sys.executable, "launch/train.py", f"--config={config}",
      f"--workdir=runs/protocol/{protocol}/m1/{name}/ws{ws}_seed{seed}", f"--config.seed={seed}",
      f"--config.sft.seed={ws}", *common, *overrides])
      for seed in range(module.SEEDS) for ws in range(module.WARM_STARTS) for name, config, overrides in module.ARMS]
  planned = sweep_py.plan(sweep_file.load_protocol(f"configs/protocols/{protocol}.py"), root, "m1")
  assert planned == expected and len(planned) == len(module.ARMS) * module.SEEDS * module.WARM_STARTS


def test_the_ablation_sweep_files_plan():
  from configs import coding
  from configs.protocols import sge_coding as protocol
  sge = coding.get_config("sge").sge
  out = sweep("--sweep=configs/sweeps/sge_ablations.py", "--root=/nonexistent/root", "--dry_run", "--machine=m1")
  assert out.returncode == 0, out.stderr[-2000:]
  lines = [line.split() for line in out.stdout.splitlines() if "launch/train.py" in line]
  assert len(lines) == 8 * protocol.WARM_STARTS * protocol.SEEDS
  arms = {line[4].split("/")[-2]: line[-3:] for line in lines}
  assert len(arms) == 8 and all(set(protocol.get_protocol()["overrides"]) <= set(line) for line in lines)
  # The protocol's one-knob ablations are cells of the factorial: the same configs, knob for knob.
  assert arms["mixed_neg_pos"] == [f"--config.sge.strategy_temperature={sge.strategy_temperature}",
                                   f"--config.sge.p_failure={sge.p_failure}", f"--config.sge.p_success={sge.p_success}"]
  for cell, (name, _, knob) in zip(("flat_neg_pos", "mixed_noneg_pos", "mixed_neg_nopos"), protocol.ARMS[2:]):
    changed = [o for o in arms[cell] if o not in arms["mixed_neg_pos"]]
    assert len(changed) == 1 and changed[0].split("=")[0] == knob[0].split("=")[0], (cell, name)
    assert float(changed[0].split("=")[1]) == float(knob[0].split("=")[1]), (cell, name)

  out = sweep("--sweep=configs/sweeps/rnd_coef.py", "--root=/nonexistent/root", "--dry_run", "--machine=m1")
  assert out.returncode == 0, out.stderr[-2000:]
  lines = [line for line in out.stdout.splitlines() if "launch/train.py" in line]
  assert len(lines) == 8 and sum("/coef=1.0/" in line and line.endswith("--config.rnd.coef=1.0") for line in lines) == 4



def _planned_arms(protocol_name, names):
  """The protocol's dry-run lines, each arm's planned over warm starts 0-2; every override names a config field."""
  protocol = importlib.import_module(f"configs.protocols.{protocol_name}")
  out = sweep(f"--protocol=configs/protocols/{protocol_name}.py", "--root=/nonexistent/root", "--dry_run",
              "--machine=m1")
  assert out.returncode == 0, out.stderr[-2000:]
  lines = [line for line in out.stdout.splitlines() if "launch/train.py" in line]
  assert [name for name, _, _ in protocol.ARMS] == names
  assert len(lines) == len(names) * protocol.WARM_STARTS * protocol.SEEDS and protocol.WARM_STARTS >= 3
  for name in names:
    mine = [line for line in lines if f"/{name}/ws" in line]
    assert sorted(line.split("--config.sft.seed=")[1].split()[0] for line in mine) == ["0", "1", "2"]
  _overrides_name_fields(protocol)
  return lines


def test_the_empo2_protocol_plans_its_arms_over_the_same_warm_starts():
  lines = _planned_arms("empo2", ["empo2", "grpo", "gigpo", "empo2_no_memory", "empo2_small", "grpo_small",
                                  "empo2_fit", "empo2_no_memory_fit", "empo2_fit_no_novelty", "empo2_fit_no_mask"])
  assert all("--config.sft.env_kwargs.oracle=search" in line for line in lines)
  assert all("--config.empo2.p_memory_free=1.0" in line for line in lines if "/empo2_no_memory" in line)
  # Round 0's EMPO2 arms ran with the left cut; round 1's and the unrun :small arms fit their prompts.
  round_0 = [line for line in lines if "/empo2/ws" in line or "/empo2_no_memory/ws" in line]
  assert len(round_0) == 6 and all("--config.empo2.fit_prompts=False" in line for line in round_0)
  assert not any("fit_prompts" in line for line in lines if line not in round_0)
  assert all("--config.rollout.max_prompt_tokens=768" in line for line in lines if "/empo2_fit" in line)
  # The diagnostics each drop one thing from empo2_fit, and only that.
  fit = [line for line in lines if "/empo2_fit/ws" in line]
  for arm, dropped in (("empo2_fit_no_novelty", "--config.empo2.novelty=off"),
                       ("empo2_fit_no_mask", "--config.rl.loss.low_prob_mask=none")):
    mine = [line for line in lines if f"/{arm}/ws" in line]
    assert [line.replace(f"/{arm}/", "/empo2_fit/").replace(f" {dropped}", "") for line in mine] == fit


def test_the_dpepo_protocol_plans_its_arms_over_the_same_warm_starts():
  lines = _planned_arms("dpepo", ["dpepo", "dpepo_no_weight", "dpepo_k1", "gigpo", "dpepo_small",
                                  "dpepo_no_weight_small"])
  assert all("--config=configs/dpepo_keydoor.py:gigpo " in line for line in lines if "/gigpo/" in line)
  assert all("--config=configs/dpepo_keydoor.py:small " in line for line in lines if "/dpepo_small/" in line)
  assert all("--config.env.parallel.copies=1" in line for line in lines if "/dpepo_k1/" in line)


def test_the_eapo_protocol_plans_its_arms_over_the_same_warm_starts():
  lines = _planned_arms("eapo", ["eapo", "eapo_no_explore", "eapo_task_groups", "eapo_no_rollback", "gigpo",
                                 "eapo_small", "gigpo_small", "eapo_alfworld", "gigpo_alfworld"])
  assert all("--config=configs/eapo_keydoor.py:gigpo " in line for line in lines if "/gigpo/" in line)
  assert all("--config.rl.advantage_options.groups=task" in line for line in lines if "/eapo_task_groups/" in line)
  assert all("--config=configs/eapo_alfworld.py " in line for line in lines if "/eapo_alfworld/" in line)
  # The rollback stage before RL is cached with the warm start: the no-rollback arm starts RL from the warm start
  # alone, so a sweep does not count it among the arms that share eapo's start (launch/sweep.py: may_start).
  from configs.protocols import eapo as protocol
  args = {run.arm: sweep_records.warm_start_args(run) for run in sweep_py.plan(protocol.get_protocol(), "/r", "m1")}
  assert args["eapo"] == args["eapo_no_explore"] == args["eapo_task_groups"] != args["eapo_no_rollback"]
