#!/usr/bin/env bash
# Role 'worker' of job 'llama70b-tune' (nodes 0-7), launcher megatron.
# The backend runs this once per node with NODE_RANK, MASTER_ADDR, MASTER_PORT, NODE_HOSTS
# and MDC_LAUNCH_ID set.
set -euo pipefail
: "${MASTER_ADDR:?MASTER_ADDR must be set by the backend}"
: "${MASTER_PORT:?MASTER_PORT must be set by the backend}"
export MAD_MULTI_NODE_RUNNER="torchrun --nnodes 8 --rdzv-backend c10d --rdzv-endpoint ${MASTER_ADDR}:${MASTER_PORT} --rdzv-id llama70b-tune --nproc-per-node 8 --max-restarts 0"
export NNODES=8
export NPROC_PER_NODE=8
export TENSOR_MODEL_PARALLEL_SIZE=8
export PIPELINE_MODEL_PARALLEL_SIZE=8
export CONTEXT_PARALLEL_SIZE=1
export CUDA_DEVICE_MAX_CONNECTIONS=1
cd /workspace/Megatron-LM
exec torchrun --nnodes 8 --rdzv-backend c10d --rdzv-endpoint "${MASTER_ADDR}:${MASTER_PORT}" --rdzv-id llama70b-tune --nproc-per-node 8 --max-restarts 0 pretrain_gpt.py --data-path /data/corpus_text_document --tokenizer-type HuggingFaceTokenizer --tokenizer-model /models/llama3 --tensor-model-parallel-size 8 --pipeline-model-parallel-size 8 --context-parallel-size 1 --expert-model-parallel-size 1 --expert-tensor-parallel-size 8 --sequence-parallel --use-distributed-optimizer --micro-batch-size 1 --global-batch-size 512 --num-layers 80 --hidden-size 8192 --ffn-hidden-size 28672 --num-attention-heads 64 --group-query-attention --num-query-groups 8 --seq-length 8192 --max-position-embeddings 8192 --swiglu --untie-embeddings-and-output-weights --position-embedding-type rope --disable-bias-linear --normalization RMSNorm --bf16
