"""Trains the built-in tiny model's byte-level BPE tokenizer offline and saves it in Hugging Face format.

  python launch/build_tiny_tokenizer.py --out=explore_jax/hf/assets/tiny

The corpus is the Python standard library's source (English docstrings and comments, Python code), which
every machine has, so the tokenizer is rebuilt without downloads. The result is committed; this script
documents how it was made.
"""

import os
import sysconfig

from absl import app, flags

_OUT = flags.DEFINE_string("out", "explore_jax/hf/assets/tiny", "Directory to write the tokenizer to.")
_VOCAB = flags.DEFINE_integer("vocab_size", 4096, "Vocabulary size, special tokens included.")
_MAX_BYTES = flags.DEFINE_integer("max_bytes", 24_000_000, "Corpus size cap.")

SPECIAL_TOKENS = ["<|endoftext|>", "<|pad|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def corpus(max_bytes: int):
  root = sysconfig.get_paths()["stdlib"]
  total = 0
  for dirpath, dirnames, filenames in sorted(os.walk(root)):
    dirnames[:] = sorted(d for d in dirnames if d not in ("site-packages", "test", "tests", "idlelib"))
    for fn in sorted(filenames):
      if not fn.endswith(".py"):
        continue
      with open(os.path.join(dirpath, fn), encoding="utf-8", errors="ignore") as f:
        text = f.read()
      total += len(text)
      yield text
      if total >= max_bytes:
        return


def main(_):
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
  from transformers import PreTrainedTokenizerFast

  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=_VOCAB.value, special_tokens=SPECIAL_TOKENS,
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
  tok.train_from_iterator(corpus(_MAX_BYTES.value), trainer=trainer)
  fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|pad|>",
                                 additional_special_tokens=["<|im_start|>", "<|im_end|>"])
  fast.chat_template = CHAT_TEMPLATE
  os.makedirs(_OUT.value, exist_ok=True)
  fast.save_pretrained(_OUT.value)
  print(f"vocab={tok.get_vocab_size()} saved to {_OUT.value}: {sorted(os.listdir(_OUT.value))}")


if __name__ == "__main__":
  app.run(main)
