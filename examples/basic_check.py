"""A program for the basic launcher: it reads --world_size/--rank and joins the group itself.

It calls init_process_group("gloo") with the rank and world size from its
arguments (and --init_method when the launcher passes one; otherwise env://,
which reads MASTER_ADDR and MASTER_PORT), all-reduces its rank, and prints one
JSON line: its arguments, the environment the launcher gave it, and what the
process group says. If DDP_CHECK_DIR is set it also writes that line to
DDP_CHECK_DIR/rank-<rank>.json.
"""

import argparse
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "MASTER_PORT")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--world_size", type=int, required=True)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--init_method", default="env://")
    args = parser.parse_args()

    dist.init_process_group(
        "gloo", init_method=args.init_method, world_size=args.world_size, rank=args.rank
    )
    rank, world = dist.get_rank(), dist.get_world_size()
    total = torch.tensor([float(rank)])
    dist.all_reduce(total)
    assert total.item() == world * (world - 1) / 2, total

    report: dict[str, object] = {name: int(os.environ[name]) for name in ENV}
    report.update(
        arg_rank=args.rank,
        arg_world_size=args.world_size,
        init_method=args.init_method,
        dist_rank=rank,
        dist_world_size=world,
        allreduce=total.item(),
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
