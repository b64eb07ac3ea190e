#!/usr/bin/env bash
# Role 'worker' of job 'vllm-dp-span-4x8' (nodes 0-3), launcher vllm.
# The backend runs this once per node with NODE_RANK, MASTER_ADDR, MASTER_PORT, NODE_HOSTS
# and MDC_LAUNCH_ID set.
set -euo pipefail
MDC_OUT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export MDC_OUT
: "${NODE_RANK:?NODE_RANK must be set by the backend}"
: "${MASTER_ADDR:?MASTER_ADDR must be set by the backend}"
: "${MASTER_PORT:?MASTER_PORT must be set by the backend}"
export VLLM_TENSOR_PARALLEL_SIZE=16
export VLLM_PIPELINE_PARALLEL_SIZE=1
export VLLM_DISTRIBUTED_BACKEND=ray
export NNODES=4
export NPROC_PER_NODE=8
export NODE_RANK="${NODE_RANK}"
export MASTER_ADDR="${MASTER_ADDR}"
export MASTER_PORT="${MASTER_PORT}"
export VLLM_RAY_DP_PACK_STRATEGY=span
exec bash "${MDC_OUT}/launch/vllm-node.sh" vllm serve meta-llama/Llama-3.1-405B-Instruct-FP8 --tensor-parallel-size 16 --pipeline-parallel-size 1 --host 0.0.0.0 --port 8000 --data-parallel-size 2 --data-parallel-backend ray --max-model-len 16384
