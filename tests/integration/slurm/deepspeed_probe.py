"""A stand-in for a DeepSpeed training script, started by the deepspeed launcher.

Checks the DeepSpeed launcher's environment contract (RANK, LOCAL_RANK,
WORLD_SIZE, LOCAL_SIZE, CROSS_RANK, CROSS_SIZE, MASTER_ADDR, MASTER_PORT)
against the compiled plan.json (PROBE_PLAN) and the node rank, reads the
``--deepspeed_config FILE`` the launcher appends and checks its batch triad
against the plan, then lets DeepSpeed itself start (``deepspeed.init_distributed``
on gloo) and validate the file (``DeepSpeedConfig``, which checks the triad
against the real world size). Writes PROBE_DIR/rank-<RANK>.json; exits
non-zero on any mismatch.
"""

import argparse
import json
import os
import sys
from pathlib import Path

import torch


def main() -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False)
    parser.add_argument("--deepspeed", action="store_true")
    parser.add_argument("--deepspeed_config", default=None)
    parser.add_argument("--local_rank", type=int, default=None)
    args, _ = parser.parse_known_args()
    plan = json.loads(Path(os.environ["PROBE_PLAN"]).read_text(encoding="utf-8"))
    nproc, nnodes = plan["nproc_per_node"], plan["nnodes"]
    env = {
        name: os.environ.get(name)
        for name in (
            "RANK",
            "LOCAL_RANK",
            "WORLD_SIZE",
            "LOCAL_SIZE",
            "CROSS_RANK",
            "CROSS_SIZE",
            "MASTER_ADDR",
            "MASTER_PORT",
            "NODE_RANK",
            "MDC_DEEPSPEED_CONFIG",
        )
    }
    problems = []

    def expect(what: str, seen: object, wanted: object) -> None:
        if seen != wanted:
            problems.append(f"{what}: {seen!r}, expected {wanted!r}")

    expect("--deepspeed", args.deepspeed, True)
    expect("WORLD_SIZE", env["WORLD_SIZE"], str(plan["world_size"]))
    expect("LOCAL_SIZE", env["LOCAL_SIZE"], str(nproc))
    expect("CROSS_SIZE", env["CROSS_SIZE"], str(nnodes))
    expect("CROSS_RANK", env["CROSS_RANK"], env["NODE_RANK"])
    rank, local = int(env["RANK"] or -1), int(env["LOCAL_RANK"] or -1)
    expect("RANK", rank, int(env["NODE_RANK"] or -1) * nproc + local)
    expect("MASTER_PORT", env["MASTER_PORT"], str(plan["rendezvous"]["master_port"]))
    if args.local_rank is not None:
        expect("--local_rank", args.local_rank, local)
    config_path = Path(args.deepspeed_config or "")
    expect("--deepspeed_config is a file", config_path.is_file(), True)
    expect("MDC_DEEPSPEED_CONFIG", env["MDC_DEEPSPEED_CONFIG"], str(config_path))
    config = json.loads(config_path.read_text(encoding="utf-8")) if config_path.is_file() else {}
    batch = plan["batch"]
    expect("train_batch_size", config.get("train_batch_size"), batch["global_batch_size"])
    expect(
        "train_micro_batch_size_per_gpu",
        config.get("train_micro_batch_size_per_gpu"),
        batch["micro_batch_size"],
    )
    expect(
        "gradient_accumulation_steps",
        config.get("gradient_accumulation_steps"),
        batch["grad_accum_steps"],
    )

    import deepspeed  # DeepSpeed starts the process group from the launcher's variables
    import torch.distributed as dist
    from deepspeed.runtime.config import DeepSpeedConfig, DeepSpeedConfigError

    deepspeed.init_distributed(dist_backend="gloo")
    expect("dist rank", dist.get_rank(), rank)
    expect("dist world size", dist.get_world_size(), plan["world_size"])
    total = torch.tensor([float(rank)])
    dist.all_reduce(total)
    world = plan["world_size"]
    expect("all-reduce", total.item(), world * (world - 1) / 2)
    try:
        checked = DeepSpeedConfig(str(config_path))
        expect(
            "DeepSpeedConfig train_batch_size", checked.train_batch_size, batch["global_batch_size"]
        )
    except (AssertionError, ValueError, DeepSpeedConfigError) as exc:  # DeepSpeed's words
        problems.append(f"DeepSpeedConfig refused {config_path}: {exc}")
    report = {"rank": rank, "env": env, "config": str(config_path), "problems": problems}
    Path(os.environ["PROBE_DIR"], f"rank-{rank}.json").write_text(
        json.dumps(report, sort_keys=True) + "\n", encoding="utf-8"
    )
    dist.barrier()
    dist.destroy_process_group()
    if problems:
        print(f"deepspeed_probe rank {rank}: " + "; ".join(problems), file=sys.stderr)
    # torch 2.13's gloo can abort in interpreter finalization ("terminate called without an
    # active exception", seen under load, with no Python frame left): skip it
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1 if problems else 0)


if __name__ == "__main__":
    main()
