"""Exports a training run's policy as files that transformers, PEFT and vLLM load.

  # a LoRA run: its adapters in PEFT's format (adapter_config.json, adapter_model.safetensors) and, with
  # --merged, the base with the adapters merged in, a full Hugging Face checkpoint in <output>/merged
  python launch/export.py --config=configs/grpo_keydoor.py --config.model.lora.rank=8 --run=runs/grpo_keydoor_lora \\
      --merged
  # a run without LoRA: the full Hugging Face checkpoint (weights, config, tokenizer)
  python launch/export.py --config=configs/grpo_keydoor.py --run=runs/grpo_keydoor

Give the run's own config and overrides. --step picks a checkpoint (default: the latest); --output defaults to
<run>/export-<step>, or runs/export-<run name>-<step> for a run in a bucket (--run=gs://...: the checkpoint is
read from there, the files are written to a local directory, where transformers and vLLM read them). The adapters go on the config's model.checkpoint (written into adapter_config.json as
base_model_name_or_path):
  peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(BASE), OUTPUT)
  vllm.LLM(BASE, enable_lora=True, max_lora_rank=R).generate(..., lora_request=LoRARequest("policy", 1, OUTPUT))
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags, logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from explore_jax import cli  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", None, "The run's experiment config file[:variant].",
                                          lock_config=True)
_RUN = flags.DEFINE_string("run", None, "The training run directory whose checkpoint to export.")
_STEP = flags.DEFINE_integer("step", None, "Checkpoint step of --run (default: the latest).")
_OUTPUT = flags.DEFINE_string("output", None, "Where the files go (default: <run>/export-<step>).")
_MERGED = flags.DEFINE_bool("merged", False, "LoRA runs: also write the merged model to <output>/merged.")
flags.mark_flags_as_required(["config", "run"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  logging.set_verbosity(logging.WARNING)
  from explore_jax import hf, storage
  from explore_jax.hf import peft_format
  from explore_jax.train import loop
  from explore_jax.train.builder import build

  try:
    if not storage.isdir(os.path.join(_RUN.value, "checkpoints")):
      raise FileNotFoundError(f"{_RUN.value} has no checkpoints/ directory")
    parts = build(_CONFIG.value, _RUN.value)
    step = parts.checkpointer.latest_step() if _STEP.value is None else _STEP.value
    params = loop.load_params(parts, step)
  except (FileNotFoundError, ValueError) as e:  # the config or flags name something that is not there
    sys.exit(f"error: {e}")
  if _OUTPUT.value:
    output = _OUTPUT.value
  elif storage.is_remote(_RUN.value):
    output = os.path.join("runs", f"export-{os.path.basename(_RUN.value.rstrip('/'))}-{step}")
  else:
    output = os.path.join(_RUN.value, f"export-{step}")
  if storage.is_remote(output):
    sys.exit(f"error: --output={output}: exports are written to a local directory")
  output = os.path.abspath(output)
  config, lora = parts.model.config, parts.learner.lora
  if lora is None:
    hf.save_pretrained(output, config, params, parts.tokenizer)
    print(f"[export] step {step}: the policy as a Hugging Face checkpoint in {output}")
    return
  peft_format.save_peft(output, config, params, lora, base_model_name_or_path=parts.checkpoint_dir)
  print(f"[export] step {step}: LoRA adapters (r={lora.rank}, alpha={lora.alpha:g}) in PEFT's format in {output}, "
        f"for the base {parts.checkpoint_dir}")
  if _MERGED.value:
    merged = hf.save_pretrained(os.path.join(output, "merged"), config, parts.server.policy_params(params),
                                parts.tokenizer)
    print(f"[export] the merged model as a Hugging Face checkpoint in {merged}")


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
