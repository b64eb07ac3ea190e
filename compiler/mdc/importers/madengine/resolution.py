"""Reading madengine's context: the deployment target, vendor, job name, launcher and
node and GPU counts, each as madengine resolves it on its target (§2.2, §3).
"""

from __future__ import annotations

import difflib
import re
from pathlib import PurePath
from typing import Any

from .context import Context
from .tables import LAUNCHERS, TARGETS


class Resolution(Context):
    """The target, vendor, name, launcher and counts, as madengine resolves them."""

    # deployment target (§2.2)
    def resolve_target(self) -> tuple[str, str | None]:
        b, ctx = self.b, self.ctx
        k8s_key = "k8s" if "k8s" in ctx else "kubernetes" if "kubernetes" in ctx else None
        if k8s_key and "slurm" in ctx:
            b.error(
                "MDC530",
                "/slurm",
                "Conflicting deployment configuration: Both 'k8s' and "
                "'slurm' fields present. Please specify only one deployment target.",
                hint=f"remove {k8s_key!r} or 'slurm'",
            )
        if "k8s" in ctx and "kubernetes" in ctx:
            b.note(
                "MDC504",
                "/kubernetes",
                "both 'k8s' and 'kubernetes' are given; madengine "
                "reads 'k8s', so 'kubernetes' is dropped",
                hint="merge it into 'k8s'",
            )
        target = "kubernetes" if k8s_key else "slurm" if "slurm" in ctx else "local"
        self.target_origin = f"/{k8s_key}" if k8s_key else ("/slurm" if "slurm" in ctx else None)
        deploy = ctx.get("deploy")
        if isinstance(deploy, str):
            wanted = TARGETS.get(deploy.lower())
            if wanted is None:
                b.error(
                    "MDC531",
                    "/deploy",
                    f"unknown deploy target {deploy!r}",
                    hint="use 'k8s', 'slurm' or 'local'",
                )
            elif wanted != target:
                have = (
                    "no 'k8s' config"
                    if wanted == "kubernetes"
                    else ("no 'slurm' config" if wanted == "slurm" else "k8s/slurm config")
                )
                b.error(
                    "MDC531",
                    "/deploy",
                    f"Conflicting deployment: 'deploy' field is {deploy!r} but {have} present",
                    hint=f"the blocks given mean {target}",
                )
            else:
                b.note(
                    "MDC505",
                    "/deploy",
                    f"deploy = {deploy!r} agrees with the blocks given "
                    f"({target}); madengine's CLI would reject this file, since it checks "
                    "'deploy' as an object while its config loader reads a string; mdc "
                    "accepts it",
                )
        elif "deploy" in ctx:
            b.note(
                "MDC500",
                "/deploy",
                "madengine's CLI accepts 'deploy' only as an object, "
                "which nothing reads; the target comes from the k8s/slurm blocks",
            )
        if target == "local":
            b.note(
                "MDC503",
                "",
                "no 'k8s' or 'slurm' block: madengine runs the model in local "
                "docker; mdc uses the local backend (one node, no container)",
            )
        return target, k8s_key

    def resolve_vendor(self) -> tuple[Any, str | None]:
        vendor = self.ctx.get("gpu_vendor")
        if vendor is None:
            self.b.note(
                "MDC503",
                "",
                'no gpu_vendor: madengine\'s default is AMD, so mdc uses accelerator = "amd"',
                hint="set gpu_vendor to NVIDIA for NVIDIA GPUs",
            )
            return "amd", None
        if isinstance(vendor, str) and vendor.upper() in ("AMD", "NVIDIA"):
            return vendor.lower(), "/gpu_vendor"  # madengine upper-cases it
        return vendor, "/gpu_vendor"  # mdc's schema reports it there

    def resolve_name(self) -> str:
        stem = re.sub(r"[^a-z0-9]+", "-", PurePath(self.b.src.path).stem.lower()).strip("-")
        name = f"madengine-{stem}"[:40].rstrip("-") if stem else "madengine-job"
        self.b.note(
            "MDC502",
            "",
            f"madengine names its job madengine-<model> after the model "
            f"chosen with --tags, which the context does not hold; mdc names it "
            f"{name!r} after the file",
            hint="set [job] name in the imported spec",
        )
        return name

    # launcher (§3, §2.3)
    def resolve_launcher(self) -> tuple[str, str | None]:
        b, dist = self.b, self.dist
        raw: Any = None
        origin: str | None = None
        if self.target == "kubernetes" and "type" in self.launcher_block:
            raw, origin = self.launcher_block["type"], "/launcher/type"
        elif "launcher" in dist:
            raw, origin = dist["launcher"], "/distributed/launcher"
        if raw is None:
            return self.default_launcher(), None
        if not isinstance(raw, str):
            return raw, origin  # mdc's schema reports the type there
        mapped = LAUNCHERS.get(raw) or LAUNCHERS.get(raw.lower())
        if mapped is None:
            near = difflib.get_close_matches(raw, list(LAUNCHERS), n=1, cutoff=0.6)
            where = {
                "slurm": "renders it as 'docker' with only NNODES, NPROC_PER_NODE and MASTER_PORT",
                "kubernetes": "runs the model script directly",
                "local": "uses its torchrun runner",
            }[self.target]
            b.note(
                "MDC504",
                origin or "",
                f"launcher {raw!r} is not one madengine knows: "
                f"madengine {where}; mdc refuses an unknown launcher",
                hint=f"did you mean {near[0]!r}?"
                if near
                else f"use one of: {', '.join(sorted(set(LAUNCHERS) - {'megatron_lm'}))}",
            )
            return raw, origin
        if mapped == "megatron" and self.target == "slurm":
            b.note(
                "MDC505",
                origin or "",
                f"madengine turns launcher {raw!r} on SLURM into its "
                "'docker' fallback (only 'megatron-lm' passes its check, and that has no "
                "branch), so no SLURM job gets the Megatron env; mdc runs the megatron "
                "launcher with TENSOR/PIPELINE/CONTEXT_MODEL_PARALLEL_SIZE",
            )
        elif mapped == "basic":
            b.note(
                "MDC504",
                origin or "",
                f"madengine's {raw!r} deployment has no mdc equivalent: it runs the model "
                "script once in the allocation (which starts its own srun steps), pulls the "
                "image on every node, passes --reservation and writes a completion marker; "
                "mdc uses the basic launcher instead, which starts nproc_per_node copies of "
                "[job] command on every node with --world_size and --rank appended",
                hint="set [job] command to the per-process program the script starts with srun",
            )
        elif mapped != raw:
            b.note("MDC504", origin or "", f"madengine's launcher {raw!r} is mdc's {mapped!r}")
        return mapped, origin

    def default_launcher(self) -> str:
        b = self.b
        if self.target == "slurm":
            b.note(
                "MDC503", "/slurm", "no distributed.launcher: madengine's SLURM default is torchrun"
            )
            return "torchrun"
        if self.target == "local":
            b.note(
                "MDC503",
                "",
                "no distributed.launcher: madengine's local run gives the "
                "script a torchrun runner (MAD_MULTI_NODE_RUNNER), so mdc uses torchrun",
            )
            return "torchrun"
        if self.k8s_multi_node() or self.k8s_multi_gpu():
            b.note(
                "MDC503",
                f"/{self.k8s_key}",
                "no launcher: madengine's multi-GPU/multi-node "
                "Kubernetes preset sets distributed.launcher = torchrun",
            )
            return "torchrun"
        b.note(
            "MDC503",
            f"/{self.k8s_key}",
            "no launcher and one GPU: madengine runs the model script once, as written, "
            "in the pod; mdc uses the basic launcher with one process, which appends "
            "--world_size 1 --rank 0 to [job] command (and sets RANK, WORLD_SIZE, ...)",
            hint="make sure the program accepts --world_size and --rank, or wrap it in a "
            "script that ignores them",
        )
        return "basic"

    def router_beside_servers(self, nnodes: int, origin: str | None) -> int:
        """madengine gives sglang-disagg's proxy a node of its own (1 + prefill + decode
        nodes); mdc runs the router beside the first prefill server, on the servers' nodes."""
        self.b.note(
            "MDC504",
            origin or "",
            f"madengine runs sglang-disagg's proxy on a node of its own ({nnodes} nodes: 1 "
            f"proxy + {nnodes - 1} for the servers); mdc runs the router beside the first "
            f"prefill server, so the job asks for the servers' {nnodes - 1} nodes",
        )
        return nnodes - 1

    # counts (§3)
    def resolve_nnodes(self) -> tuple[Any, str | None]:
        b, dist = self.b, self.dist
        if self.target == "kubernetes":
            if "nnodes" in self.launcher_block:
                return self.launcher_block["nnodes"], "/launcher/nnodes"
            if "nnodes" in dist:
                return dist["nnodes"], "/distributed/nnodes"
            return 1, None
        if self.target == "slurm":
            if "nnodes" in dist:
                nodes = self.slurm.get("nodes")
                if "nodes" in self.slurm and nodes != dist["nnodes"]:
                    b.note(
                        "MDC505",
                        "/slurm/nodes",
                        f"slurm.nodes = {nodes!r} and "
                        f"distributed.nnodes = {dist['nnodes']!r} disagree: madengine would "
                        f"request --nodes={nodes} and start --nnodes={dist['nnodes']} (a job "
                        f"that never forms); mdc uses {dist['nnodes']!r} for both",
                        hint="make them equal",
                    )
                else:
                    b.handled.add("/slurm/nodes")
                return dist["nnodes"], "/distributed/nnodes"
            if "nodes" in self.slurm:
                return self.slurm["nodes"], "/slurm/nodes"
            b.note("MDC503", "/slurm", "no slurm.nodes: madengine's SLURM preset has nodes = 1")
            return 1, None
        if "nnodes" in dist:
            if dist["nnodes"] != 1:
                b.note(
                    "MDC500",
                    "/distributed/nnodes",
                    f"nnodes = {dist['nnodes']!r} has no "
                    "effect on madengine's local docker run (one node); mdc keeps 1",
                    hint="add a 'slurm' or 'k8s' block for a multi-node job",
                )
            else:
                b.handled.add("/distributed/nnodes")
        return 1, None

    def resolve_nproc(self) -> tuple[Any, str | None]:
        b, dist = self.b, self.dist
        if self.target == "kubernetes" and "nproc_per_node" in self.launcher_block:
            return self.launcher_block["nproc_per_node"], "/launcher/nproc_per_node"
        if self.target != "local" and "nproc_per_node" in dist:
            return dist["nproc_per_node"], "/distributed/nproc_per_node"
        override = self.gpu_override()
        if override is not None:
            return override
        if self.target == "kubernetes":
            if "gpu_count" in self.k8s:
                b.note(
                    "MDC504",
                    f"/{self.k8s_key}/gpu_count",
                    "madengine takes nproc_per_node "
                    "from the model card's n_gpus (not in the context); mdc uses the GPUs "
                    "per pod, k8s.gpu_count",
                    hint="set distributed.nproc_per_node if they differ",
                )
                return self.k8s["gpu_count"], f"/{self.k8s_key}/gpu_count"
            b.note(
                "MDC502",
                f"/{self.k8s_key}",
                "madengine takes nproc_per_node from the model "
                "card's n_gpus (not in the context); mdc uses 1",
                hint="set distributed.nproc_per_node or k8s.gpu_count",
            )
            return 1, None
        if self.target == "slurm":
            if "gpus_per_node" in self.slurm:
                return self.slurm["gpus_per_node"], "/slurm/gpus_per_node"
            b.note(
                "MDC503",
                "/slurm",
                "no slurm.gpus_per_node: madengine's SLURM preset has 8 "
                "GPUs per node, so nproc_per_node = 8",
            )
            return 8, None
        if "nproc_per_node" in dist:
            b.note(
                "MDC504",
                "/distributed/nproc_per_node",
                "madengine's local run ignores "
                "distributed.nproc_per_node (it uses the model card's n_gpus); mdc uses it",
            )
            return dist["nproc_per_node"], "/distributed/nproc_per_node"
        b.note(
            "MDC502",
            "",
            "madengine's local run uses the model card's n_gpus (not in the "
            "context); mdc uses nproc_per_node = 1",
            hint="set distributed.nproc_per_node",
        )
        return 1, None
