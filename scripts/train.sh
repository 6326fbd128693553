#!/usr/bin/env bash
# Sets up (scripts/setup.sh) and runs the main job: a small GPT trained on torch_xla.device().
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/python examples/train_gpt.py "$@"
