#!/usr/bin/env bash
# Role 'worker' of job 'moe-8x7b' (nodes 0-3), launcher megatron.
# The backend runs this once per node with NODE_RANK, MASTER_ADDR, MASTER_PORT, NODE_HOSTS
# and MDC_LAUNCH_ID set.
set -euo pipefail
: "${MASTER_ADDR:?MASTER_ADDR must be set by the backend}"
: "${MASTER_PORT:?MASTER_PORT must be set by the backend}"
export MAD_MULTI_NODE_RUNNER="torchrun --nnodes 4 --rdzv-backend c10d --rdzv-endpoint ${MASTER_ADDR}:${MASTER_PORT} --rdzv-id moe-8x7b --nproc-per-node 8 --max-restarts 0"
export NNODES=4
export NPROC_PER_NODE=8
export TENSOR_MODEL_PARALLEL_SIZE=2
export PIPELINE_MODEL_PARALLEL_SIZE=2
export CONTEXT_PARALLEL_SIZE=1
export CUDA_DEVICE_MAX_CONNECTIONS=1
exec torchrun --nnodes 4 --rdzv-backend c10d --rdzv-endpoint "${MASTER_ADDR}:${MASTER_PORT}" --rdzv-id moe-8x7b --nproc-per-node 8 --max-restarts 0 pretrain_gpt.py --mock-data --train-iters 1000 --moe-grouped-gemm --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --context-parallel-size 1 --expert-model-parallel-size 2 --expert-tensor-parallel-size 1 --use-tp-pp-dp-mapping --sequence-parallel --use-distributed-optimizer --micro-batch-size 2 --global-batch-size 256 --num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 --group-query-attention --num-query-groups 8 --seq-length 4096 --max-position-embeddings 4096 --num-experts 8 --moe-router-topk 2 --swiglu --untie-embeddings-and-output-weights --position-embedding-type rope --disable-bias-linear --normalization RMSNorm --bf16 --recompute-granularity full --recompute-method uniform --recompute-num-layers 2
