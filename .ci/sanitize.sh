#!/usr/bin/env bash
# Builds the C++ tests with sanitizers and runs them:
#   asan  AddressSanitizer (with LeakSanitizer) + UndefinedBehaviorSanitizer: every C++ test
#         (codec, policy, threads, composition, the host algorithms; the example runs as two
#         processes under plain ctest)
#   tsan  ThreadSanitizer: the threads test (every CPU engine: the host path's executor, the composed
#         path's issuer over gloo) and the composed path's tests; .ci/tsan.supp says which reports
#         come from torch's or gloo's uninstrumented code and why they are suppressed
# The codec's random sweep runs reduced under ASan (CNCCL_TEST_REDUCED_SWEEPS): ctest runs it whole.
# Usage: .ci/sanitize.sh [asan|tsan|all]   (after .ci/setup; CI runs both). Exit 1 on any report.
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
which="${1:-all}"
# UCX's malloc/mmap hooks fight the sanitizers' own interceptors.
export UCX_MEM_EVENTS=no UCX_MEM_MALLOC_HOOKS=no
status=0

run_config() {  # name sanitizers targets...
  local name=$1 sanitizers=$2; shift 2
  local dir="build-$name"
  echo "=== $name ($sanitizers): build"
  cmake -S . -B "$dir" -DPython3_EXECUTABLE="$(command -v "$PY")" -DCNCCL_SANITIZE="$sanitizers" -DCNCCL_PACKAGE_DIR="$PWD/$dir/package" \
    -DCNCCL_WITH_CUDA=OFF -DCNCCL_BUILD_BENCH=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$dir.configure.log" 2>&1 \
    || { cat "$dir.configure.log"; return 1; }
  cmake --build "$dir" -j "$(nproc)" --target "$@" || return 1
  for t in "$@"; do
    echo "=== $name: $t"
    "$(find "$dir/tests/cpp" -name "$t" -type f -perm -u+x | head -1)" --gtest_brief=1 || return 1
  done
}

if [[ $which == asan || $which == all ]]; then
  CNCCL_TEST_REDUCED_SWEEPS=1 ASAN_OPTIONS="detect_leaks=1:halt_on_error=1:abort_on_error=1" \
  UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1" \
    run_config asan address,undefined test_codec test_stochastic test_codec_frames test_codec_mx test_frames test_policy \
      test_threads test_composition \
      test_host_ring test_host_direct test_host_rooted test_host_alltoall test_host_comm test_host_shm || status=1
fi
if [[ $which == tsan || $which == all ]]; then
  TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/.ci/tsan.supp" \
    run_config tsan thread test_threads test_composition || status=1
fi
echo "=== sanitizers: $([[ $status == 0 ]] && echo clean || echo FAILED)"
exit $status
