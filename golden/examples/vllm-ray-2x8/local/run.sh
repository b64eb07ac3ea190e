#!/usr/bin/env bash
# Runs job 'vllm-llama70b' on this machine: 2 node(s) x 8 process(es), nodes as local agents on 127.0.0.1.
set -euo pipefail
out="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export MASTER_ADDR=127.0.0.1
# This launch's id, exported to every process: fresh for every run of this script.
MDC_LAUNCH_ID="$(date -u +%Y%m%dT%H%M%SZ)-$$-$RANDOM"
export MDC_LAUNCH_ID
export MASTER_PORT=6379
node_hosts=()
for ((node = 0; node < 2; node++)); do node_hosts+=(127.0.0.1); done
export NODE_HOSTS="${node_hosts[*]}"
pids=()
stop() { kill "${pids[@]}" 2>/dev/null || true; }
# On Ctrl-C or TERM, stop every node and wait for it before exiting.
trap 'stop; wait || true; exit 130' INT
trap 'stop; wait || true; exit 143' TERM
for ((node = 0; node < 2; node++)); do
  NODE_RANK="$node" bash "$out"/launch/worker.sh &
  pids+=("$!")
done
# The first node to fail stops the others; its status is the job's.
for _ in "${pids[@]}"; do
  if wait -n; then
    continue
  else
    status=$?
    echo "mdc: a node exited with status $status; stopping the others" >&2
    stop
    wait || true
    exit "$status"
  fi
done
