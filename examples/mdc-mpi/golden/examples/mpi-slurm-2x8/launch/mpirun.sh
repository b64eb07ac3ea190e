#!/usr/bin/env bash
# Starts all 16 ranks of job 'mpi-slurm-2x8' from node 0 with srun (2 node(s) x 8); each rank runs
# launch/mpi_rank.sh with the job's command as its arguments. launch/worker.sh runs
# this on every node; the other nodes have nothing to start and exit 0.
set -euo pipefail
: "${NODE_RANK:?NODE_RANK must be set by the backend}"
if (($# == 0)); then
  echo "mdc: launch/mpirun.sh needs the command to run as its arguments" >&2
  exit 2
fi
if ((NODE_RANK != 0)); then
  echo "mdc: node $NODE_RANK: node 0 starts this node's 8 rank(s) with srun; nothing to run here" >&2
  exit 0
fi
if [[ -z "${SLURM_JOB_ID:-}" ]]; then
  echo "mdc: the srun starter runs inside a SLURM allocation (slurm/job.sbatch)" >&2
  exit 2
fi
exec srun \
  --overlap \
  --nodes=2 \
  --ntasks=16 \
  --ntasks-per-node=8 \
  --cpus-per-task=1 \
  --distribution=block \
  --kill-on-bad-exit=1 \
  --mpi=pmix \
  bash "${MDC_OUT}/launch/mpi_rank.sh" "$@"
