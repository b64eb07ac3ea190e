"""A program for the mpirun launcher: torch's env:// rendezvous from the variables
launch/mpi_rank.sh derived from the MPI launcher's own.

It calls init_process_group("gloo", init_method="env://"), all-reduces its rank, checks
that torch's rank and world size are the ones the environment named, and prints one JSON
line with both. If MPI_CHECK_DIR is set it also writes the line to MPI_CHECK_DIR/rank-<rank>.json.
"""

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

ENV = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "NODE_RANK",
    "MASTER_PORT",
)


def main() -> None:
    dist.init_process_group("gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    total = torch.tensor([float(rank)])
    dist.all_reduce(total)
    report: dict[str, object] = {name: int(os.environ[name]) for name in ENV}
    # the rank the MPI launcher itself gave this process (Open MPI's, or srun's)
    launcher_rank = os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("SLURM_PROCID"))
    report.update(
        dist_rank=rank,
        dist_world_size=world,
        allreduce=total.item(),
        launcher_rank=int(launcher_rank or -1),
    )
    assert rank == report["RANK"] and world == report["WORLD_SIZE"], report
    assert total.item() == world * (world - 1) / 2, report
    line = json.dumps(report, sort_keys=True)
    print(line, flush=True)
    if os.environ.get("MPI_CHECK_DIR"):
        Path(os.environ["MPI_CHECK_DIR"], f"rank-{rank}.json").write_text(line + "\n")
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
