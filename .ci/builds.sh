#!/usr/bin/env bash
# The builds only CI's last tests need, as two lanes that .ci/run starts behind everything else (phases.sh,
# `behind`: in the idle scheduling class, on cores no test wants):
#   sanitizers  the ASan build, then the TSan build (.ci/sanitize.sh)
#   others      the build without UCX (.ci/no_ucx.sh; after .ci/setup, whose ccache entries it reuses), then
#               the compile against torch 2.11's headers (.ci/torch_compat.py; reads the main build's
#               compile commands)
# Each step is recorded as a phase. Exit 1 when any step failed.
set -uo pipefail
cd "$(dirname "$0")/.."
source .ci/phases.sh
PY="${PYTHON:-python3}"
rc=0
case "${1:-}" in
  sanitizers)
    phase asan-build bash .ci/sanitize.sh asan build || rc=1
    phase tsan-build bash .ci/sanitize.sh tsan build || rc=1
    ;;
  others)
    phase no-ucx-build bash .ci/no_ucx.sh build || rc=1
    # The GPU machine runs torch 2.11: the sources must also compile against its headers.
    phase torch-2.11 env TORCH_DEVICE_BACKEND_AUTOLOAD=0 "$PY" .ci/torch_compat.py 2.11.0 || rc=1
    ;;
  *)
    echo "usage: .ci/builds.sh sanitizers|others"
    exit 2
    ;;
esac
exit $rc
