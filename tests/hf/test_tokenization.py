"""load_tokenizer's direct path: a directory AutoTokenizer loads as the generic TokenizersBackend loads through that
class itself, without transformers' model registry and torch, and gives the same tokenizer as AutoTokenizer;
every other directory still goes through AutoTokenizer."""

import json
import os
import subprocess
import sys

import pytest

from explore_jax import hf, tokenization

transformers = pytest.importorskip("transformers")

TEXTS = ["hello world", "def f(x):\n    return x + 1", "  two  spaces", "naïve café ☕ 数字", "",
         "<|im_start|>user\nhi<|im_end|>", "<|endoftext|> after the end", "<|pad|><|pad|>"]
MESSAGES = [{"role": "system", "content": "Reply with one action."},
            {"role": "user", "content": "You are in a kitchen. Actions: go north, take key."},
            {"role": "assistant", "content": "take key"},
            {"role": "user", "content": "Taken."}]


def _with_config(directory, model_type: str) -> str:
  """The tiny tokenizer saved beside a config.json of `model_type` (all AutoTokenizer reads of a config)."""
  os.makedirs(directory, exist_ok=True)
  hf.load_tokenizer(hf.TINY_ASSETS).save_pretrained(directory)
  with open(os.path.join(directory, "config.json"), "w") as f:
    json.dump({"model_type": model_type}, f)
  return str(directory)


@pytest.fixture(scope="module", params=["assets", "tiny", "tiny-vl", "tiny-qwen3-vl", "llama"])
def direct_dir(request, tmp_path_factory):
  if request.param == "assets":
    return hf.TINY_ASSETS
  if request.param == "tiny":
    return hf.tiny_dir()
  if request.param == "llama":
    return _with_config(tmp_path_factory.mktemp("llama"), "llama")
  return hf.tiny_vl_dir(request.param)


def test_direct_path_is_autotokenizers_tokenizer(direct_dir, tmp_path):
  assert tokenization.direct_backend(direct_dir)
  ours = tokenization.load_tokenizer(direct_dir)
  reference = transformers.AutoTokenizer.from_pretrained(direct_dir, local_files_only=True)
  assert type(ours) is type(reference)
  assert len(ours) == len(reference)
  for name in ("bos_token_id", "eos_token_id", "pad_token_id", "all_special_ids", "all_special_tokens"):
    assert getattr(ours, name) == getattr(reference, name), name
  for text in TEXTS:
    for special in (True, False):
      ids = ours(text, add_special_tokens=special)["input_ids"]
      assert ids == reference(text, add_special_tokens=special)["input_ids"], (text, special)
      for skip in (True, False):
        assert ours.decode(ids, skip_special_tokens=skip) == reference.decode(ids, skip_special_tokens=skip)
  for prompt in (True, False):
    text = ours.apply_chat_template(MESSAGES, add_generation_prompt=prompt, tokenize=False)
    assert text == reference.apply_chat_template(MESSAGES, add_generation_prompt=prompt, tokenize=False)
  added = sorted(reference.get_added_vocab())
  assert ours.convert_tokens_to_ids(added) == reference.convert_tokens_to_ids(added)
  ours.save_pretrained(tmp_path / "ours")
  reference.save_pretrained(tmp_path / "reference")
  assert sorted(os.listdir(tmp_path / "ours")) == sorted(os.listdir(tmp_path / "reference"))
  for name in os.listdir(tmp_path / "ours"):
    assert (tmp_path / "ours" / name).read_bytes() == (tmp_path / "reference" / name).read_bytes(), name


def test_qwen2_goes_through_autotokenizer(tmp_path):
  """qwen2 is a model type where AutoTokenizer replaces the TokenizersBackend a tokenizer_config.json names with its
  own Qwen2Tokenizer, so the direct path must leave it to AutoTokenizer."""
  directory = _with_config(tmp_path, "qwen2")
  assert not tokenization.direct_backend(directory)
  ours = tokenization.load_tokenizer(directory)
  assert type(ours) is type(transformers.AutoTokenizer.from_pretrained(directory, local_files_only=True))
  assert type(ours).__name__ != tokenization.BACKEND_CLASS


def test_other_tokenizer_classes_and_custom_code_go_through_autotokenizer(tmp_path):
  directory = _with_config(tmp_path, "qwen3")
  path = os.path.join(directory, tokenization.TOKENIZER_CONFIG)
  with open(path) as f:
    config = json.load(f)
  assert tokenization.direct_backend(directory)
  for change in ({"tokenizer_class": "Qwen2Tokenizer"}, {"auto_map": {"AutoTokenizer": ["x.Tok", None]}}):
    with open(path, "w") as f:
      json.dump({**config, **change}, f)
    assert not tokenization.direct_backend(directory), change
  os.remove(os.path.join(directory, "tokenizer.json"))
  with open(path, "w") as f:
    json.dump(config, f)
  assert not tokenization.direct_backend(directory)


def test_direct_path_imports_no_torch():
  code = ("import sys; from explore_jax import tokenization; "
          f"tokenization.load_tokenizer({hf.TINY_ASSETS!r}); print(sorted(m for m in ('torch', 'jax') if m in sys.modules))")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
  assert out.stdout.strip() == "[]", out.stdout + out.stderr
