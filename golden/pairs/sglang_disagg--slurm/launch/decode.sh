#!/usr/bin/env bash
# Role 'decode' of job 'pair-sglang-disagg' (nodes 1-2), launcher sglang_disagg.
# The backend runs this once per node with NODE_RANK, MASTER_ADDR, MASTER_PORT, NODE_HOSTS
# and MDC_LAUNCH_ID set.
set -euo pipefail
MDC_OUT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export MDC_OUT
: "${NODE_RANK:?NODE_RANK must be set by the backend}"
export SGLANG_DISAGG_MODE=enabled
export SGLANG_DISAGG_ROLE=decode
export SGLANG_DISAGG_PREFILL_NODES=1
export SGLANG_DISAGG_DECODE_NODES=2
export SGLANG_DISAGG_TOTAL_NODES=3
export SGLANG_DISAGG_TRANSFER_BACKEND=mooncake
export SGLANG_TP_SIZE=8
export SGLANG_NODE_RANK="${NODE_RANK}"
export MODEL_PATH=Qwen/Qwen3-32B
export POD_INDEX="${NODE_RANK}"
export TOTAL_PODS=3
export PREFILL_COUNT=1
export DECODE_COUNT=2
export TP_SIZE=8
exec bash "${MDC_OUT}/launch/sglang_disagg.sh" decode python3 -m sglang.launch_server --model-path Qwen/Qwen3-32B --disaggregation-mode decode --tp-size 8 --host 0.0.0.0 --disaggregation-transfer-backend mooncake
