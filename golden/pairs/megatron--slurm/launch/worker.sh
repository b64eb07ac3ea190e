#!/usr/bin/env bash
# Role 'worker' of job 'pair-megatron' (nodes 0-1), launcher megatron.
# The backend runs this once per node with NODE_RANK, MASTER_ADDR, MASTER_PORT, NODE_HOSTS
# and MDC_LAUNCH_ID set.
set -euo pipefail
: "${MASTER_ADDR:?MASTER_ADDR must be set by the backend}"
: "${MASTER_PORT:?MASTER_PORT must be set by the backend}"
export MAD_MULTI_NODE_RUNNER="torchrun --nnodes 2 --rdzv-backend c10d --rdzv-endpoint ${MASTER_ADDR}:${MASTER_PORT} --rdzv-id pair-megatron --nproc-per-node 8 --max-restarts 0"
export NNODES=2
export NPROC_PER_NODE=8
export TENSOR_MODEL_PARALLEL_SIZE=4
export PIPELINE_MODEL_PARALLEL_SIZE=2
export CONTEXT_PARALLEL_SIZE=1
export CUDA_DEVICE_MAX_CONNECTIONS=1
exec torchrun --nnodes 2 --rdzv-backend c10d --rdzv-endpoint "${MASTER_ADDR}:${MASTER_PORT}" --rdzv-id pair-megatron --nproc-per-node 8 --max-restarts 0 pretrain_gpt.py --mock-data --tensor-model-parallel-size 4 --pipeline-model-parallel-size 2 --context-parallel-size 1 --expert-model-parallel-size 1 --expert-tensor-parallel-size 4 --sequence-parallel --use-distributed-optimizer --micro-batch-size 1 --global-batch-size 64 --num-layers 16 --hidden-size 2048 --num-attention-heads 16 --seq-length 4096 --max-position-embeddings 4096 --bf16
