#!/usr/bin/env bash
# Runs a command with explore_jax on an accelerator host's own Python (its JAX and accelerator plugin), where no
# package registry is reachable: the wheels in .whl/ (requirements-device.txt, from `make device-wheels` on a
# machine that reaches one) are installed into a folder of their own, which goes on PYTHONPATH with the
# repository. For example, the accelerator figures, resumable where a machine's time limit stopped them:
#
#   bash launch/device_env.sh python3 benchmarks/bench_gpu.py --output="$OUT/accelerator.json" --resume
set -euo pipefail
cd "$(dirname "$0")/.."
site="${EXPLORE_JAX_DEVICE_SITE:-/tmp/explore_jax_site}"
shopt -s nullglob
wheels=(.whl/*.whl)
if [ ${#wheels[@]} -gt 0 ]; then
  python3 -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
    "${wheels[@]}"
fi
export PYTHONPATH="$PWD:$site${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
exec "$@"
