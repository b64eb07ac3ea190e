#!/usr/bin/env bash
# Role 'worker' of job 'llama32-1b-ddp' (node 0), launcher torchrun.
# The backend runs this once per node with NODE_RANK, MASTER_ADDR, MASTER_PORT, NODE_HOSTS
# and MDC_LAUNCH_ID set.
set -euo pipefail
export MAD_MULTI_NODE_RUNNER="torchrun --standalone --nnodes 1 --nproc-per-node 8 --max-restarts 0"
export NNODES=1
export NPROC_PER_NODE=8
export MAD_RUNTIME_NGPUS=8
exec torchrun --standalone --nnodes 1 --nproc-per-node 8 --max-restarts 0 train.py --data-path /data/corpus
