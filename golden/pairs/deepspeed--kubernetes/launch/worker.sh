#!/usr/bin/env bash
# Role 'worker' of job 'pair-deepspeed' (nodes 0-1), launcher deepspeed.
# The backend runs this once per node with NODE_RANK, MASTER_ADDR, MASTER_PORT, NODE_HOSTS
# and MDC_LAUNCH_ID set.
set -euo pipefail
: "${NODE_RANK:?NODE_RANK must be set by the backend}"
: "${MASTER_ADDR:?MASTER_ADDR must be set by the backend}"
: "${MASTER_PORT:?MASTER_PORT must be set by the backend}"
MDC_OUT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export MDC_OUT
export CROSS_RANK="${NODE_RANK}"
export CROSS_SIZE=2
export DS_ACCELERATOR=cuda
export LOCAL_SIZE=8
export MAD_MULTI_NODE_RUNNER="torchrun --nnodes 2 --rdzv-backend static --node-rank ${NODE_RANK} --master-addr ${MASTER_ADDR} --master-port ${MASTER_PORT} --nproc-per-node 8 --max-restarts 0"
export MDC_DEEPSPEED_CONFIG="${MDC_OUT}/launch/ds_config.json"
export NNODES=2
export NPROC_PER_NODE=8
exec torchrun --nnodes 2 --rdzv-backend static --node-rank "${NODE_RANK}" --master-addr "${MASTER_ADDR}" --master-port "${MASTER_PORT}" --nproc-per-node 8 --max-restarts 0 train.py --deepspeed --deepspeed_config "${MDC_OUT}/launch/ds_config.json"
