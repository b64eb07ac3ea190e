#!/usr/bin/env bash
# Role 'worker' of job 'trtllm-disagg-3x8' (nodes 0-2), launcher trtllm.
# The backend runs this once per node with NODE_RANK, MASTER_ADDR, MASTER_PORT, NODE_HOSTS
# and MDC_LAUNCH_ID set.
set -euo pipefail
MDC_OUT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export MDC_OUT
export NNODES=3
export NPROC_PER_NODE=8
exec bash "${MDC_OUT}/launch/trtllm-disagg.sh" deepseek-ai/DeepSeek-R1-0528 trtllm-serve
