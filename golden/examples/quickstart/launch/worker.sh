#!/usr/bin/env bash
# Role 'worker' of job 'quickstart' (node 0), launcher torchrun.
# The backend runs this once per node with NODE_RANK, MASTER_ADDR, MASTER_PORT, NODE_HOSTS
# and MDC_LAUNCH_ID set.
set -euo pipefail
export MAD_MULTI_NODE_RUNNER="torchrun --standalone --nnodes 1 --nproc-per-node 2 --max-restarts 0"
export NNODES=1
export NPROC_PER_NODE=2
export MAD_RUNTIME_NGPUS=2
export GLOO_SOCKET_IFNAME=lo
exec torchrun --standalone --nnodes 1 --nproc-per-node 2 --max-restarts 0 examples/ddp_check.py
