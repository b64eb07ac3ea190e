#!/usr/bin/env bash
# Starts all 16 ranks of job 'mpi-ssh-2x8' from node 0 with mpirun (2 node(s) x 8); each rank runs
# launch/mpi_rank.sh with the job's command as its arguments. launch/worker.sh runs
# this on every node; the other nodes have nothing to start and exit 0.
set -euo pipefail
: "${NODE_RANK:?NODE_RANK must be set by the backend}"
if (($# == 0)); then
  echo "mdc: launch/mpirun.sh needs the command to run as its arguments" >&2
  exit 2
fi
if ((NODE_RANK != 0)); then
  echo "mdc: node $NODE_RANK: node 0 starts this node's 8 rank(s) with mpirun; nothing to run here" >&2
  exit 0
fi
: "${NODE_HOSTS:?NODE_HOSTS must be set by the backend}"
read -r -a hosts <<< "$NODE_HOSTS"
if ((${#hosts[@]} != 2)); then
  echo "mdc: NODE_HOSTS names ${#hosts[@]} host(s); the plan has 2 node(s)" >&2
  exit 2
fi
# host0:8,host1:8,... in node order; Open MPI adds up the slots of a host
# named twice (the local backend's nodes are all 127.0.0.1).
host_list=
for host in "${hosts[@]}"; do
  host_list+="${host_list:+,}$host:8"
done
exec /opt/openmpi/bin/mpirun \
  -np 16 \
  -H "${host_list}" \
  --map-by slot \
  --bind-to socket \
  --allow-run-as-root \
  --mca btl_tcp_if_include eth0 \
  --mca plm_rsh_args '-p 2222' \
  -x MASTER_ADDR \
  -x MASTER_PORT \
  -x LD_LIBRARY_PATH \
  -x NCCL_DEBUG \
  -x NCCL_SOCKET_IFNAME \
  -x PATH \
  --report-bindings \
  bash "${MDC_OUT}/launch/mpi_rank.sh" "$@"
