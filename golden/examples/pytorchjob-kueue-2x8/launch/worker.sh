#!/usr/bin/env bash
# Role 'worker' of job 'bert-kueue' (nodes 0-1), launcher torchrun.
# The backend runs this once per node with NODE_RANK, MASTER_ADDR, MASTER_PORT, NODE_HOSTS
# and MDC_LAUNCH_ID set.
set -euo pipefail
: "${MASTER_ADDR:?MASTER_ADDR must be set by the backend}"
: "${MASTER_PORT:?MASTER_PORT must be set by the backend}"
export MAD_MULTI_NODE_RUNNER="torchrun --nnodes 2 --rdzv-backend c10d --rdzv-endpoint ${MASTER_ADDR}:${MASTER_PORT} --rdzv-id bert-kueue --nproc-per-node 8 --max-restarts 0"
export NNODES=2
export NPROC_PER_NODE=8
export MAD_RUNTIME_NGPUS=8
exec torchrun --nnodes 2 --rdzv-backend c10d --rdzv-endpoint "${MASTER_ADDR}:${MASTER_PORT}" --rdzv-id bert-kueue --nproc-per-node 8 --max-restarts 0 /workspace/train.py
