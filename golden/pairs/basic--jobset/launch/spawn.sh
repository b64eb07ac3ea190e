#!/usr/bin/env bash
# Starts the processes of job 'pair-basic' on one node (basic launcher): 4 per node, 8 in all.
# launch/worker.sh runs it with NODE_RANK, MASTER_ADDR, MASTER_PORT, WORLD_SIZE and
# LOCAL_WORLD_SIZE exported and the job's command as its arguments. Each process gets
# RANK and LOCAL_RANK, and --world_size WORLD_SIZE --rank RANK after the command.
set -euo pipefail
: "${NODE_RANK:?NODE_RANK must be set by the backend}"
: "${WORLD_SIZE:?WORLD_SIZE must be set by launch/worker.sh}"
: "${LOCAL_WORLD_SIZE:?LOCAL_WORLD_SIZE must be set by launch/worker.sh}"
if (($# == 0)); then
  echo "mdc: spawn.sh needs the command to run as its arguments" >&2
  exit 2
fi
pids=()
stop() { if ((${#pids[@]})); then kill "${pids[@]}" 2>/dev/null || true; fi; }
# On Ctrl-C or TERM, stop every process and wait for it before exiting.
trap 'stop; wait || true; exit 130' INT
trap 'stop; wait || true; exit 143' TERM
for ((local_rank = 0; local_rank < LOCAL_WORLD_SIZE; local_rank++)); do
  rank=$((NODE_RANK * LOCAL_WORLD_SIZE + local_rank))
  RANK="$rank" LOCAL_RANK="$local_rank" "$@" --world_size "$WORLD_SIZE" --rank "$rank" &
  pids+=("$!")
done
# The first process to fail stops the others; its status is the node's.
# each ended one's status read by its pid, before and after every wait -n, as bash
# can drop one killed by a signal unreported (and wait -n then never returns it)
status=0
waited=0
while ((${#pids[@]})); do
  running=()
  for pid in "${pids[@]}"; do
    if kill -0 "$pid" 2>/dev/null; then
      running+=("$pid")
    else
      wait "$pid" || status=$?
    fi
  done
  # all ended; or wait -n found no child and none ended (what kill -0 finds is not ours)
  if ((${#running[@]} == 0)) || ((waited == 127 && ${#running[@]} == ${#pids[@]})); then
    pids=()
  else
    pids=("${running[@]}")
  fi
  if ((status != 0 || ${#pids[@]} == 0)); then
    break
  fi
  waited=0
  wait -n || waited=$?
done
if ((status != 0)); then
  echo "mdc: a process on node $NODE_RANK exited with status $status; stopping the others" >&2
  stop
  wait || true
  exit "$status"
fi
