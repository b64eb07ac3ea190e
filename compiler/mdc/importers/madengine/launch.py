"""What the job runs and how its processes meet: [job] command and image, the master port,
and the launcher's own tables (the layout madengine's scripts run, sglang-disagg's split,
Primus's config).
"""

from __future__ import annotations

from .builder import escape_token
from .context import Context
from .tables import (
    COMMANDS,
    DEFAULT_PORT,
    MODEL_KEYS,
    PLACEHOLDER,
    PRIMUS_DEFAULT_CONFIG,
    PRIMUS_KEYS,
    SGLANG_DISAGG_KEYS,
)


class Launch(Context):
    """[job], the master port and the launcher's tables."""

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
