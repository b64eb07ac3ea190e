#!/usr/bin/env bash
# Role 'worker' of job 'pair-sglang' (nodes 0-1), launcher sglang.
# The backend runs this once per node with NODE_RANK, MASTER_ADDR, MASTER_PORT, NODE_HOSTS
# and MDC_LAUNCH_ID set.
set -euo pipefail
MDC_OUT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export MDC_OUT
: "${NODE_RANK:?NODE_RANK must be set by the backend}"
: "${MASTER_ADDR:?MASTER_ADDR must be set by the backend}"
: "${MASTER_PORT:?MASTER_PORT must be set by the backend}"
export SGLANG_TENSOR_PARALLEL_SIZE=16
export SGLANG_PIPELINE_PARALLEL_SIZE=1
export NNODES=2
export NPROC_PER_NODE=8
export NODE_RANK="${NODE_RANK}"
export MASTER_ADDR="${MASTER_ADDR}"
export MASTER_PORT="${MASTER_PORT}"
export NCCL_INIT_ADDR="${MASTER_ADDR}:${MASTER_PORT}"
exec bash "${MDC_OUT}/launch/sglang-node.sh" python3 -m sglang.launch_server --model-path deepseek-ai/DeepSeek-V3 --tp-size 16 --nnodes 2 --node-rank "${NODE_RANK}" --dist-init-addr "${MASTER_ADDR}:${MASTER_PORT}" --host 0.0.0.0 --port 30000
