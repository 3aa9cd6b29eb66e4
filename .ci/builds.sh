#!/usr/bin/env bash
# Every compile CI makes, in two lanes at once (after .ci/setup-deps.sh): the main build (.ci/setup), then
# the build without UCX (from the main build's ccache entries) and the torch 2.11 check; beside them the
# ASan and TSan builds. A build alone leaves the cores idle at times (links, a precompiled header before
# its units, one slow unit last: the cold ASan build took 292 s here with 381 s of CPU), which the other fills.
# The main lane's output is printed as it comes, the sanitizer lane's whole when both are done.
# Exit 2 when the main build failed (nothing after it can run), 1 when anything else did.
set -uo pipefail
cd "$(dirname "$0")/.."
source .ci/phases.sh
PY="${PYTHON:-python3}"
logs=$(mktemp -d)

main_lane() {
  phase setup env CNCCL_BUILD_TESTS=ON bash .ci/setup || return 2
  local rc=0
  phase no-ucx-build bash .ci/no_ucx.sh build || rc=1
  # The GPU machine runs torch 2.11: the sources must also compile against its headers.
  phase torch-2.11 env TORCH_DEVICE_BACKEND_AUTOLOAD=0 "$PY" .ci/torch_compat.py 2.11.0 || rc=1
  return $rc
}

sanitizer_lane() {
  local rc=0
  phase asan-build bash .ci/sanitize.sh asan build || rc=1
  phase tsan-build bash .ci/sanitize.sh tsan build || rc=1
  return $rc
}

sanitizer_lane >"$logs/sanitizers" 2>&1 &
sanitizers=$!
echo "=== builds: main lane (setup, the build without UCX, the torch 2.11 check); the sanitizer lane's log follows it"
main_lane
main_rc=$?
wait $sanitizers
sanitizers_rc=$?
echo "=== builds: sanitizer lane (ASan, TSan)"
cat "$logs/sanitizers"
rm -rf "$logs"
((main_rc == 2)) && exit 2
((main_rc || sanitizers_rc)) && exit 1
exit 0
