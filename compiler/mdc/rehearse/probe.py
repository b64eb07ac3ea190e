"""The program ``mdc rehearse`` runs in place of the job's own: one process per rank.

Started by the compiled launcher exactly as the user's program would be (``python -m
mdc.rehearse.probe`` plus whatever arguments the launcher appends), it checks what the
launcher handed it against the compiled ``plan.json``:

- RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE and the node it runs on (rank =
  node x nproc_per_node + local rank; under a join-order rendezvous the node's
  GROUP_RANK instead, which the parent checks is a permutation);
- every ``worker_env`` entry of the plan that names a value (``"2"``, ``"cpu"``,
  ``"NODE_RANK"``, a range ``"0..7"``);
- the launcher's own arguments it recognises: Megatron-LM's sizes and batch,
  DeepSpeed's ``--deepspeed_config`` (train_batch_size = micro x accumulation x dp)
  and ``--local_rank``, the basic launcher's ``--world_size``/``--rank``, TorchTitan's
  ``--parallelism.*``/``--training.*`` overrides;
- then ``init_process_group("gloo")``, ``new_group`` for every group of every kind the
  plan lists (every rank creates every group, in the same order) and an all-reduce of
  ``[rank, 1]`` inside each of its own groups: the sum must be the members' ranks and
  their count.

Each rank writes one JSON report, ``$MDC_REHEARSE_RESULTS/rank-<RANK>.json``, and exits 1
when it found a mismatch. Only this module imports torch, and only in the workers.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

from mdc.runtime import RUNTIME_VARIABLES

#: what a launcher sets for each rank (torchrun's names; the other launchers map theirs)
RANK_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK")
#: environment variables the report copies, when set: the rank's, the node's (set by the
#: backend), then other launchers' own
REPORTED = (
    *RANK_VARIABLES,
    *RUNTIME_VARIABLES,
    "LOCAL_SIZE",
    "CROSS_RANK",
    "CROSS_SIZE",
    "SLURM_NODEID",
    "JOB_COMPLETION_INDEX",
)
#: worker_env descriptions that are not a value the probe can compare
RANGE = re.compile(r"(\d+)\.\.(\d+)")
LITERAL = re.compile(r"[^\s*+]+")
VARIABLE = re.compile(r"[A-Z][A-Z0-9_]*_RANK")


def _arguments(argv: list[str]) -> argparse.Namespace:
    """The launcher-added arguments the probe knows; the rest are left alone."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    add = parser.add_argument
    for flag in (
        "--tensor-model-parallel-size",
        "--pipeline-model-parallel-size",
        "--context-parallel-size",
        "--expert-model-parallel-size",
        "--expert-tensor-parallel-size",
        "--num-virtual-stages-per-pipeline-rank",
        "--micro-batch-size",
        "--global-batch-size",
        "--world_size",
        "--rank",
        "--local_rank",
        "--parallelism.tensor_parallel_degree",
        "--parallelism.pipeline_parallel_degree",
        "--parallelism.context_parallel_degree",
        "--parallelism.expert_parallel_degree",
        "--training.local_batch_size",
        "--training.global_batch_size",
    ):
        add(flag, type=int, default=None)
    add("--use-tp-pp-dp-mapping", action="store_true")
    add("--deepspeed", action="store_true")
    add("--deepspeed_config", default=None)
    known, _ = parser.parse_known_args(argv)
    return known


class Probe:
    def __init__(self, plan: dict[str, Any], argv: list[str]) -> None:
        self.plan, self.argv = plan, argv
        self.problems: list[str] = []
        self.node = int(os.environ.get("MDC_REHEARSE_NODE", "-1"))

    def expect(self, what: str, seen: object, wanted: object) -> None:
        if seen != wanted:
            self.problems.append(f"{what} is {seen!r}, plan.json says {wanted!r}")

    def env_int(self, name: str) -> int | None:
        value = os.environ.get(name)
        if value is None:
            self.problems.append(f"{name} is not set")
            return None
        try:
            return int(value)
        except ValueError:
            self.problems.append(f"{name} is {value!r}, not an integer")
            return None

    # -- what the launcher gave this process ------------------------------------------------

    def join_order(self) -> bool:
        """Whether the plan says node ranks follow the rendezvous' join order (c10d)."""
        described = str(self.plan.get("worker_env", {}).get("GROUP_RANK", ""))
        return "join order" in described or "rendezvous" in described

    def check_ranks(self) -> tuple[int, int]:
        plan = self.plan
        nproc, world = plan["nproc_per_node"], plan["world_size"]
        rank, local = self.env_int("RANK"), self.env_int("LOCAL_RANK")
        self.expect("WORLD_SIZE", self.env_int("WORLD_SIZE"), world)
        if "LOCAL_WORLD_SIZE" in os.environ:
            self.expect("LOCAL_WORLD_SIZE", self.env_int("LOCAL_WORLD_SIZE"), nproc)
        if rank is None or local is None:
            return -1, -1
        if not 0 <= local < nproc:
            self.problems.append(f"LOCAL_RANK is {local}, outside 0..{nproc - 1}")
        if self.join_order():
            group = self.env_int("GROUP_RANK")
            if group is not None:
                self.expect(
                    f"RANK (GROUP_RANK {group} x {nproc} + LOCAL_RANK {local})",
                    rank,
                    group * nproc + local,
                )
        else:
            self.expect(
                f"RANK of local rank {local} on node {self.node} (node x {nproc} + local rank)",
                rank,
                self.node * nproc + local,
            )
            hosts = os.environ.get("NODE_HOSTS", "").split()
            described = str(self.plan.get("worker_env", {}).get("MASTER_ADDR", ""))
            if hosts and "MASTER_ADDR" in os.environ and described.startswith("node 0"):
                self.expect(
                    "MASTER_ADDR (node 0's host in NODE_HOSTS)", os.environ["MASTER_ADDR"], hosts[0]
                )
        if "NODE_RANK" in os.environ:
            self.expect(f"NODE_RANK on node {self.node}", self.env_int("NODE_RANK"), self.node)
        return rank, local

    def check_worker_env(self) -> None:
        """Every worker_env entry that names a value, a variable or a range."""
        for name, described in sorted(self.plan.get("worker_env", {}).items()):
            head = str(described).split(" (", 1)[0].strip()
            seen = os.environ.get(name)
            span = RANGE.fullmatch(head)
            if name in ("RANK", "MASTER_ADDR") or not LITERAL.fullmatch(head):
                continue  # a formula or words: RANK is checked above
            if seen is None:
                self.problems.append(f"{name} is not set; plan.json's worker_env says {head!r}")
            elif span:
                if not (seen.isdigit() and int(span[1]) <= int(seen) <= int(span[2])):
                    self.problems.append(f"{name} is {seen!r}, outside {head}")
            elif head == "NODE_RANK":
                if not self.join_order() or name != "GROUP_RANK":
                    self.expect(f"{name} (this node's rank)", seen, str(self.node))
            elif VARIABLE.fullmatch(head):
                self.expect(f"{name} (= {head})", seen, os.environ.get(head))
            else:
                self.expect(name, seen, head)

    def check_arguments(self, rank: int, local: int) -> None:
        plan, args = self.plan, _arguments(self.argv)
        sizes, batch = plan["parallelism"], plan.get("batch")
        pairs: list[tuple[str, object, object]] = [
            ("--tensor-model-parallel-size", args.tensor_model_parallel_size, sizes["tp"]),
            ("--pipeline-model-parallel-size", args.pipeline_model_parallel_size, sizes["pp"]),
            ("--context-parallel-size", args.context_parallel_size, sizes["cp"]),
            ("--expert-model-parallel-size", args.expert_model_parallel_size, sizes["ep"]),
            ("--expert-tensor-parallel-size", args.expert_tensor_parallel_size, sizes["etp"]),
            (
                "--num-virtual-stages-per-pipeline-rank",
                args.num_virtual_stages_per_pipeline_rank,
                sizes.get("vpp"),
            ),
            (
                "--parallelism.tensor_parallel_degree",
                getattr(args, "parallelism.tensor_parallel_degree"),
                sizes["tp"],
            ),
            (
                "--parallelism.pipeline_parallel_degree",
                getattr(args, "parallelism.pipeline_parallel_degree"),
                sizes["pp"],
            ),
            (
                "--parallelism.context_parallel_degree",
                getattr(args, "parallelism.context_parallel_degree"),
                sizes["cp"],
            ),
            (
                "--parallelism.expert_parallel_degree",
                getattr(args, "parallelism.expert_parallel_degree"),
                sizes["ep"],
            ),
            ("--world_size", args.world_size, plan["world_size"]),
            ("--rank", args.rank, rank),
            ("--local_rank", args.local_rank, local),
        ]
        if batch:
            pairs += [
                ("--micro-batch-size", args.micro_batch_size, batch["micro_batch_size"]),
                ("--global-batch-size", args.global_batch_size, batch["global_batch_size"]),
                (
                    "--training.local_batch_size",
                    getattr(args, "training.local_batch_size"),
                    batch["micro_batch_size"],
                ),
                (
                    "--training.global_batch_size",
                    getattr(args, "training.global_batch_size"),
                    batch["global_batch_size"],
                ),
            ]
        for flag, seen, wanted in pairs:
            if seen is not None:
                self.expect(flag, seen, wanted)
        if plan["launcher"] == "megatron":
            self.expect(
                "--use-tp-pp-dp-mapping",
                args.use_tp_pp_dp_mapping,
                sizes["order"] == "tp-cp-ep-pp-dp",
            )
        if args.deepspeed_config is not None:
            self.check_ds_config(Path(args.deepspeed_config))

    def check_ds_config(self, path: Path) -> None:
        try:
            config = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            self.problems.append(f"--deepspeed_config {path}: cannot read it: {exc}")
            return
        batch, dp = self.plan.get("batch"), self.plan["parallelism"]["dp"]
        micro = config.get("train_micro_batch_size_per_gpu")
        steps = config.get("gradient_accumulation_steps")
        total = config.get("train_batch_size")
        if isinstance(micro, int) and isinstance(steps, int):
            self.expect(
                f"ds_config train_batch_size (micro {micro} x accumulation {steps} x dp {dp})",
                total,
                micro * steps * dp,
            )
        if batch:
            self.expect("ds_config train_batch_size", total, batch["global_batch_size"])
            self.expect(
                "ds_config train_micro_batch_size_per_gpu", micro, batch["micro_batch_size"]
            )
            self.expect("ds_config gradient_accumulation_steps", steps, batch["grad_accum_steps"])
        named = os.environ.get("MDC_DEEPSPEED_CONFIG")
        if named is not None:
            self.expect("MDC_DEEPSPEED_CONFIG", named, str(path))

    # -- the process groups -----------------------------------------------------------------

    def check_groups(self, rank: int) -> dict[str, Any]:
        torch = importlib.import_module("torch")  # only here, in the workers
        dist = importlib.import_module("torch.distributed")
        timeout = timedelta(seconds=float(os.environ.get("MDC_REHEARSE_GROUP_TIMEOUT", "120")))
        dist.init_process_group("gloo", timeout=timeout)
        self.expect("torch.distributed rank", dist.get_rank(), rank)
        self.expect("torch.distributed world size", dist.get_world_size(), self.plan["world_size"])
        me = dist.get_rank()
        built, mine = 0, {}
        for kind, listed in sorted(self.plan.get("groups", {}).items()):
            groups = listed.get("ranks")
            if groups is None:
                self.problems.append(f"plan.json does not list the {kind} groups' ranks")
                continue
            member_of = []
            for ranks in groups:
                group = dist.new_group(ranks)  # collective: every rank, every group, same order
                built += 1
                if me in ranks:
                    member_of.append(ranks)
                    total = torch.tensor([float(me), 1.0], dtype=torch.float64)
                    dist.all_reduce(total, group=group)
                    self.expect(
                        f"{kind} all-reduce over ranks {ranks} (sum of ranks, count)",
                        [int(total[0].item()), int(total[1].item())],
                        [sum(ranks), len(ranks)],
                    )
                    if len(ranks) != listed.get("size"):
                        self.problems.append(
                            f"{kind} group {ranks} has {len(ranks)} ranks, "
                            f"plan.json says size {listed.get('size')}"
                        )
            if len(member_of) != 1:
                self.problems.append(
                    f"rank {me} is in {len(member_of)} {kind} groups "
                    f"({member_of}), expected exactly 1"
                )
            mine[kind] = member_of[0] if member_of else None
        world = self.plan["world_size"]
        total = torch.tensor([float(me)], dtype=torch.float64)
        dist.all_reduce(total)
        self.expect("world all-reduce (sum of ranks)", int(total.item()), world * (world - 1) // 2)
        return {"built": built, "mine": mine}


def _write(results: Path, name: str, report: dict[str, Any]) -> None:
    path = results / name
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(report, sort_keys=True) + "\n", encoding="utf-8")
    tmp.replace(path)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    started = time.monotonic()
    results = Path(os.environ["MDC_REHEARSE_RESULTS"])
    label = os.environ.get("RANK", f"pid{os.getpid()}")
    (results / "up").mkdir(parents=True, exist_ok=True)
    (results / "up" / label).touch()
    plan = json.loads(Path(os.environ["MDC_REHEARSE_PLAN"]).read_text(encoding="utf-8"))
    probe = Probe(plan, argv)
    report: dict[str, Any] = {
        "rank": label,
        "node": probe.node,
        "host": os.environ.get("MDC_REHEARSE_HOST"),
        "argv": argv,
        "env": {k: os.environ[k] for k in REPORTED if k in os.environ},
    }
    groups: dict[str, Any] = {}
    try:
        rank, local = probe.check_ranks()
        probe.check_worker_env()
        probe.check_arguments(rank, local)
        if rank >= 0:
            groups = probe.check_groups(rank)
    except Exception as exc:  # noqa: BLE001 - whatever fails is reported by rank, never hangs
        probe.problems.append(f"{type(exc).__name__}: {exc}")
        report["traceback"] = traceback.format_exc()
    report.update(
        problems=probe.problems, groups=groups, seconds=round(time.monotonic() - started, 2)
    )
    _write(results, f"rank-{label}.json", report)
    if groups:
        dist = importlib.import_module("torch.distributed")
        dist.barrier()  # every rank has written its report before any exits
        dist.destroy_process_group()
    if probe.problems:
        print(f"mdc rehearse probe, rank {label}: " + "; ".join(probe.problems), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    code = main()
    # torch 2.13's gloo can abort in interpreter finalization, after the report is written
    # ("terminate called without an active exception", seen under load, with no Python
    # frame left), which would fail a rehearsal that passed: exit without finalizing
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
