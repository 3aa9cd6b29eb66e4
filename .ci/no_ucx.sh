#!/usr/bin/env bash
# A build without UCX (CNCCL_WITH_UCX=OFF, as where libucx is not installed): it compiles with the
# CUDA path, its C++ composition and thread tests pass (the host path's engines skip by name), and its
# Python package carries CPU tensors through gloo and refuses cpu_engine=ucx by name.
# It builds a copy of the tree (build-noucx/src, its build in build/ as the main one's): ccache's keys are
# relative to the source folder, and only the units that read CNCCL_WITH_UCX differ from the main build's
# (backend/CMakeLists.txt), so after .ci/setup the rest come from the cache.
# Usage: .ci/no_ucx.sh [build|run|both]   (after .ci/setup, whose cache entries it reuses; CI builds it
# beside the sanitizers' builds, .ci/builds.sh, and runs it after).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
step="${1:-both}"
src="$PWD/build-noucx/src"
dir="$src/build"
if [[ $step != run ]]; then
  # The main build's flags (.ci/setup), for its ccache entries.
  cxx_flags="-O2 -g -DNDEBUG"
  [[ ${CNCCL_DEBUG_INFO:-ON} == OFF ]] && cxx_flags="-O2 -DNDEBUG"
  rm -rf "$src" && mkdir -p "$src"
  git ls-files -z --cached --others --exclude-standard | tar --null --ignore-failed-read -T - -cf - | tar -xf - -C "$src"
  cmake -S "$src" -B "$dir" -DPython3_EXECUTABLE="$(command -v "$PY")" -DCNCCL_WITH_UCX=OFF -DCNCCL_BUILD_TESTS=ON \
    -DCNCCL_BUILD_BENCH=OFF -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$cxx_flags" >"$dir.configure.log" 2>&1 || { cat "$dir.configure.log"; exit 1; }
  grep "UCX        : off" "$dir.configure.log"
  cmake --build "$dir" -j "$(nproc)" --target cnccl_python test_composition test_threads
fi
[[ $step != build ]] || exit 0
"$dir/tests/cpp/test_composition" --gtest_brief=1
"$dir/tests/cpp/test_threads" --gtest_brief=1
cd tests/python
# The opposite of CI's main build: here the host path must be missing, and the test of a build without it
# must run, not skip.
out=$(env -u CNCCL_REQUIRE_HOST_PATH -u CNCCL_KNOWN_SKIPS_ONLY PYTHONPATH="$src/python" \
  "$PY" -m pytest -q -rs -p no:cacheprovider test_package.py -k "not wheel" 2>&1) || { echo "$out"; exit 1; }
echo "$out"
if grep -q "SKIPPED.*checks a build without UCX" <<<"$out"; then
  echo "no_ucx: the test of a build without UCX skipped in the build without UCX"
  exit 1
fi
