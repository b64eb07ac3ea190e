#!/usr/bin/env bash
# Role 'worker' of job 'pair-trtllm' (nodes 0-1), launcher trtllm.
# The backend runs this once per node with NODE_RANK, MASTER_ADDR, MASTER_PORT, NODE_HOSTS
# and MDC_LAUNCH_ID set.
set -euo pipefail
MDC_OUT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export MDC_OUT
export TRTLLM_TP_SIZE=4
export TRTLLM_PP_SIZE=1
export NNODES=2
export NPROC_PER_NODE=8
exec bash "${MDC_OUT}/launch/trtllm-node.sh" trtllm-serve meta-llama/Llama-3.3-70B-Instruct --host 0.0.0.0 --tp_size 4 --pp_size 1 --max_batch_size 256 --max_num_tokens 8192 --kv_cache_free_gpu_memory_fraction 0.85
