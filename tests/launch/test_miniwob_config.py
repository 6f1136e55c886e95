"""configs/grpo_miniwob.py as a user runs it: a vision-language policy on MiniWoB++ in Chromium, screenshots
through the SFT warm start, actors, sampler, records and the update (no episode dropped: the prompt budget holds
the image and the longest feedback)."""

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_grpo_miniwob_trains_an_iteration_on_screenshots(tmp_path, lora):
  """With LoRA too: adapters on the language model, warm-started and trained on image records."""
  out = subprocess.run(
      [sys.executable, "launch/train.py", "--config=configs/grpo_miniwob.py", f"--workdir={tmp_path / 'run'}",
       "--config.train.num_iterations=1", "--config.eval.every=0", "--config.eval.passk_samples=0",
       "--config.rollout.num_actors=1", "--config.rollout.num_tasks=1", "--config.rollout.group_size=2",
       "--config.rl.minibatch_size=8", "--config.sft.oracle_episodes=4", "--config.sft.steps=2",
       "--config.sft.batch_size=8", *(["--config.model.lora.rank=4"] if lora else [])],
      cwd=REPO, capture_output=True, text=True, timeout=1200)
  assert out.returncode == 0, out.stderr[-3000:]
  with open(tmp_path / "run" / "metrics.jsonl") as f:
    row = [json.loads(line) for line in f][-1]
  # Both episodes ran (after a two-step warm start on the oracle's screenshots the actions are mostly malformed,
  # so most steps are one), and the update trained on their records, images included.
  assert row["episodes_dropped"] == 0 and 1.0 <= row["episode_length"] <= 3.0
  assert row["update/minibatches"] >= 1 and row["update/tokens"] > 2 * 48


def test_the_oracles_demonstrations_show_the_screenshot_and_fit_the_prompt():
  """The warm start's demonstrations: the oracle's click with the screenshot the policy sees, laid out as the
  actors lay it out, inside the config's prompt budget."""
  from configs import grpo_miniwob
  from explore_jax import hf
  from explore_jax.images import ImageLayout
  from explore_jax.methods import make_method
  from explore_jax.models.config import VL_PRESETS
  from explore_jax.train import sft_data

  c = grpo_miniwob.get_config()
  assert c.sft.enabled and not c.sft.demonstrations
  demos = sft_data.oracle_sft_demos(c.env.id, {**c.env.kwargs, "task": ["click-test", "click-button"]}, [0, 1],
                                    make_method(c).prompt_hook())
  assert len(demos) == 2 and all(d["response"].startswith("Click(") for d in demos)
  assert all(d["images"][0].shape == tuple(c.rollout.image_shape) for d in demos)
  layout = ImageLayout.from_config(VL_PRESETS["tiny-vl"])
  arrays = sft_data.tokenize_demos(hf.tiny_vl_tokenizer(), demos, c.rollout.max_prompt_tokens,
                                   c.rollout.max_new_tokens, layout)
  assert arrays["image_count"].tolist() == [1, 1]
  assert ((arrays["tokens"] == layout.pad_id).sum(1) == 48).all()  # 168 x 224 at the model: 48 image tokens
