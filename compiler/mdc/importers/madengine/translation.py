"""Recognising a madengine context and translating it, in madengine's order of resolution."""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Mapping
from pathlib import PurePath
from typing import Any

from mdc.errors import Diagnostic, SpecError
from mdc.loaders import LoadedDocument

from .builder import Builder, env_value, escape_token
from .tables import (
    AMD_MULTI_GPU_ENV,
    COMMANDS,
    DEFAULT_PORT,
    DISTRIBUTED_KEYS,
    DROPPED,
    GPU_COUNT_KEYS,
    K8S_DEFAULT_ENV,
    K8S_KEYS,
    K8S_MULTI_NODE_ENV,
    K8S_NVIDIA_ENV,
    K8S_TEMPLATE_ENV,
    LAUNCHER_ENV,
    LAUNCHER_KEYS,
    LAUNCHERS,
    MANAGED_ENV,
    MDC_DEFAULT_TTL_SECONDS,
    MODEL_KEYS,
    NATIVE_LAUNCHERS,
    NULL_DEFAULTS,
    OBJECT_KEYS,
    OWN_DISTRIBUTED,
    OWN_K8S,
    OWN_SLURM,
    OWN_TOP,
    PLACEHOLDER,
    PRIMUS_DEFAULT_CONFIG,
    PRIMUS_KEYS,
    QUIET_NULLS,
    SGLANG_DISAGG_KEYS,
    SLURM_DEFAULT_ENV,
    SLURM_KEYS,
    SLURM_MULTI_NODE_ENV,
    SLURM_SINGLE_NODE_ENV,
    TARGETS,
    TOP_KEYS,
)

# --- detection ------------------------------------------------------------------------------


def detect(doc: LoadedDocument) -> bool:
    """Whether ``doc`` is a madengine additional context rather than an mdc spec.

    An mdc spec always has ``job`` (the schema requires it), so a document with one is
    never taken. Without it, the document must hold a key only madengine uses, or a
    ``distributed``/``slurm``/``kubernetes`` block with a key only madengine's has
    (e.g. ``slurm.nodes``, ``distributed.port``, ``kubernetes.gpu_count``). JSON files only:
    madengine's context file is JSON.
    """
    data = doc.data
    if not isinstance(data, dict) or "job" in data or PurePath(doc.path).suffix.lower() != ".json":
        return False
    if any(key in data for key in OWN_TOP):
        return True
    for block, own in (
        ("distributed", OWN_DISTRIBUTED),
        ("slurm", OWN_SLURM),
        ("kubernetes", OWN_K8S),
    ):
        value = data.get(block)
        if isinstance(value, dict) and any(k in value for k in own):
            return True
    return False


# --- translation ------------------------------------------------------------------------------


def translate(doc: LoadedDocument) -> tuple[LoadedDocument, list[Diagnostic]]:
    """The mdc spec for madengine's context ``doc``, and the report of what changed.

    Raises :class:`SpecError` (with the report so far) for contexts madengine itself
    refuses: both ``k8s`` and ``slurm``, a contradicting ``deploy``, a block of the wrong type.
    """
    b = Builder(doc)
    if not isinstance(doc.data, dict):
        b.error(
            "MDC533",
            "",
            "a madengine additional context is a JSON object, got "
            f"{type(doc.data).__name__} (madengine exits with code 4)",
        )
        raise SpecError(b.errors)
    for key in OBJECT_KEYS:
        if key in doc.data and not isinstance(doc.data[key], dict):
            b.error(
                "MDC532",
                f"/{key}",
                f"madengine requires {key!r} to be an object, got "
                f'{type(doc.data[key]).__name__} ("Invalid additional context: key {key} '
                'must be a dict.")',
                hint=f"write {key} as {{...}}",
            )
    if b.errors:
        raise SpecError(b.errors)
    _Translation(b).run()
    if b.errors:
        raise SpecError([*b.notes, *b.errors])
    return b.document(), b.notes


class _Translation:
    def __init__(self, b: Builder) -> None:
        self.b = b
        self.ctx: dict[str, Any] = b.src.data  # type: ignore[assignment]
        self.env: dict[str, tuple[object, str | None]] = {}
        #: the node count as madengine reads it (sglang-disagg's counts its proxy's node)
        self.madengine_nnodes: object = None

    def block(self, key: str) -> dict[str, Any]:
        value = self.ctx.get(key)
        return value if isinstance(value, dict) else {}

    def without_nulls(self, value: Any, pointer: str) -> Any:
        """``value`` with every JSON null in it left out, each reported at its pointer: mdc
        reads a null as an absent key (an absent list item)."""
        if isinstance(value, dict):
            kept: dict[str, Any] = {}
            for key, item in value.items():
                here = f"{pointer}/{escape_token(str(key))}"
                if item is None:
                    self.null(here, str(key))
                else:
                    kept[key] = self.without_nulls(item, here)
            return kept
        if isinstance(value, list):
            items = []
            for index, item in enumerate(value):
                if item is None:
                    self.null(f"{pointer}/{index}", f"item {index}")
                else:
                    items.append(self.without_nulls(item, f"{pointer}/{index}"))
            return items
        return value

    def null(self, pointer: str, key: str) -> None:
        self.b.handled.add(pointer)
        block, _, rest = pointer[1:].partition("/")
        if pointer in QUIET_NULLS or (block in ("k8s", "kubernetes") and rest in NULL_DEFAULTS):
            return  # null is madengine's own value there: none set
        if block in ("env_vars", "docker_env_vars") and "/" not in rest:
            self.b.note(
                "MDC505",
                pointer,
                f"{key} is null: madengine exports it as the text 'None' (its templates "
                "render Python's None); mdc does not set it",
                hint=f'write the value as a string, e.g. "{key}": ""',
            )
            return
        self.b.note(
            "MDC504",
            pointer,
            f"{key} is null: mdc reads it as absent, so mdc's default (or madengine's "
            "preset, where the report says one applies) takes its place",
            hint="give it a value, or remove it",
        )

    # the whole translation, in madengine's order of resolution
    def run(self) -> None:
        b = self.b
        self.ctx = self.without_nulls(self.ctx, "")
        self.target, self.k8s_key = self.resolve_target()
        self.dist = self.block("distributed")
        self.k8s = self.block(self.k8s_key) if self.k8s_key else {}
        self.slurm = self.block("slurm")
        self.vendor = self.resolve_vendor()
        self.launcher_block = self.block("launcher")
        self.name = self.resolve_name()
        launcher, launcher_origin = self.resolve_launcher()
        nnodes, nnodes_origin = self.resolve_nnodes()
        nproc, nproc_origin = self.resolve_nproc()
        self.madengine_nnodes = nnodes
        if launcher == "sglang_disagg" and isinstance(nnodes, int) and nnodes >= 3:
            nnodes = self.router_beside_servers(nnodes, nnodes_origin)
        b.put(("job", "name"), self.name, None)
        self.launcher = launcher
        self.job(launcher)
        if "distributed" in self.ctx:
            b.table(("distributed",), "/distributed")
        b.put(("distributed", "launcher"), launcher, launcher_origin)
        b.put(("distributed", "backend"), self.target, self.target_origin)
        b.put(("distributed", "nnodes"), nnodes, nnodes_origin)
        b.put(("distributed", "nproc_per_node"), nproc, nproc_origin)
        b.put(("distributed", "accelerator"), self.vendor[0], self.vendor[1])
        self.nnodes = nnodes if isinstance(nnodes, int) else 1
        self.nnodes_origin = nnodes_origin
        self.nproc = nproc if isinstance(nproc, int) else 1
        self.port()
        self.launcher_options(launcher)
        if self.target == "kubernetes":
            self.kubernetes()
        elif self.target == "slurm":
            self.slurm_table()
        self.environment()
        self.leftovers()

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
        self.target_origin: str | None = (
            f"/{k8s_key}" if k8s_key else ("/slurm" if "slurm" in ctx else None)
        )
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

    def k8s_multi_node(self) -> bool:
        nnodes = self.dist.get("nnodes")
        return isinstance(nnodes, int | float) and not isinstance(nnodes, bool) and nnodes > 1

    def k8s_multi_gpu(self) -> bool:
        count = self.k8s.get("gpu_count")
        counted = isinstance(count, int | float) and not isinstance(count, bool) and count > 1
        return counted or bool(self.dist.get("enabled")) or "launcher" in self.dist

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

    def gpu_override(self) -> tuple[Any, str] | None:
        for key in GPU_COUNT_KEYS:
            if key in self.ctx:
                return self.ctx[key], f"/{key}"
        return None

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

    # [job]
    def job(self, launcher: object) -> None:
        b = self.b
        name = launcher if isinstance(launcher, str) else "torchrun"
        command = COMMANDS.get(name, COMMANDS["torchrun"])
        b.put(("job", "command"), list(command), None)
        b.note(
            "MDC502",
            "",
            f"madengine runs the script of the model chosen with --tags (from "
            f"its models.json), which the context does not hold; mdc's [job] command is "
            f"set to {' '.join(command)!r} for the {name} launcher",
            hint="set [job] command to your program; for a model script that runs "
            "$MAD_MULTI_NODE_RUNNER PROGRAM ARGS, set it to PROGRAM ARGS (mdc's launcher "
            "starts the processes) and move the script's exports to [job] env",
        )
        if name == "primus":
            b.put(("job", "workdir"), "/workspace/Primus", None)
        image = self.ctx.get("MAD_CONTAINER_IMAGE")
        if "MAD_CONTAINER_IMAGE" in self.ctx:
            b.put(("job", "image"), image, "/MAD_CONTAINER_IMAGE")
        elif self.target == "kubernetes":
            b.put(("job", "image"), f"{PLACEHOLDER}/madengine-image:latest", None)
            b.note(
                "MDC502",
                "",
                "madengine's pods run the image its build step made "
                "(registry_image in the build manifest); mdc needs [job] image, set to a "
                "placeholder",
                hint="set MAD_CONTAINER_IMAGE or [job] image",
            )

    # master port (§3)
    def port(self) -> None:
        b, dist = self.b, self.dist
        if self.target == "kubernetes":
            if "master_port" in self.launcher_block:
                b.put(
                    ("distributed", "master_port"),
                    self.launcher_block["master_port"],
                    "/launcher/master_port",
                )
            else:
                b.put(("distributed", "master_port"), DEFAULT_PORT, None)
            if "port" in dist:
                b.note(
                    "MDC500",
                    "/distributed/port",
                    "madengine reads distributed.port only "
                    "on SLURM; on Kubernetes the port is launcher.master_port",
                )
        elif self.target == "slurm":
            if "port" in dist:
                b.put(("distributed", "master_port"), dist["port"], "/distributed/port")
            else:
                b.put(("distributed", "master_port"), DEFAULT_PORT, None)
        elif "port" in dist:
            b.note(
                "MDC500",
                "/distributed/port",
                "madengine's local run starts torchrun --standalone, which picks its own port",
            )
        if "master_port" in dist:
            used = self.b.data["distributed"].get("master_port", "its own")
            b.note(
                "MDC504",
                "/distributed/master_port",
                "madengine ignores "
                "distributed.master_port (it reads launcher.master_port on Kubernetes and "
                f"distributed.port on SLURM); the port stays {used}",
                hint="use distributed.port (SLURM) or launcher.master_port (Kubernetes)",
            )
        if self.target != "kubernetes":
            for key in self.launcher_block:
                b.note(
                    "MDC500",
                    f"/launcher/{escape_token(key)}",
                    "madengine reads the top-level 'launcher' block only on Kubernetes",
                )

    # launcher tables
    def launcher_options(self, launcher: object) -> None:
        self.model_placeholder(launcher)
        self.layout_as_madengine_runs_it(launcher)
        self.sglang_disagg_notes(launcher)
        self.sglang_disagg_split(launcher)
        self.primus(launcher)

    def model_placeholder(self, launcher: object) -> None:
        """A serving launcher's model key, which madengine's scripts choose themselves."""
        b = self.b
        if launcher in MODEL_KEYS:
            table, key = str(launcher), MODEL_KEYS[str(launcher)]
            b.put((table, key), f"{PLACEHOLDER}/model", None)
            b.note(
                "MDC502",
                "",
                f"madengine's {launcher} script picks the model itself; mdc "
                f"needs [{table}] {key}, set to a placeholder",
                hint=f"set [{table}] {key}",
            )

    def layout_as_madengine_runs_it(self, launcher: object) -> None:
        """The sizes and rendezvous madengine's scripts use where mdc's defaults differ."""
        b, nnodes, nproc = self.b, self.nnodes, self.nproc
        if launcher == "vllm" and nnodes > 1:
            b.put(("vllm", "mode"), "replicas", None)
            b.put(("parallelism", "tp"), nproc, None)
            b.put(("parallelism", "pp"), 1, None)
            b.note(
                "MDC503",
                "",
                f"madengine's multi-node vLLM runs an independent server per "
                f"node (tensor parallel {nproc}, pipeline 1: a Ray head per pod on "
                "Kubernetes, backend 'none' on SLURM); mdc keeps that: [vllm] mode = "
                '"replicas"',
                hint="for one server over every node, remove mode and set "
                "tp x pp = nnodes x nproc_per_node",
            )
        if launcher == "sglang" and nnodes > 1:
            b.put(("parallelism", "tp"), nnodes * nproc, None)
            b.put(("parallelism", "pp"), 1, None)
            if self.target == "slurm":
                what = (
                    f"madengine's SLURM job exports SGLANG_TENSOR_PARALLEL_SIZE = {nproc} and "
                    f"PIPELINE 1 and runs one server per node ({nnodes} independent servers, "
                    "no NCCL_INIT_ADDR)"
                )
            else:
                what = (
                    f"madengine exports SGLANG_TENSOR_PARALLEL_SIZE = {nproc} and PIPELINE 1 "
                    f"on each of {nnodes} pods, with NCCL_INIT_ADDR for one server across them"
                )
            b.note(
                "MDC504",
                "",
                f"{what}; mdc runs one SGLang server over the {nnodes} nodes, which needs "
                f"tp x pp = {nnodes * nproc}, so mdc keeps pp 1 and uses tp {nnodes * nproc}",
                hint="for one server per node, compile a 1-node spec and run it on each node",
            )
        if launcher == "megatron" and nnodes == 1 and nproc > 8:
            b.put(("parallelism", "tp"), 8, None)
            b.note(
                "MDC503",
                "",
                f"madengine's single-node Megatron uses tensor parallel min({nproc}, 8) = 8",
            )
        if launcher in ("torchrun", "megatron") and nnodes > 1 and self.target != "local":
            b.put(("torchrun", "rdzv_backend"), "static", None)
            b.note(
                "MDC503",
                "",
                "madengine's multi-node torchrun passes --node_rank and "
                "--master_addr (a static rendezvous); mdc keeps it: [torchrun] "
                'rdzv_backend = "static"',
            )

    def sglang_disagg_notes(self, launcher: object) -> None:
        """What madengine's sglang-disagg runs that mdc's runs otherwise."""
        b, nnodes = self.b, self.nnodes
        few = isinstance(self.madengine_nnodes, int) and self.madengine_nnodes < 3
        if launcher == "sglang_disagg" and few and self.nnodes_origin:
            b.note(
                "MDC504",
                self.nnodes_origin,
                f"madengine refuses sglang-disagg on fewer than 3 nodes (1 proxy + 1 prefill "
                f"+ 1 decode); mdc runs it on {self.nnodes}: the router beside the servers, "
                "the GPUs split between prefill and decode",
                hint="set 3 or more nodes for madengine's layout (the router on its own node)",
            )
        if launcher == "sglang_disagg" and self.target == "kubernetes":
            b.put(("sglang_disagg", "server_args"), ["--trust-remote-code"], None)
            b.note(
                "MDC503",
                "",
                "madengine's Kubernetes prefill and decode servers run with "
                "--trust-remote-code; mdc keeps it: [sglang_disagg] server_args",
            )
        if launcher == "sglang_disagg" and self.target == "slurm":
            b.put(("job", "env", "NNODES"), str(nnodes), None)
            b.note(
                "MDC503",
                "",
                "madengine's SLURM job exports NNODES (slurm.nodes, its node count) to the "
                "model script; mdc's sglang_disagg launcher sets no NNODES, so [job] env "
                f"keeps it as the job's node count, {nnodes}",
            )
        if launcher == "sglang_disagg" and self.target == "kubernetes":
            b.note(
                "MDC504",
                "",
                "madengine's Kubernetes pods run SGLang's mini_lb proxy on pod 0 "
                "(on the master port) and servers on port 30000 with the mooncake transfer; "
                "mdc runs sglang_router on port 8000 and server i on 30000 + i",
                hint='for an SGLang without sglang_router set [sglang_disagg] router = "mini_lb"',
            )

    def sglang_disagg_split(self, launcher: object) -> None:
        """distributed.sglang_disagg: a custom prefill/decode split, as madengine reads it."""
        b, dist = self.b, self.dist
        disagg = dist.get("sglang_disagg")
        if "sglang_disagg" in dist:
            split = disagg if isinstance(disagg, dict) else {}
            if launcher != "sglang_disagg":
                b.note(
                    "MDC500",
                    "/distributed/sglang_disagg",
                    f"only the sglang-disagg launcher reads it; the launcher is {launcher!r}",
                )
            elif "prefill_nodes" in split and "decode_nodes" in split:
                b.table(("distributed",), "/distributed")
                # on 2 nodes (madengine's 3, less its proxy node) mdc splits GPUs
                gpus = self.nnodes == 2 and self.madengine_nnodes == 3
                for role in ("prefill", "decode"):
                    value = split[f"{role}_nodes"]
                    if gpus and isinstance(value, int) and not isinstance(value, bool):
                        key, value = f"{role}_gpus", value * self.nproc
                    else:
                        key = f"{role}_nodes"
                    b.put(("distributed", key), value, f"/distributed/sglang_disagg/{role}_nodes")
                b.handled.add("/distributed/sglang_disagg")
            else:
                for key in SGLANG_DISAGG_KEYS:
                    if key in split:
                        b.note(
                            "MDC504",
                            f"/distributed/sglang_disagg/{key}",
                            "madengine "
                            "ignores a custom split unless both prefill_nodes and "
                            "decode_nodes are given; mdc keeps the automatic split, "
                            "madengine's (prefill = max(1, (nnodes-1)*2//5) of madengine's "
                            "nnodes, which count the proxy's node)",
                            hint="give both",
                        )
                b.handled.add("/distributed/sglang_disagg")
            self.unknown_keys("/distributed/sglang_disagg", split, SGLANG_DISAGG_KEYS)

    def primus(self, launcher: object) -> None:
        """distributed.primus: the Primus config, madengine's default where none is given."""
        b, dist = self.b, self.dist
        primus = dist.get("primus")
        if launcher == "primus":
            opts = primus if isinstance(primus, dict) else {}
            if "config_path" in opts:
                b.put(
                    ("primus", "config_path"),
                    opts["config_path"],
                    "/distributed/primus/config_path",
                )
            else:
                b.put(("primus", "config_path"), PRIMUS_DEFAULT_CONFIG, None)
                b.note(
                    "MDC503",
                    "/distributed" if "distributed" in self.ctx else "",
                    f"no distributed.primus.config_path: madengine's default is "
                    f"{PRIMUS_DEFAULT_CONFIG!r}",
                )
            for key in ("cli_extra", "backend"):
                if key in opts:
                    b.put(("primus", key), opts[key], f"/distributed/primus/{key}")
            if "primus" in dist:
                b.table(("primus",), "/distributed/primus")
                b.handled.add("/distributed/primus")
        elif "primus" in dist:
            b.note(
                "MDC500",
                "/distributed/primus",
                f"only the primus launcher reads it; the launcher is {launcher!r}",
            )
        if isinstance(primus, dict):
            self.unknown_keys("/distributed/primus", primus, PRIMUS_KEYS)

    # [kubernetes] (§4, §2.3)
    def kubernetes(self) -> None:
        b, k8s, src = self.b, self.k8s, f"/{self.k8s_key}"
        table = ("kubernetes",)
        b.table(table, src)
        multi_node = self.k8s_multi_node()
        multi = multi_node or self.k8s_multi_gpu()
        self.k8s_presets(multi)
        if multi_node:
            b.put((*table, "host_ipc"), True, None)
            b.note(
                "MDC503",
                src,
                "madengine's multi-node Jobs run their pods with hostIPC: true (whatever "
                "k8s.host_ipc says); mdc keeps it: [kubernetes] host_ipc = true",
                hint="remove host_ipc if your processes do not share memory across pods",
            )
        if self.launcher in NATIVE_LAUNCHERS:
            self.pod_index(src, multi_node)
        self.ttl(src)
        if "node_selector" in k8s:
            selector = k8s["node_selector"]
            if isinstance(selector, dict):
                selector = {k: env_value(v) for k, v in selector.items()}
            b.put((*table, "node_selector"), selector, f"{src}/node_selector")
        if "tolerations" in k8s:
            self.tolerations(k8s["tolerations"], f"{src}/tolerations")
        if "gpu_resource_name" in k8s:
            b.put((*table, "gpu_resource"), k8s["gpu_resource_name"], f"{src}/gpu_resource_name")
        gpus = self.gpu_override() or (
            (k8s["gpu_count"], f"{src}/gpu_count") if "gpu_count" in k8s else None
        )
        if gpus is not None:
            if gpus[0] != self.nproc:
                b.put((*table, "gpus_per_node"), gpus[0], gpus[1])
            else:
                b.handled.add(gpus[1])
        if "data_pvc" in k8s:
            b.put(
                (*table, "volumes"),
                [{"name": "data", "mount_path": "/data", "claim": k8s["data_pvc"]}],
                None,
            )
            b.locate_only((*table, "volumes", 0, "claim"), f"{src}/data_pvc")
            b.note(
                "MDC504",
                f"{src}/data_pvc",
                "madengine mounts the data PVC at /data; mdc "
                "does the same with a [kubernetes] volume named 'data'",
            )
        timeout = self.ctx.get("timeout")
        if "timeout" in self.ctx:
            if isinstance(timeout, int | float) and not isinstance(timeout, bool) and timeout > 0:
                b.put((*table, "active_deadline_seconds"), int(timeout), "/timeout")
                b.note(
                    "MDC504",
                    "/timeout",
                    f"madengine stops the model run after {timeout} s; "
                    "mdc makes it the Job's activeDeadlineSeconds",
                )
            else:
                b.note("MDC500", "/timeout", f"timeout {timeout!r}: no limit")
        self.unknown_keys(src, k8s, K8S_KEYS)

    def k8s_presets(self, multi: bool) -> None:
        """The namespace, pull policy, retries and requests madengine's presets give."""
        b, k8s, src = self.b, self.k8s, f"/{self.k8s_key}"
        table = ("kubernetes",)
        b.put(
            (*table, "namespace"),
            k8s.get("namespace", "default"),
            f"{src}/namespace" if "namespace" in k8s else None,
        )
        defaults = ['namespace "default"'] if "namespace" not in k8s else []
        policy = k8s.get("image_pull_policy", "Always")
        b.put(
            (*table, "image_pull_policy"),
            policy,
            f"{src}/image_pull_policy" if "image_pull_policy" in k8s else None,
        )
        if "image_pull_policy" not in k8s:
            defaults.append('image_pull_policy "Always"')
        b.put(
            (*table, "backoff_limit"),
            k8s.get("backoff_limit", 3),
            f"{src}/backoff_limit" if "backoff_limit" in k8s else None,
        )
        if "backoff_limit" not in k8s:
            defaults.append(
                "backoff_limit 3 (mdc's own default is 0: a distributed job whose "
                "pod failed cannot continue)"
            )
        memory, cpu = ("64Gi", 16) if multi else ("16Gi", 8)
        for key, preset in (("memory", memory), ("cpu", cpu)):
            if key in k8s:
                b.put((*table, key), k8s[key], f"{src}/{key}")
            else:
                b.put((*table, key), preset, None)
                defaults.append(
                    f"{key} {json.dumps(preset)} (the "
                    f"{'multi' if multi else 'single'}-GPU profile's request)"
                )
        if defaults:
            b.note(
                "MDC503",
                src,
                "madengine's Kubernetes presets give " + "; ".join(defaults),
                hint="set them in k8s to change them",
            )

    def tolerations(self, value: object, origin: str) -> None:
        b = self.b
        if not isinstance(value, list):
            b.put(("kubernetes", "tolerations"), value, origin)
            return
        renamed = {"tolerationSeconds": "toleration_seconds"}
        items: list[object] = []
        for item in value:
            items.append(
                {renamed.get(k, k): v for k, v in item.items()} if isinstance(item, dict) else item
            )
        b.put(("kubernetes", "tolerations"), items, origin)
        for index, item in enumerate(value):
            if isinstance(item, dict) and "tolerationSeconds" in item:
                b.locate_only(
                    ("kubernetes", "tolerations", index, "toleration_seconds"),
                    f"{origin}/{index}/tolerationSeconds",
                )

    # [slurm] (§5, §2.3)
    def pod_index(self, src: str, multi_node: bool) -> None:
        """madengine's Job exports POD_INDEX (= JOB_COMPLETION_INDEX) only on several nodes."""
        if multi_node:
            self.b.put(("job", "env", "POD_INDEX"), {"ref": "NODE_RANK"}, None)
            self.b.note(
                "MDC503",
                src,
                "madengine's pods export POD_INDEX (= JOB_COMPLETION_INDEX) for the "
                f"{self.launcher} launcher on several nodes; mdc's NODE_RANK is the same "
                'index, so [job] env has POD_INDEX = { ref = "NODE_RANK" }',
            )
        else:
            self.b.note(
                "MDC503",
                src,
                f"madengine exports POD_INDEX for the {self.launcher} launcher only when "
                "nnodes > 1; this job has one node, so POD_INDEX is not set (as in madengine)",
            )

    def ttl(self, src: str) -> None:
        """ttlSecondsAfterFinished: madengine's preset is null (none written); mdc's is a week."""
        key = "ttl_seconds_after_finished"
        value = self.k8s.get(key)
        if value is not None:
            self.b.put(("kubernetes", key), value, f"{src}/{key}")
            return
        self.b.handled.add(f"{src}/{key}")
        self.b.note(
            "MDC504",
            f"{src}/{key}" if self.b.has(f"{src}/{key}") else src,  # a null is madengine's
            "madengine writes no ttlSecondsAfterFinished, so its finished Jobs and pods "
            "stay until deleted; mdc's Kubernetes backend deletes them "
            f"{MDC_DEFAULT_TTL_SECONDS} s (a week) after the job finishes",
            hint=f"set {key} = -1 in [kubernetes] to keep them, as madengine does",
        )

    def slurm_table(self) -> None:
        b, slurm = self.b, self.slurm
        table = ("slurm",)
        b.table(table, "/slurm")
        raw = self.dist.get("launcher")
        reservation = slurm.get("reservation")
        if str(raw).replace("-", "_") == "slurm_multi" and isinstance(reservation, str):
            # the one launcher madengine passes --reservation for
            b.put((*table, "sbatch_args"), [f"--reservation={reservation}"], None)
            b.locate_only((*table, "sbatch_args", 0), "/slurm/reservation")
        multi = self.nnodes > 1
        defaults = []
        for key, preset in (
            ("partition", "amd-rccl"),
            ("time", "24:00:00" if multi else "12:00:00"),
            ("exclusive", True),
        ):
            if key in slurm:
                b.put((*table, key), slurm[key], f"/slurm/{key}")
            else:
                b.put((*table, key), preset, None)
                defaults.append(f"{key} {json.dumps(preset)}")
        if defaults:
            b.note(
                "MDC503",
                "/slurm",
                "madengine's SLURM presets give " + ", ".join(defaults),
                hint="set them in slurm"
                + (
                    " (amd-rccl is a partition of madengine's own cluster)"
                    if "partition" not in slurm
                    else ""
                ),
            )
        for key in ("account", "qos", "constraint", "exclude"):
            if key in slurm:
                b.put((*table, key), slurm[key], f"/slurm/{key}")
        if "nodelist" in slurm:
            nodes = slurm["nodelist"]
            if isinstance(nodes, list) and all(isinstance(n, str) for n in nodes):
                b.put((*table, "nodelist"), ",".join(nodes), "/slurm/nodelist")
            else:
                b.put((*table, "nodelist"), nodes, "/slurm/nodelist")
        if "modules" in slurm:
            b.put((*table, "modules"), slurm["modules"], "/slurm/modules")
        gpus = self.gpu_override() or (
            (slurm["gpus_per_node"], "/slurm/gpus_per_node")
            if "gpus_per_node" in slurm
            else (8, None)
        )
        if gpus[0] != self.nproc:
            b.put((*table, "gpus_per_node"), gpus[0], gpus[1])
        elif gpus[1] is not None:
            b.handled.add(gpus[1])
        if "output_dir" in slurm:
            out = slurm["output_dir"]
            if isinstance(out, str):
                b.put((*table, "output"), f"{out.rstrip('/')}/%x_%j.out", "/slurm/output_dir")
                b.put((*table, "error"), f"{out.rstrip('/')}/%x_%j.err", "/slurm/output_dir")
                b.note(
                    "MDC504",
                    "/slurm/output_dir",
                    f"madengine writes its logs under "
                    f"{out!r} and creates it; mdc writes the batch output there as "
                    "%x_%j.out/.err, and SLURM does not create the directory",
                    hint=f"mkdir -p {out} before sbatch",
                )
            else:
                b.put((*table, "output"), out, "/slurm/output_dir")
        if "network_interface" in slurm:
            iface = slurm["network_interface"]
            self.env["NCCL_SOCKET_IFNAME"] = (iface, "/slurm/network_interface")
            self.env["GLOO_SOCKET_IFNAME"] = (iface, "/slurm/network_interface")
            b.note(
                "MDC504",
                "/slurm/network_interface",
                "madengine exports it as "
                "NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME; mdc puts both in [job] env",
            )
        self.unknown_keys("/slurm", slurm, SLURM_KEYS)

    # [job] env: presets, then env_vars, then docker_env_vars (§2.3, §4, §5)
    def environment(self) -> None:
        b = self.b
        layers: list[tuple[str, dict[str, str]]] = []
        amd = self.vendor[0] == "amd"
        if self.target == "kubernetes":
            layers.append(("k8s/defaults.json", K8S_DEFAULT_ENV))
            if self.vendor[0] == "nvidia":
                layers.append(("k8s/gpu-vendors/nvidia.json", K8S_NVIDIA_ENV))
            if amd and (self.k8s_multi_gpu() or self.k8s_multi_node()):
                layers.append(("k8s/amd-multi-gpu.json", AMD_MULTI_GPU_ENV))
            if self.k8s_multi_node():
                layers.append(("the multi-node profile", K8S_MULTI_NODE_ENV))
            layers.append(("the Job template", K8S_TEMPLATE_ENV))
        elif self.target == "slurm":
            layers.append(("slurm/defaults.json", SLURM_DEFAULT_ENV))
            layers.append(
                ("the multi-node profile", SLURM_MULTI_NODE_ENV)
                if self.nnodes > 1
                else ("the single-node profile", SLURM_SINGLE_NODE_ENV)
            )
        preset: dict[str, str] = {}
        names: list[str] = []
        for name, layer in layers:
            preset.update(layer)
            names.append(name)
        given: dict[str, tuple[object, str | None]] = dict(self.env)
        for block in ("env_vars", "docker_env_vars"):
            values = self.ctx.get(block)
            if not isinstance(values, dict):
                continue
            b.table(("job", "env"), f"/{block}")
            for key, value in values.items():
                origin = f"/{block}/{escape_token(key)}"
                if key.startswith("_"):
                    b.note(
                        "MDC504",
                        origin,
                        f"{key!r} is a comment; madengine's SLURM script "
                        "exports it anyway, mdc drops it",
                    )
                    continue
                if key in self.managed_env():
                    b.note(
                        "MDC504",
                        origin,
                        f"{key} is set by mdc's {self.launcher} launcher "
                        "or its backend; madengine's value is dropped",
                    )
                    continue
                if (
                    block == "docker_env_vars"
                    and key in given
                    and given[key][1]
                    and given[key][0] != value
                ):
                    b.note(
                        "MDC504",
                        origin,
                        f"{key} is in env_vars and docker_env_vars; the "
                        "docker value is what madengine's container sees, so mdc keeps it",
                    )
                if not isinstance(value, str) and isinstance(value, bool | int | float):
                    b.note(
                        "MDC504",
                        origin,
                        f"{key} = {json.dumps(value)} is exported as the "
                        f"string {env_value(value)!r} (madengine renders it with str())",
                    )
                given[key] = (env_value(value), origin)
        applied = sorted(k for k in preset if k not in given)
        if applied:
            b.note(
                "MDC503",
                f"/{self.k8s_key}" if self.k8s_key else "/slurm",
                "madengine's "
                f"presets ({', '.join(names)}) add "
                + ", ".join(f"{k}={preset[k]}" for k in applied)
                + "; mdc keeps them in "
                "[job] env",
                hint="override one in env_vars",
            )
        env: dict[str, tuple[object, str | None]] = {k: (preset[k], None) for k in applied}
        env.update(given)
        if self.target == "slurm" and "env_vars" in self.ctx:
            b.note(
                "MDC505",
                "/env_vars",
                "on SLURM, madengine exports env_vars in the batch "
                "shell unquoted, and only a whitelist reaches the container; mdc gives every "
                "process all of them, quoted",
            )
        for key in sorted(env):
            b.put(("job", "env", key), env[key][0], env[key][1])
        for block in ("env_vars", "docker_env_vars"):
            if block in self.ctx:
                b.handled.add(f"/{block}")

    def managed_env(self) -> set[str]:
        names = {*MANAGED_ENV, *LAUNCHER_ENV.get(str(self.launcher), ())}
        tp = self.b.data.get("parallelism", {}).get("tp", self.nproc)
        if self.launcher == "megatron" and tp > 1 and self.vendor[0] != "cpu":
            names.add("CUDA_DEVICE_MAX_CONNECTIONS")  # mdc's megatron sets it to 1 then
        return names

    # what is left: known keys dropped with a reason, unknown keys
    def unknown_keys(self, where: str, block: Mapping[str, Any], known: tuple[str, ...]) -> None:
        for key in block:
            pointer = f"{where}/{escape_token(key)}"
            if key in known or key.startswith("_"):
                continue
            near = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
            label = where.rsplit("/", 1)[-1] or "the context"
            self.b.note(
                "MDC501",
                pointer,
                f"{key!r} is not a madengine key mdc knows in {label}; dropped",
                hint=f"did you mean {near[0]!r}?" if near else None,
            )

    def leftovers(self) -> None:
        b = self.b
        for key in self.ctx:
            pointer = f"/{escape_token(key)}"
            if key.startswith(("_", "log_error_")):
                if key.startswith("log_error_"):
                    b.note(
                        "MDC500",
                        pointer,
                        "madengine's log scan for failure patterns; mdc does not run the job",
                    )
                continue
            if key not in TOP_KEYS:
                self.unknown_keys("", {key: None}, TOP_KEYS)
        self.unknown_keys("/distributed", self.dist, DISTRIBUTED_KEYS)
        if self.target == "kubernetes":
            self.unknown_keys("/launcher", self.launcher_block, LAUNCHER_KEYS)
        for pointer, reason in DROPPED.items():
            actual = pointer.replace("/k8s/", f"/{self.k8s_key}/") if self.k8s_key else pointer
            if b.has(actual) and actual not in b.handled:
                b.note("MDC500", actual, f"dropped: {reason}")
        if "timeout" in self.ctx and self.target != "kubernetes":
            b.note(
                "MDC500",
                "/timeout",
                "madengine's limit on its own model run ("
                + (
                    "madengine run --timeout on the compute node); mdc's limit is slurm.time"
                    if self.target == "slurm"
                    else "docker run); mdc's local backend has none"
                ),
            )
        for key in (
            "gpu_vendor",
            "MAD_CONTAINER_IMAGE",
            "env_vars",
            "docker_env_vars",
            "deploy",
            "k8s",
            "kubernetes",
            "slurm",
            "distributed",
            "launcher",
            "timeout",
            "guest_os",
        ):
            b.handled.add(f"/{key}")
        for key in GPU_COUNT_KEYS:
            pointer = f"/{key}"
            if key in self.ctx and pointer not in b.handled:
                b.note(
                    "MDC500",
                    pointer,
                    "madengine uses only the first of gpus_per_node, "
                    "gpu_count, n_gpus, num_gpus, ngpus; this one is shadowed",
                )
        self.unhandled()

    def unhandled(self) -> None:
        """Known madengine keys that nothing above carried over or reported."""
        b = self.b
        blocks: list[tuple[str, dict[str, Any], tuple[str, ...]]] = [
            ("/distributed", self.dist, DISTRIBUTED_KEYS)
        ]
        if self.k8s_key:
            blocks.append((f"/{self.k8s_key}", self.k8s, K8S_KEYS))
        if "slurm" in self.ctx:
            blocks.append(("/slurm", self.slurm, SLURM_KEYS))
        if self.target == "kubernetes":
            blocks.append(("/launcher", self.launcher_block, LAUNCHER_KEYS))
        for where, block, known in blocks:
            for key in block:
                pointer = f"{where}/{escape_token(key)}"
                if key in known and pointer not in b.handled:
                    b.note(
                        "MDC500",
                        pointer,
                        f"{key!r} has no effect on madengine's "
                        f"{self.target} deployment with launcher {self.launcher!r}; dropped",
                    )
