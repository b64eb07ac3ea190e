"""A tiny distributed check for CPU runs: gloo all-reduce plus one DDP step.

Every rank prints one JSON line with what torchrun gave it; if DDP_CHECK_DIR
is set, it also writes that line to DDP_CHECK_DIR/rank-<RANK>.json.
"""

import json
import os
from pathlib import Path

import torch
import torch.distributed as dist


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    total = torch.tensor([float(rank)])
    dist.all_reduce(total)
    assert total.item() == world * (world - 1) / 2, total

    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
    model(torch.full((2, 4), float(rank))).sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    for grad in grads:  # DDP averaged them: every rank holds the same values
        reference = grad.clone()
        dist.broadcast(reference, src=0)
        assert torch.equal(grad, reference)

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


if __name__ == "__main__":
    main()
