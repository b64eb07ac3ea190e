#!/usr/bin/env bash
# One rank of job 'mpi-local-1x4' (4 in all, 4 per node), started by an MPI
# launcher. Maps its variables onto torch's env:// contract and runs the arguments:
#   Open MPI   OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE
#   MPICH      PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS (Hydra)
#   SLURM      SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NTASKS_PER_NODE,
#              SLURM_NODEID (srun, also srun --mpi=pmix)
#   PMIx       PMIX_RANK (sizes from the plan)
# RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE; GROUP_RANK and NODE_RANK = the
# node's index (SLURM_NODEID, else RANK / LOCAL_WORLD_SIZE: ranks are placed in
# blocks of LOCAL_WORLD_SIZE per node).
set -euo pipefail
node=""
if [[ -n "${OMPI_COMM_WORLD_RANK:-}" ]]; then
  from="Open MPI (OMPI_COMM_WORLD_*)"
  rank="$OMPI_COMM_WORLD_RANK" size="${OMPI_COMM_WORLD_SIZE:-}"
  local_rank="${OMPI_COMM_WORLD_LOCAL_RANK:-}" local_size="${OMPI_COMM_WORLD_LOCAL_SIZE:-}"
elif [[ -n "${PMI_RANK:-}" && -n "${PMI_SIZE:-}" ]]; then
  from="PMI (PMI_RANK, PMI_SIZE)"
  rank="$PMI_RANK" size="$PMI_SIZE"
  local_rank="${MPI_LOCALRANKID:-}" local_size="${MPI_LOCALNRANKS:-}"
elif [[ -n "${SLURM_PROCID:-}" && -n "${SLURM_NTASKS:-}" ]]; then
  from="SLURM (SLURM_PROCID, SLURM_NTASKS)"
  rank="$SLURM_PROCID" size="$SLURM_NTASKS"
  local_rank="${SLURM_LOCALID:-}" local_size="${SLURM_NTASKS_PER_NODE:-}"
  node="${SLURM_NODEID:-}"
elif [[ -n "${PMIX_RANK:-}" ]]; then
  from="PMIx (PMIX_RANK)"
  rank="$PMIX_RANK" size="" local_rank="" local_size=""
else
  echo "mdc: launch/mpi_rank.sh found no MPI rank variables (OMPI_COMM_WORLD_RANK; PMI_RANK and PMI_SIZE; SLURM_PROCID and SLURM_NTASKS; PMIX_RANK): it runs under mpirun or srun, started by launch/mpirun.sh" >&2
  exit 2
fi
for value in "$rank" "$size" "$local_rank" "$local_size" "$node"; do
  if [[ -n "$value" && ! "$value" =~ ^[0-9]+$ ]]; then
    echo "mdc: $from gave a rank variable that is not a number: '$value'" >&2
    exit 2
  fi
done
size="${size:-4}"
local_size="${local_size:-4}"
if ((local_size == 0)); then
  echo "mdc: $from says this node runs 0 ranks" >&2
  exit 2
fi
local_rank="${local_rank:-$((rank % local_size))}"
node="${node:-$((rank / local_size))}"
if ((size != 4)); then
  echo "mdc: $from started $size ranks; job 'mpi-local-1x4' has 4 ranks (1 x 4)" >&2
  exit 2
fi
export RANK="$rank" WORLD_SIZE="$size" LOCAL_RANK="$local_rank" LOCAL_WORLD_SIZE="$local_size"
export GROUP_RANK="$node" NODE_RANK="$node"
exec "$@"
