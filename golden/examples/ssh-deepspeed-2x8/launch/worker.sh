#!/usr/bin/env bash
# Role 'worker' of job 'ds-zero3-sft' (nodes 0-1), launcher deepspeed.
# The backend runs this once per node with NODE_RANK, MASTER_ADDR, MASTER_PORT, NODE_HOSTS
# and MDC_LAUNCH_ID set.
set -euo pipefail
MDC_OUT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export MDC_OUT
: "${NODE_RANK:?NODE_RANK must be set by the backend}"
: "${MASTER_ADDR:?MASTER_ADDR must be set by the backend}"
: "${MASTER_PORT:?MASTER_PORT must be set by the backend}"
export DS_ACCELERATOR=cuda
export GROUP_RANK="${NODE_RANK}"
export LOCAL_WORLD_SIZE=8
export MAD_MULTI_NODE_RUNNER="deepspeed --hostfile ${MDC_OUT}/launch/hostfile --no_ssh --node_rank ${NODE_RANK} --master_addr ${MASTER_ADDR} --master_port ${MASTER_PORT} --num_nodes 2 --num_gpus 8"
export MDC_DEEPSPEED_CONFIG="${MDC_OUT}/launch/ds_config.json"
export NNODES=2
export NPROC_PER_NODE=8
export NCCL_DEBUG=WARN
cd /shared/sft
exec deepspeed --hostfile "${MDC_OUT}/launch/hostfile" --no_ssh --node_rank "${NODE_RANK}" --master_addr "${MASTER_ADDR}" --master_port "${MASTER_PORT}" --num_nodes 2 --num_gpus 8 train_sft.py --model /models/llama-3-8b --deepspeed --deepspeed_config "${MDC_OUT}/launch/ds_config.json"
