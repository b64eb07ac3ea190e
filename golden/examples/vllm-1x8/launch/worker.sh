#!/usr/bin/env bash
# Role 'worker' of job 'vllm-llama8b' (node 0), launcher vllm.
# The backend runs this once per node with NODE_RANK, MASTER_ADDR, MASTER_PORT, NODE_HOSTS
# and MDC_LAUNCH_ID set.
set -euo pipefail
: "${NODE_RANK:?NODE_RANK must be set by the backend}"
: "${MASTER_ADDR:?MASTER_ADDR must be set by the backend}"
: "${MASTER_PORT:?MASTER_PORT must be set by the backend}"
export VLLM_TENSOR_PARALLEL_SIZE=8
export VLLM_PIPELINE_PARALLEL_SIZE=1
export VLLM_DISTRIBUTED_BACKEND=auto
export NNODES=1
export NPROC_PER_NODE=8
export NODE_RANK="${NODE_RANK}"
export MASTER_ADDR="${MASTER_ADDR}"
export MASTER_PORT="${MASTER_PORT}"
exec vllm serve meta-llama/Llama-3.1-8B-Instruct --tensor-parallel-size 8 --pipeline-parallel-size 1 --host 0.0.0.0 --port 8000 --max-model-len 8192 --gpu-memory-utilization 0.9
