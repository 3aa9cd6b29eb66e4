#!/usr/bin/env bash
# Builds the C++ tests with sanitizers and runs them:
#   asan  AddressSanitizer (with LeakSanitizer) + UndefinedBehaviorSanitizer
#   tsan  ThreadSanitizer; .ci/tsan.supp says which reports come from torch's or gloo's uninstrumented
#         code and why they are suppressed
# Each runs every C++ test binary the build defines (its targets named test_*), less those excluded
# below by name, each with its reason: a new test binary runs under both without a list to edit.
# The codec's random sweep runs reduced under ASan (CNCCL_TEST_REDUCED_SWEEPS): ctest runs it whole.
# Usage: .ci/sanitize.sh [asan|tsan|all] [build|run|both]   (after .ci/setup-deps.sh; CI builds both
# beside its other builds, .ci/builds.sh, then runs them). Exit 1 on a failed build or any report.
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
which="${1:-all}"
step="${2:-both}"
# UCX's malloc/mmap hooks fight the sanitizers' own interceptors.
export UCX_MEM_EVENTS=no UCX_MEM_MALLOC_HOOKS=no
status=0
# -O1 and line tables only: the reports keep their file:line stacks, and a cold build compiles in well
# under half the time of RelWithDebInfo's -O2 -g (test_composition.cpp under ASan+UBSan: 29 s, not 67 s).
SANITIZE_OPT="-O1 -g1 -DNDEBUG"
# Each target compiles as one unit (CMake's unity build): apart, every library unit instruments and
# compiles torch's inline code again. Cold, on 2 cores: ASan's build used 462 s of CPU apart and 355 s
# as one, TSan's 228 s and 151 s. So names in a target's anonymous namespaces must differ between its
# files: where two clash, these builds fail to compile.
UNITY="-DCMAKE_UNITY_BUILD=ON -DCMAKE_UNITY_BUILD_BATCH_SIZE=0"

# Excluded test binaries: "name: reason", one per line.
ASAN_EXCLUDED=""
# TSan looks for races between threads: these run their kernels on the calling thread alone (ASan runs them).
TSAN_EXCLUDED="test_codec: single-threaded codec kernels
test_stochastic: single-threaded codec kernels
test_codec_frames: single-threaded codec kernels
test_codec_mx: single-threaded codec kernels
test_codec_nvfp4: single-threaded codec kernels
test_rotation: single-threaded codec kernels
test_frames: single-threaded frame kernels"

run_config() {  # name sanitizers excluded
  local name=$1 sanitizers=$2 excluded=$3
  local dir="build-$name"
  if [[ $step != run ]]; then
    echo "=== $name ($sanitizers): build"
    cmake -S . -B "$dir" -DPython3_EXECUTABLE="$(command -v "$PY")" -DCNCCL_SANITIZE="$sanitizers" \
      -DCNCCL_PACKAGE_DIR="$PWD/$dir/package" -DCNCCL_WITH_CUDA=OFF -DCNCCL_BUILD_BENCH=OFF \
      -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$SANITIZE_OPT" $UNITY >"$dir.configure.log" 2>&1 \
      || { cat "$dir.configure.log"; return 1; }
  fi
  local all targets=() t
  all=$(cmake --build "$dir" --target help | grep -o '\btest_[a-z0-9_]*' | sort -u)
  [[ -n $all ]] || { echo "no test_* targets in $dir"; return 1; }
  for t in $all; do
    if grep -q "^$t:" <<<"$excluded"; then
      [[ $step == build ]] || echo "=== $name: skips $(grep "^$t:" <<<"$excluded")"
    else
      targets+=("$t")
    fi
  done
  if [[ $step != run ]]; then
    cmake --build "$dir" -j "$(nproc)" --target "${targets[@]}" || return 1
  fi
  [[ $step != build ]] || return 0
  for t in "${targets[@]}"; do
    echo "=== $name: $t"
    # One binary of that name, or the folder also holds one built before a move: which would run is chance.
    local found
    found=$(find "$dir/tests/cpp" -name "$t" -type f -perm -u+x)
    [[ $(wc -l <<<"$found") == 1 && -n $found ]] || { echo "expected one $t under $dir/tests/cpp, found: $found"; return 1; }
    "$found" --gtest_brief=1 || return 1
  done
}

if [[ $which == asan || $which == all ]]; then
  CNCCL_TEST_REDUCED_SWEEPS=1 ASAN_OPTIONS="detect_leaks=1:halt_on_error=1:abort_on_error=1" \
  UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1" run_config asan address,undefined "$ASAN_EXCLUDED" || status=1
fi
if [[ $which == tsan || $which == all ]]; then
  TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/.ci/tsan.supp" \
    run_config tsan thread "$TSAN_EXCLUDED" || status=1
fi
if [[ $step == build ]]; then
  echo "=== sanitizer builds: $([[ $status == 0 ]] && echo "done" || echo FAILED)"
else
  echo "=== sanitizers: $([[ $status == 0 ]] && echo clean || echo FAILED)"
fi
exit $status
