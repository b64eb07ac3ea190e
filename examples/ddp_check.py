"""A tiny distributed check for CPU runs: gloo all-reduce plus one DDP step.

Every rank prints one JSON line with what torchrun gave it; if DDP_CHECK_DIR
is set, it also writes that line to DDP_CHECK_DIR/rank-<RANK>.json.
"""

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist


def ddp_step(rank: int) -> None:
    """One DDP forward and backward; the gradients DDP averaged are the same on every rank.
    The DDP module (its reducer holds the process group) is freed on return, before the
    group is destroyed, so no gloo work outlives it into interpreter shutdown."""
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
    model(torch.full((2, 4), float(rank))).sum().backward()
    for param in model.parameters():
        reference = param.grad.clone()
        dist.broadcast(reference, src=0)
        assert torch.equal(param.grad, reference)


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    total = torch.tensor([float(rank)])
    dist.all_reduce(total)
    assert total.item() == world * (world - 1) / 2, total

    ddp_step(rank)

    report = {
        name: int(os.environ[name])
        for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK")
    }
    report.update(
        dist_rank=rank,
        dist_world_size=world,
        allreduce=total.item(),
        master_port=int(os.environ["MASTER_PORT"]),
    )
    line = json.dumps(report, sort_keys=True)
    print(line, flush=True)
    if os.environ.get("DDP_CHECK_DIR"):
        Path(os.environ["DDP_CHECK_DIR"], f"rank-{rank}.json").write_text(line + "\n")
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
