"""A stand-in for a Megatron-LM training script, started by the megatron launcher.

It reads the Megatron-LM arguments the launcher appends (unknown ones are left
alone, as a wrapper script would), checks them and the launcher's environment
(TENSOR_MODEL_PARALLEL_SIZE, PIPELINE_MODEL_PARALLEL_SIZE, CONTEXT_PARALLEL_SIZE)
against the compiled plan.json (PROBE_PLAN), then forms every TP, PP, DP, CP
and DP-CP group the plan lists with torch.distributed.new_group (gloo; every
rank creates every group, in the same order) and all-reduces its rank in each
of its own groups. Writes PROBE_DIR/rank-<RANK>.json; exits non-zero on any
mismatch.
"""

import argparse
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

KINDS = ("tp", "pp", "dp", "cp", "dp-cp")


def megatron_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(allow_abbrev=False)
    parser.add_argument("--tensor-model-parallel-size", type=int, default=1)
    parser.add_argument("--pipeline-model-parallel-size", type=int, default=1)
    parser.add_argument("--context-parallel-size", type=int, default=1)
    parser.add_argument("--expert-model-parallel-size", type=int, default=1)
    parser.add_argument("--expert-tensor-parallel-size", type=int, default=None)
    parser.add_argument("--micro-batch-size", type=int, default=None)
    parser.add_argument("--global-batch-size", type=int, default=None)
    parser.add_argument("--use-tp-pp-dp-mapping", action="store_true")
    known, _ = parser.parse_known_args(argv)
    return known


def main() -> None:
    args = megatron_args(sys.argv[1:])
    plan = json.loads(Path(os.environ["PROBE_PLAN"]).read_text(encoding="utf-8"))
    sizes = plan["parallelism"]
    problems = []

    def expect(what: str, seen: object, wanted: object) -> None:
        if seen != wanted:
            problems.append(f"{what}: {seen!r}, plan.json says {wanted!r}")

    expect("--tensor-model-parallel-size", args.tensor_model_parallel_size, sizes["tp"])
    expect("--pipeline-model-parallel-size", args.pipeline_model_parallel_size, sizes["pp"])
    expect("--context-parallel-size", args.context_parallel_size, sizes["cp"])
    expect("--expert-model-parallel-size", args.expert_model_parallel_size, sizes["ep"])
    expect("--micro-batch-size", args.micro_batch_size, plan["batch"]["micro_batch_size"])
    expect("--global-batch-size", args.global_batch_size, plan["batch"]["global_batch_size"])
    expect("--use-tp-pp-dp-mapping", args.use_tp_pp_dp_mapping, sizes["order"] == "tp-cp-ep-pp-dp")
    for name, key in (
        ("TENSOR_MODEL_PARALLEL_SIZE", "tp"),
        ("PIPELINE_MODEL_PARALLEL_SIZE", "pp"),
        ("CONTEXT_PARALLEL_SIZE", "cp"),
    ):
        expect(name, os.environ.get(name), str(sizes[key]))
    expect("WORLD_SIZE", int(os.environ["WORLD_SIZE"]), plan["world_size"])

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    expect("RANK", rank, int(os.environ["RANK"]))
    mine: dict[str, list[int]] = {}
    sums: dict[str, float] = {}
    for kind in KINDS:
        for ranks in plan["groups"][kind]["ranks"]:
            group = dist.new_group(ranks)  # collective: every rank, every group, same order
            if rank in ranks:
                if kind in mine:
                    problems.append(f"rank {rank} is in two {kind} groups")
                mine[kind] = ranks
                total = torch.tensor([float(rank)])
                dist.all_reduce(total, group=group)
                sums[kind] = total.item()
                expect(f"{kind} all-reduce over {ranks}", total.item(), float(sum(ranks)))
        if kind not in mine:
            problems.append(f"rank {rank} is in no {kind} group")
    dist.barrier()
    report = {
        "rank": rank,
        "groups": mine,
        "sums": sums,
        "problems": problems,
        "node_rank": os.environ.get("NODE_RANK"),
        "group_rank": os.environ.get("GROUP_RANK"),
    }
    Path(os.environ["PROBE_DIR"], f"rank-{rank}.json").write_text(
        json.dumps(report, sort_keys=True) + "\n", encoding="utf-8"
    )
    # every rank is done before any closes its gloo connections: a peer still tearing
    # down when another's sockets close aborts ("terminate called without an active exception")
    dist.barrier()
    dist.destroy_process_group()
    if problems:
        print(f"megatron_probe rank {rank}: " + "; ".join(problems), file=sys.stderr)
    # torch 2.13's gloo can abort in interpreter finalization ("terminate called without an
    # active exception", seen under load, with no Python frame left): skip it
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1 if problems else 0)


if __name__ == "__main__":
    main()
