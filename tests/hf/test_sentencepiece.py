"""Checkpoints whose tokenizer is only a SentencePiece model (tokenizer.model, Llama-2 style) load through
sentencepiece: the same ids as the model's own SentencePiece processor and as transformers' LlamaTokenizer,
chat templates rendered alike, and the whole path (load_pretrained, logit parity, the actors' tokenizer)."""

import json
import os
import shutil

import numpy as np
import pytest

from explore_jax import hf, tokenization
from explore_jax.actors.actor import PromptTokenizer
from explore_jax.hf import parity

sentencepiece = pytest.importorskip("sentencepiece")
torch = pytest.importorskip("torch", reason="PyTorch (a dev extra) is the parity reference")
transformers = pytest.importorskip("transformers")

TEXTS = ["hello world", "def f(x):\n    return x + 1", "  two  spaces", "a\n\nb  c", "naïve café ☕ 数字", "the quick brown fox",
         "", "x" * 40]
# Llama-2's template in its essentials: [INST] turns, the system prompt folded into the first, BOS per turn.
CHAT_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}{% set system = messages[0]['content'] %}"
    "{% set messages = messages[1:] %}{% else %}{% set system = '' %}{% endif %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'user' %}{{ bos_token }}[INST] "
    "{% if loop.first and system %}<<SYS>>\n{{ system }}\n<</SYS>>\n\n{% endif %}"
    "{{ message['content'] }} [/INST]"
    "{% elif message['role'] == 'assistant' %} {{ message['content'] }} {{ eos_token }}"
    "{% else %}{{ raise_exception('unknown role ' + message['role']) }}{% endif %}{% endfor %}")


@pytest.fixture(scope="module")
def sp_dir(tmp_path_factory):
  """A directory whose tokenizer is only a BPE SentencePiece model with byte fallback (as Llama-2's)."""
  root = tmp_path_factory.mktemp("spm")
  corpus = root / "corpus.txt"
  corpus.write_text("\n".join([f"the quick brown fox jumps over the lazy dog {i} times" for i in range(200)]
                              + ["def f(x):\n    return x + 1", "hello world, hello again"] * 40))
  sentencepiece.SentencePieceTrainer.train(
      input=str(corpus), model_prefix=str(root / "tok"), vocab_size=400, model_type="bpe", byte_fallback=True,
      unk_id=0, bos_id=1, eos_id=2, pad_id=-1, minloglevel=2,
      # Llama-2's normalizer settings: text kept as written (spaces, newlines), digits split.
      normalization_rule_name="identity", remove_extra_whitespaces=False, split_digits=True,
      allow_whitespace_only_pieces=True)
  directory = root / "ckpt"
  directory.mkdir()
  shutil.move(str(root / "tok.model"), directory / "tokenizer.model")
  return directory


# What Llama-2's tokenizer_config.json says, which transformers needs to be told and sentencepiece knows.
LLAMA2_CONFIG = {"tokenizer_class": "LlamaTokenizer", "add_bos_token": True, "add_eos_token": False,
                 "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": None}


def llama_tokenizer(directory, tmp_path, **config):
  """transformers' own reading of the same model, with Llama-2's tokenizer config."""
  copy = tmp_path / "as_llama"
  shutil.copytree(directory, copy, dirs_exist_ok=True)
  (copy / "tokenizer_config.json").write_text(json.dumps({**LLAMA2_CONFIG, **config}))
  return transformers.AutoTokenizer.from_pretrained(str(copy), local_files_only=True)


def test_a_sentencepiece_only_directory_loads_through_sentencepiece(sp_dir, tmp_path):
  ours = hf.load_tokenizer(str(sp_dir))
  assert isinstance(ours, tokenization.SentencePieceTokenizer)
  sp = sentencepiece.SentencePieceProcessor(model_file=str(sp_dir / "tokenizer.model"))
  theirs = llama_tokenizer(sp_dir, tmp_path)
  for text in TEXTS:
    assert ours(text, add_special_tokens=False)["input_ids"] == sp.encode(text)
    assert ours(text)["input_ids"] == [1] + sp.encode(text)  # BOS, as Llama-2's tokenizer adds it
    # transformers' Llama tokenizer drops the text's own leading space after the dummy prefix, which the
    # model's SentencePiece processor keeps ("  two" -> "▁▁" "▁t"...): there the model's processor is followed.
    if not text[:1].isspace():
      for special in (False, True):
        assert ours(text, add_special_tokens=special)["input_ids"] == \
            theirs(text, add_special_tokens=special)["input_ids"], text
    ids = ours(text)["input_ids"] + [ours.eos_token_id]
    assert ours.decode(ids, skip_special_tokens=True) == theirs.decode(ids, skip_special_tokens=True) == text
  assert (ours.bos_token_id, ours.eos_token_id, ours.pad_token_id, len(ours)) == (1, 2, None, 400)
  assert ours.convert_tokens_to_ids("</s>") == theirs.convert_tokens_to_ids("</s>") == 2


def test_the_chat_template_renders_as_transformers_renders_it(sp_dir, tmp_path):
  directory = tmp_path / "chat"
  shutil.copytree(sp_dir, directory)
  config = {"chat_template": CHAT_TEMPLATE, "bos_token": "<s>", "eos_token": "</s>"}
  (directory / "tokenizer_config.json").write_text(json.dumps(config))
  ours = hf.load_tokenizer(str(directory))
  theirs = llama_tokenizer(sp_dir, tmp_path, **config)
  messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello world"},
              {"role": "assistant", "content": "hello again"}, {"role": "user", "content": "the fox?"}]
  text = ours.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
  assert text == theirs.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
  assert text.startswith("<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nhello world [/INST] hello again </s><s>[INST]")
  with pytest.raises(ValueError, match="unknown role"):
    ours.apply_chat_template([{"role": "tool", "content": "x"}], tokenize=False)
  # The actors' prompts: the template's text, its special tokens written by the template itself and each turn
  # encoded on its own, as Llama-2's reference code does (BOS + sp.encode(turn) [+ EOS]); transformers' Llama
  # tokenizer would drop the dummy prefix after a special token ("<s>" "[" instead of "<s>" "▁" "[").
  prompt, cut = PromptTokenizer.from_dir(str(directory), max_prompt_tokens=1000).encode(messages)
  assert prompt == ours(text, add_special_tokens=False)["input_ids"] and cut == 0
  first, second = text.removeprefix("<s>").split(" </s><s>")
  sp = sentencepiece.SentencePieceProcessor(model_file=str(sp_dir / "tokenizer.model"))
  assert prompt == [1] + sp.encode(first + " ") + [2, 1] + sp.encode(second)


def test_a_special_token_the_model_lacks_is_a_clear_error(sp_dir, tmp_path):
  directory = tmp_path / "bad"
  shutil.copytree(sp_dir, directory)
  (directory / "tokenizer_config.json").write_text(json.dumps({"pad_token": "<pad>"}))
  with pytest.raises(ValueError, match="pad_token '<pad>' is not a piece"):
    hf.load_tokenizer(str(directory))


def test_a_llama_checkpoint_with_a_sentencepiece_tokenizer_loads_and_matches_transformers(sp_dir, tmp_path):
  torch.manual_seed(0)
  model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
      vocab_size=400, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
      num_key_value_heads=2, max_position_embeddings=256, bos_token_id=1, eos_token_id=2))
  with torch.no_grad():
    for p in model.parameters():
      p.normal_(0.0, 0.15)
  directory = tmp_path / "llama2"
  model.save_pretrained(directory)
  shutil.copy(sp_dir / "tokenizer.model", directory / "tokenizer.model")
  assert not (directory / "tokenizer.json").exists()

  pre = hf.load_pretrained(str(directory))
  assert isinstance(pre.tokenizer, tokenization.SentencePieceTokenizer) and pre.config.vocab_size == 400
  assert max(parity.max_logit_diffs(str(directory))) <= 1e-4  # prompts tokenized by sentencepiece
  # Exported again, the directory keeps its SentencePiece tokenizer and reads back the same.
  out = tmp_path / "export"
  hf.save_pretrained(str(out), pre.config, pre.params, pre.tokenizer)
  again = hf.load_tokenizer(str(out))
  assert isinstance(again, tokenization.SentencePieceTokenizer)
  assert all(again(t)["input_ids"] == pre.tokenizer(t)["input_ids"] for t in TEXTS)
  # The actors read the checkpoint's tokenizer the same way (no chat template: the joined contents, BOS first).
  actor = PromptTokenizer.from_dir(str(directory), max_prompt_tokens=8)
  ids, cut = actor.encode([{"role": "user", "content": "the quick brown fox jumps"}])
  full = pre.tokenizer("the quick brown fox jumps")["input_ids"]
  assert ids == full[-8:] and cut == max(0, len(full) - 8)
  assert actor.decode(np.asarray(full)) == "the quick brown fox jumps"
