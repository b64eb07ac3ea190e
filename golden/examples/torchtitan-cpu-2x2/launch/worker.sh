#!/usr/bin/env bash
# Role 'worker' of job 'torchtitan-cpu' (nodes 0-1), launcher torchtitan.
# The backend runs this once per node with NODE_RANK, MASTER_ADDR, MASTER_PORT, NODE_HOSTS
# and MDC_LAUNCH_ID set.
set -euo pipefail
: "${NODE_RANK:?NODE_RANK must be set by the backend}"
: "${MASTER_ADDR:?MASTER_ADDR must be set by the backend}"
: "${MASTER_PORT:?MASTER_PORT must be set by the backend}"
MDC_OUT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export MDC_OUT
export MAD_MULTI_NODE_RUNNER="torchrun --nnodes 2 --rdzv-backend static --node-rank ${NODE_RANK} --master-addr ${MASTER_ADDR} --master-port ${MASTER_PORT} --nproc-per-node 2 --max-restarts 0"
export NNODES=2
export NPROC_PER_NODE=2
export TORCHTITAN_TENSOR_PARALLEL_SIZE=2
export TORCHTITAN_PIPELINE_PARALLEL_SIZE=1
export TORCHTITAN_FSDP_ENABLED=1
export TORCHTITAN_CONTEXT_PARALLEL_SIZE=1
export GLOO_SOCKET_IFNAME=lo
exec torchrun --nnodes 2 --rdzv-backend static --node-rank "${NODE_RANK}" --master-addr "${MASTER_ADDR}" --master-port "${MASTER_PORT}" --nproc-per-node 2 --max-restarts 0 tests/conformance/test_torchtitan.py --job.config_file "${MDC_OUT}/launch/torchtitan.toml" --parallelism.data_parallel_replicate_degree 1 --parallelism.data_parallel_shard_degree 2 --parallelism.tensor_parallel_degree 2 --parallelism.pipeline_parallel_degree 1 --parallelism.context_parallel_degree 1 --parallelism.expert_parallel_degree 1 --training.local_batch_size 2 --training.global_batch_size 8
