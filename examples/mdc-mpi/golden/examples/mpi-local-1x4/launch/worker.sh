#!/usr/bin/env bash
# Role 'worker' of job 'mpi-local-1x4' (node 0), launcher mpirun.
# The backend runs this once per node with NODE_RANK, MASTER_ADDR, MASTER_PORT, NODE_HOSTS
# and MDC_LAUNCH_ID set.
set -euo pipefail
MDC_OUT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export MDC_OUT
: "${NODE_RANK:?NODE_RANK must be set by the backend}"
: "${MASTER_ADDR:?MASTER_ADDR must be set by the backend}"
: "${MASTER_PORT:?MASTER_PORT must be set by the backend}"
: "${NODE_HOSTS:?NODE_HOSTS must be set by the backend}"
export NODE_RANK="${NODE_RANK}"
export MASTER_ADDR="${MASTER_ADDR}"
export MASTER_PORT="${MASTER_PORT}"
export NODE_HOSTS="${NODE_HOSTS}"
export GLOO_SOCKET_IFNAME=lo
exec bash "${MDC_OUT}/launch/mpirun.sh" python examples/mpi_check.py
