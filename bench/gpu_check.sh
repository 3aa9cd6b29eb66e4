#!/usr/bin/env bash
# The GPU check, run on a machine with a GPU and its own torch (no package registry needed), in under
# 5 minutes: checks its prerequisites first and stops naming what is missing, builds cnccl against
# that torch, runs the GPU tests, then the GPU benchmarks
#   bench/codec_cuda       the codec kernels' GB/s beside a device-to-device copy (goal >= 0.85x)
#   bench/gpu_allreduce.py what compression adds to a 25 MiB allreduce, cnccl vs the fp16 hook, both
#                          waited on (goal <= 0.6x)
# Run bench/gpu_check_stage.sh beforehand where there is a registry, and carry .gpu-deps/ (UCX,
# GoogleTest and pytest's wheels). Writes gpu_check.log and gpu_check.json (each step's status and the
# benchmarks' numbers) to $OUT, or /tmp.
set -uo pipefail
cd "$(dirname "$0")/.."
DIR="${OUT:-/tmp}"
LOG="$DIR/gpu_check.log"
JSON="$DIR/gpu_check.json"
exec > >(tee "$LOG") 2>&1
PY="${PYTHON:-python3}"
BUILD="$PWD/build-gpu"
STAGE="$PWD/.gpu-deps/root"
WHEELS="$PWD/.gpu-deps/wheels"
LIBDIR="$STAGE/usr/lib/x86_64-linux-gnu"
START=$SECONDS
declare -A RESULT
step() { echo; echo "=== $* ($(date +%T), ${SECONDS}s)"; }
missing() { echo "gpu_check: missing prerequisite: $*"; RESULT[prerequisites]="missing: $*"; summary; exit 2; }
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
run() {  # run NAME TIMEOUT CMD...: records ok/failed/timed out
  local name=$1 limit=$2; shift 2
  timeout "$limit" "$@"; local rc=$?
  if [[ $rc == 0 ]]; then RESULT[$name]=ok; elif [[ $rc == 124 ]]; then RESULT[$name]="timed out after ${limit}s"; status=1
  else RESULT[$name]="failed (exit $rc)"; status=1; fi
}
status=0

step "prerequisites"
command -v nvcc >/dev/null || missing "nvcc on PATH (the CUDA toolkit; e.g. PATH=/usr/local/cuda/bin:\$PATH)"
"$PY" -c 'import torch' 2>/dev/null || missing "torch for $PY"
torch_cuda=$("$PY" -c 'import torch; print(torch.version.cuda or "")')
[[ -n "$torch_cuda" ]] || missing "a CUDA build of torch (torch.version.cuda is None)"
"$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' || missing "a visible CUDA GPU"
nvcc_cuda=$(nvcc --version | sed -n 's/.*release \([0-9]*\.[0-9]*\).*/\1/p')
[[ "${nvcc_cuda%%.*}" == "${torch_cuda%%.*}" ]] ||
  missing "an nvcc of torch's CUDA major version (nvcc $nvcc_cuda, torch built with CUDA $torch_cuda)"
pyinc=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
[[ -f "$pyinc/Python.h" ]] || missing "Python headers ($pyinc/Python.h)"
if ! "$PY" -c 'import pytest' 2>/dev/null; then
  [[ -d "$WHEELS" ]] || missing "pytest (stage it with bench/gpu_check_stage.sh and carry .gpu-deps)"
  "$PY" -m pip install -q --no-index --find-links "$WHEELS" --disable-pip-version-check --root-user-action=ignore \
    pytest || missing "pytest from $WHEELS"
fi
extra=()
if ! pkg-config --exists ucx 2>/dev/null; then
  [[ -d "$STAGE" ]] || missing "UCX (libucx-dev; stage it with bench/gpu_check_stage.sh and carry .gpu-deps)"
  export CNCCL_UCX_ROOT="$STAGE/usr" UCX_MODULE_DIR="$LIBDIR/ucx"
  export LD_LIBRARY_PATH="$LIBDIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
[[ -d "$LIBDIR/cmake/GTest" ]] && extra+=("-DGTest_DIR=$LIBDIR/cmake/GTest")
arch=$("$PY" -c 'import torch; m, n = torch.cuda.get_device_capability(); print(f"{m}{n}-real")')
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
"$PY" -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda, "NCCL", torch.cuda.nccl.version())'
echo "nvcc $nvcc_cuda, arch $arch"
RESULT[prerequisites]=ok

step "build (CUDA arch $arch)"
gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
cmake -S . -B "$BUILD" "${gen[@]}" -DPython3_EXECUTABLE="$(command -v "$PY")" -DCNCCL_CUDA_ARCHS="$arch" \
  -DCMAKE_BUILD_TYPE=Release "${extra[@]}" > "$DIR/gpu_check_cmake.log" 2>&1 || { cat "$DIR/gpu_check_cmake.log"; missing "a CMake configuration that succeeds (log above)"; }
sed -n '/cnccl .* configuration/,/sanitizers/p' "$DIR/gpu_check_cmake.log"
grep -q "CUDA *: on" "$DIR/gpu_check_cmake.log" || missing "the CUDA path switched ON in the build (see the configuration above)"
run build 180 cmake --build "$BUILD" -j "$(nproc)"
[[ ${RESULT[build]} == ok ]] || { summary; exit 1; }
CNCCL_BUILD_DIR="$BUILD" "$PY" -m pip install -q --no-index --no-deps --no-build-isolation \
  --disable-pip-version-check --root-user-action=ignore -e python || { RESULT[install]=failed; summary; exit 1; }

step "C++ tests (CUDA codec, composition)"
run cpp_codec_cuda 60 "$BUILD/tests/cpp/test_codec_cuda" --gtest_brief=1
run cpp_composition 60 "$BUILD/tests/cpp/test_composition" --gtest_brief=1

step "Python tests on the GPU"
pushd tests/python >/dev/null
run python_cuda 150 "$PY" -m pytest -q -rs -p no:cacheprovider test_cuda.py test_package.py
popd >/dev/null

step "benchmark: CUDA codec vs device-to-device copy"
run codec_cuda 60 bash -o pipefail -c "'$BUILD/bench/codec_cuda' 256 | tee '$DIR/codec_cuda.txt'"

step "benchmark: added time of a compressed 25 MiB allreduce"
CNCCL_GPU_JSON="$DIR/gpu_allreduce.json" run gpu_allreduce 60 "$PY" bench/gpu_allreduce.py

step "done: status $status"
summary
exit $status
