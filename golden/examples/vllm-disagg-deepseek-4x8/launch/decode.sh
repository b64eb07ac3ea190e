#!/usr/bin/env bash
# Role 'decode' of job 'deepseek-v3-vllm-pd' (nodes 2-3), launcher vllm_disagg.
# The backend runs this once per node with NODE_RANK, MASTER_ADDR, MASTER_PORT, NODE_HOSTS
# and MDC_LAUNCH_ID set.
set -euo pipefail
MDC_OUT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export MDC_OUT
: "${NODE_RANK:?NODE_RANK must be set by the backend}"
export VLLM_DISAGG_ROLE=decode
export VLLM_DISAGG_PREFILL=2
export VLLM_DISAGG_DECODE=2
export VLLM_DISAGG_UNIT=nodes
export MODEL=deepseek-ai/DeepSeek-V3-0324
export NODE_RANK="${NODE_RANK}"
export VLLM_ALL2ALL_BACKEND=deepep_low_latency
export VLLM_USE_DEEP_GEMM=1
exec bash "${MDC_OUT}/launch/vllm_disagg.sh" decode vllm serve deepseek-ai/DeepSeek-V3-0324 --tensor-parallel-size 1 --data-parallel-size 16 --data-parallel-size-local 8 --enable-expert-parallel --host 0.0.0.0 --kv-transfer-config '{"kv_connector":"NixlConnector","kv_role":"kv_both"}'
