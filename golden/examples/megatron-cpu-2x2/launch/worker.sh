#!/usr/bin/env bash
# Role 'worker' of job 'megatron-cpu' (nodes 0-1), launcher megatron.
# The backend runs this once per node with NODE_RANK, MASTER_ADDR, MASTER_PORT, NODE_HOSTS
# and MDC_LAUNCH_ID set.
set -euo pipefail
: "${NODE_RANK:?NODE_RANK must be set by the backend}"
: "${MASTER_ADDR:?MASTER_ADDR must be set by the backend}"
: "${MASTER_PORT:?MASTER_PORT must be set by the backend}"
export MAD_MULTI_NODE_RUNNER="torchrun --nnodes 2 --rdzv-backend static --node-rank ${NODE_RANK} --master-addr ${MASTER_ADDR} --master-port ${MASTER_PORT} --nproc-per-node 2 --max-restarts 0"
export NNODES=2
export NPROC_PER_NODE=2
export TENSOR_MODEL_PARALLEL_SIZE=2
export PIPELINE_MODEL_PARALLEL_SIZE=1
export CONTEXT_PARALLEL_SIZE=1
export GLOO_SOCKET_IFNAME=lo
exec torchrun --nnodes 2 --rdzv-backend static --node-rank "${NODE_RANK}" --master-addr "${MASTER_ADDR}" --master-port "${MASTER_PORT}" --nproc-per-node 2 --max-restarts 0 tests/conformance/test_megatron_args.py --mock-data --tensor-model-parallel-size 2 --pipeline-model-parallel-size 1 --context-parallel-size 1 --expert-model-parallel-size 1 --expert-tensor-parallel-size 2 --sequence-parallel --use-distributed-optimizer --micro-batch-size 2 --global-batch-size 8 --num-layers 4 --hidden-size 64 --ffn-hidden-size 256 --num-attention-heads 4 --group-query-attention --num-query-groups 2 --seq-length 128 --max-position-embeddings 128 --distributed-backend gloo
