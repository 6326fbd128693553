#!/usr/bin/env bash
# Sets up (scripts/setup.sh) and runs the main job: a small GPT trained on torch_xla.device().
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# A fast host allocator (mimalloc, installed by setup.sh) cuts tracing's host time by about a third;
# TORCH_XLA_ALLOCATOR=glibc runs on the C library's malloc instead (torch_xla/_allocator.py).
LD_PRELOAD="$(.venv/bin/python torch_xla/_allocator.py)${LD_PRELOAD:+:$LD_PRELOAD}" .venv/bin/python examples/train_gpt.py "$@"
