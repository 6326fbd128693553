#!/usr/bin/env bash
# One command for a GPU machine (torch preinstalled, no network): builds torch_xla against THAT torch,
# checks the CUDA plugin, runs the GPU-relevant tests with PJRT_DEVICE=CUDA and the GPU benchmark, and
# writes OUTDIR/gpu_check.log (everything printed), OUTDIR/gpu_check.json (stages, test counts,
# plugin check, benchmark figures), OUTDIR/bench_gpu.json and OUTDIR/test_logs.tar.gz.
#
#   bash scripts/gpu_check.sh OUTDIR
#
# Fits in GPU_CHECK_BUDGET_S seconds (default 560, i.e. under 10 minutes; 1200 in a dry run): every stage runs under
# `timeout` with at most what is left of the budget, so a hang cannot eat it; stage timings printed.
# Before the trip run scripts/gpu_prepare.sh here and carry .gpu_carry (the PJRT header + wheels).
#
# Dry run on a machine without a GPU (the CPU plugin, tiny benchmark shapes, build skipped if built):
#   PJRT_DEVICE=CPU GPU_CHECK_DRY_RUN=1 bash scripts/gpu_check.sh /tmp/x
#
# Environment: PYTHON (default: python3, or .venv/bin/python in a dry run), PJRT_DEVICE (default CUDA),
# GPU_CHECK_BUDGET_S, GPU_CHECK_OPINFO_SAMPLE (OpInfo cases to run, default 120; 30 in a dry run),
# GPU_CHECK_TEST_FILES (names in tests/, space-separated), GPU_CHECK_XDIST (pytest workers, default 4, when pytest-xdist is installed), GPU_CHECK_TESTS_BUDGET_S (all test files together: 210; 480 in a dry run), GPU_CHECK_SKIP (comma list of stages to skip: build,plugin,tests,bench), GPU_CHECK_BENCH_ARGS (extra args).
set -uo pipefail
OUTDIR=${1:?usage: bash scripts/gpu_check.sh OUTDIR}
mkdir -p "$OUTDIR"
OUTDIR=$(cd "$OUTDIR" && pwd)
cd "$(dirname "$0")/.."
REPO=$(pwd)
LOG="$OUTDIR/gpu_check.log"
: > "$LOG"
exec > >(tee -a "$LOG") 2>&1
rm -f "$OUTDIR/bench_gpu.json" "$OUTDIR/gpu_check.json" "$OUTDIR/test_logs.tar.gz" "$OUTDIR/diag.log" "$OUTDIR/diag.json"
# Intermediate files live in WORK; OUTDIR gets 4 files (the device tool brings back at most 8):
# gpu_check.log, gpu_check.json, bench_gpu.json, test_logs.tar.gz (each test file's whole pytest output).
WORK=$(mktemp -d /tmp/gpu_check.XXXXXX)

DRY=${GPU_CHECK_DRY_RUN:-0}
export PJRT_DEVICE=${PJRT_DEVICE:-CUDA}
export PYTHONUNBUFFERED=1
# No network there: skip fetching the host-kernel headers (a CPU-plugin feature) at configure time.
export TXLA_HOST_KERNELS_BUILD=${TXLA_HOST_KERNELS_BUILD:-0}
if [ "$DRY" = 1 ]; then BUDGET=${GPU_CHECK_BUDGET_S:-1200}; TESTS_BUDGET=${GPU_CHECK_TESTS_BUDGET_S:-480}
else BUDGET=${GPU_CHECK_BUDGET_S:-560}; TESTS_BUDGET=${GPU_CHECK_TESTS_BUDGET_S:-210}; fi
SKIP=",${GPU_CHECK_SKIP:-},"
if [ -n "${PYTHON:-}" ]; then PY=$PYTHON
elif [ "$DRY" = 1 ] && [ -x .venv/bin/python ]; then PY=$REPO/.venv/bin/python
else PY=$(command -v python3); fi
if [ "$DRY" = 1 ]; then SAMPLE=${GPU_CHECK_OPINFO_SAMPLE:-30}; else SAMPLE=${GPU_CHECK_OPINFO_SAMPLE:-120}; fi
T0=$(date +%s)
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }

# stage NAME CAP_S CMD...: runs CMD under timeout min(CAP_S, what is left - 15 s for the summary).
stage() {
  local name=$1 cap=$2; shift 2
  local lim; lim=$(( $(left) - 15 )); [ "$lim" -gt "$cap" ] && lim=$cap
  if [ "$lim" -lt 5 ]; then
    echo "=== [$name] skipped: budget spent"; printf '%s\t%s\t%s\t%s\n' "$name" 125 0 0 >> "$WORK/stages.tsv"; return 125
  fi
  echo "=== [$name] start (limit ${lim}s, $(left)s of the budget left)"
  local s; s=$(date +%s.%N)
  timeout -k 10 "$lim" bash -c '"$@"' stage "$@"; local rc=$?
  local dt; dt=$(python3 -c "print(round($(date +%s.%N)-$s,1))" 2>/dev/null || echo 0)
  [ "$rc" = 124 ] || [ "$rc" = 137 ] && echo "=== [$name] TIMED OUT after ${lim}s"
  echo "=== [$name] rc=$rc in ${dt}s"
  printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$dt" "$lim" >> "$WORK/stages.tsv"
  return $rc
}
export PY OUTDIR REPO WORK
skipped() { case "$SKIP" in *",$1,"*) echo "=== [$1] skipped (GPU_CHECK_SKIP)"; return 0;; esac; return 1; }

echo "gpu_check: repo=$REPO python=$PY PJRT_DEVICE=$PJRT_DEVICE dry_run=$DRY budget=${BUDGET}s $(date -u +%FT%TZ)"

env_info() {
  command -v nvidia-smi >/dev/null && timeout 20 nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  "$PY" -c "import sys,torch;print('python',sys.version.split()[0],'torch',torch.__version__,'cuda',torch.version.cuda,'cuda available',torch.cuda.is_available())"
  "$PY" -m pip list 2>/dev/null | grep -i -E '^(torch|jax|jaxlib|jax-cuda13-pjrt|xla-cuda13-pjrt|xla-cpu-pjrt|pybind11|scikit-build-core|cmake|ninja|pytest|expecttest) '
  nproc
  # the toolchain (a static libstdc++ from LDFLAGS or the compiler's defaults changes how we link)
  c++ --version 2>/dev/null | head -1
  env | grep -E '^(CC|CXX|CFLAGS|CXXFLAGS|LDFLAGS|CMAKE_[A-Z_]*)=' || true
  return 0
}
export -f env_info
stage env 40 env_info

# Wheels carried in .gpu_carry/whl (pure Python) for modules the machine lacks.
if ls .gpu_carry/whl/*.whl >/dev/null 2>&1 && ! "$PY" -c "import expecttest" 2>/dev/null; then
  SITE=/tmp/gpu_check_site
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .gpu_carry/whl/*.whl \
    && export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi

build() {
  if [ -z "${TXLA_PJRT_INCLUDE:-}" ]; then
    local inc
    inc=$("$PY" -c "import importlib.util,os;s=importlib.util.find_spec('xla_plugins.xla_cpu_pjrt');print(os.path.join(os.path.dirname(s.origin),'include') if s else '')" 2>/dev/null)
    if [ -z "$inc" ] || [ ! -f "$inc/pjrt_c_api.h" ]; then
      if [ -f .gpu_carry/pjrt/pjrt_c_api.h ]; then export TXLA_PJRT_INCLUDE=$REPO/.gpu_carry/pjrt
      else echo "build: no pjrt_c_api.h: run scripts/gpu_prepare.sh where the network is and carry .gpu_carry"; return 2; fi
    fi
  fi
  echo "build: TXLA_PJRT_INCLUDE=${TXLA_PJRT_INCLUDE:-<from xla-cpu-pjrt>}"
  local pyinc
  pyinc=$("$PY" -c "import sysconfig;print(sysconfig.get_paths()['include'])")
  if [ ! -f "$pyinc/Python.h" ]; then  # no python3-dev in the image: the carried headers of that minor version
    local ver; ver=$("$PY" -c "import sys;print('%d.%d'%sys.version_info[:2])")
    if [ -f ".gpu_carry/python$ver-include/Python.h" ]; then
      export SKBUILD_CMAKE_DEFINE="Python_INCLUDE_DIR=$REPO/.gpu_carry/python$ver-include"
      echo "build: $pyinc has no Python.h; using .gpu_carry/python$ver-include"
    else
      echo "build: $pyinc has no Python.h and .gpu_carry/python$ver-include is missing (scripts/gpu_prepare.sh)"; return 2
    fi
  fi
  export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}
  "$PY" -m pip install -v --no-build-isolation --no-deps --no-index -e . > "$WORK/build.log" 2>&1
  local rc=$?
  grep -E -- '-- (C\+\+ compiler|pjrt_c_api|host kernels)|Performing Test TXLA|Successfully installed' "$WORK/build.log"
  [ "$rc" = 0 ] || tail -n 60 "$WORK/build.log"
  # libstdc++ linked into our libraries (statically)? Then --exclude-libs must keep it private.
  local core
  core=$("$PY" -c "import importlib.util,os;s=importlib.util.find_spec('torch_xla');print(os.path.join(s.submodule_search_locations[0],'libtxla_core.so'))" 2>/dev/null)
  for f in "$core" "$(dirname "$core")"/_C*.so; do
    [ -f "$f" ] || continue
    echo "build: $(basename "$f"): libstdc++ locale code inside: $(nm -C --defined-only "$f" 2>/dev/null | grep -c 'std::locale::classic'), exported: $(nm -C -D --defined-only "$f" 2>/dev/null | grep -c 'std::locale::classic')"
  done
  return "$rc"
}
export -f build
if ! skipped build; then
  if [ "$DRY" = 1 ] && "$PY" -c "import torch_xla._C" 2>/dev/null; then
    echo "=== [build] skipped: dry run and torch_xla is already built for $PY"
  else
    stage build 240 build || { echo "gpu_check: build failed"; "$PY" scripts/gpu_check_util.py summary "$OUTDIR" "$WORK"; exit 1; }
  fi
fi

if ! skipped plugin; then
  stage plugin 90 "$PY" scripts/gpu_check_util.py plugin-check "$WORK/plugin_check.json"; prc=$?
  # Died of a signal (a crash, not a failed check): find where at once, in this same run (staged
  # programs, then cuda-gdb's backtrace of every thread), before the tests crash the same way.
  if [ "$prc" -gt 128 ] && [ "$prc" != 137 ]; then
    stage diag 120 "$PY" scripts/gpu_diag.py "$WORK/diag" --timeout 30 --gdb-timeout 75
    cp "$WORK/diag/diag.log" "$WORK/diag/diag.json" "$OUTDIR/" 2>/dev/null
  fi
fi

# pytest-xdist (in the GPU image) runs GPU_CHECK_XDIST workers (default 4) on the one GPU: the client
# does not preallocate GPU memory, so the processes share it, and XLA's compiles use the many cores.
XDIST_ARGS=""
if [ "${GPU_CHECK_XDIST:-4}" -gt 1 ] && "$PY" -c "import xdist" 2>/dev/null; then XDIST_ARGS="-n ${GPU_CHECK_XDIST:-4}"; fi
export XDIST_ARGS
run_tests() {  # run_tests NAME ARGS...: one pytest run, its log in WORK/tests_NAME.log
  local name=$1; shift
  # shellcheck disable=SC2086
  "$PY" -m pytest -q -p no:cacheprovider -rfE $XDIST_ARGS "$@" 2>&1 | tee "$WORK/tests_$name.log" | tail -n 40
  return "${PIPESTATUS[0]}"
}
export -f run_tests
# The test files share TESTS_BUDGET seconds; each gets at most its cap of what is left of it.
TEST_END=$(( $(date +%s) + TESTS_BUDGET ))
tcap() { local l=$(( TEST_END - $(date +%s) )); [ "$l" -gt "$1" ] && l=$1; [ "$l" -lt 1 ] && l=1; echo "$l"; }
if ! skipped tests; then
  for f in ${GPU_CHECK_TEST_FILES:-test_cuda test_models test_training test_dynamo test_donation test_compile_control test_cache test_views_inplace}; do
    stage "tests:$f" "$(tcap 90)" run_tests "$f" "tests/$f.py"
  done
  OPIDS=()
  if [ "$(tcap 60)" -gt 20 ]; then  # collecting the OpInfo cases takes a while: only with time left for them
    mapfile -t OPIDS < <(timeout "$(tcap 60)" "$PY" scripts/gpu_check_util.py opinfo-sample "$SAMPLE")
  fi
  if [ "${#OPIDS[@]}" -gt 0 ]; then
    stage "tests:opinfo_sample" "$(tcap 90)" run_tests opinfo_sample "${OPIDS[@]}"
  else
    echo "=== [tests:opinfo_sample] not run: no time left in the tests budget, or the OpInfo cases could not be collected"
  fi
fi

if ! skipped bench; then
  BENCH_ARGS=(--out "$OUTDIR/bench_gpu.json")
  [ "$DRY" = 1 ] && BENCH_ARGS+=(--tiny)
  blim=$(( $(left) - 25 ))
  # shellcheck disable=SC2206
  stage bench $(( blim + 10 )) "$PY" bench/bench_gpu.py "${BENCH_ARGS[@]}" --budget-s "$blim" ${GPU_CHECK_BENCH_ARGS:-}
fi

echo "=== summary ($(( $(date +%s) - T0 ))s of ${BUDGET}s)"
"$PY" scripts/gpu_check_util.py summary "$OUTDIR" "$WORK"
ls "$WORK"/tests_*.log >/dev/null 2>&1 && tar -C "$WORK" -czf "$OUTDIR/test_logs.tar.gz" $(cd "$WORK" && ls tests_*.log)
echo "gpu_check: wrote $(cd "$OUTDIR" && ls gpu_check.log gpu_check.json bench_gpu.json test_logs.tar.gz 2>/dev/null | tr '\n' ' ')in $OUTDIR"
