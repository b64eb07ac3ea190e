#!/usr/bin/env bash
# Runs job 'pair-deepspeed' on this machine: 2 node(s) x 8 process(es), nodes as local agents on 127.0.0.1.
set -euo pipefail
out="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export MASTER_ADDR=127.0.0.1
# This launch's id, exported to every process: fresh for every run of this script.
MDC_LAUNCH_ID="$(date -u +%Y%m%dT%H%M%SZ)-$$-$RANDOM"
export MDC_LAUNCH_ID
# The rendezvous port: a hash of the launch id picks a start in 20000-29999;
# then, on node 0, the first port from there that nothing listens on, so concurrent
# launches on one host never share it. Every node is given the same port.
port=$((20000 + $(printf '%s' "$MDC_LAUNCH_ID" | cksum | cut -d ' ' -f 1) % 10000))
for ((try = 0; try < 100; try++)); do
  if ! (: <"/dev/tcp/127.0.0.1/$port") 2>/dev/null &&
    ! (: <"/dev/tcp/$MASTER_ADDR/$port") 2>/dev/null; then
    break
  fi
  port=$((20000 + (port - 20000 + 1) % 10000))
done
export MASTER_PORT="$port"
node_hosts=()
for ((node = 0; node < 2; node++)); do node_hosts+=(127.0.0.1); done
export NODE_HOSTS="${node_hosts[*]}"
pids=()
stop() { if ((${#pids[@]})); then kill "${pids[@]}" 2>/dev/null || true; fi; }
# On Ctrl-C or TERM, stop every node and wait for it before exiting.
trap 'stop; wait || true; exit 130' INT
trap 'stop; wait || true; exit 143' TERM
for ((node = 0; node < 2; node++)); do
  NODE_RANK="$node" bash "$out"/launch/worker.sh &
  pids+=("$!")
done
# The first node to fail stops the others; its status is the job's.
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
  echo "mdc: a node exited with status $status; stopping the others" >&2
  stop
  wait || true
  exit "$status"
fi
