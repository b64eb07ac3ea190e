#!/usr/bin/env bash
# Runs job 'sglang-qwen' on this machine: 1 node(s) x 8 process(es), nodes as local agents on 127.0.0.1.
set -euo pipefail
out="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export MASTER_ADDR=127.0.0.1
# This launch's id, exported to every process: fresh for every run of this script.
MDC_LAUNCH_ID="$(date -u +%Y%m%dT%H%M%SZ)-$$-$RANDOM"
export MDC_LAUNCH_ID
export MASTER_PORT=29500
node_hosts=()
for ((node = 0; node < 1; node++)); do node_hosts+=(127.0.0.1); done
export NODE_HOSTS="${node_hosts[*]}"
NODE_RANK=0 exec bash "$out"/launch/worker.sh
