# Sourced by .ci/run and .ci/test: `phase NAME COMMAND...` runs the command and records its wall
# time and outcome in $CNCCL_CI_PHASES (a file, shared with nested scripts); the script that made
# the file prints the table when it exits.
if [[ -z "${CNCCL_CI_PHASES:-}" ]]; then
  CNCCL_CI_PHASES=$(mktemp)
  export CNCCL_CI_PHASES
  _phases_start=$SECONDS
  _phases_owner=$BASHPID
  _phases_report() {
    # Subshells inherit the trap (one that stop_behind ends runs it): the table is its maker's to print.
    [[ $BASHPID == "$_phases_owner" ]] || return 0
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

# `behind NAME COMMAND`: starts the command (a string, run by bash) in the background, recorded as a phase
# and its output kept, in the idle scheduling class (SCHED_IDLE, chrt --idle; nice 19 where chrt is
# missing): the kernel runs it only on a core no other process wants, and a process that wakes takes the
# core back at once, so what runs in front (the tests, some of which time the machine) keeps the cores as
# if alone. `catch_up` waits for every command started so and prints each one's output whole; it fails if
# any failed. `stop_behind` ends them (their process groups: make's compilers too).
_behind=()
behind() {
  local log
  log=$(mktemp)
  set -m
  (chrt --idle -p 0 $BASHPID >/dev/null 2>&1 || renice -n 19 -p $BASHPID >/dev/null
   phase "$1" bash -c "$2") >"$log" 2>&1 &
  set +m
  _behind+=("$1:$!:$log")
}

catch_up() {
  local rc=0 entry name pid log
  for entry in "${_behind[@]}"; do
    IFS=: read -r name pid log <<<"$entry"
    wait "$pid" || rc=1
    echo "=== $name"
    cat "$log"
    rm -f "$log"
  done
  _behind=()
  return $rc
}

stop_behind() {
  local entry name pid log
  for entry in "${_behind[@]}"; do
    IFS=: read -r name pid log <<<"$entry"
    kill -TERM -- "-$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    rm -f "$log"
  done
  _behind=()
}
