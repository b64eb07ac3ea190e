"""DeepSpeed: every node starts its own workers, with a ds_config.json built from the plan.

Two runners, chosen by ``[deepspeed] runner``:

* ``deepspeed``: the ``deepspeed`` command with ``--no_ssh`` on every node. It
  reads the world layout (nodes in rank order, slots per node) from
  ``launch/hostfile`` and starts ``deepspeed.launcher.launch`` locally with
  the backend's node rank; nothing is reached over ssh or pdsh.
* ``torchrun``: torchrun with static rendezvous (so the node rank is the
  backend's), the path DeepSpeed supports under schedulers such as SLURM.
  ``deepspeed.initialize`` reads torchrun's RANK / LOCAL_RANK / WORLD_SIZE.

Default: torchrun when the job has several nodes and the backend cannot name
their hosts before the job runs, else deepspeed. The user's script gets
``--deepspeed --deepspeed_config <launch/ds_config.json>``; the config's
batch triad is ``train_batch_size = micro * gradient_accumulation_steps * dp``
by construction.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterator, Mapping
from typing import Any

import attrs

import mdc
from mdc.api import (
    MASTER_ADDR,
    MASTER_PORT,
    NODE_RANK,
    Artifact,
    Finding,
    Launch,
    LauncherSpec,
    Plan,
    Role,
    SearchSpace,
    Severity,
    TrainingSetup,
    Word,
)
from mdc.api.files import read_schema
from mdc.api.shell import out_file
from mdc.api.torchrun import (
    TorchrunOptions,
    program,
    runner_env,
    runner_worker_env,
    torchrun_argv,
    torchrun_findings,
    torchrun_worker_env,
)

CONFIG_PATH = "launch/ds_config.json"
HOSTFILE_PATH = "launch/hostfile"
#: where every worker finds the path of ds_config.json (DeepSpeed reads no such variable itself)
CONFIG_VARIABLE = "MDC_DEEPSPEED_CONFIG"
#: the flags ``deepspeed.add_config_arguments`` defines; the script reads the second one
CONFIG_FLAGS = ("--deepspeed", "--deepspeed_config")
#: mdc's accelerator -> DeepSpeed's accelerator name (ROCm runs DeepSpeed's cuda accelerator)
DS_ACCELERATORS = {"nvidia": "cuda", "amd": "cuda", "cpu": "cpu"}
#: [model] dtype -> precision; fp8 has no ds_config mode of its own
DTYPE_PRECISION = {"bf16": "bf16", "fp16": "fp16", "fp32": "fp32"}

TRIAD = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")

#: Top-level ds_config keys DeepSpeed 0.19.8 refuses (DeepSpeedConfigError), with a way out.
REMOVED_KEYS = {
    "amp": "use [deepspeed] precision (bf16 or fp16) instead",
    "compression_training": "remove it: the compression library is gone",
    "curriculum_learning": "move it to data_efficiency.data_sampling.curriculum_learning",
    "eigenvalue": "remove it: eigenvalue-based MoQ is gone",
    "elasticity": "remove it; the batch triad comes from [batch]",
    "graph_harvesting": "remove it: graph harvesting is gone",
    "nebula": "remove it: Nebula checkpointing is gone",
    "progressive_layer_drop": "remove it: progressive layer dropping is gone",
    "quantize_training": "remove it: MoQ is gone",
    "sparse_attention": "remove it: sparse attention is gone",
    "sparse_gradients": "remove it: sparse embedding gradients need no flag",
}
#: zero_optimization keys DeepSpeed 0.19.8 refuses (DeepSpeedConfigError).
REMOVED_ZERO_KEYS = {
    "mics_hierarchical_params_gather": "remove it: MiCS sharding is gone",
    "mics_shard_size": "remove it: MiCS sharding is gone",
    "zeropp_loco_param": "remove it to use ZeRO++ quantized gradients without LoCo",
}
#: zero_optimization keys DeepSpeedZeroConfig 0.19.8 accepts (field names and their aliases);
#: it forbids any other ("Extra inputs are not permitted").
ZERO_KEYS = frozenset(
    {
        "allgather_bucket_size",
        "allgather_partitions",
        "allgather_sequential",
        "compute_grad_norm",
        "contiguous_gradients",
        "cpu_offload",
        "cpu_offload_param",
        "cpu_offload_use_pin_memory",
        "elastic_checkpoint",
        "enable_sanity_checks",
        "gather_16bit_weights_on_model_save",
        "ignore_unused_parameters",
        "leaf_module",
        "legacy_stage1",
        "load_from_fp32_weights",
        "log_trace_cache_warnings",
        "max_live_parameters",
        "max_reuse_distance",
        "memory_efficient_linear",
        "model_persistence_threshold",
        "module_granularity_threshold",
        "offload_optimizer",
        "offload_param",
        "overlap_comm",
        "override_module_apply",
        "param_persistence_threshold",
        "parameter_alignment",
        "pipeline_loading_checkpoint",
        "prefetch_bucket_size",
        "reduce_bucket_size",
        "reduce_scatter",
        "round_robin_gradients",
        "save_muon_momentum_buffer_in_memory",
        "stage",
        "stage3_gather_fp16_weights_on_model_save",
        "sub_group_size",
        "use_all_reduce_for_fetch_params",
        "use_multi_rank_bucket_allreduce",
        "zenflow",
        "zero_hpz_partition_size",
        "zero_quantized_gradients",
        "zero_quantized_nontrainable_weights",
        "zero_quantized_weights",
        # aliases
        "stage3_allgather_sequential",
        "stage3_gather_16bit_weights_on_model_save",
        "stage3_max_live_parameters",
        "stage3_max_reuse_distance",
        "stage3_model_persistence_threshold",
        "stage3_module_granularity_threshold",
        "stage3_param_persistence_threshold",
        "stage3_prefetch_bucket_size",
        "stage3_use_all_reduce_for_fetch_params",
    }
)
#: launchers a user may have left at the front of the command
LAUNCHER_COMMANDS = ("deepspeed", "torchrun")


@attrs.frozen(kw_only=True, repr=False)  # options are read, never shown
class DeepSpeedOptions:
    """The ``[deepspeed]`` table; None means "not given"."""

    runner: str | None = None
    zero_stage: int | None = None
    precision: str | None = None
    config: Mapping[str, Any] = attrs.field(factory=dict)
    config_argument: bool | None = None
    local_rank_argument: bool | None = None


def _options(options: DeepSpeedOptions | None) -> DeepSpeedOptions:
    return options if options is not None else DeepSpeedOptions()


def _torchrun_table(plan: Plan) -> TorchrunOptions | None:
    table = plan.options.get("torchrun")
    return table if isinstance(table, TorchrunOptions) else None


def runner_of(plan: Plan, opts: DeepSpeedOptions) -> str:
    """The runner: as written, else torchrun when the backend cannot name several hosts."""
    if opts.runner is not None:
        return opts.runner
    return "torchrun" if plan.hosts is None and plan.nnodes > 1 else "deepspeed"


def precision_of(plan: Plan, opts: DeepSpeedOptions) -> str | None:
    """bf16, fp16 or fp32; None when [model] dtype has no DeepSpeed counterpart (fp8)."""
    if opts.precision is not None:
        return opts.precision
    dtype = plan.model.dtype if plan.model is not None else None
    return "fp32" if dtype is None else DTYPE_PRECISION.get(dtype)


def zero_stage_of(opts: DeepSpeedOptions) -> int:
    return opts.zero_stage if opts.zero_stage is not None else 0


def triad(plan: Plan) -> tuple[int, int, int]:
    """(train_batch_size, micro batch per GPU, gradient accumulation steps) for DP = plan dp."""
    if plan.batch is None:
        return plan.sizes.dp, 1, 1
    batch = plan.batch
    return batch.global_batch_size, batch.micro_batch_size, batch.grad_accum_steps


def derived_config(plan: Plan, opts: DeepSpeedOptions) -> dict[str, Any]:
    """The ds_config keys mdc owns."""
    total, micro, steps = triad(plan)
    precision = precision_of(plan, opts) or "fp32"
    return {
        "train_batch_size": total,
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": steps,
        "zero_optimization": {"stage": zero_stage_of(opts)},
        "bf16": {"enabled": precision == "bf16"},
        "fp16": {"enabled": precision == "fp16"},
    }


def ds_config(plan: Plan, opts: DeepSpeedOptions) -> dict[str, Any]:
    """The user's ``config`` with mdc's keys merged in (a clash is a finding, never emitted)."""
    merged: dict[str, Any] = dict(opts.config.items())
    for key, value in derived_config(plan, opts).items():
        given = merged.get(key)
        if isinstance(value, dict) and isinstance(given, Mapping):
            merged[key] = {**given, **value}
        else:
            merged[key] = value
    return merged


def hostfile(plan: Plan) -> str:
    """One ``HOST slots=G`` line per node, in node-rank order."""
    lines = [
        "# Node layout for deepspeed --no_ssh: one line per node, in node-rank order.",
        "# Every node starts its own launcher; no host is reached through this file.",
    ]
    hosts = list(plan.hosts or ())
    usable = len(set(hosts)) == len(hosts) == plan.nnodes and all(
        re.fullmatch(r"[^\s#]\S*", host) for host in hosts
    )
    if not usable:
        why = (
            "the backend learns its hosts only at run time"
            if plan.hosts is None
            else "the backend's host names repeat or are not single words"
        )
        lines.append(f"# These names are labels: {why}.")
        hosts = [f"node-{index}" for index in range(plan.nnodes)]
    lines += [f"{host} slots={plan.nproc_per_node}" for host in hosts]
    return "\n".join(lines)


def _config_args(opts: DeepSpeedOptions) -> list[Word]:
    if opts.config_argument is False:
        return []
    return [CONFIG_FLAGS[0], CONFIG_FLAGS[1], out_file(CONFIG_PATH)]


def _deepspeed_program(plan: Plan) -> list[str]:
    """The job's command as the deepspeed runner's trailing words (underscore flags)."""
    words = program(plan.job.argv)
    if words and words[0] == "--no-python":
        return ["--no_python", *words[1:]]
    return words


def deepspeed_flags(plan: Plan, opts: DeepSpeedOptions) -> list[Word]:
    flags: list[Word] = [
        "deepspeed",
        "--hostfile",
        out_file(HOSTFILE_PATH),
        "--no_ssh",
        "--node_rank",
        NODE_RANK,
        "--master_addr",
        MASTER_ADDR,
        "--master_port",
        MASTER_PORT,
        "--num_nodes",
        str(plan.nnodes),
        "--num_gpus",
        str(plan.nproc_per_node),
    ]
    if opts.local_rank_argument is False:
        flags.append("--no_local_rank")
    return flags


def torchrun_options(plan: Plan) -> TorchrunOptions:
    """The ``[torchrun]`` table, with static rendezvous unless it names a backend."""
    table = _torchrun_table(plan) or TorchrunOptions()
    return attrs.evolve(table, rdzv_backend=table.rdzv_backend or "static")


# only read, never compared or printed: no generated ==, hash or repr (start-up time)
@attrs.frozen(kw_only=True, eq=False, repr=False)
class _Runner:
    """What one runner contributes to the launch."""

    #: the launcher and its flags, up to the program
    prefix: list[Word]
    #: the whole command line
    argv: list[Word]
    env: dict[str, Word]
    worker_env: dict[str, str]
    files: list[Artifact]


def _deepspeed_runner(plan: Plan, opts: DeepSpeedOptions) -> _Runner:
    nproc, nnodes = plan.nproc_per_node, plan.nnodes
    prefix = deepspeed_flags(plan, opts)
    local_rank = f"0..{nproc - 1}"
    if opts.local_rank_argument is not False:
        local_rank += " (also passed as --local_rank=<i>)"
    return _Runner(
        prefix=prefix,
        argv=[*prefix, *_deepspeed_program(plan), *_config_args(opts)],
        # what torchrun would give, so a script reads the same names under either runner
        env={"GROUP_RANK": NODE_RANK, "LOCAL_WORLD_SIZE": str(nproc)},
        worker_env={
            "RANK": f"CROSS_RANK * {nproc} + LOCAL_RANK (hostfile order)",
            "LOCAL_RANK": local_rank,
            "WORLD_SIZE": str(plan.world_size),
            "LOCAL_SIZE": str(nproc),
            "CROSS_RANK": "NODE_RANK",
            "CROSS_SIZE": str(nnodes),
            "MASTER_ADDR": "node 0",
            "MASTER_PORT": plan.rendezvous.text(),
            "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in range(nproc))
            + " (set by the deepspeed launcher)",
            "GROUP_RANK": "NODE_RANK (set by mdc, as torchrun would)",
            "LOCAL_WORLD_SIZE": f"{nproc} (set by mdc, as torchrun would)",
        },
        files=[Artifact.text(HOSTFILE_PATH, hostfile(plan))],
    )


def _torchrun_runner(plan: Plan, opts: DeepSpeedOptions) -> _Runner:
    nproc, nnodes = plan.nproc_per_node, plan.nnodes
    topts = torchrun_options(plan)
    # what the deepspeed launcher would give, so a script reads the same names
    env: dict[str, Word] = {"LOCAL_SIZE": str(nproc), "CROSS_SIZE": str(nnodes)}
    worker_env = torchrun_worker_env(plan, topts)
    by_mdc = " (set by mdc, as the deepspeed launcher would)"
    worker_env.update(LOCAL_SIZE=f"{nproc}{by_mdc}", CROSS_SIZE=f"{nnodes}{by_mdc}")
    if nnodes == 1 or topts.rdzv_backend == "static":  # c10d: node ranks follow join order
        env["CROSS_RANK"] = "0" if nnodes == 1 else NODE_RANK
        worker_env["CROSS_RANK"] = ("0" if nnodes == 1 else "NODE_RANK") + by_mdc
    return _Runner(
        prefix=torchrun_argv(plan, topts, []),
        argv=torchrun_argv(plan, topts, [*program(plan.job.argv), *_config_args(opts)]),
        env=env,
        worker_env=worker_env,
        files=[],
    )


def emit(plan: Plan, options: DeepSpeedOptions | None) -> Launch:
    opts = _options(options)
    name = runner_of(plan, opts)
    runner = (_deepspeed_runner if name == "deepspeed" else _torchrun_runner)(plan, opts)
    accelerator = DS_ACCELERATORS[plan.accelerator]
    env = {
        **runner.env,
        "DS_ACCELERATOR": accelerator,
        CONFIG_VARIABLE: out_file(CONFIG_PATH),
        **runner_env(plan, runner.prefix),
    }
    worker_env = {
        **runner.worker_env,
        "DS_ACCELERATOR": accelerator,
        CONFIG_VARIABLE: f"the absolute path of {CONFIG_PATH}",
        **runner_worker_env(plan, name),
    }
    files = [Artifact.json(CONFIG_PATH, ds_config(plan, opts)), *runner.files]
    return Launch(
        roles=(Role(name="worker", argv=tuple(runner.argv), env=dict(sorted(env.items()))),),
        files=tuple(files),
        worker_env=dict(sorted(worker_env.items())),
    )


# ---------------------------------------------------------------- checks


def _pointer(*parts: str) -> str:
    return "".join("/" + p.replace("~", "~0").replace("/", "~1") for p in parts)


def _non_json(value: object, path: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], str]]:
    """Values json cannot write as standard JSON: where, and what they are."""
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                yield (*path, str(key)), f"a non-string key {key!r}"
            else:
                yield from _non_json(item, (*path, key))
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            yield from _non_json(item, (*path, str(index)))
    elif isinstance(value, float) and not math.isfinite(value):
        yield path, f"the number {value!r}"
    elif not (value is None or isinstance(value, (str, int, float, bool))):
        yield path, f"a {type(value).__name__} value"


def _config_findings(plan: Plan, opts: DeepSpeedOptions) -> Iterator[Finding]:
    config = opts.config
    derived = derived_config(plan, opts)
    total, micro, steps = triad(plan)
    for path, what in _non_json(config, ("deepspeed", "config")):
        yield Finding(
            code="MDC312",
            pointer=_pointer(*path),
            message=f"ds_config.json cannot hold {what}: JSON has no such value",
            hint="write a string, a finite number, true/false, a list or a table",
        )
    for key in TRIAD:
        if key not in config:
            continue
        where = _pointer("deepspeed", "config", key)
        arithmetic = (
            f"train_batch_size {total} = micro {micro} * accumulation {steps} * dp {plan.sizes.dp}"
        )
        if _same(config[key], derived[key]):
            yield _redundant(where, f"{key} = {derived[key]}", f"from [batch] and dp: {arithmetic}")
            continue
        yield Finding(
            code="MDC311",
            pointer=where,
            message=f"[deepspeed] config sets {key} = {_json_text(config[key])}, but "
            f"mdc derives it ({derived[key]}) from [batch] and dp: {arithmetic}",
            hint="remove it; set [batch] global_batch_size and micro_batch_size instead",
        )
    precision = precision_of(plan, opts) or "fp32"
    owned = {
        "zero_optimization": ("stage", "zero_stage", zero_stage_of(opts)),
        "bf16": ("enabled", "precision", precision),
        "fp16": ("enabled", "precision", precision),
    }
    for table, (key, setting, now) in owned.items():
        if table not in config:
            continue
        given = config[table]
        source = f"[deepspeed] {setting} (now {now})"
        if not isinstance(given, Mapping):
            yield Finding(
                code="MDC311",
                pointer=_pointer("deepspeed", "config", table),
                message=f"[deepspeed] config sets {table} = {_json_text(given)}; mdc "
                "writes "
                f"{table}.{key} from {source}, so {table} must be a table",
                hint=f"write {table} as a table without {key!r}",
            )
        elif key in given:
            value, where = given[key], _pointer("deepspeed", "config", table, key)
            written = f"{table}.{key} = {_json_text(derived[table][key])}"
            if _same(value, derived[table][key]):
                yield _redundant(where, written, f"from {source}")
                continue
            if setting == "zero_stage" and value in (0, 1, 2, 3) and not isinstance(value, bool):
                hint = f"set [deepspeed] zero_stage = {value} instead"
            elif setting == "precision" and value is True:
                hint = f'set [deepspeed] precision = "{table}" instead'
            else:
                hint = f"remove {table}.{key} from config; [deepspeed] {setting} decides it"
            yield Finding(
                code="MDC311",
                pointer=where,
                message=f"[deepspeed] config sets {table}.{key} = {_json_text(value)}, "
                f"but mdc writes {written} from {source}",
                hint=hint,
            )
    if "bfloat16" in config:
        yield Finding(
            code="MDC311",
            pointer=_pointer("deepspeed", "config", "bfloat16"),
            message="DeepSpeed reads bfloat16 only when bf16 is absent, and mdc always "
            "writes bf16 (from [deepspeed] precision), so bfloat16 would be "
            "ignored",
            hint='put these keys under bf16, and set [deepspeed] precision = "bf16"',
        )
    for key in sorted(set(config) & set(REMOVED_KEYS)):
        yield Finding(
            code="MDC313",
            pointer=_pointer("deepspeed", "config", key),
            message=f"DeepSpeed 0.19.8 removed {key!r} and refuses a ds_config that "
            "has it (DeepSpeedConfigError)",
            hint=REMOVED_KEYS[key],
        )
    zero = config.get("zero_optimization")
    if isinstance(zero, Mapping):
        yield from _zero_key_findings(zero)


def _zero_key_findings(zero: Mapping[str, object]) -> Iterator[Finding]:
    """MDC313/MDC314: the zero_optimization keys DeepSpeed refuses. A removed key is refused
    whatever its value; any other unknown key by DeepSpeedZeroConfig (extra="forbid"),
    except with the value "auto": its constructor drops those first, so one is only ignored."""
    for raw, value in sorted(zero.items(), key=lambda item: str(item[0])):
        key = str(raw)
        at = _pointer("deepspeed", "config", "zero_optimization", key)
        if key in REMOVED_ZERO_KEYS:
            yield Finding(
                code="MDC313",
                pointer=at,
                message=f"DeepSpeed 0.19.8 removed zero_optimization.{key} and "
                "refuses a ds_config that has it (DeepSpeedConfigError)",
                hint=REMOVED_ZERO_KEYS[key],
            )
        elif key in ZERO_KEYS:
            continue
        elif value == "auto":
            yield Finding(
                code="MDC314",
                pointer=at,
                severity=Severity.WARNING,
                message=f"DeepSpeed 0.19.8 does not read zero_optimization.{key}: "
                'it drops keys whose value is "auto" before reading the section, so this '
                "one has no effect",
                hint="remove it",
            )
        else:
            import difflib  # only a config with an unknown key gets this far

            near = difflib.get_close_matches(key, sorted(ZERO_KEYS), n=1, cutoff=0.6)
            # an error: DeepSpeed stops the job at start
            yield Finding(
                code="MDC314",
                pointer=at,
                message=f"DeepSpeed 0.19.8 does not know zero_optimization.{key} "
                "and refuses it (Extra inputs are not permitted)",
                hint=f"did you mean {near[0]!r}?"
                if near
                else "remove it, unless your DeepSpeed is newer and knows it",
            )


def _same(given: object, derived: object) -> bool:
    """Whether a ``config`` value says what mdc writes (true is not 1)."""
    return _json_text(given) == _json_text(derived)


def _redundant(pointer: str, written: str, source: str) -> Finding:
    return Finding(
        code="MDC311",
        pointer=pointer,
        severity=Severity.WARNING,
        message=f"[deepspeed] config repeats {written}, which mdc writes anyway ({source})",
        hint="remove it from config",
    )


def _json_text(value: object) -> str:
    """A spec value as the user wrote it (JSON spelling: true, false, "text")."""
    try:
        return json.dumps(value, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError):
        return repr(value)


def _command_findings(plan: Plan, opts: DeepSpeedOptions, runner: str) -> Iterator[Finding]:
    argv = plan.job.argv
    listed = not isinstance(plan.job.command, str)

    def at(index: int) -> str:
        return _pointer("job", "command", str(index)) if listed else "/job/command"

    if argv and os.path.basename(argv[0]) in LAUNCHER_COMMANDS:
        yield Finding(
            code="MDC317",
            pointer=at(0),
            message=f"the command starts with {argv[0]!r}, but the deepspeed launcher "
            f"already runs it under {runner}",
            hint='give only the program, e.g. ["python", "train.py", ...]',
        )
    if opts.config_argument is not False:
        for index, word in enumerate(argv):
            flag = word.split("=", 1)[0]
            if flag in ("--deepspeed_config", "--deepscale_config"):
                yield Finding(
                    code="MDC317",
                    pointer=at(index),
                    message=f"the command already passes {flag}, and mdc appends "
                    f"--deepspeed_config <{CONFIG_PATH}>; argparse keeps the "
                    "last one (deepspeed.initialize refuses both "
                    "--deepscale_config and --deepspeed_config)",
                    hint="remove it from the command (mdc writes ds_config.json), or "
                    "set [deepspeed] config_argument = false",
                )
    if runner == "torchrun" and opts.local_rank_argument is True:
        yield Finding(
            code="MDC317",
            pointer="/deepspeed/local_rank_argument",
            message="torchrun never passes --local_rank=<i> to workers, so "
            'local_rank_argument = true needs runner = "deepspeed"',
            hint="read LOCAL_RANK from the environment and drop "
            'local_rank_argument, or set runner = "deepspeed"',
        )


def check(plan: Plan, options: DeepSpeedOptions | None) -> Iterator[Finding]:
    opts = _options(options)
    runner = runner_of(plan, opts)
    stage, sizes = zero_stage_of(opts), plan.sizes
    if stage >= 2 and sizes.pp > 1:
        yield Finding(
            code="MDC310",
            pointer="/deepspeed/zero_stage",
            message=f"DeepSpeed's pipeline engine refuses ZeRO stage {stage} with "
            f'pipeline parallelism (pp = {sizes.pp}): "ZeRO-2 and ZeRO-3 are '
            'incompatible with pipeline parallelism"',
            hint="use zero_stage = 0 or 1 with pp > 1, or pp = 1",
        )
    if plan.elastic:
        total, _, _ = triad(plan)
        yield Finding(
            code="MDC315",
            pointer="/distributed/min_nnodes",
            message=f"DeepSpeed cannot run an elastic job (min_nnodes = "
            f"{plan.min_nnodes} < nnodes = {plan.nnodes}): ds_config.json "
            f"fixes train_batch_size = {total} for dp = {sizes.dp}, which "
            "DeepSpeed refuses when fewer nodes join, and DeepSpeed 0.19.8 "
            "removed its elasticity support",
            hint=f"remove min_nnodes (a fixed {plan.nnodes}-node job)",
        )
    if precision_of(plan, opts) is None and plan.model is not None:
        yield Finding(
            code="MDC316",
            pointer="/model/dtype",
            message=f"ds_config.json has no {plan.model.dtype} mode (only bf16, fp16 "
            "or fp32), so [model] dtype does not say how DeepSpeed trains",
            hint='set [deepspeed] precision, e.g. "bf16"',
        )
    if sizes.tp * sizes.cp > 1:
        total, micro, steps = triad(plan)
        axis = "tp" if sizes.tp > 1 else "cp"
        yield Finding(
            code="MDC319",
            pointer=f"/parallelism/{axis}",
            severity=Severity.WARNING,
            message=f"DeepSpeed checks train_batch_size = {total} against micro "
            f"{micro} * accumulation {steps} * its data-parallel size; with "
            f"tp = {sizes.tp} and cp = {sizes.cp} that is dp = {sizes.dp} only "
            "if the script passes deepspeed.initialize an mpu (as "
            "Megatron-DeepSpeed does), else it is the world size "
            f"{plan.world_size} and DeepSpeed refuses the config",
            hint="pass an mpu whose get_data_parallel_world_size() is "
            f"{sizes.dp}, or keep tp = cp = 1",
        )
    yield from _config_findings(plan, opts)
    yield from _command_findings(plan, opts, runner)
    table = _torchrun_table(plan)
    if runner == "torchrun":
        yield from torchrun_findings(plan, table)
    elif table is not None:
        yield Finding(
            code="MDC318",
            pointer="/torchrun",
            severity=Severity.WARNING,
            message="the [torchrun] table is not used: the deepspeed launcher runs "
            'with runner = "deepspeed"',
            hint='remove [torchrun], or set [deepspeed] runner = "torchrun"',
        )


#: what the memory hint proposes, in the [deepspeed] table's words
LEVERS = (
    *((f"zero {stage}", f"[deepspeed] zero_stage = {stage}") for stage in (1, 2, 3)),
    (
        "optimizer offload",
        '[deepspeed.config.zero_optimization.offload_optimizer] device = "cpu"',
    ),
)


def _offloaded(opts: DeepSpeedOptions, key: str) -> bool:
    """Whether ds_config's zero_optimization.<key> sends it to the host ("cpu" or "nvme")."""
    zero = opts.config.get("zero_optimization")
    table = zero.get(key) if isinstance(zero, Mapping) else None
    device = table.get("device") if isinstance(table, Mapping) else None
    return device in ("cpu", "nvme")


def _overlaps(opts: DeepSpeedOptions, stage: int) -> bool:
    """zero_optimization.overlap_comm as DeepSpeed reads it: as written, else on for stage 3
    only (DeepSpeedZeroConfig's default)."""
    zero = opts.config.get("zero_optimization")
    written = zero.get("overlap_comm") if isinstance(zero, Mapping) else None
    return bool(written) if isinstance(written, bool) else stage == 3


ZERO = "zero_stage"
OVERLAP = "config.zero_optimization.overlap_comm"
OFFLOAD_OPTIMIZER = "config.zero_optimization.offload_optimizer.device"
OFFLOAD_PARAM = "config.zero_optimization.offload_param.device"


def search_switches(
    tp: int, chunk_layers: int, held: Mapping[str, Any]
) -> Iterator[dict[str, Any]]:
    """What mdc tune tries in [deepspeed]: ZeRO stages 0-3, each with overlap_comm on (off
    by default below stage 3), and the host offloads DeepSpeed runs: the optimizer state
    (stages 1-3) and the weights (stage 3). mdc tune searches only the data-parallel size
    for a data-parallel launcher (tp, cp and pp are the script's, held as written)."""
    stages = [held[ZERO]] if held.get(ZERO) is not None else [0, 1, 2, 3]
    for stage in stages:
        base: dict[str, Any] = {ZERO: stage}
        if stage in (1, 2):
            base[OVERLAP] = True
        yield base
        if stage >= 1 and held.get(OFFLOAD_OPTIMIZER) is None:
            yield {**base, OFFLOAD_OPTIMIZER: "cpu"}
            if stage == 3 and held.get(OFFLOAD_PARAM) is None:
                yield {**base, OFFLOAD_OPTIMIZER: "cpu", OFFLOAD_PARAM: "cpu"}


#: DeepSpeed's pipeline engine runs one stage per rank (no interleaving)
SEARCH = SearchSpace(switches=search_switches, interleaves=lambda pp, vpp, held: vpp == 1)


def training(options: DeepSpeedOptions | None) -> TrainingSetup:
    """ZeRO (Rajbhandari et al. 2020): stage 1 shards the optimizer state, 2 also the
    gradients (kept in the 16-bit training dtype), 3 also the weights. offload_optimizer
    (stages 1-3, ZeRO-Offload) keeps the optimizer state on the host; offload_param (stage
    3, ZeRO-Infinity) also the weights."""
    opts = _options(options)
    stage = zero_stage_of(opts)
    return TrainingSetup(
        zero_stage=stage,
        grad_bytes=4 if opts.precision == "fp32" else 2,
        optimizer_offload=1.0 if stage >= 1 and _offloaded(opts, "offload_optimizer") else 0.0,
        param_offload=stage == 3 and _offloaded(opts, "offload_param"),
        overlap_grad_reduce=_overlaps(opts, stage),
        overlap_param_gather=stage == 3,
        levers=LEVERS,
    )


@mdc.hookimpl
def mdc_register_launchers() -> list[LauncherSpec]:
    return [
        LauncherSpec(
            reads=("torchrun",),  # [torchrun] tunes the torchrun it runs on
            name="deepspeed",
            description="DeepSpeed: the deepspeed command (--no_ssh) or torchrun on every node, "
            "with a ds_config.json whose batch triad matches the plan",
            parallelism="data",
            emit=emit,
            check=check,
            training=training,
            search=SEARCH,
            schema=read_schema("mdc_schemas", "plugins/deepspeed.v1.schema.json"),
            options_type=DeepSpeedOptions,
        )
    ]
