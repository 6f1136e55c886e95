"""The JAX all-MiniLM-L6-v2 sentence encoder (explore_jax/hf/encoder.py, models/bert.py): parity with
sentence-transformers on real texts (long ones cut at 256 tokens), padding independence, the cache, checkpoint
name handling and the one-line errors, and no torch import."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from explore_jax.hf import encoder as encoder_lib
from explore_jax.hf import load_encoder, safetensors_io
from explore_jax.models import bert

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PARAGRAPH = ("The laboratory has a sink, a counter with a beaker of water, a thermometer and a stove. To measure the "
             "melting point you first move the ice to the beaker, then heat it slowly while reading the thermometer "
             "every few steps, writing down each temperature you see. ")
LONG = " ".join([PARAGRAPH] * 40)  # ~2,000 words, far past the 256-token cut
TEXTS = [
    "Preheat the oven to 200 C, then chop two onions and fry them in butter until golden.",
    "This room is called the kitchen. In it, you see: a fridge (closed), a counter, a glass cup containing "
    "nothing, an orange. You also see: a door to the hallway (open).",
    "def f(x):\n    return sum(i * i for i in range(x))  # squares",
    "Ünïcödé naïve café, emoji 🙂 and 中文字符 — «quotes»",
    "",
    LONG,
    "open door to hallway",
    "open door to hallway",
    "   SHOUTING with   odd\twhitespace\n\n",
    "In 2024, 12345 apples cost $3.50 -- isn't that 'odd'?",
]


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
  with pytest.MonkeyPatch.context() as mp:
    path = str(tmp_path_factory.mktemp("cache"))
    mp.setenv("EXPLORE_JAX_CACHE", path)
    yield path


@pytest.fixture(scope="module")
def encoder(cache_dir):
  return load_encoder()  # the wheel is installed by make install (requirements-models.txt): missing is a failure


def test_parity_with_sentence_transformers(encoder):
  pytest.importorskip("torch", reason="PyTorch (a dev extra) runs the reference")
  sentence_transformers = pytest.importorskip("sentence_transformers")
  reference = sentence_transformers.SentenceTransformer(encoder.directory, device="cpu")
  want = reference.encode(TEXTS, convert_to_numpy=True, batch_size=64)
  got = encoder.encode(TEXTS)
  assert got.shape == (len(TEXTS), 384) and got.dtype == np.float32
  assert reference.max_seq_length == encoder.max_tokens == 256
  assert len(encoder.tokenizer.encode(LONG).ids) == 256
  np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
  np.testing.assert_allclose(np.linalg.norm(want, axis=1), 1.0, atol=1e-5)
  diff = float(np.abs(got - want).max())
  print(f"max |diff| vs sentence-transformers: {diff:.3g}")
  assert diff <= 1e-5


def test_batch_rows_equal_single_texts(encoder):
  texts = [TEXTS[0], TEXTS[4], TEXTS[1], TEXTS[5], TEXTS[3]]
  batch = encoder.encode(texts)
  for i, text in enumerate(texts):
    np.testing.assert_allclose(batch[i], encoder.encode([text])[0], atol=1e-6, err_msg=repr(text[:40]))


def test_similarity_sanity(encoder):
  a, b, c = encoder.encode(["The cat sits on the mat.", "A cat is sitting on a rug.",
                            "Quarterly tax filings are due in April."])
  assert float(a @ a) == pytest.approx(1.0, abs=1e-6)
  assert float(a @ b) > float(a @ c) + 0.2


def test_empty_and_attributes(encoder):
  assert encoder.encode([]).shape == (0, 384) and encoder.encode([]).dtype == np.float32
  assert encoder.dim == 384 and encoder.max_tokens == 256


def test_extracted_once(encoder, cache_dir):
  assert load_encoder().directory == encoder.directory
  assert os.listdir(os.path.join(cache_dir, "encoders")) == [os.path.basename(encoder.directory)]
  assert len(os.path.basename(encoder.directory)) == 16


def test_missing_wheel_is_one_line(monkeypatch):
  from explore_jax.hf import packaged

  monkeypatch.setattr(packaged.importlib.util, "find_spec", lambda name: None)
  with pytest.raises(FileNotFoundError, match="make install") as e:
    load_encoder()
  assert "\n" not in str(e.value)


def _tiny_dir(path, encoder, prefix="", extra=None, drop=None):
  """A random 2-layer, width-8 BERT directory with the real tokenizer (the real vocabulary size)."""
  config = bert.BertConfig(30522, 8, 2, 2, 16, 64, 2)
  os.makedirs(path, exist_ok=True)
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump({"model_type": "bert", "vocab_size": 30522, "hidden_size": 8, "num_hidden_layers": 2,
               "num_attention_heads": 2, "intermediate_size": 16, "max_position_embeddings": 64,
               "type_vocab_size": 2, "layer_norm_eps": 1e-12, "hidden_act": "gelu"}, f)
  shutil.copy(os.path.join(encoder.directory, "tokenizer.json"), path)
  rng = np.random.default_rng(0)
  shapes = bert.param_shapes(config)
  tensors = {name: rng.normal(size=shapes["embed"][k]).astype(np.float32)
             for k, name in encoder_lib._EMBED_NAMES.items()}
  for k, (name, transposed) in encoder_lib._LAYER_NAMES.items():
    for i in range(config.num_layers):
      shape = shapes["layers"][k][1:]
      tensors[f"encoder.layer.{i}.{name}"] = rng.normal(size=shape[::-1] if transposed else shape).astype(np.float32)
  tensors["pooler.dense.weight"] = np.zeros((8, 8), np.float32)  # present in real checkpoints, unused
  tensors.update(extra or {})
  tensors = {prefix + n: t for n, t in tensors.items() if n != drop}
  safetensors_io.write_file(os.path.join(path, "model.safetensors"), tensors)
  return path


def test_bert_prefix_and_plain_layout(encoder, tmp_path):
  plain = load_encoder(_tiny_dir(str(tmp_path / "plain"), encoder))
  prefixed = load_encoder(_tiny_dir(str(tmp_path / "prefixed"), encoder, prefix="bert."))
  assert plain.max_tokens == 64 and plain.dim == 8
  texts = ["open door to hallway", LONG]
  np.testing.assert_array_equal(plain.encode(texts), prefixed.encode(texts))
  np.testing.assert_allclose(np.linalg.norm(plain.encode(texts), axis=1), 1.0, atol=1e-5)


@pytest.mark.parametrize("case,error,pattern", [
    ("no_safetensors", FileNotFoundError, "model.safetensors"),
    ("unexpected", ValueError, "unexpected tensor 'encoder.layer.0.attention.self.rotary.weight'"),
    ("missing", ValueError, "no tensor 'encoder.layer.1.output.dense.bias'"),
])
def test_checkpoint_errors_are_one_line(encoder, tmp_path, case, error, pattern):
  extra = {"encoder.layer.0.attention.self.rotary.weight": np.zeros(3, np.float32)} if case == "unexpected" else None
  path = _tiny_dir(str(tmp_path / case), encoder, extra=extra,
                   drop="encoder.layer.1.output.dense.bias" if case == "missing" else None)
  if case == "no_safetensors":
    os.remove(os.path.join(path, "model.safetensors"))
  with pytest.raises(error, match=pattern) as e:
    load_encoder(path)
  assert "\n" not in str(e.value)


def test_loading_imports_no_torch(encoder, cache_dir):
  code = ("import sys; from explore_jax.hf import load_encoder; e = load_encoder(); e.encode(['hello', '']); "
          "print('torch' in sys.modules)")
  env = {**os.environ, "EXPLORE_JAX_CACHE": cache_dir, "JAX_PLATFORMS": "cpu"}
  out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, check=True)
  assert out.stdout.strip().splitlines()[-1] == "False", out.stderr[-2000:]
