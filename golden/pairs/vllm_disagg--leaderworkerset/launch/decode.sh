#!/usr/bin/env bash
# Role 'decode' of job 'pair-vllm-disagg' (nodes 1-2), launcher vllm_disagg.
# The backend runs this once per node with NODE_RANK, MASTER_ADDR, MASTER_PORT, NODE_HOSTS
# and MDC_LAUNCH_ID set.
set -euo pipefail
MDC_OUT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export MDC_OUT
: "${NODE_RANK:?NODE_RANK must be set by the backend}"
export VLLM_DISAGG_ROLE=decode
export VLLM_DISAGG_PREFILL=1
export VLLM_DISAGG_DECODE=2
export VLLM_DISAGG_UNIT=nodes
export MODEL=Qwen/Qwen3-32B
export NODE_RANK="${NODE_RANK}"
exec bash "${MDC_OUT}/launch/vllm_disagg.sh" decode vllm serve Qwen/Qwen3-32B --tensor-parallel-size 8 --host 0.0.0.0 --kv-transfer-config '{"kv_connector":"NixlConnector","kv_role":"kv_both"}'
