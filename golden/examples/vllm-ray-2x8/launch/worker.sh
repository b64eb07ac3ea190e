#!/usr/bin/env bash
# Role 'worker' of job 'vllm-llama70b' (nodes 0-1), launcher vllm.
# The backend runs this once per node with NODE_RANK, MASTER_ADDR, MASTER_PORT, NODE_HOSTS
# and MDC_LAUNCH_ID set.
set -euo pipefail
MDC_OUT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export MDC_OUT
: "${NODE_RANK:?NODE_RANK must be set by the backend}"
: "${MASTER_ADDR:?MASTER_ADDR must be set by the backend}"
: "${MASTER_PORT:?MASTER_PORT must be set by the backend}"
export VLLM_TENSOR_PARALLEL_SIZE=8
export VLLM_PIPELINE_PARALLEL_SIZE=2
export VLLM_DISTRIBUTED_BACKEND=ray
export NNODES=2
export NPROC_PER_NODE=8
export NODE_RANK="${NODE_RANK}"
export MASTER_ADDR="${MASTER_ADDR}"
export MASTER_PORT="${MASTER_PORT}"
exec bash "${MDC_OUT}/launch/vllm-node.sh" vllm serve meta-llama/Llama-3.1-70B-Instruct --tensor-parallel-size 8 --pipeline-parallel-size 2 --host 0.0.0.0 --port 8080 --distributed-executor-backend ray
