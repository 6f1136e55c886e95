"""Hugging Face import/export: logit parity with transformers, bit-exact round trips, clear errors."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from explore_jax import hf
from explore_jax.hf import convert, parity, safetensors_io

torch = pytest.importorskip("torch", reason="PyTorch (a dev extra) is the parity reference")
transformers = pytest.importorskip("transformers")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_COMMON = dict(vocab_size=4096, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
FAMILIES = {
    # head_dim differs from hidden/heads on purpose, and the embeddings are tied, as in small Qwen3s.
    "qwen3": lambda: transformers.Qwen3ForCausalLM(
        transformers.Qwen3Config(head_dim=24, tie_word_embeddings=True, rope_parameters={
            "rope_type": "default", "rope_theta": 1_000_000.0}, **_COMMON)),
    "llama3": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(rope_parameters={
        "rope_type": "llama3", "rope_theta": 500_000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 64}, rms_norm_eps=1e-5, **_COMMON)),
    "qwen2": lambda: transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**_COMMON)),
}


def make_hf_checkpoint(directory, family: str, seed: int = 0) -> str:
  """A random transformers model of `family`, saved with the tiny tokenizer; weights large enough that
  layer mistakes (a wrong transpose, RoPE layout, norm) show up far above the tolerance."""
  torch.manual_seed(seed)
  model = FAMILIES[family]()
  with torch.no_grad():
    for name, p in model.named_parameters():
      if "norm" in name:
        p.uniform_(0.5, 1.5)
      else:
        p.normal_(0.0, 0.15)
  model.save_pretrained(directory)
  hf.load_tokenizer(hf.TINY_ASSETS).save_pretrained(directory)
  return str(directory)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_logits_match_transformers(tmp_path, family):
  d = make_hf_checkpoint(tmp_path, family)
  diffs = parity.max_logit_diffs(d)  # one batch: left padding on the shorter prompts
  assert max(diffs) <= 1e-4, diffs


def test_right_padding_matches_transformers(tmp_path):
  d = make_hf_checkpoint(tmp_path, "qwen3", seed=1)
  assert max(parity.max_logit_diffs(d, padding_side="right")) <= 1e-4


def test_config_fields(tmp_path):
  c = hf.config_from_hf(make_hf_checkpoint(tmp_path / "l", "llama3"))
  assert (c.rope_type, c.rope_theta, c.qkv_bias, c.qk_norm, c.tie_embeddings) == ("llama3", 500_000.0, False, False, False)
  assert c.rope_scaling_dict["original_max_position_embeddings"] == 64
  q = hf.config_from_hf(make_hf_checkpoint(tmp_path / "q", "qwen3"), param_dtype="bfloat16")
  assert (q.head_dim, q.qk_norm, q.tie_embeddings, q.param_dtype, q.dtype) == (24, True, True, "bfloat16", "bfloat16")
  assert hf.config_from_hf(make_hf_checkpoint(tmp_path / "2", "qwen2")).qkv_bias


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_export_reimport_is_bit_exact(tmp_path, family, dtype):
  src = make_hf_checkpoint(tmp_path / "src", family)
  pre = hf.load_pretrained(src, param_dtype=dtype)
  out = hf.save_pretrained(tmp_path / "out", pre.config, pre.params, pre.tokenizer)
  again = hf.load_pretrained(out, param_dtype=dtype)
  assert again.config == pre.config
  for a, b in zip(jax.tree.leaves(pre.params), jax.tree.leaves(again.params)):
    assert a.dtype == b.dtype and np.array_equal(np.asarray(a), np.asarray(b))
  if dtype == "float32":  # the source's tensors come back unchanged, name for name
    src_r, out_r = safetensors_io.CheckpointReader(src), safetensors_io.CheckpointReader(out)
    assert sorted(src_r.keys()) == sorted(out_r.keys())
    for name in src_r.keys():
      assert np.array_equal(src_r.get(name), out_r.get(name)), name


def test_export_loads_in_transformers_with_same_logits(tmp_path):
  pre = hf.load_pretrained("tiny")
  out = hf.save_pretrained(tmp_path, pre.config, pre.params, pre.tokenizer)
  assert max(parity.max_logit_diffs(out)) <= 1e-4


def test_sharded_export_with_index(tmp_path):
  pre = hf.load_pretrained(make_hf_checkpoint(tmp_path / "src", "qwen2"))
  convert.save_params(str(tmp_path / "out"), pre.config, pre.params, max_shard_bytes=200_000)
  files = os.listdir(tmp_path / "out")
  assert safetensors_io.INDEX_FILE in files and sum(f.endswith(".safetensors") for f in files) > 2
  pre.tokenizer.save_pretrained(tmp_path / "out")
  again = hf.load_pretrained(str(tmp_path / "out"))
  for a, b in zip(jax.tree.leaves(pre.params), jax.tree.leaves(again.params)):
    assert np.array_equal(np.asarray(a), np.asarray(b))
  assert max(parity.max_logit_diffs(str(tmp_path / "out"))) <= 1e-4  # transformers reads the shards too


def test_import_streams_without_materialising_the_checkpoint(tmp_path, monkeypatch):
  """Every tensor is read once, through a memory map, and converted one at a time."""
  d = make_hf_checkpoint(tmp_path, "qwen3")
  reads = []
  original = safetensors_io.SafetensorsFile.get
  monkeypatch.setattr(safetensors_io.SafetensorsFile, "get",
                      lambda self, name: reads.append(name) or original(self, name))
  hf.load_pretrained(d, with_tokenizer=False)
  assert sorted(reads) == sorted(safetensors_io.CheckpointReader(d).keys())
  view = safetensors_io.CheckpointReader(d).get(reads[0])
  while not isinstance(view, np.memmap) and view.base is not None:
    view = view.base
  assert isinstance(view, np.memmap)  # a view of the file, not a copy in memory


def _through_transformers(hf_dir: str) -> "hf.ModelConfig":
  """config_from_hf with every field read through transformers' AutoConfig, as it read them all before."""
  original = convert.hf_config
  try:
    convert.hf_config = lambda d, raw: transformers.AutoConfig.from_pretrained(d, local_files_only=True)
    return hf.config_from_hf(hf_dir)
  finally:
    convert.hf_config = original


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_config_reads_as_transformers_reads_it(tmp_path, family):
  """A config.json that spells out every field is read without transformers, to the same ModelConfig; one that
  leaves some out (transformers 5 writes no head_dim for Qwen2) goes through transformers."""
  d = make_hf_checkpoint(tmp_path / "hf", family)
  raw = json.load(open(os.path.join(d, "config.json")))
  explicit = all(k in raw for k in convert.EXPLICIT_FIELDS)
  assert explicit == (family != "qwen2")
  assert isinstance(convert.hf_config(d, raw), transformers.PreTrainedConfig) != explicit
  assert hf.config_from_hf(d) == _through_transformers(d)
  ours = str(tmp_path / "ours")  # as hf_config_dict writes it
  convert.save_params(ours, hf.config_from_hf(d), hf.load_pretrained(d, with_tokenizer=False).params)
  assert hf.config_from_hf(ours) == _through_transformers(ours) == hf.config_from_hf(d)


def test_older_config_layouts_go_through_transformers(tmp_path):
  """A top-level rope_theta and no head_dim (transformers 4's Llama layout): transformers fills in and converts."""
  d = make_hf_checkpoint(tmp_path, "llama3")
  raw = json.load(open(os.path.join(d, "config.json")))
  old = {k: v for k, v in raw.items() if k not in ("rope_parameters", "head_dim")}
  with open(os.path.join(d, "config.json"), "w") as f:
    json.dump({**old, "rope_theta": 250_000.0}, f)
  config = hf.config_from_hf(d)
  assert (config.rope_theta, config.rope_type, config.head_dim) == (250_000.0, "default", 16)


def test_a_run_loads_its_model_and_tokenizer_without_torch():
  code = ("import sys; from explore_jax import hf; p = hf.load_pretrained(hf.tiny_dir()); "
          "assert p.tokenizer is not None; print('torch' in sys.modules)")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
  assert out.stdout.strip() == "False", out.stdout + out.stderr


def test_errors_name_the_problem(tmp_path):
  with pytest.raises(FileNotFoundError, match="does not exist"):
    hf.load_pretrained(str(tmp_path / "nowhere"))
  d = make_hf_checkpoint(tmp_path / "a", "qwen3")
  raw = json.load(open(os.path.join(d, "config.json")))
  with open(os.path.join(d, "config.json"), "w") as f:
    json.dump({**raw, "architectures": ["MambaForCausalLM"], "model_type": "mamba"}, f)
  with pytest.raises(hf.UnsupportedCheckpointError, match="MambaForCausalLM"):
    hf.load_pretrained(d)
  d = make_hf_checkpoint(tmp_path / "b", "qwen3")
  os.remove(os.path.join(d, "model.safetensors"))
  with pytest.raises(FileNotFoundError, match="no model.safetensors"):
    hf.load_pretrained(d)
  d = make_hf_checkpoint(tmp_path / "c", "llama3")
  raw = json.load(open(os.path.join(d, "config.json")))
  with open(os.path.join(d, "config.json"), "w") as f:  # claims a layer the weights do not have
    json.dump({**raw, "num_hidden_layers": 3}, f)
  with pytest.raises(hf.UnsupportedCheckpointError, match="missing tensor 'model.layers.2"):
    hf.load_pretrained(d)


def test_check_hf_script_reports_parity(tmp_path):
  d = make_hf_checkpoint(tmp_path / "qwen3", "qwen3", seed=3)
  run = subprocess.run([sys.executable, os.path.join(REPO, "launch", "check_hf.py"), f"--hf_dir={d}"],
                       capture_output=True, text=True, timeout=300, cwd=REPO)
  assert run.returncode == 0, run.stderr[-2000:]
  last = run.stdout.strip().splitlines()[-1]
  assert last.startswith("max_abs_logit_diff=") and float(last.split("=")[1]) <= 1e-4
  bad = subprocess.run([sys.executable, os.path.join(REPO, "launch", "check_hf.py"), f"--hf_dir={tmp_path}/none"],
                       capture_output=True, text=True, timeout=300, cwd=REPO)
  assert bad.returncode != 0 and "does not exist" in bad.stderr
