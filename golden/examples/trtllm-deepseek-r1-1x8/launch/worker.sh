#!/usr/bin/env bash
# Role 'worker' of job 'trtllm-deepseek-r1' (node 0), launcher trtllm.
# The backend runs this once per node with NODE_RANK, MASTER_ADDR, MASTER_PORT, NODE_HOSTS
# and MDC_LAUNCH_ID set.
set -euo pipefail
MDC_OUT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export MDC_OUT
export TRTLLM_TP_SIZE=8
export TRTLLM_PP_SIZE=1
export NNODES=1
export NPROC_PER_NODE=8
exec trtllm-serve deepseek-ai/DeepSeek-R1-0528 --host 0.0.0.0 --backend pytorch --tp_size 8 --pp_size 1 --ep_size 8 --max_batch_size 1024 --max_num_tokens 3200 --max_seq_len 2048 --kv_cache_free_gpu_memory_fraction 0.8 --extra_llm_api_options "${MDC_OUT}/launch/trtllm-extra-llm-api-options.yaml" --trust_remote_code --port 8000
