#!/usr/bin/env bash
# Role 'worker' of job 'primus-qwen3-1-7b' (node 0), launcher primus.
# The backend runs this once per node with NODE_RANK, MASTER_ADDR, MASTER_PORT, NODE_HOSTS
# and MDC_LAUNCH_ID set.
set -euo pipefail
: "${NODE_RANK:?NODE_RANK must be set by the backend}"
: "${MASTER_ADDR:?MASTER_ADDR must be set by the backend}"
: "${MASTER_PORT:?MASTER_PORT must be set by the backend}"
export PRIMUS_ROOT=/workspace/Primus
export PRIMUS_CONFIG_PATH=examples/torchtitan/configs/MI300X/qwen3_1.7B-pretrain.yaml
export EXP=examples/torchtitan/configs/MI300X/qwen3_1.7B-pretrain.yaml
export BACKEND=torchtitan
export NNODES=1
export NODE_RANK="${NODE_RANK}"
export GPUS_PER_NODE=8
export MASTER_ADDR="${MASTER_ADDR}"
export MASTER_PORT="${MASTER_PORT}"
export MAD_RUNTIME_NGPUS=8
export HF_HOME=/data/huggingface
export NCCL_DEBUG=WARN
cd /workspace/Primus
exec bash examples/run_pretrain.sh
