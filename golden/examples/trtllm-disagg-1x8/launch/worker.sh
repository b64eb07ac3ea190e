#!/usr/bin/env bash
# Role 'worker' of job 'trtllm-disagg' (node 0), launcher trtllm.
# The backend runs this once per node with NODE_RANK, MASTER_ADDR, MASTER_PORT, NODE_HOSTS
# and MDC_LAUNCH_ID set.
set -euo pipefail
MDC_OUT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export MDC_OUT
export NNODES=1
export NPROC_PER_NODE=8
exec bash "${MDC_OUT}/launch/trtllm-disagg.sh" LGAI-EXAONE/K-EXAONE-236B-A23B trtllm-serve
