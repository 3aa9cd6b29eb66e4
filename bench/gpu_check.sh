#!/usr/bin/env bash
# The GPU check, for a machine with a GPU and its own torch (2.11 or later, a CUDA build), any Python
# torch's wheels support (3.9-3.14), no package registry, possibly not Debian. It ends within
# CNCCL_GPU_CHECK_SECONDS (default 470, inside the 8 minutes it promises) and always leaves its JSON:
#   1. prerequisites, every missing one named at once (a visible GPU last, after the rest): Python,
#      torch's CUDA build, setuptools and headers, a host compiler nvcc accepts (a probe compile),
#      nvcc of torch's CUDA major, CMake >= 3.18, pytest, GoogleTest (the system's or staged);
#   2. the library, the Python extension, the C++ GPU tests and bench/codec_cuda, built against that
#      torch; with the machine's own UCX only (pkg-config), else without it (CNCCL_WITH_UCX=OFF: CPU
#      tensors on gloo), so that the verdict is the CUDA path's and not a foreign UCX's;
#   3. the verdict, every step of "verdict" in the JSON (a step skipped for time fails it): the C++ GPU
#      tests (the CUDA codec against the CPU's, the frame kernels' multi-row sums, the composition) and
#      the Python GPU tests, at world size 1 over NCCL (tests/python/test_cuda.py) and at 2, 3 and 4
#      ranks on the one GPU over gloo (test_cuda_ranks.py);
#   4. benchmarks, reported after the verdict, each only if the deadline leaves it room:
#      bench/gpu_allreduce.py (what compression adds to a 25 MiB allreduce, cnccl vs the fp16 hook,
#      goal <= 0.75x; peak memory per wire beside the hook's) and bench/codec_cuda (the codec's GB/s
#      beside a device-to-device copy, goal >= 0.85x).
# Budgets (seconds; the build timed on 2 CPU cores scaled to the GPU machine's 16, the tests from their
# CPU share and one world-size-1 run on an H200): configure 45, build 140, install 20, C++ tests 45,
# Python 190; 10 to write the summary.
# Run bench/gpu_check_stage.sh beforehand where there is a registry, and carry .gpu-deps/ (pytest
# for each Python, cmake and ninja wheels, GoogleTest). Writes gpu_check.log and
# gpu_check.json to $OUT, or /tmp. The JSON is rewritten after every step, so it is there even if
# the check is killed with SIGKILL; on SIGTERM, SIGINT or SIGHUP the step under way is stopped,
# recorded as killed, and the JSON printed. Exit status: 0 all verdict steps passed, 1 one failed,
# 2 a prerequisite is missing, 128+n killed by signal n.
set -uo pipefail
trap '' PIPE  # tee may die first when the check is killed; the JSON still gets written
cd "$(dirname "$0")/.."
DIR="${OUT:-/tmp}"
mkdir -p "$DIR"
LOG="$DIR/gpu_check.log"
JSON="$DIR/gpu_check.json"
DEADLINE="${CNCCL_GPU_CHECK_SECONDS:-470}"
# What the verdict is: these steps, every one ok.
VERDICT=(cpp_codec_cuda cpp_frames_cuda cpp_composition python_cuda python_cuda_ranks)
exec 3>&1  # where the JSON is printed at the end, even once tee is gone
exec > >(tee "$LOG") 2>&1
PY="${PYTHON:-python3}"
BUILD="$PWD/build-gpu"
DEPS="$PWD/.gpu-deps"
STAGE="$DEPS/root"
LIBDIR="$STAGE/usr/lib/x86_64-linux-gnu"
TOOLS="$DIR/gpu_check_tools"  # cmake and ninja from the staged wheels, when the machine lacks them
START=$SECONDS
declare -A RESULT
ORDER=()
FACTS=()     # "key=value" lines: versions and what the machine is
missing_list=()
state=running
current=prerequisites
child=
status=0

left() { echo $((DEADLINE - (SECONDS - START))); }
step() { current=$1; shift; echo; echo "=== $current: $* ($(date +%T), ${SECONDS}s, $(left)s left)"; }
need() { echo "gpu_check: missing prerequisite: $*"; missing_list+=("$*"); }
fact() { FACTS+=("$1=$2"); }
json_string() {  # the argument as a JSON string
  local s=$1
  s=${s//\\/\\\\}; s=${s//\"/\\\"}; s=${s//$'\n'/\\n}; s=${s//$'\r'/\\r}; s=${s//$'\t'/\\t}
  s=$(printf '%s' "$s" | tr -d '\000-\037')
  printf '"%s"' "$s"
}
write_json() {  # the whole summary, replaced atomically
  local out sep name n=$'\n'  # printed with %s: a value's backslashes stay as json_string wrote them
  out="{$n \"state\": $(json_string "$state"),$n \"seconds\": $((SECONDS - START)),"
  out+="$n \"deadline_seconds\": $DEADLINE,$n \"status\": $status,$n \"verdict\": ["
  sep=""
  for name in "${VERDICT[@]}"; do out+="$sep$(json_string "$name")"; sep=", "; done
  out+="],$n \"facts\": {"
  sep=""
  for name in "${FACTS[@]}"; do
    out+="$sep$n  $(json_string "${name%%=*}"): $(json_string "${name#*=}")"; sep=","
  done
  out+="$n },$n \"steps\": {"
  sep=""
  for name in "${ORDER[@]}"; do
    out+="$sep$n  $(json_string "$name"): $(json_string "${RESULT[$name]}")"; sep=","
  done
  out+="$n }"
  if [[ -s "$DIR/gpu_allreduce.json" ]] && [[ ${bench_json_ok:-0} == 1 ]]; then
    out+=",$n \"gpu_allreduce\": $(cat "$DIR/gpu_allreduce.json")"
  fi
  if [[ -s "$DIR/codec_cuda.txt" ]]; then
    out+=",$n \"codec_cuda\": ["; sep=""
    while IFS= read -r name; do out+="$sep$n  $(json_string "$name")"; sep=","; done < "$DIR/codec_cuda.txt"
    out+="$n ]"
  fi
  printf '%s\n}\n' "$out" > "$JSON.tmp" && mv -f "$JSON.tmp" "$JSON"
}
record() {  # record NAME RESULT
  [[ -v RESULT[$1] ]] || ORDER+=("$1")
  RESULT[$1]=$2
  write_json
}
on_exit() {
  local rc=$?
  trap - EXIT
  [[ $state == running ]] && state="ended (exit $rc)"
  write_json
  echo "summary: $JSON"
  cat "$JSON" >&3 2>/dev/null || true
}
on_signal() {  # on_signal NAME NUMBER: stop the step under way, record it, leave
  trap '' TERM INT HUP
  status=$((128 + $2))
  state="killed by SIG$1 during $current"
  if [[ -n $child ]]; then
    kill -TERM -- "-$child" 2>/dev/null
    record "$current" "killed by SIG$1 after $((SECONDS - START))s"
  fi
  [[ $current == prerequisites ]] && record prerequisites "killed by SIG$1 after $((SECONDS - START))s"
  exit $((128 + $2))
}
trap on_exit EXIT
trap 'on_signal TERM 15' TERM
trap 'on_signal INT 2' INT
trap 'on_signal HUP 1' HUP

# run NAME LIMIT CMD...: at most LIMIT seconds and never past the deadline (less a margin to write
# the summary); ok / failed / timed out / skipped; anything but ok sets status. The command runs in
# the background under timeout (its own process group) so that a signal reaches the trap at once.
run() {
  local name=$1 want=$2 budget rc; shift 2
  budget=$(($(left) - 10))
  if ((budget < 15)); then record "$name" "skipped: $(left)s left before the ${DEADLINE}s deadline"; status=1; return; fi
  ((want < budget)) && budget=$want
  current=$name
  record "$name" "running (limit ${budget}s)"
  timeout "$budget" "$@" &
  child=$!
  wait "$child"; rc=$?
  child=
  current="after $name"
  if [[ $rc == 0 ]]; then record "$name" ok
  elif [[ $rc == 124 ]]; then status=1; record "$name" "timed out after ${budget}s"
  else status=1; record "$name" "failed (exit $rc)"; fi
}
optional() {  # optional NAME LIMIT CMD...: recorded the same way, never fails the check
  local before=$status
  run "$@"
  status=$before
  write_json
}
staged_pip() {  # staged_pip FOLDER PACKAGE...: installs from staged wheels only
  "$PY" -m pip install -q --no-index --find-links "$1" --disable-pip-version-check --root-user-action=ignore "${@:2}"
}
stop_if_missing() {
  ((${#missing_list[@]})) || return 0
  status=2
  record prerequisites "missing: $(IFS=';'; echo "${missing_list[*]}")"
  exit 2
}

step prerequisites "each checked, every missing one named"
record prerequisites running
pyver=$("$PY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")' 2>/dev/null) ||
  { need "a Python interpreter ($PY)"; stop_if_missing; }
echo "python $pyver ($(command -v "$PY"))"
fact python "$pyver"
case "$pyver" in 3.9|3.1[0-4]) ;; *) need "Python 3.9-3.14 (found $pyver)" ;; esac
# One import of torch (seconds each): its version, CUDA version and whether it sees a GPU.
torch_facts=$("$PY" -c 'import torch; print(torch.__version__, torch.version.cuda or "none", int(torch.cuda.is_available()))' 2>/dev/null) ||
  { need "torch for $PY"; torch_facts="none none 0"; }
read -r torch_version torch_cuda gpu_visible <<<"$torch_facts"
fact torch "$torch_version"; fact torch_cuda "$torch_cuda"
[[ "$torch_version" == none || "$torch_cuda" != none ]] || need "a CUDA build of torch (torch.version.cuda is None)"
"$PY" -c 'import setuptools' 2>/dev/null || need "setuptools for $PY (the Python package installs through it)"
pyinc=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["include"])' 2>/dev/null)
[[ -f "$pyinc/Python.h" ]] || need "Python headers ($pyinc/Python.h)"
cxx="${CXX:-$(command -v c++ || command -v g++ || true)}"
if [[ -n "$cxx" ]] && "$cxx" --version >/dev/null 2>&1; then fact host_compiler "$("$cxx" --version | head -1)"
else need "a host C++ compiler (c++ or g++; or set CXX)"; cxx=; fi
nvcc_cuda=none
if command -v nvcc >/dev/null; then
  nvcc_cuda=$(nvcc --version | sed -n 's/.*release \([0-9]*\.[0-9]*\).*/\1/p')
  fact nvcc "$nvcc_cuda"
  [[ "$torch_cuda" == none || "${nvcc_cuda%%.*}" == "${torch_cuda%%.*}" ]] ||
    need "an nvcc of torch's CUDA major version (nvcc $nvcc_cuda, torch built with CUDA $torch_cuda)"
  if [[ -n "$cxx" ]]; then
    # nvcc refuses host compilers outside its supported range: a probe compile says so before CMake does.
    probe=$(mktemp -d)
    printf '__global__ void k() {}\nint main() { k<<<1, 1>>>(); }\n' > "$probe/probe.cu"
    if ! nvcc -ccbin "$cxx" -c "$probe/probe.cu" -o "$probe/probe.o" > "$probe/log" 2>&1; then
      need "a host compiler nvcc $nvcc_cuda accepts ($cxx: $(grep -m1 -i 'error' "$probe/log" || head -1 "$probe/log"))"
    fi
    rm -rf "$probe"
  fi
else
  need "nvcc on PATH (the CUDA toolkit; e.g. PATH=/usr/local/cuda/bin:\$PATH)"
fi
if ! "$PY" -c 'import pytest' 2>/dev/null; then
  if [[ -d "$DEPS/wheels/py$pyver" ]]; then
    staged_pip "$DEPS/wheels/py$pyver" pytest || need "pytest from $DEPS/wheels/py$pyver"
  else
    need "pytest (stage it for Python $pyver with bench/gpu_check_stage.sh and carry .gpu-deps)"
  fi
fi
cmake_ok() {
  local v major minor
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
# A staged UCX (Debian's, built for another glibc) once crashed both ranks of `python -m cnccl` on an H200
# machine (SIGSEGV in the host path's setup): the check builds with the machine's own UCX or none.
if pkg-config --exists ucx 2>/dev/null; then
  fact ucx "system ($(pkg-config --modversion ucx))"
else
  extra+=(-DCNCCL_WITH_UCX=OFF)
  fact ucx "none on this machine: built with CNCCL_WITH_UCX=OFF, CPU tensors on gloo"
fi
if [[ -d "$LIBDIR/cmake/GTest" ]]; then
  extra+=("-DGTest_DIR=$LIBDIR/cmake/GTest")
  fact googletest "staged ($STAGE)"
elif compgen -G "/usr/lib/*/cmake/GTest" >/dev/null || compgen -G "/usr/lib*/cmake/GTest" >/dev/null ||
    compgen -G "/usr/local/lib*/cmake/GTest" >/dev/null; then
  fact googletest system
else
  need "GoogleTest (libgtest-dev; stage it with bench/gpu_check_stage.sh and carry .gpu-deps): the C++ GPU tests are in the verdict"
fi
gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
# Last, once the rest is known: without a GPU nothing below can run.
if ((${#missing_list[@]} == 0)); then
  [[ "$gpu_visible" == 1 ]] || need "a visible CUDA GPU"
fi
stop_if_missing
arch=$("$PY" -c 'import torch; m, n = torch.cuda.get_device_capability(); print(f"{m}{n}-real")')
gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)
fact gpu "${gpu:-unknown (no nvidia-smi)}"
fact nccl "$("$PY" -c 'import torch; print(".".join(map(str, torch.cuda.nccl.version())))' 2>/dev/null)"
fact cuda_arch "$arch"; fact cmake "$(cmake --version | head -1)"; fact cores "$(nproc)"
printf '%s\n' "${FACTS[@]}"
record prerequisites ok

step build "library, Python extension, C++ GPU tests and codec benchmark (CUDA arch $arch)"
run configure 45 sh -c 'log=$1; shift; exec "$@" > "$log" 2>&1' sh "$DIR/gpu_check_cmake.log" \
  cmake -S . -B "$BUILD" "${gen[@]}" -DPython3_EXECUTABLE="$(command -v "$PY")" -DCNCCL_CUDA_ARCHS="$arch" \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_CUDA_HOST_COMPILER="$cxx" \
  -DCNCCL_BUILD_TESTS=ON -DCNCCL_BUILD_BENCH=ON "${extra[@]}"
[[ ${RESULT[configure]} == ok ]] || { cat "$DIR/gpu_check_cmake.log"; exit 1; }
sed -n '/cnccl .* configuration/,/sanitizers/p' "$DIR/gpu_check_cmake.log"
grep -q "CUDA *: on" "$DIR/gpu_check_cmake.log" || { status=1; record build "the CUDA path is off (configuration above)"; exit 1; }
run build 140 cmake --build "$BUILD" -j "$(nproc)" --target cnccl_python test_codec_cuda test_frames test_composition \
  codec_cuda
[[ ${RESULT[build]} == ok ]] || exit 1
run install 20 env CNCCL_BUILD_DIR="$BUILD" "$PY" -m pip install -q --no-index --no-deps --no-build-isolation \
  --disable-pip-version-check --root-user-action=ignore -e .
[[ ${RESULT[install]} == ok ]] || exit 1

step verdict "${VERDICT[*]}"
# python -m cnccl (the 2-process self-check on CPU tensors) beside the tests, its output kept whole.
timeout 150 "$PY" -m cnccl > "$DIR/self_check.log" 2>&1 &
self_check=$!
run cpp_codec_cuda 15 "$BUILD/tests/cpp/compress/test_codec_cuda" --gtest_brief=1
run cpp_frames_cuda 15 "$BUILD/tests/cpp/test_frames" --gtest_brief=1
run cpp_composition 15 "$BUILD/tests/cpp/test_composition" --gtest_brief=1
pytest_args=(-q -rfs -p no:cacheprovider --tb=short -o faulthandler_timeout=120)
pushd tests/python >/dev/null
run python_cuda 80 "$PY" -m pytest "${pytest_args[@]}" test_cuda.py
run python_cuda_ranks 110 "$PY" -m pytest "${pytest_args[@]}" test_cuda_ranks.py
popd >/dev/null
wait "$self_check"; rc=$?
fact self_check "exit $rc: $(tail -1 "$DIR/self_check.log")"
for name in "${VERDICT[@]}"; do [[ ${RESULT[$name]:-} == ok ]] || status=1; done
fact verdict "$([[ $status == 0 ]] && echo "ok: every verdict step passed" || echo "failed")"
write_json

step benchmarks "reported, not part of the verdict"
CNCCL_GPU_JSON="$DIR/gpu_allreduce.json" optional gpu_allreduce 90 "$PY" bench/gpu_allreduce.py
"$PY" -c 'import json, sys; json.load(open(sys.argv[1]))' "$DIR/gpu_allreduce.json" 2>/dev/null && bench_json_ok=1
optional codec_cuda 40 bash -o pipefail -c "'$BUILD/bench/codec_cuda' 256 | tee '$DIR/codec_cuda.txt'"
write_json

step done "status $status"
state=done
exit $status
