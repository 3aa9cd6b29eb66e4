#!/usr/bin/env bash
# Runs BINARY as WORLD_SIZE ranks side by side, each writing to this script's own output, and fails
# unless every rank exits 0. (CMake's execute_process can only start several commands as a pipeline,
# which would feed one rank's output into the next and kill it with SIGPIPE once the reader exits.)
# Usage: run_ranks.sh BINARY WORLD_SIZE STORE_FILE
set -u
binary=$1 world=$2 store=$3
pids=()
for ((rank = 0; rank < world; rank++)); do
  timeout --kill-after=5 240 "$binary" "$rank" "$world" "$store" &
  pids+=($!)
done
status=0
for rank in "${!pids[@]}"; do
  wait "${pids[$rank]}" || { echo "rank $rank exited with status $?"; status=1; }
done
exit $status
