#!/usr/bin/env bash
# Role 'decode' of job 'deepseek-v3-pd' (nodes 2-3), launcher sglang_disagg.
# The backend runs this once per node with NODE_RANK, MASTER_ADDR, MASTER_PORT, NODE_HOSTS
# and MDC_LAUNCH_ID set.
set -euo pipefail
MDC_OUT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export MDC_OUT
: "${NODE_RANK:?NODE_RANK must be set by the backend}"
export SGLANG_DISAGG_MODE=enabled
export SGLANG_DISAGG_ROLE=decode
export SGLANG_DISAGG_PREFILL_NODES=2
export SGLANG_DISAGG_DECODE_NODES=2
export SGLANG_DISAGG_TOTAL_NODES=4
export SGLANG_DISAGG_TRANSFER_BACKEND=mooncake
export SGLANG_TP_SIZE=16
export SGLANG_NODE_RANK="${NODE_RANK}"
export MODEL_PATH=deepseek-ai/DeepSeek-V3-0324
export POD_INDEX="${NODE_RANK}"
export TOTAL_PODS=4
export PREFILL_COUNT=2
export DECODE_COUNT=2
export TP_SIZE=16
exec bash "${MDC_OUT}/launch/sglang_disagg.sh" decode python3 -m sglang.launch_server --model-path deepseek-ai/DeepSeek-V3-0324 --disaggregation-mode decode --tp-size 16 --dp-size 8 --enable-dp-attention --moe-a2a-backend deepep --host 0.0.0.0 --disaggregation-transfer-backend mooncake --trust-remote-code --mem-fraction-static 0.8 --max-running-requests 128
