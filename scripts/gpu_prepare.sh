#!/usr/bin/env bash
# Fills .gpu_carry/ (git-ignored) with what scripts/gpu_check.sh needs on a GPU machine that has no
# network and no xla-cpu-pjrt wheel:
#   .gpu_carry/pjrt/pjrt_c_api.h  the PJRT C API header, copied from the xla-cpu-pjrt wheel installed in
#                                 .venv (the same header CMake builds against here; never committed)
#   .gpu_carry/python3.12-include Python 3.12's C headers (used only if the GPU image has none)
#   .gpu_carry/whl/*.whl          pure-Python wheels the tests need that the GPU image lacks (expecttest,
#                                 imported by torch.testing._internal, which the OpInfo tests use)
# Then carry it: device run with carry=[".gpu_carry"] and command "bash scripts/gpu_check.sh $OUT".
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || { echo "gpu_prepare: $PY not found: run scripts/setup.sh first (or set PYTHON)" >&2; exit 1; }
grep -qx '.gpu_carry/' .gitignore || { echo "gpu_prepare: .gpu_carry/ must be git-ignored" >&2; exit 1; }
mkdir -p .gpu_carry/pjrt .gpu_carry/whl
hdr=$("$PY" -c "import importlib.util,os;s=importlib.util.find_spec('xla_plugins.xla_cpu_pjrt');print(os.path.join(os.path.dirname(s.origin),'include','pjrt_c_api.h') if s else '')")
if [ -n "${TXLA_PJRT_INCLUDE:-}" ]; then hdr="$TXLA_PJRT_INCLUDE/pjrt_c_api.h"; fi
[ -f "$hdr" ] || { echo "gpu_prepare: pjrt_c_api.h not found (pip install xla-cpu-pjrt into $PY's environment)" >&2; exit 1; }
cp "$hdr" .gpu_carry/pjrt/pjrt_c_api.h
echo "gpu_prepare: header $hdr -> .gpu_carry/pjrt/"
# Python 3.12's C headers, for a GPU image whose python3.12 lacks its -dev files (used there only if
# its own Python.h is missing): taken from a Python 3.12 here (PY312, else python3.12 on PATH or under pyenv).
if [ -z "${PY312:-}" ]; then
  for c in python3.12 "$HOME"/.pyenv/versions/3.12*/bin/python3.12; do
    if "$c" -c "" 2>/dev/null; then PY312=$c; break; fi
  done
fi
if [ -n "${PY312:-}" ]; then
  inc312=$("$PY312" -c "import sysconfig;print(sysconfig.get_paths()['include'])" 2>/dev/null || true)
  if [ -f "$inc312/Python.h" ]; then
    rm -rf .gpu_carry/python3.12-include && cp -r "$inc312" .gpu_carry/python3.12-include
    echo "gpu_prepare: Python 3.12 headers $inc312 -> .gpu_carry/python3.12-include/"
  fi
fi
if ! ls .gpu_carry/whl/expecttest-*.whl >/dev/null 2>&1; then
  "$PY" -m pip download -q --no-deps --only-binary=:all: -d .gpu_carry/whl "expecttest==0.3.0"
fi
ls -la .gpu_carry/pjrt .gpu_carry/whl
du -sh .gpu_carry
