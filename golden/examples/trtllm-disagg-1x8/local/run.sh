#!/usr/bin/env bash
# Runs job 'trtllm-disagg' on this machine: 1 node(s) x 8 process(es), nodes as local agents on 127.0.0.1.
set -euo pipefail
out="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export MASTER_ADDR=127.0.0.1
export MASTER_PORT=28515
node_hosts=()
for ((node = 0; node < 1; node++)); do node_hosts+=(127.0.0.1); done
export NODE_HOSTS="${node_hosts[*]}"
NODE_RANK=0 exec bash "$out"/launch/worker.sh
