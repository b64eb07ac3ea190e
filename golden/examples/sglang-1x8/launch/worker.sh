#!/usr/bin/env bash
# Role 'worker' of job 'sglang-qwen' (node 0), launcher sglang.
# The backend runs this once per node with NODE_RANK, MASTER_ADDR, MASTER_PORT, NODE_HOSTS
# and MDC_LAUNCH_ID set.
set -euo pipefail
: "${NODE_RANK:?NODE_RANK must be set by the backend}"
: "${MASTER_ADDR:?MASTER_ADDR must be set by the backend}"
: "${MASTER_PORT:?MASTER_PORT must be set by the backend}"
export SGLANG_TENSOR_PARALLEL_SIZE=8
export SGLANG_PIPELINE_PARALLEL_SIZE=1
export NNODES=1
export NPROC_PER_NODE=8
export NODE_RANK="${NODE_RANK}"
export MASTER_ADDR="${MASTER_ADDR}"
export MASTER_PORT="${MASTER_PORT}"
exec python -m sglang.launch_server --model-path Qwen/Qwen2.5-72B-Instruct --tp-size 8 --host 0.0.0.0 --port 30000 --mem-fraction-static 0.85 --trust-remote-code
