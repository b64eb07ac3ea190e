"""What one worker sees under SLURM: torchrun's and SLURM's variables, and a gloo all-reduce.

Writes PROBE_DIR/rank-<RANK>.json. Run by the slurm backend's real-job tests.
"""

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

NAMES = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "NODE_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "SLURM_NODEID",
    "SLURM_PROCID",
    "SLURM_LOCALID",
    "SLURMD_NODENAME",
    "SLURM_JOB_ID",
    "CUDA_VISIBLE_DEVICES",
)


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    total = torch.tensor([float(rank)])
    dist.all_reduce(total)
    report = {name: os.environ.get(name) for name in NAMES}
    report.update(dist_rank=rank, dist_world_size=world, allreduce=total.item())
    Path(os.environ["PROBE_DIR"], f"rank-{rank}.json").write_text(
        json.dumps(report, sort_keys=True) + "\n", encoding="utf-8"
    )
    # every rank is done before any closes its gloo connections: a peer still tearing
    # down when another's sockets close aborts ("terminate called without an active exception")
    dist.barrier()
    dist.destroy_process_group()
    # torch 2.13's gloo can still abort the same way in interpreter finalization, after
    # everything is written (seen under load, with no Python frame left): skip it
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
