#!/usr/bin/env bash
# Role 'worker' of job 'r1-serve' (nodes 0-1), launcher trtllm.
# The backend runs this once per node with NODE_RANK, MASTER_ADDR, MASTER_PORT, NODE_HOSTS
# and MDC_LAUNCH_ID set.
set -euo pipefail
MDC_OUT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export MDC_OUT
export TRTLLM_TP_SIZE=8
export TRTLLM_PP_SIZE=2
export NNODES=2
export NPROC_PER_NODE=8
exec bash "${MDC_OUT}/launch/trtllm-node.sh" trtllm-serve deepseek-ai/DeepSeek-R1 --host 0.0.0.0 --tp_size 8 --pp_size 2 --extra_llm_api_options "${MDC_OUT}/launch/trtllm-extra-llm-api-options.yaml" --trust_remote_code
