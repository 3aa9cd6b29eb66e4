# Sourced by .ci/run and .ci/test: `phase NAME COMMAND...` runs the command and records its wall
# time and outcome in $CNCCL_CI_PHASES (a file, shared with nested scripts); the script that made
# the file prints the table when it exits.
if [[ -z "${CNCCL_CI_PHASES:-}" ]]; then
  CNCCL_CI_PHASES=$(mktemp)
  export CNCCL_CI_PHASES
  _phases_start=$SECONDS
  _phases_report() {
    echo "=== phases (wall time)"
    cat "$CNCCL_CI_PHASES"
    printf '  %-12s %5d s\n' total $((SECONDS - _phases_start))
    rm -f "$CNCCL_CI_PHASES"
  }
  trap _phases_report EXIT
fi

phase() {
  local name=$1 start=$SECONDS rc=0
  shift
  "$@" || rc=$?
  printf '  %-12s %5d s  %s\n' "$name" $((SECONDS - start)) "$([[ $rc == 0 ]] && echo ok || echo "FAILED ($rc)")" \
    >>"$CNCCL_CI_PHASES"
  return $rc
}

# `together NAME COMMAND NAME COMMAND ...`: runs the commands (strings, run by bash) at once, each recorded
# as a phase, and prints their output whole, in the order given, when all are done. Fails if any failed.
together() {
  local dir rc=0 i=0 pids=() names=()
  dir=$(mktemp -d)
  while (($# >= 2)); do
    names+=("$1")
    phase "$1" bash -c "$2" >"$dir/$i" 2>&1 &
    pids+=($!)
    shift 2
    i=$((i + 1))
  done
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}" || rc=1
  done
  for i in "${!names[@]}"; do
    echo "=== ${names[$i]}"
    cat "$dir/$i"
  done
  rm -rf "$dir"
  return $rc
}
