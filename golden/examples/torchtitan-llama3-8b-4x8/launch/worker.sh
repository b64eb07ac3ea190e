#!/usr/bin/env bash
# Role 'worker' of job 'llama3-8b' (nodes 0-3), launcher torchtitan.
# The backend runs this once per node with NODE_RANK, MASTER_ADDR, MASTER_PORT, NODE_HOSTS
# and MDC_LAUNCH_ID set.
set -euo pipefail
: "${MASTER_ADDR:?MASTER_ADDR must be set by the backend}"
: "${MASTER_PORT:?MASTER_PORT must be set by the backend}"
MDC_OUT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export MDC_OUT
export MAD_MULTI_NODE_RUNNER="torchrun --nnodes 4 --rdzv-backend c10d --rdzv-endpoint ${MASTER_ADDR}:${MASTER_PORT} --rdzv-id llama3-8b --nproc-per-node 8 --max-restarts 0"
export NNODES=4
export NPROC_PER_NODE=8
export TORCHTITAN_TENSOR_PARALLEL_SIZE=2
export TORCHTITAN_PIPELINE_PARALLEL_SIZE=2
export TORCHTITAN_FSDP_ENABLED=1
export TORCHTITAN_CONTEXT_PARALLEL_SIZE=1
cd /workspace/torchtitan
exec torchrun --nnodes 4 --rdzv-backend c10d --rdzv-endpoint "${MASTER_ADDR}:${MASTER_PORT}" --rdzv-id llama3-8b --nproc-per-node 8 --max-restarts 0 --module torchtitan.train --job.config_file "${MDC_OUT}/launch/torchtitan.toml" --parallelism.data_parallel_replicate_degree 1 --parallelism.data_parallel_shard_degree 8 --parallelism.tensor_parallel_degree 2 --parallelism.pipeline_parallel_degree 2 --parallelism.context_parallel_degree 1 --parallelism.expert_parallel_degree 1 --training.local_batch_size 8 --training.global_batch_size 128
