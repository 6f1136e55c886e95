"""SFT data: demonstrations files, oracle demonstrations, token layout; and the metrics writer."""

import json

import numpy as np
import pytest

from explore_jax import hf
from explore_jax.methods import ObservationPrompt
from explore_jax.train import metrics as metrics_lib, sft_data


@pytest.fixture(scope="module")
def tokenizer():
  return hf.load_tokenizer(hf.TINY_ASSETS)


def test_tokenized_demo_layout(tokenizer):
  demos = [{"messages": [{"role": "user", "content": "Room 1/4. Actions: go right."}], "response": "go right"}]
  arrays = sft_data.tokenize_demos(tokenizer, demos, prompt_len=64, response_len=6)
  text = tokenizer.apply_chat_template(demos[0]["messages"], add_generation_prompt=True, tokenize=False)
  prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
  response = tokenizer("go right", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
  row, attn, loss = arrays["tokens"][0], arrays["attention_mask"][0], arrays["loss_mask"][0]
  assert list(row[64 - len(prompt):64]) == prompt and not attn[:64 - len(prompt)].any()
  assert list(row[64:64 + len(response)]) == response
  assert loss.sum() == len(response) and loss[64:64 + len(response)].all()
  # A prompt longer than prompt_len keeps its end, as actors truncate.
  short = sft_data.tokenize_demos(tokenizer, demos, prompt_len=5, response_len=6)
  assert list(short["tokens"][0, :5]) == prompt[-5:]
  with pytest.raises(ValueError, match="exceeds response_len"):
    sft_data.tokenize_demos(tokenizer, demos, prompt_len=64, response_len=2)


def test_oracle_demos_follow_the_oracle_and_round_trip(tmp_path):
  hook = ObservationPrompt(history_steps=1)
  demos = sft_data.oracle_sft_demos("explore_jax/KeyDoor-v0", {"num_rooms": 3}, [1, 2, 3], hook)
  assert len(demos) >= 3 and all(d["response"] for d in demos)
  assert demos[0]["messages"][-1]["role"] == "user" and "Room" in demos[0]["messages"][-1]["content"]
  assert demos[1]["messages"][-2] == {"role": "assistant", "content": demos[0]["response"]}  # history kept
  path = str(tmp_path / "demos.jsonl")
  assert sft_data.write_demonstrations(path, demos) == len(demos)
  assert sft_data.load_demonstrations(path) == demos


def test_bad_demonstrations_file_names_the_line(tmp_path):
  path = tmp_path / "bad.jsonl"
  path.write_text(json.dumps({"messages": [], "response": "x"}) + "\n{oops\n")
  with pytest.raises(ValueError, match=r"bad.jsonl:2: not JSON"):
    sft_data.load_demonstrations(str(path))
  path.write_text(json.dumps({"prompt": "x"}) + "\n")
  with pytest.raises(ValueError, match=r":1: expected"):
    sft_data.load_demonstrations(str(path))
  with pytest.raises(FileNotFoundError):
    sft_data.load_demonstrations(str(tmp_path / "none.jsonl"))


def test_metrics_writer_resume_truncates_and_plots(tmp_path):
  w = metrics_lib.MetricsWriter(str(tmp_path))
  for i in range(1, 6):
    w.write(i, {"success_rate": i / 10, "return": np.float32(i)})
  w.close()
  w = metrics_lib.MetricsWriter(str(tmp_path), resume_from=3)  # a run resumed from iteration 3
  w.write(4, {"success_rate": 0.9})
  w.close()
  rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
  assert [r["iteration"] for r in rows] == [1, 2, 3, 4] and rows[-1]["success_rate"] == 0.9
  assert any(p.name.startswith("events") for p in (tmp_path / "tensorboard").iterdir())
  png = metrics_lib.plot_curves(rows, ["success_rate", "return"], str(tmp_path / "c.png"))
  assert open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_metrics_writer_of_a_secondary_process_keeps_history_and_writes_nothing(tmp_path):
  (tmp_path / "metrics.jsonl").write_text(json.dumps({"iteration": 1, "success_rate": 0.5}) + "\n")
  w = metrics_lib.MetricsWriter(str(tmp_path), resume_from=1, write=False)
  w.write(2, {"success_rate": 0.7})
  w.close()
  assert [r["iteration"] for r in w.history] == [2]
  assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]  # untouched: process 0's file
  assert (tmp_path / "metrics.jsonl").read_text().count("\n") == 1


def test_the_warm_start_key_follows_the_history_the_prompts_show():
  from configs import grpo_keydoor
  from explore_jax.train.warm_start import warm_start_key

  c = grpo_keydoor.get_config()
  key = warm_start_key(c, "/ckpt", 128, 16)
  with c.unlocked():
    c.action_history = 0
  assert warm_start_key(c, "/ckpt", 128, 16) == key  # unset or 0: the key of the warm starts made before
  c.action_history = 4
  with_actions = warm_start_key(c, "/ckpt", 128, 16)
  c.history_steps = 1
  assert len({key, with_actions, warm_start_key(c, "/ckpt", 128, 16)}) == 3
