#!/usr/bin/env bash
# Starts all 4 ranks of job 'mpi-local-1x4' from node 0 with mpirun (1 node(s) x 4); each rank runs
# launch/mpi_rank.sh with the job's command as its arguments. launch/worker.sh runs
# this on every node; the other nodes have nothing to start and exit 0.
set -euo pipefail
: "${NODE_RANK:?NODE_RANK must be set by the backend}"
if (($# == 0)); then
  echo "mdc: launch/mpirun.sh needs the command to run as its arguments" >&2
  exit 2
fi
if ((NODE_RANK != 0)); then
  echo "mdc: node $NODE_RANK: node 0 starts this node's 4 rank(s) with mpirun; nothing to run here" >&2
  exit 0
fi
: "${NODE_HOSTS:?NODE_HOSTS must be set by the backend}"
read -r -a hosts <<< "$NODE_HOSTS"
if ((${#hosts[@]} != 1)); then
  echo "mdc: NODE_HOSTS names ${#hosts[@]} host(s); the plan has 1 node(s)" >&2
  exit 2
fi
# host0:4,host1:4,... in node order; Open MPI adds up the slots of a host
# named twice (the local backend's nodes are all 127.0.0.1).
host_list=
for host in "${hosts[@]}"; do
  host_list+="${host_list:+,}$host:4"
done
exec mpirun \
  -np 4 \
  -H "${host_list}" \
  --map-by slot \
  --bind-to none \
  --oversubscribe \
  -x MASTER_ADDR \
  -x MASTER_PORT \
  -x GLOO_SOCKET_IFNAME \
  bash "${MDC_OUT}/launch/mpi_rank.sh" "$@"
