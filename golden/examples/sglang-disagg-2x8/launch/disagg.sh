#!/usr/bin/env bash
# Role 'disagg' of job 'sglang-disagg-2x8' (nodes 0-1), launcher sglang_disagg.
# The backend runs this once per node with NODE_RANK, MASTER_ADDR, MASTER_PORT, NODE_HOSTS
# and MDC_LAUNCH_ID set.
set -euo pipefail
MDC_OUT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export MDC_OUT
: "${NODE_RANK:?NODE_RANK must be set by the backend}"
export SGLANG_DISAGG_MODE=enabled
export SGLANG_DISAGG_TRANSFER_BACKEND=nixl
export SGLANG_TP_SIZE=2
export SGLANG_NODE_RANK="${NODE_RANK}"
export MODEL_PATH=Qwen/Qwen3-8B
export POD_INDEX="${NODE_RANK}"
export TOTAL_PODS=2
export TP_SIZE=2
exec bash "${MDC_OUT}/launch/sglang_disagg.sh" python3
