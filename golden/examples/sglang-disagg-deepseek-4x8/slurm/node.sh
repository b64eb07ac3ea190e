#!/usr/bin/env bash
# One srun task per node of job 'deepseek-v3-pd': NODE_RANK is SLURM_NODEID (0 on the first host, MASTER_ADDR),
# then the node's role runs: launch/<role>.sh. Started by slurm/job.sbatch.
set -euo pipefail
if [[ -z "${SLURM_NODEID:-}" || -z "${MASTER_ADDR:-}" || -z "${MASTER_PORT:-}" ]]; then
  echo "mdc: slurm/node.sh is run by slurm/job.sbatch through srun" >&2
  exit 2
fi
if [[ "${SLURM_LOCALID:-0}" != 0 ]]; then
  echo "mdc: more than one task on node $SLURM_NODEID; the plan runs one per node" >&2
  exit 2
fi
out="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export NODE_RANK="$SLURM_NODEID"
if ((NODE_RANK < 2)); then script=launch/prefill.sh
else script=launch/decode.sh
fi
exec bash "${out}/${script}"
