"""SFT data: demonstrations files, oracle demonstrations, token layout; and the metrics writer."""

import dataclasses
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


def test_sft_trains_on_the_shorter_form_an_actor_would_sample(tokenizer, tmp_path):
  hook = ObservationPrompt(system="sys", history_steps=2)
  demo = sft_data.demonstration(hook("o3 " * 5, [("o1 " * 20, "a1"), ("o2 " * 5, "a2")], {}, {}), "a3")
  assert [len(m) for m in [demo["messages"], *demo["shorter"]]] == [6, 4, 2]  # 2 earlier steps, 1, none
  path = str(tmp_path / "demos.jsonl")
  sft_data.write_demonstrations(path, [demo])
  assert sft_data.load_demonstrations(path) == [demo]
  ids = lambda messages: tokenizer(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False),
                                   add_special_tokens=False)["input_ids"]
  expected = ids(demo["shorter"][0])
  budget = len(expected)  # the form without the long first step fits whole, the full one does not
  assert len(ids(demo["messages"])) > budget
  arrays = sft_data.tokenize_demos(tokenizer, [demo], prompt_len=budget, response_len=6)
  assert list(arrays["tokens"][0, :budget]) == expected


def test_oracle_demos_follow_the_oracle_and_round_trip(tmp_path):
  hook = ObservationPrompt(history_steps=1)
  demos = sft_data.oracle_sft_demos("explore_jax/KeyDoor-v0", {"num_rooms": 3}, [1, 2, 3], hook)
  assert len(demos) >= 3 and all(d["response"] for d in demos)
  assert demos[0]["messages"][-1]["role"] == "user" and "Room" in demos[0]["messages"][-1]["content"]
  assert demos[1]["messages"][-2] == {"role": "assistant", "content": demos[0]["response"]}  # history kept
  path = str(tmp_path / "demos.jsonl")
  assert sft_data.write_demonstrations(path, demos) == len(demos)
  assert sft_data.load_demonstrations(path) == demos


def test_a_world_without_a_seeded_oracle_plays_its_demonstrations_on_one_instance(monkeypatch):
  """KeyDoor declares neither concurrent instances nor a seeded oracle: whatever `workers` says, one instance
  plays every seed in turn (tests/envs/test_alfworld.py has a world that declares both)."""
  made = []
  make = sft_data.gymnasium.make
  monkeypatch.setattr(sft_data.gymnasium, "make", lambda *a, **k: made.append(a) or make(*a, **k))
  hook = ObservationPrompt()
  at_once = sft_data.oracle_sft_demos("explore_jax/KeyDoor-v0", {"num_rooms": 3}, [3, 1, 2], hook, workers=4)
  assert len(made) == 1
  assert at_once == sft_data.oracle_sft_demos("explore_jax/KeyDoor-v0", {"num_rooms": 3}, [3, 1, 2], hook,
                                              workers=1)


def test_image_demonstrations_round_trip_and_lay_out_as_the_actors_do(tmp_path):
  from explore_jax.actors.actor import PromptTokenizer
  from explore_jax.images import IMAGE, ImageLayout
  from explore_jax.models.config import VL_PRESETS

  layout = ImageLayout.from_config(VL_PRESETS["tiny-vl"])
  vl_tokenizer = hf.tiny_vl_tokenizer()
  rng = np.random.default_rng(0)
  shots = [rng.integers(0, 256, (50, 60, 3), dtype=np.uint8) for _ in range(2)]
  demos = [{"messages": [{"role": "user", "content": f"{IMAGE} Click the button."}], "response": "Click(3, 4)",
            "images": [shots[0]]},
           {"messages": [{"role": "user", "content": "No image here."}], "response": "Key(\"Enter\")"},
           {"messages": [{"role": "user", "content": f"{IMAGE} Type."}], "response": "Click(5, 6)",
            "images": [shots[1]]}]
  path = str(tmp_path / "demos.jsonl")
  assert sft_data.write_demonstrations(path, demos) == 3
  loaded = sft_data.load_demonstrations(path)  # images as PNG files beside the JSONL, lossless
  assert [d["messages"] for d in loaded] == [d["messages"] for d in demos] and "images" not in loaded[1]
  np.testing.assert_array_equal(loaded[0]["images"][0], shots[0])
  np.testing.assert_array_equal(loaded[2]["images"][0], shots[1])

  arrays = sft_data.tokenize_demos(vl_tokenizer, loaded, prompt_len=96, response_len=12, image_layout=layout)
  resized = [layout.resize(s) for s in shots]
  assert arrays["images"].shape == (3, 1, *resized[0].shape) and arrays["image_count"].tolist() == [1, 0, 1]
  np.testing.assert_array_equal(arrays["images"][0, 0], resized[0])
  assert not arrays["images"][1].any()
  # The prompt is the actors' own layout of the same messages and images.
  actors = PromptTokenizer(vl_tokenizer, 96, layout)
  prompt, _ = actors.encode(loaded[0]["messages"], (resized[0],))
  assert arrays["tokens"][0, 96 - len(prompt):96].tolist() == prompt
  assert prompt.count(layout.pad_id) == layout.num_tokens(resized[0])
  with pytest.raises(ValueError, match="not a vision-language model"):
    sft_data.tokenize_demos(vl_tokenizer, loaded, prompt_len=96, response_len=12)
  other = {**loaded[2], "images": [np.zeros((200, 60, 3), np.uint8)]}
  with pytest.raises(ValueError, match="2 sizes after resizing"):
    sft_data.tokenize_demos(vl_tokenizer, [loaded[0], other], prompt_len=160, response_len=12, image_layout=layout)
  path_missing = tmp_path / "missing.jsonl"
  path_missing.write_text(json.dumps({**demos[1], "images": ["nowhere.png"]}) + "\n")
  with pytest.raises(ValueError, match=r"missing.jsonl:1: no image file"):
    sft_data.load_demonstrations(str(path_missing))


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


def test_the_warm_start_key_follows_the_history_the_prompts_show_and_micro_batches_not_how_often_it_saves():
  from configs import grpo_keydoor
  from explore_jax.train.warm_start import warm_start_key

  c = grpo_keydoor.get_config()
  key = warm_start_key(c, "/ckpt", 128, 16)
  with c.unlocked():
    c.action_history = 0
  assert warm_start_key(c, "/ckpt", 128, 16) == key  # unset or 0: the key of the warm starts made before
  c.sft.checkpoint_every = 7
  assert warm_start_key(c, "/ckpt", 128, 16) == key  # how often the SFT saves changes nothing in its result
  c.sft.micro_batch_size = 0
  assert warm_start_key(c, "/ckpt", 128, 16) == key  # the whole batch at once: the warm starts made before
  c.sft.micro_batch_size = 8
  micro = warm_start_key(c, "/ckpt", 128, 16)
  assert micro != key  # micro-batches sum the gradient in another order: other bits
  c.sft.micro_batch_size = 0
  c.action_history = 4
  with_actions = warm_start_key(c, "/ckpt", 128, 16)
  c.history_steps = 1
  assert len({key, with_actions, warm_start_key(c, "/ckpt", 128, 16)}) == 3


def test_a_methods_own_prompt_hook_keys_the_warm_starts_it_builds_demonstrations_for():
  """EMPO2's tips, EAPO's fields and DPEPO's layout make other oracle demonstrations from the same config fields
  and lengths: each hook is its own key, with its settings; the plain hook keeps the keys warm starts had before
  hooks were part of them; a JSONL file's demonstrations do not depend on the hook."""
  from configs import empo2_twx, grpo_twx
  from explore_jax.methods import make_method
  from explore_jax.train.warm_start import warm_start_key

  grpo, empo2 = grpo_twx.get_config(), empo2_twx.get_config()
  with grpo.unlocked():
    grpo.rollout.final_max_new_tokens = empo2.rollout.final_max_new_tokens  # every field the key reads agrees
  plain, tips = make_method(grpo).prompt_hook(), make_method(empo2).prompt_hook()
  key = warm_start_key(grpo, "/ckpt", 384, 128)
  assert warm_start_key(grpo, "/ckpt", 384, 128, plain) == key
  assert warm_start_key(empo2, "/ckpt", 384, 128) == key  # what the key held before the hook: a collision
  with_tips = warm_start_key(empo2, "/ckpt", 384, 128, tips)
  assert with_tips != key
  other_prompt = dataclasses.replace(tips, tip_prompt="Summarise the episode.")
  assert warm_start_key(empo2, "/ckpt", 384, 128, other_prompt) not in (key, with_tips)
  with empo2.unlocked():
    empo2.sft.demonstrations = "/data/demos.jsonl"
  assert warm_start_key(empo2, "/ckpt", 384, 128, tips) == warm_start_key(empo2, "/ckpt", 384, 128, plain)


def test_a_built_in_checkpoint_keys_its_warm_starts_by_name_wherever_the_cache_is(tmp_path, monkeypatch):
  """The built-in checkpoints live under the cache root in directories named by their content, so a warm start
  keeps its key when the cache moves (another machine's home, EXPLORE_JAX_CACHE); a user's directory is its path."""
  from configs import grpo_keydoor
  from explore_jax.train.warm_start import warm_start_key

  c = grpo_keydoor.get_config()
  keys = []
  for root in (tmp_path / "a", tmp_path / "b" / "cache"):
    monkeypatch.setenv("EXPLORE_JAX_CACHE", str(root))
    keys.append(warm_start_key(c, str(root / "tiny-0123456789ab"), 128, 16))
    assert warm_start_key(c, str(root / "tiny-ba9876543210"), 128, 16) != keys[-1]
  assert keys[0] == keys[1]
  monkeypatch.setenv("EXPLORE_JAX_CACHE", str(tmp_path / "a"))
  mine = [warm_start_key(c, str(tmp_path / d / "tiny-0123456789ab"), 128, 16) for d in ("b", "c")]
  assert mine[0] != mine[1] and keys[0] not in mine  # outside the cache: the path decides


def test_a_demonstration_keeps_a_prompts_images_and_takes_plain_messages():
  from explore_jax.actors.protocol import Prompt

  messages = [{"role": "user", "content": "look"}]
  image = np.zeros((4, 5, 3), np.uint8)
  d = sft_data.demonstration(Prompt(messages, variants={"other": []}, images=[image]), "click(1, 2)")
  assert d["messages"] == messages and d["response"] == "click(1, 2)"
  assert len(d["images"]) == 1 and d["images"][0].shape == (4, 5, 3)
  assert sft_data.demonstration(messages, "ok") == {"messages": messages, "response": "ok"}
