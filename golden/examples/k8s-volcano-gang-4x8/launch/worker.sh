#!/usr/bin/env bash
# Role 'worker' of job 'gpt-gang' (nodes 0-3), launcher torchrun.
# The backend runs this once per node with NODE_RANK, MASTER_ADDR, MASTER_PORT, NODE_HOSTS
# and MDC_LAUNCH_ID set.
set -euo pipefail
: "${NODE_RANK:?NODE_RANK must be set by the backend}"
: "${MASTER_ADDR:?MASTER_ADDR must be set by the backend}"
: "${MASTER_PORT:?MASTER_PORT must be set by the backend}"
export MAD_MULTI_NODE_RUNNER="torchrun --nnodes 4 --rdzv-backend static --node-rank ${NODE_RANK} --master-addr ${MASTER_ADDR} --master-port ${MASTER_PORT} --nproc-per-node 8 --max-restarts 0"
export NNODES=4
export NPROC_PER_NODE=8
export MAD_RUNTIME_NGPUS=8
exec torchrun --nnodes 4 --rdzv-backend static --node-rank "${NODE_RANK}" --master-addr "${MASTER_ADDR}" --master-port "${MASTER_PORT}" --nproc-per-node 8 --max-restarts 0 /workspace/train.py
