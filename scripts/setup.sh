#!/usr/bin/env bash
# Sets up .venv in the repo root (reused when present) and builds torch_xla into it (editable).
# Rebuilds are incremental: CMake's build folder lives in build/ and is reused.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
VPY=.venv/bin/python
"$VPY" -m pip install -q --upgrade pip >/dev/null
# torch 2.13.0 (CPU) installs from a file on disk; the rest from PyPI.
"$VPY" -m pip install -q "torch==2.13.0" numpy pytest expecttest tqdm "pybind11>=2.12" "scikit-build-core>=0.10" \
  ninja cmake xla-cpu-pjrt "jax==0.10.2" "jaxlib==0.10.2" "lightning==2.6.6" cmeel-mimalloc
# cmeel-mimalloc: the fast host allocator spawned workers and scripts/train.sh preload (torch_xla/_allocator.py).
start=$(date +%s)
"$VPY" -m pip install -q --no-build-isolation --no-deps -e . 
echo "torch_xla built in $(( $(date +%s) - start ))s"
