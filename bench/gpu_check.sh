#!/usr/bin/env bash
# The GPU check, run on a machine with a GPU and its own torch (2.11 or later), any Python 3.9-3.12,
# no package registry, possibly not Debian, in under 5 minutes:
#   1. prerequisites, each checked and named when missing (a visible GPU last, after the rest);
#   2. the library and the Python extension built against that torch (no GoogleTest, no benchmarks);
#   3. the Python GPU tests (tests/python/test_cuda.py, test_package.py): the check's verdict;
#   4. optional steps, reported but not fatal: the C++ GPU tests (CUDA codec, composition) and the
#      benchmarks bench/codec_cuda (the codec's GB/s beside a device-to-device copy, goal >= 0.85x)
#      and bench/gpu_allreduce.py (what compression adds to a 25 MiB allreduce, cnccl vs the fp16
#      hook, goal <= 0.6x).
# Run bench/gpu_check_stage.sh beforehand where there is a registry, and carry .gpu-deps/ (pytest
# for each Python, cmake and ninja wheels, UCX and GoogleTest). Writes gpu_check.log and
# gpu_check.json (each step's status, the benchmarks' numbers) to $OUT, or /tmp.
set -uo pipefail
cd "$(dirname "$0")/.."
DIR="${OUT:-/tmp}"
LOG="$DIR/gpu_check.log"
JSON="$DIR/gpu_check.json"
exec > >(tee "$LOG") 2>&1
PY="${PYTHON:-python3}"
BUILD="$PWD/build-gpu"
DEPS="$PWD/.gpu-deps"
STAGE="$DEPS/root"
LIBDIR="$STAGE/usr/lib/x86_64-linux-gnu"
TOOLS="$DIR/gpu_check_tools"  # cmake and ninja from the staged wheels, when the machine lacks them
START=$SECONDS
declare -A RESULT
status=0
missing_list=()
step() { echo; echo "=== $* ($(date +%T), ${SECONDS}s)"; }
need() { echo "gpu_check: missing prerequisite: $*"; missing_list+=("$*"); }
summary() {
  "$PY" - "$JSON" "$((SECONDS - START))" "${!RESULT[@]}" -- "${RESULT[@]}" <<'PYEOF'
import json, os, sys
path, seconds, rest = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
cut = rest.index("--")
out = {"seconds": seconds, "steps": dict(zip(rest[:cut], rest[cut + 1:]))}
for name in ("gpu_allreduce.json", "codec_cuda.txt"):
    p = os.path.join(os.path.dirname(path), name)
    if os.path.exists(p):
        out[name] = json.load(open(p)) if name.endswith(".json") else open(p).read().splitlines()
json.dump(out, open(path, "w"), indent=1)
print("summary:", path)
PYEOF
}
stop_if_missing() {
  ((${#missing_list[@]})) || return 0
  RESULT[prerequisites]="missing: $(IFS=';'; echo "${missing_list[*]}")"
  summary
  exit 2
}
run() {  # run NAME TIMEOUT CMD...: records ok / failed / timed out; a failure sets status
  local name=$1 limit=$2; shift 2
  timeout "$limit" "$@"; local rc=$?
  if [[ $rc == 0 ]]; then RESULT[$name]=ok; elif [[ $rc == 124 ]]; then RESULT[$name]="timed out after ${limit}s"; status=1
  else RESULT[$name]="failed (exit $rc)"; status=1; fi
}
optional() {  # optional NAME TIMEOUT CMD...: recorded the same way, never fails the check
  local before=$status
  run "$@"
  status=$before
}
staged_pip() {  # staged_pip FOLDER PACKAGE...: installs from staged wheels only
  "$PY" -m pip install -q --no-index --find-links "$1" --disable-pip-version-check --root-user-action=ignore "${@:2}"
}

step "prerequisites"
pyver=$("$PY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")' 2>/dev/null) ||
  { need "a Python interpreter ($PY)"; stop_if_missing; }
echo "python $pyver ($(command -v "$PY"))"
case "$pyver" in 3.9|3.10|3.11|3.12) ;; *) need "Python 3.9-3.12 (found $pyver)" ;; esac
# One import of torch (seconds each): its CUDA version and whether it sees a GPU.
torch_facts=$("$PY" -c 'import torch; print(torch.version.cuda or "none", int(torch.cuda.is_available()))' 2>/dev/null) ||
  { need "torch for $PY"; torch_facts="none 0"; }
read -r torch_cuda gpu_visible <<<"$torch_facts"
[[ "$torch_cuda" != none ]] || need "a CUDA build of torch (torch.version.cuda is None)"
"$PY" -c 'import setuptools' 2>/dev/null || need "setuptools for $PY (the Python package installs through it)"
pyinc=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
[[ -f "$pyinc/Python.h" ]] || need "Python headers ($pyinc/Python.h)"
cxx="${CXX:-$(command -v c++ || command -v g++ || true)}"
[[ -n "$cxx" ]] && "$cxx" --version >/dev/null 2>&1 || need "a host C++ compiler (c++ or g++; or set CXX)"
command -v nvcc >/dev/null || need "nvcc on PATH (the CUDA toolkit; e.g. PATH=/usr/local/cuda/bin:\$PATH)"
if command -v nvcc >/dev/null && [[ "$torch_cuda" != none ]]; then
  nvcc_cuda=$(nvcc --version | sed -n 's/.*release \([0-9]*\.[0-9]*\).*/\1/p')
  [[ "${nvcc_cuda%%.*}" == "${torch_cuda%%.*}" ]] ||
    need "an nvcc of torch's CUDA major version (nvcc $nvcc_cuda, torch built with CUDA $torch_cuda)"
fi
if ! "$PY" -c 'import pytest' 2>/dev/null; then
  if [[ -d "$DEPS/wheels/py$pyver" ]]; then
    staged_pip "$DEPS/wheels/py$pyver" pytest || need "pytest from $DEPS/wheels/py$pyver"
  else
    need "pytest (stage it for Python $pyver with bench/gpu_check_stage.sh and carry .gpu-deps)"
  fi
fi
cmake_ok() {
  local v
  v=$(cmake --version 2>/dev/null | sed -n 's/^cmake version \([0-9]*\)\.\([0-9]*\).*/\1 \2/p')
  [[ -n "$v" ]] && { read -r major minor <<<"$v"; ((major > 3 || (major == 3 && minor >= 18))); }
}
if ! cmake_ok || ! command -v ninja >/dev/null; then
  if [[ -d "$DEPS/wheels/tools" ]]; then
    "$PY" -m pip install -q --no-index --find-links "$DEPS/wheels/tools" --target "$TOOLS" --disable-pip-version-check \
      --root-user-action=ignore cmake ninja && export PATH="$TOOLS/bin:$PATH" PYTHONPATH="$TOOLS${PYTHONPATH:+:$PYTHONPATH}"
  fi
  cmake_ok || need "CMake >= 3.18 (or its wheel: stage it with bench/gpu_check_stage.sh and carry .gpu-deps)"
fi
extra=()
if ! pkg-config --exists ucx 2>/dev/null; then
  if [[ -d "$STAGE" ]]; then
    export CNCCL_UCX_ROOT="$STAGE/usr" UCX_MODULE_DIR="$LIBDIR/ucx"
    export LD_LIBRARY_PATH="$LIBDIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  else
    need "UCX (libucx-dev; stage it with bench/gpu_check_stage.sh and carry .gpu-deps)"
  fi
fi
[[ -d "$LIBDIR/cmake/GTest" ]] && extra+=("-DGTest_DIR=$LIBDIR/cmake/GTest")
gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
# Last, once the rest is known: without a GPU nothing below can run.
if ((${#missing_list[@]} == 0)); then
  [[ "$gpu_visible" == 1 ]] || need "a visible CUDA GPU"
fi
stop_if_missing
arch=$("$PY" -c 'import torch; m, n = torch.cuda.get_device_capability(); print(f"{m}{n}-real")')
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
"$PY" -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda, "NCCL", torch.cuda.nccl.version())'
echo "nvcc $nvcc_cuda, arch $arch, $(cmake --version | head -1), compiler $cxx"
RESULT[prerequisites]=ok

step "build: library and Python extension (CUDA arch $arch)"
configure() {  # configure LOG [-D...]
  local log=$1; shift
  cmake -S . -B "$BUILD" "${gen[@]}" -DPython3_EXECUTABLE="$(command -v "$PY")" -DCNCCL_CUDA_ARCHS="$arch" \
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER="$cxx" "${extra[@]}" "$@" > "$log" 2>&1
}
if ! configure "$DIR/gpu_check_cmake.log" -DCNCCL_BUILD_TESTS=OFF -DCNCCL_BUILD_BENCH=OFF; then
  cat "$DIR/gpu_check_cmake.log"; RESULT[build]="configure failed"; summary; exit 1
fi
sed -n '/cnccl .* configuration/,/sanitizers/p' "$DIR/gpu_check_cmake.log"
grep -q "CUDA *: on" "$DIR/gpu_check_cmake.log" || { RESULT[build]="the CUDA path is off (configuration above)"; summary; exit 1; }
run build 180 cmake --build "$BUILD" -j "$(nproc)"
[[ ${RESULT[build]} == ok ]] || { summary; exit 1; }
CNCCL_BUILD_DIR="$BUILD" "$PY" -m pip install -q --no-index --no-deps --no-build-isolation \
  --disable-pip-version-check --root-user-action=ignore -e . || { RESULT[install]=failed; summary; exit 1; }

step "Python tests on the GPU"
pushd tests/python >/dev/null
run python_cuda 150 "$PY" -m pytest -q -rs -p no:cacheprovider test_cuda.py test_package.py
popd >/dev/null

step "optional: C++ GPU tests and benchmarks (reported, not fatal)"
if configure "$DIR/gpu_check_cmake_tests.log" -DCNCCL_BUILD_TESTS=ON -DCNCCL_BUILD_BENCH=ON; then
  optional cpp_build 150 cmake --build "$BUILD" -j "$(nproc)" --target test_codec_cuda test_composition codec_cuda
  optional cpp_codec_cuda 60 "$BUILD/tests/cpp/test_codec_cuda" --gtest_brief=1
  optional cpp_composition 60 "$BUILD/tests/cpp/test_composition" --gtest_brief=1
  optional codec_cuda 60 bash -o pipefail -c "'$BUILD/bench/codec_cuda' 256 | tee '$DIR/codec_cuda.txt'"
else
  RESULT[cpp_build]="configure failed (GoogleTest?): $(tail -3 "$DIR/gpu_check_cmake_tests.log" | tr '\n' ' ')"
fi
CNCCL_GPU_JSON="$DIR/gpu_allreduce.json" optional gpu_allreduce 60 "$PY" bench/gpu_allreduce.py

step "done: status $status"
summary
exit $status
