#!/usr/bin/env bash
# Role 'worker' of job 'pair-primus' (nodes 0-1), launcher primus.
# The backend runs this once per node with NODE_RANK, MASTER_ADDR, MASTER_PORT, NODE_HOSTS
# and MDC_LAUNCH_ID set.
set -euo pipefail
: "${NODE_RANK:?NODE_RANK must be set by the backend}"
: "${MASTER_ADDR:?MASTER_ADDR must be set by the backend}"
: "${MASTER_PORT:?MASTER_PORT must be set by the backend}"
export PRIMUS_CONFIG_PATH=examples/megatron/configs/MI300X/llama3.1_8B-BF16-pretrain.yaml
export EXP=examples/megatron/configs/MI300X/llama3.1_8B-BF16-pretrain.yaml
export BACKEND=megatron
export NNODES=2
export NODE_RANK="${NODE_RANK}"
export GPUS_PER_NODE=8
export MASTER_ADDR="${MASTER_ADDR}"
export MASTER_PORT="${MASTER_PORT}"
export MAD_RUNTIME_NGPUS=8
cd /workspace/Primus
exec bash examples/run_pretrain.sh
