#!/usr/bin/env bash
# Sets up (scripts/setup.sh) and runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/python -m pytest -q -p no:cacheprovider tests "$@"
