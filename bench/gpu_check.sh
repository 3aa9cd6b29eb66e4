#!/usr/bin/env bash
# The GPU check (issue #4), run on a machine with a GPU and its own torch, in under 8 minutes:
# builds cnccl against that torch, runs the GPU tests, then the GPU benchmarks
#   bench/codec_cuda       the codec kernels' GB/s beside a device-to-device copy (goal >= 0.85x)
#   bench/gpu_allreduce.py what compression adds to a 25 MiB allreduce, cnccl vs the fp16 hook (goal <= 0.6x)
# Where no registry is reachable, run bench/gpu_check_stage.sh beforehand and carry .gpu-deps/.
# Writes its log to $OUT/gpu_check.log when OUT is set.
set -uo pipefail
cd "$(dirname "$0")/.."
LOG="${OUT:-/tmp}/gpu_check.log"
exec > >(tee "$LOG") 2>&1
PY="${PYTHON:-python3}"
BUILD="$PWD/build-gpu"
STAGE="$PWD/.gpu-deps/root"
LIBDIR="$STAGE/usr/lib/x86_64-linux-gnu"
step() { echo; echo "=== $* ($(date +%T))"; }
status=0

extra=()
if [[ -d "$STAGE" ]] && ! pkg-config --exists ucx 2>/dev/null; then
  export CNCCL_UCX_ROOT="$STAGE/usr" UCX_MODULE_DIR="$LIBDIR/ucx"
  export LD_LIBRARY_PATH="$LIBDIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
[[ -d "$LIBDIR/cmake/GTest" ]] && extra+=("-DGTest_DIR=$LIBDIR/cmake/GTest")
arch=$("$PY" -c 'import torch; m, n = torch.cuda.get_device_capability(); print(f"{m}{n}-real")' 2>/dev/null || echo 90-real)

step "environment"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
"$PY" -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda, "NCCL", torch.cuda.nccl.version())'

step "build (CUDA arch $arch)"
gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
cmake -S . -B "$BUILD" "${gen[@]}" -DPython3_EXECUTABLE="$(command -v "$PY")" -DCNCCL_CUDA_ARCHS="$arch" \
  -DCMAKE_BUILD_TYPE=Release "${extra[@]}" | sed -n '/cnccl .* configuration/,/sanitizers/p' || exit 1
cmake --build "$BUILD" -j "$(nproc)" || exit 1
CNCCL_BUILD_DIR="$BUILD" "$PY" -m pip install -q --no-index --no-deps --no-build-isolation \
  --disable-pip-version-check --root-user-action=ignore -e python || exit 1

step "C++ tests (CUDA codec)"
if [[ -x "$BUILD/tests/cpp/test_codec_cuda" ]]; then
  "$BUILD/tests/cpp/test_codec_cuda" --gtest_brief=1 || status=1
else
  echo "test_codec_cuda not built (no GoogleTest found)"; status=1
fi

step "Python tests on the GPU"
(cd tests/python && timeout 300 "$PY" -m pytest -q -rs test_cuda.py test_package.py) || status=1

step "benchmark: CUDA codec vs device-to-device copy"
"$BUILD/bench/codec_cuda" 256 || status=1

step "benchmark: added time of a compressed 25 MiB allreduce"
timeout 120 "$PY" bench/gpu_allreduce.py || status=1

step "done: status $status"
exit $status
