"""The `:small` scale: the built-in pretrained SmolLM2-135M-Instruct trains like any other checkpoint. One
command runs its SFT warm start and an RL iteration with LoRA adapters on the 8 fake devices as a (2, 1, 4) mesh,
checkpoints, resumes to a second iteration, and exports a merged checkpoint that transformers loads with the same
logits as ours; every method config offers the variant."""

import importlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
torch = pytest.importorskip("torch", reason="PyTorch (a dev extra) is the parity reference")

RUN = ("--config=configs/grpo_keydoor.py:small", "--config.model.lora.rank=8", "--config.mesh.shape=(2,1,4)",
       "--config.sft.steps=2", "--config.sft.oracle_episodes=4", "--config.sft.batch_size=8",
       "--config.env.kwargs.num_rooms=2", "--config.rollout.task_pool=2", "--config.rollout.num_tasks=2",
       "--config.rollout.group_size=2", "--config.rollout.num_actors=1", "--config.rollout.envs_per_actor=4",
       "--config.rl.minibatch_size=16", "--config.rl.epochs=1", "--config.checkpoint.every=1",
       "--config.eval.every=0", "--config.eval.passk_samples=0")


def launch(script, *args, cache, timeout=900):
  # Its own cache: the warm start is computed here, not found from an earlier run.
  env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8", "EXPLORE_JAX_CACHE": str(cache)}
  return subprocess.run([sys.executable, os.path.join(REPO, "launch", script), *args], capture_output=True,
                        text=True, timeout=timeout, cwd=REPO, env=env)


@pytest.mark.slow
def test_smollm2_warm_start_rl_resume_and_export(tmp_path):
  from explore_jax import hf
  from explore_jax.hf import parity, safetensors_io

  work = str(tmp_path / "run")
  cache = tmp_path / "cache"
  first = launch("train.py", *RUN, f"--workdir={work}", "--config.train.num_iterations=1", cache=cache)
  assert first.returncode == 0, first.stderr[-3000:]
  assert "[sft] 2 steps on" in first.stdout + first.stderr
  second = launch("train.py", *RUN, f"--workdir={work}", "--config.train.num_iterations=2", cache=cache)
  assert second.returncode == 0, second.stderr[-3000:]
  metrics = [json.loads(line) for line in open(os.path.join(work, "metrics.jsonl"))]
  assert [m["iteration"] for m in metrics] == [1, 2]  # the second command resumed after the first's iteration
  assert all(np.isfinite(m["update/loss"]) and m["update/tokens"] > 0 for m in metrics)

  exported = launch("export.py", *RUN, f"--run={work}", "--merged", f"--output={tmp_path / 'export'}", cache=cache)
  assert exported.returncode == 0, exported.stderr[-3000:]
  merged = str(tmp_path / "export" / "merged")
  assert max(parity.max_logit_diffs(merged)) <= 3e-4  # transformers reads what we wrote as we do
  # The warm start trained the adapters: the merged weights are not SmolLM2's.
  base = safetensors_io.CheckpointReader(hf.resolve("smollm2-135m-instruct"))
  ours = safetensors_io.CheckpointReader(merged)
  name = "model.layers.0.self_attn.q_proj.weight"
  assert np.abs(np.asarray(ours.get(name), np.float32) - np.asarray(base.get(name), np.float32)).max() > 0


@pytest.mark.parametrize("config", ["grpo_keydoor", "grpo_coding", "sge_coding", "rnd_coding", "rlad_coding",
                                    "entropyadv_coding", "sge_rnd_coding", "grpo_twx", "gigpo_twx",
                                    "grpo_scienceworld", "gigpo_scienceworld", "grpo_textworld", "gigpo_textworld",
                                    "grpo_alfworld", "gigpo_alfworld", "empo2_twx", "empo2_scienceworld"])
def test_every_text_method_config_has_the_small_scale(config):
  module = importlib.import_module(f"configs.{config}")
  tiny, small = module.get_config(""), module.get_config("small")
  assert small.model.checkpoint == "smollm2-135m-instruct" and tiny.model.checkpoint == "tiny"
  # The same world and method: only the model and the rates that follow from it differ.
  assert (small.env.to_dict(), small.method, small.rl.advantage) == (tiny.env.to_dict(), tiny.method,
                                                                     tiny.rl.advantage)
  assert small.optimizer.learning_rate < tiny.optimizer.learning_rate
  assert small.system_prompt
