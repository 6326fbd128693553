#!/usr/bin/env bash
# Compiles every bridge TU (csrc/bridge/*.cc, the only code that includes torch headers) with
# -fsyntax-only against ANOTHER torch's headers, with the build's flags, one TU at a time.
# Used to check that the bridge builds against torch 2.11 (the GPU machine's) without installing it:
#   python -m pip download --no-deps torch==2.11.0 -d /tmp/t && (cd /tmp/t && unzip -q torch-*.whl 'torch/include/*')
#   bash scripts/check_torch_headers.sh /tmp/t/torch/include
#   (further arguments: only those TUs)
# Exit status: the number of TUs that failed (0: all compile).
set -uo pipefail
INC=${1:?usage: check_torch_headers.sh TORCH_INCLUDE_DIR (the torch/include folder of a torch wheel)}
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
CXX=${CXX:-c++}
PYINC=$("$PY" -c "import sysconfig;print(sysconfig.get_paths()['include'])")
ver=$(grep -h -E '#define TORCH_VERSION_(MAJOR|MINOR|PATCH)' "$INC"/torch/headeronly/version.h "$INC"/torch/csrc/api/include/torch/version.h 2>/dev/null | awk '{print $3}' | paste -sd.)
echo "torch headers: $INC (TORCH_VERSION $ver)"
fail=0
TUS=("${@:2}"); [ ${#TUS[@]} -gt 0 ] || TUS=(csrc/bridge/*.cc)
for tu in "${TUS[@]}"; do
  s=$(date +%s)
  if "$CXX" -fsyntax-only -std=gnu++17 -fPIC -Wno-unused-parameter -Wno-deprecated-declarations \
      -DTORCH_API_INCLUDE_EXTENSION_H -DTORCH_EXTENSION_NAME=_C -D_C_EXPORTS -D_GLIBCXX_USE_CXX11_ABI=1 \
      -I"$INC" -I"$INC/torch/csrc/api/include" -Icsrc -isystem "$PYINC" "$tu" 2> /tmp/check_torch_headers.err; then
    echo "ok    $tu ($(( $(date +%s) - s ))s)"
  else
    echo "FAIL  $tu"; grep -E "error" /tmp/check_torch_headers.err | head -20; fail=$((fail + 1))
  fi
done
echo "$fail TU(s) failed against torch $ver"
exit $fail
