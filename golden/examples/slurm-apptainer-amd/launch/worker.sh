#!/usr/bin/env bash
# Role 'worker' of job 'rocm-elastic-pretrain' (nodes 0-3), launcher torchrun.
# The backend runs this once per node with NODE_RANK, MASTER_ADDR, MASTER_PORT, NODE_HOSTS
# and MDC_LAUNCH_ID set.
set -euo pipefail
: "${MASTER_ADDR:?MASTER_ADDR must be set by the backend}"
: "${MASTER_PORT:?MASTER_PORT must be set by the backend}"
export MAD_MULTI_NODE_RUNNER="torchrun --nnodes 2:4 --rdzv-backend c10d --rdzv-endpoint ${MASTER_ADDR}:${MASTER_PORT} --rdzv-id rocm-elastic-pretrain --rdzv-conf join_timeout=600 --nproc-per-node 8 --max-restarts 2"
export NNODES=4
export NPROC_PER_NODE=8
export MAD_RUNTIME_NGPUS=8
export NCCL_DEBUG=WARN
export HSA_FORCE_FINE_GRAIN_PCIE=1
cd /work
exec torchrun --nnodes 2:4 --rdzv-backend c10d --rdzv-endpoint "${MASTER_ADDR}:${MASTER_PORT}" --rdzv-id rocm-elastic-pretrain --rdzv-conf join_timeout=600 --nproc-per-node 8 --max-restarts 2 --module trainer.pretrain --config /work/configs/pretrain.yaml
