"""Random transformers checkpoints of both vision-language families (Qwen2.5-VL and Qwen3-VL) that the checkpoint
tests share, each made once a session, and transformers' model of each as the reference."""

import functools
import json
import os

import jax
import numpy as np
import pytest

from explore_jax import hf
from explore_jax.hf import convert_vl, safetensors_io

torch = pytest.importorskip("torch", reason="PyTorch (a dev extra) is the parity reference")
transformers = pytest.importorskip("transformers")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The tiny tokenizer's vision tokens (hf.tiny_vl_tokenizer) and a vocabulary padded past them.
TOKENS = dict(vision_start_token_id=4096, vision_end_token_id=4097, image_token_id=4098, video_token_id=4099)
FAMILIES = ["qwen2.5-vl", "qwen3-vl"]
ARCHITECTURES = {"qwen2.5-vl": "Qwen2_5_VLForConditionalGeneration", "qwen3-vl": "Qwen3VLForConditionalGeneration"}


def _randomise_and_save(model, directory, is_norm) -> str:
  """Large random weights (norms around 1), saved with the tiny-vl tokenizer."""
  with torch.no_grad():
    for name, p in model.named_parameters():
      if is_norm(name):
        p.uniform_(0.5, 1.5)
      else:
        p.normal_(0.0, 0.1)
  model.save_pretrained(directory)
  hf.tiny_vl_tokenizer().save_pretrained(directory)
  return str(directory)


def make_vl_checkpoint(directory, seed: int = 0, tie: bool = False) -> str:
  """A random transformers Qwen2.5-VL with a 3-block tower (block 1 full attention, the others windows of 2 x 2
  merged tokens), saved with the tiny-vl tokenizer. The weights are large enough that a wrong transpose, RoPE
  layout or window shows far above the tolerance."""
  torch.manual_seed(seed)
  config = transformers.Qwen2_5_VLConfig(
      text_config=dict(vocab_size=4104, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6, max_position_embeddings=512,
                       rope_parameters={"rope_type": "default", "rope_theta": 10_000.0, "mrope_section": [2, 3, 3]}),
      vision_config=dict(depth=3, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=64,
                         patch_size=4, window_size=16, fullatt_block_indexes=[1]),
      tie_word_embeddings=tie, **TOKENS)
  return _randomise_and_save(transformers.Qwen2_5_VLForConditionalGeneration(config), directory,
                             lambda name: "norm" in name or "ln_q" in name)


def make_qwen3_vl_checkpoint(directory, seed: int = 0, tie: bool = False) -> str:
  """A random transformers Qwen3-VL: a 3-block tower with 4-pixel patches, a 6 x 6 learned position grid and
  DeepStack after blocks 0 and 2; a 3-layer language model whose head_dim (24) is not hidden / heads, with
  the 12 rotary frequencies interleaved 4/4/4. Saved with the tiny-vl tokenizer. The weights are large enough
  that a wrong transpose, RoPE layout, position resampling or DeepStack step shows far above the tolerance."""
  torch.manual_seed(seed)
  config = transformers.Qwen3VLConfig(
      text_config=dict(vocab_size=4104, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=24, rms_norm_eps=1e-6,
                       max_position_embeddings=512,
                       rope_parameters={"rope_type": "default", "rope_theta": 10_000.0, "mrope_section": [4, 4, 4],
                                        "mrope_interleaved": True}),
      vision_config=dict(depth=3, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=64,
                         patch_size=4, num_position_embeddings=36, deepstack_visual_indexes=[0, 2]),
      tie_word_embeddings=tie, **TOKENS)
  return _randomise_and_save(transformers.Qwen3VLForConditionalGeneration(config), directory,
                             lambda name: "norm" in name and name.endswith("weight"))


MAKERS = {"qwen2.5-vl": make_vl_checkpoint, "qwen3-vl": make_qwen3_vl_checkpoint}
_MADE: dict[str, str] = {}


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory):
  """family -> the path of its random checkpoint (seed 0, untied), made on first use."""

  def get(family: str) -> str:
    if family not in _MADE:
      _MADE[family] = MAKERS[family](tmp_path_factory.mktemp(family.replace(".", "")))
    return _MADE[family]

  return get


@functools.cache
def reference(family: str, checkpoint: str):
  """transformers' model of `checkpoint`, loaded once."""
  cls = getattr(transformers, ARCHITECTURES[family])
  return cls.from_pretrained(checkpoint, local_files_only=True).eval()


def assert_relaid_out_checkpoint_loads_the_same(checkpoint: str, directory: str, rename, relay_config) -> None:
  """`checkpoint` written again into `directory`, its tensors named by `rename` and its config.json as
  `relay_config` returns the parsed one: it loads as the same config and the same params."""
  reader = safetensors_io.CheckpointReader(checkpoint)
  renamed = {n: rename(n) for n in reader.keys()}
  entries = [(renamed[n], reader.get(n).shape, reader.get(n).dtype) for n in reader.keys()]
  by_new = {v: k for k, v in renamed.items()}
  safetensors_io.write_checkpoint(directory, entries, lambda n: np.asarray(reader.get(by_new[n])), 2**30)
  raw = json.load(open(os.path.join(checkpoint, "config.json")))
  with open(os.path.join(directory, "config.json"), "w") as f:
    json.dump(relay_config(raw), f)
  config = convert_vl.config_from_hf(directory)
  assert config == convert_vl.config_from_hf(checkpoint)
  got, want = convert_vl.load_params(directory, config), convert_vl.load_params(checkpoint, config)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    assert np.array_equal(np.asarray(a), np.asarray(b))
