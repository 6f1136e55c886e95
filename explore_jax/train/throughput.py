"""How fast an iteration went: learner tokens/s, model TFLOP/s and MFU, sampler tokens/s (new tokens, and prompt
tokens prefilled), waiting for environments.

The learner counts what it computed on (Learner.update: `update/tokens`, the real prompt and response tokens of the
valid rows of every minibatch, `update/attention_pairs`, the (query, key) pairs of causal attention among them, and
`time_policy_update_s`). Model FLOPs are those of the model on real tokens, forward and backward (3x the forward pass):

  forward per token   2 x (the matmul weights a token passes through: q, k, v, o, gate, up, down per layer, the
                      vocabulary projection)
  attention           2 x 2 x layers x heads x head_dim per (query, key) pair (scores and the weighted sum)

so padding, rematerialisation and the reference policy's forward pass count as waste, not work (the MFU convention
of PaLM and MaxText). MFU divides by the peak of the devices the learner runs on: `train.peak_tflops` (per device)
when set, else the dense bf16 peak of a known device kind (PEAK_TFLOPS); none for CPUs, whose peak depends on the
part and its clocks.
"""

from __future__ import annotations

from typing import Any, Optional

from explore_jax.models.config import language_config

# Dense bf16 TFLOP/s per device, from the vendors' data sheets (TPUs: per chip; GPUs: SXM parts without sparsity).
PEAK_TFLOPS = (
    ("TPU v6", 918.0),       # v6e (Trillium)
    ("TPU v5p", 459.0),
    ("TPU v5", 197.0),       # v5e, reported as "TPU v5 lite" (matched after v5p)
    ("TPU v4", 275.0),
    ("H200", 989.0),
    ("H100", 989.0),
    ("A100", 312.0),
)


def matmul_weights_per_token(c: Any) -> int:
  """Weights of a ModelConfig's matmuls that one token's forward pass multiplies with (embedding lookup excluded,
  the vocabulary projection included, tied or not)."""
  attention = c.hidden_size * (c.num_heads + 2 * c.num_kv_heads) * c.head_dim + c.num_heads * c.head_dim * c.hidden_size
  mlp = 3 * c.hidden_size * c.intermediate_size
  return c.num_layers * (attention + mlp) + c.hidden_size * c.vocab_size


def training_flops(c: Any, tokens: float, attention_pairs: float) -> float:
  """Forward and backward FLOPs of a ModelConfig on `tokens` tokens with `attention_pairs` causal (query, key)
  pairs among them."""
  forward = 2.0 * matmul_weights_per_token(c) * tokens + 4.0 * c.num_layers * c.num_heads * c.head_dim * attention_pairs
  return 3.0 * forward


def peak_tflops(override: Optional[float], devices: list[Any]) -> Optional[float]:
  """The devices' total peak TFLOP/s: `override` x devices when it is positive, else the table's value of their
  device kind, else None (unknown: no MFU is reported)."""
  if not devices:
    return None
  if override:
    return float(override) * len(devices)
  kind = str(getattr(devices[0], "device_kind", ""))
  for name, peak in PEAK_TFLOPS:
    if name.lower() in kind.lower():
      return peak * len(devices)
  return None


def iteration_metrics(m: dict[str, float], model_config: Any, peak: Optional[float]) -> dict[str, float]:
  """The throughput/ metrics of one iteration's metrics `m` (rollout timings, the learner's counts); a
  vision-language model's FLOPs are its language model's (the tower's are left out)."""
  model_config = language_config(model_config)
  out: dict[str, float] = {}
  if m.get("sample_tokens_per_s") is not None:
    out["throughput/sampler_tokens_per_s"] = float(m["sample_tokens_per_s"])
  if m.get("sample_prompt_tokens_per_s") is not None:
    out["throughput/sampler_prompt_tokens_per_s"] = float(m["sample_prompt_tokens_per_s"])
  busy = m.get("time_rollout_s", 0.0) + m.get("time_update_s", 0.0)
  if busy > 0 and "time_environment_s" in m:
    out["throughput/env_wait_share"] = float(m["time_environment_s"]) / busy
  waited = m.get("time_rollout_wait_s")
  if waited is not None and waited + m.get("time_update_s", 0.0) > 0:
    # The loop's own share of an iteration spent waiting for episodes (all of the rollout when synchronous,
    # what the update did not hide when overlapped).
    out["throughput/rollout_wait_share"] = float(waited) / (waited + m.get("time_update_s", 0.0))
  seconds = m.get("time_policy_update_s", 0.0)
  if seconds > 0 and "update/tokens" in m:
    tflops = training_flops(model_config, m["update/tokens"], m.get("update/attention_pairs", 0.0)) / seconds / 1e12
    out["throughput/learner_tokens_per_s"] = float(m["update/tokens"]) / seconds
    out["throughput/learner_tflops"] = tflops
    if peak:
      out["throughput/mfu"] = tflops / peak
  return out
