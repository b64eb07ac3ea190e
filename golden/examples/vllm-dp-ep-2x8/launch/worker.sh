#!/usr/bin/env bash
# Role 'worker' of job 'deepseek-v3-dp-ep' (nodes 0-1), launcher vllm.
# The backend runs this once per node with NODE_RANK, MASTER_ADDR, MASTER_PORT, NODE_HOSTS
# and MDC_LAUNCH_ID set.
set -euo pipefail
MDC_OUT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export MDC_OUT
: "${NODE_RANK:?NODE_RANK must be set by the backend}"
: "${MASTER_ADDR:?MASTER_ADDR must be set by the backend}"
: "${MASTER_PORT:?MASTER_PORT must be set by the backend}"
export VLLM_TENSOR_PARALLEL_SIZE=1
export VLLM_PIPELINE_PARALLEL_SIZE=1
export VLLM_DISTRIBUTED_BACKEND=mp
export NNODES=2
export NPROC_PER_NODE=8
export NODE_RANK="${NODE_RANK}"
export MASTER_ADDR="${MASTER_ADDR}"
export MASTER_PORT="${MASTER_PORT}"
export VLLM_ALL2ALL_BACKEND=deepep_low_latency
export VLLM_USE_DEEP_GEMM=1
exec bash "${MDC_OUT}/launch/vllm-node.sh" vllm serve deepseek-ai/DeepSeek-V3-0324 --tensor-parallel-size 1 --pipeline-parallel-size 1 --host 0.0.0.0 --port 8000 --data-parallel-size 16 --data-parallel-size-local 8 --enable-expert-parallel
