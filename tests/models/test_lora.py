"""LoRA adapters (models/lora.py) and their PEFT export (hf/peft_format.py): the adapted model starts as the base,
the in-forward and merged forms agree, and transformers + PEFT load our export with our logits."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from explore_jax import hf
from explore_jax.hf import peft_format
from explore_jax.models import lora as lora_lib
from explore_jax.models.config import ModelConfig
from explore_jax.models.transformer import Model, positions_from_mask

# head_dim differs from hidden / heads and the MLP from the hidden size, so a transposed or mis-flattened
# adapter cannot have the right shape by accident.
_COMMON = dict(vocab_size=256, hidden_size=64, intermediate_size=96, num_layers=2, num_heads=4, num_kv_heads=2,
               head_dim=24, max_position_embeddings=256)
FAMILIES = {
    "qwen3": ModelConfig(**_COMMON, qk_norm=True, tie_embeddings=True, rope_theta=1_000_000.0),
    "qwen2": ModelConfig(**_COMMON, qkv_bias=True),
    "llama": ModelConfig(**_COMMON, rms_norm_eps=1e-5),
}
ALL = lora_lib.LoraConfig(rank=4, alpha=8.0, target_modules=("all-linear",))


def _base(config, seed=0):
  params = Model(config).init(jax.random.key(seed), std=0.15)
  if config.qkv_bias:  # non-zero biases, so the export's base checkpoint is fully exercised
    for i, name in enumerate(("q_bias", "k_bias", "v_bias")):
      params["layers"][name] = 0.1 * jax.random.normal(jax.random.key(100 + i), params["layers"][name].shape)
  return params


def _trained(config, lora, seed=1):
  """Adapters as after training: A from init, B random (at init B = 0 and every export would look right)."""
  adapters = lora_lib.init(config, lora)
  for i, leaf in enumerate(lora.leaves):
    b = adapters[leaf]["b"]
    adapters[leaf]["b"] = 0.1 * jax.random.normal(jax.random.fold_in(jax.random.key(seed), i), b.shape)
  return adapters


def _batch(config, seed=0):
  """Left-padded rows of different lengths (padding must not change a row)."""
  rng = np.random.default_rng(seed)
  tokens = rng.integers(1, config.vocab_size, (3, 12)).astype(np.int32)
  mask = np.ones_like(tokens, bool)
  mask[1, :4] = False
  mask[2, :9] = False
  return tokens, mask


def _logits(config, params, tokens, mask):
  with jax.default_matmul_precision("highest"):
    out = jax.jit(Model(config).apply)(params, tokens, positions_from_mask(jnp.asarray(mask)), attention_mask=mask)
  return np.asarray(out.logits)


def test_config_names_and_errors():
  assert ALL.target_modules == tuple(lora_lib.MODULES) and ALL.scale == 2.0
  picked = lora_lib.LoraConfig(rank=8, alpha=16, target_modules=("v_proj", "q_proj", "q_proj"))
  assert picked.target_modules == ("q_proj", "v_proj") and picked.leaves == ("q", "v")
  assert lora_lib.from_config({"rank": 0, "alpha": 16.0, "target_modules": ("q_proj",)}) is None
  assert lora_lib.from_config(None) is None
  assert lora_lib.from_config({"rank": 2, "alpha": 4.0, "target_modules": "all-linear"}).leaves == ALL.leaves
  with pytest.raises(ValueError, match="unknown \\['qkv_proj'\\]"):
    lora_lib.LoraConfig(rank=4, alpha=8.0, target_modules=("qkv_proj",))
  with pytest.raises(ValueError, match="rank must be positive"):
    lora_lib.LoraConfig(rank=-1, alpha=8.0, target_modules=("q_proj",))


def test_adapters_at_init_are_the_base_model():
  config = FAMILIES["qwen3"]
  base, adapters = _base(config), lora_lib.init(config, ALL)
  assert all(float(jnp.abs(adapters[leaf]["a"]).min()) > 0 for leaf in ALL.leaves)  # A is random, B zero
  tokens, mask = _batch(config)
  want = _logits(config, base, tokens, mask)
  np.testing.assert_array_equal(_logits(config, lora_lib.adapted(base, adapters, ALL), tokens, mask), want)
  np.testing.assert_array_equal(_logits(config, lora_lib.merge(base, adapters, ALL), tokens, mask), want)


def test_adapted_forward_equals_merged_weights_with_and_without_cache():
  """Training's form (x A B added in the forward pass) and sampling's (W + s A B) are the same function, in the
  scanned layers and in the unrolled, cached decoding path; and the adapters do change the model."""
  config = FAMILIES["llama"]
  lora = lora_lib.LoraConfig(rank=4, alpha=8.0, target_modules=("q_proj", "o_proj", "down_proj"))
  base, adapters = _base(config), _trained(config, lora)
  adapted, merged = lora_lib.adapted(base, adapters, lora), lora_lib.merge(base, adapters, lora)
  for leaf in ("embed", "lm_head"):
    assert merged[leaf] is base[leaf]  # untouched leaves are shared, not copied
  assert merged["layers"]["k"] is base["layers"]["k"]
  tokens, mask = _batch(config)
  ours = _logits(config, adapted, tokens, mask)
  np.testing.assert_allclose(ours, _logits(config, merged, tokens, mask), atol=2e-5)
  assert np.abs(ours - _logits(config, base, tokens, mask)).max() > 1e-2

  model = Model(config)
  positions = positions_from_mask(jnp.asarray(mask))
  with jax.default_matmul_precision("highest"):
    cached = [model.apply(p, tokens, positions, model.init_cache(3, 16), attention_mask=mask).logits
              for p in (adapted, merged)]
  np.testing.assert_allclose(np.asarray(cached[0]), np.asarray(cached[1]), atol=2e-5)
  np.testing.assert_allclose(np.asarray(cached[0])[mask], ours[mask], atol=2e-5)  # padding rows aside


def test_adapters_shard_like_their_weights():
  config = FAMILIES["qwen3"]
  axes = lora_lib.axes(config, ALL)
  assert axes["q"] == {"a": ("layers", "embed", None), "b": ("layers", None, "q_heads", "head_dim")}
  assert axes["o"] == {"a": ("layers", "q_heads", "head_dim", None), "b": ("layers", None, "embed")}
  assert axes["down"] == {"a": ("layers", "mlp", None), "b": ("layers", None, "embed")}
  shapes = lora_lib.shapes(config, ALL)
  assert shapes["o"]["a"].shape == (2, 4, 24, 4) and shapes["gate"]["b"].shape == (2, 4, 96)
  assert {s.dtype for s in jax.tree.leaves(shapes)} == {np.dtype(np.float32)}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_peft_export_loads_in_peft_with_our_logits(tmp_path, family):
  torch = pytest.importorskip("torch", reason="PyTorch (a dev extra) is the reference")
  peft = pytest.importorskip("peft", reason="PEFT (a dev extra) is the reference")
  transformers = pytest.importorskip("transformers")
  config = FAMILIES[family]
  lora = ALL if family != "llama" else lora_lib.LoraConfig(rank=3, alpha=5.0, target_modules=("k_proj", "up_proj"))
  base, adapters = _base(config), _trained(config, lora)
  base_dir = hf.save_pretrained(tmp_path / "base", config, base)
  adapter_dir = peft_format.save_peft(tmp_path / "adapter", config, adapters, lora, base_model_name_or_path=base_dir)
  written = json.load(open(os.path.join(adapter_dir, "adapter_config.json")))
  assert (written["r"], written["lora_alpha"], written["target_modules"]) == (
      lora.rank, lora.alpha, list(lora.target_modules))

  torch.manual_seed(0)
  model = transformers.AutoModelForCausalLM.from_pretrained(base_dir, local_files_only=True, dtype=torch.float32)
  model = peft.PeftModel.from_pretrained(model, adapter_dir).eval()
  # Our names and shapes are exactly PEFT's own for this model (none missing, none extra).
  theirs = {k: tuple(v.shape) for k, v in peft.get_peft_model_state_dict(model).items()}
  assert theirs == {k: v.shape for k, v in peft_format.peft_tensors(config, adapters, lora).items()}

  tokens, mask = _batch(config)
  positions = np.asarray(positions_from_mask(jnp.asarray(mask)))
  with torch.no_grad():
    ref = model(input_ids=torch.from_numpy(tokens.astype(np.int64)),
                attention_mask=torch.from_numpy(mask.astype(np.int64)),
                position_ids=torch.from_numpy(positions.astype(np.int64))).logits.numpy()
  ours = _logits(config, lora_lib.adapted(base, adapters, lora), tokens, mask)
  assert np.abs(ours - _logits(config, base, tokens, mask))[mask].max() > 1e-2  # the adapters matter
  np.testing.assert_allclose(ours[mask], ref[mask], atol=1e-4)


def test_merged_export_is_the_adapted_model(tmp_path):
  """The merged model through hf.save_pretrained reloads (ours) bit for bit as `merge` and scores like the
  adapted model; in bfloat16 the merge rounds once, in the weight's dtype."""
  config = FAMILIES["qwen2"]
  base, adapters = _base(config), _trained(config, ALL)
  merged = lora_lib.merge(base, adapters, ALL)
  tokenizer = hf.load_tokenizer(hf.TINY_ASSETS)
  out = hf.save_pretrained(tmp_path / "merged", config, merged, tokenizer)
  again = hf.load_pretrained(out)
  for a, b in zip(jax.tree.leaves(merged), jax.tree.leaves(again.params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  tokens, mask = _batch(config)
  np.testing.assert_allclose(_logits(again.config, again.params, tokens, mask),
                             _logits(config, lora_lib.adapted(base, adapters, ALL), tokens, mask), atol=2e-5)

  bf16 = jax.tree.map(lambda x: x.astype(jnp.bfloat16), base)
  merged16 = lora_lib.merge(bf16, adapters, ALL)["layers"]["q"]
  want = np.asarray(bf16["layers"]["q"], np.float32) + np.asarray(lora_lib.merge(
      jax.tree.map(lambda x: jnp.zeros_like(x, jnp.float32), base), adapters, ALL)["layers"]["q"])
  assert merged16.dtype == jnp.bfloat16
  np.testing.assert_allclose(np.asarray(merged16, np.float32), want, rtol=2**-8, atol=1e-6)


def test_vl_adapters_adapt_the_language_model_and_load_in_peft_with_our_logits(tmp_path):
  """LoRA on a Qwen2.5-VL checkpoint: adapters on its language model only (the tower frozen, and PEFT told
  so), the adapted model starts as the base, and transformers + PEFT score image prompts as we do."""
  torch = pytest.importorskip("torch", reason="PyTorch (a dev extra) is the reference")
  peft = pytest.importorskip("peft", reason="PEFT (a dev extra) is the reference")
  transformers = pytest.importorskip("transformers")
  from explore_jax.hf import parity
  from explore_jax.models import vision as vision_lib
  from explore_jax.models import vl as vl_lib
  from tests.hf.vl_checkpoints import make_vl_checkpoint

  base_dir = make_vl_checkpoint(tmp_path / "base")
  pre = hf.load_pretrained(base_dir)
  config, base = pre.config, pre.params
  lora = lora_lib.LoraConfig(rank=4, alpha=8.0, target_modules=("all-linear",))
  assert jax.tree.map(lambda x: x.shape, lora_lib.init(config, lora)) == jax.tree.map(
      lambda x: x.shape, lora_lib.init(config.text, lora))  # a VLConfig stands for its language model

  rows, pixel_values, grids = parity.image_prompts(pre.tokenizer, parity.DEFAULT_PROMPTS, config)
  tokens, mask = parity.pad_rows(rows, 0, "left")
  positions, _ = vl_lib.mrope_positions(tokens, mask, grids, config)
  images = vision_lib.vision_inputs(pixel_values, grids, config.vision)

  def logits(params):
    with jax.default_matmul_precision("highest"):
      return np.asarray(jax.jit(vl_lib.VLModel(config).apply)(params, tokens, positions, images=images,
                                                              attention_mask=mask).logits)

  np.testing.assert_array_equal(logits(lora_lib.adapted(base, lora_lib.init(config, lora), lora)), logits(base))
  adapters = _trained(config.text, lora)
  ours = logits(lora_lib.adapted(base, adapters, lora))
  assert np.abs(ours - logits(base))[mask].max() > 1e-2  # the adapters matter
  np.testing.assert_allclose(logits(lora_lib.merge(base, adapters, lora)), ours, atol=2e-5)

  adapter_dir = peft_format.save_peft(tmp_path / "adapter", config, adapters, lora, base_model_name_or_path=base_dir)
  model = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(base_dir, local_files_only=True,
                                                                          dtype=torch.float32)
  model = peft.PeftModel.from_pretrained(model, adapter_dir).eval()
  theirs = {k: tuple(v.shape) for k, v in peft.get_peft_model_state_dict(model).items()}
  assert theirs == {k: v.shape for k, v in peft_format.peft_tensors(config, adapters, lora).items()}
  assert not any("visual" in k for k in theirs)  # the tower's gate/up/down_proj are not adapted
  ids = torch.from_numpy(tokens.astype(np.int64))
  with torch.no_grad():
    ref = model(input_ids=ids, attention_mask=torch.from_numpy(mask.astype(np.int64)),
                pixel_values=torch.from_numpy(pixel_values), image_grid_thw=torch.from_numpy(grids),
                mm_token_type_ids=(ids == config.image_token_id).long()).logits.numpy()
  np.testing.assert_allclose(ours[mask], ref[mask], atol=1e-4)
