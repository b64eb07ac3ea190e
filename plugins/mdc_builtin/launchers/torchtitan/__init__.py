"""TorchTitan on torchrun: the plan as a TorchTitan job config, and as command-line overrides.

``launch/torchtitan.toml`` holds the job config TorchTitan 0.2.x reads
(``--job.config_file``): ``[job]``, ``[model] name/flavor``, ``[training]``
batch and sequence, ``[parallelism]`` degrees, plus any ``[torchtitan] config``
pass-through keys. The same degrees and batch follow as ``--section.key value``
overrides, the syntax TorchTitan's config manager (tyro) reads in 0.2.x and in
the releases after it, so they hold whatever the file says. Data parallelism
is split into ``data_parallel_replicate_degree`` (option ``dp_replicate``) and
``data_parallel_shard_degree`` (FSDP), both written out (never -1).
TorchTitan's own rules (ParallelDims, pipeline schedule, sequence length) are
checked at compile time.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import attrs

import mdc
from mdc.api import (
    Artifact,
    Finding,
    Launch,
    LauncherSpec,
    PipelineSplit,
    Plan,
    Role,
    Severity,
    TrainingSetup,
    Word,
)
from mdc.api.files import read_schema
from mdc.api.flags import FlagTable, KnownFlag, command_pointer
from mdc.api.shell import out_file
from mdc.api.stages import torchtitan_shares
from mdc.api.torchrun import (
    TorchrunOptions,
    program,
    runner_worker_env,
    torchrun_argv,
    torchrun_env,
    torchrun_findings,
    torchrun_worker_env,
)
from mdc_builtin.launchers.torchtitan.overrides import (
    MEMORY_OVERRIDES,
    override_findings,
    override_name,
    read_command,
)
from mdc_builtin.launchers.torchtitan.schedules import MULTI_STAGE, SINGLE_STAGE, V_SHAPED
from mdc_builtin.launchers.torchtitan.search import SEARCH

CONFIG_PATH = "launch/torchtitan.toml"
#: TorchTitan's mesh is built in one fixed layout, Megatron-Core's default order.
TORCHTITAN_ORDER = "tp-cp-ep-dp-pp"
#: TorchTitan's defaults where mdc needs them.
DEFAULT_MODEL, DEFAULT_FLAVOR, DEFAULT_DUMP_FOLDER = "llama3", "debugmodel", "./outputs"
DEFAULT_SEQ_LEN = 2048
#: [model] dtype -> training.mixed_precision_param (TorchTitan has no fp16 training)
PRECISION = {"bf16": "bfloat16", "fp32": "float32", "fp8": "bfloat16"}
FLOAT8_CONVERTER = "quantize.linear.float8"
#: [torchtitan] options that own a config key: pass-through keys must not set it
OPTION_KEYS: Mapping[tuple[str, str], str] = {
    ("job", "dump_folder"): "dump_folder",
    ("model", "name"): "model",
    ("model", "flavor"): "flavor",
    ("training", "steps"): "steps",
    ("training", "seq_len"): "seq_len (or [model] seq_length)",
    ("parallelism", "data_parallel_replicate_degree"): "dp_replicate",
    ("parallelism", "pipeline_parallel_schedule"): "pipeline_schedule",
    ("parallelism", "pipeline_parallel_microbatch_size"): "pipeline_microbatch_size",
}
#: config keys mdc derives from the core tables
DERIVED_KEYS: Mapping[tuple[str, str], str] = {
    ("job", "config_file"): "the path of launch/torchtitan.toml",
    ("job", "description"): "[job] name",
    ("training", "local_batch_size"): "[batch] micro_batch_size",
    ("training", "global_batch_size"): "[batch] global_batch_size",
    ("training", "mixed_precision_param"): "[model] dtype",
    ("model", "converters"): "[model] dtype",
    ("parallelism", "data_parallel_shard_degree"): "[parallelism] (dp / dp_replicate)",
    ("parallelism", "tensor_parallel_degree"): "[parallelism] tp",
    ("parallelism", "pipeline_parallel_degree"): "[parallelism] pp",
    ("parallelism", "context_parallel_degree"): "[parallelism] cp",
    ("parallelism", "expert_parallel_degree"): "[parallelism] ep",
    ("parallelism", "expert_tensor_parallel_degree"): "[parallelism] etp",
    ("parallelism", "pipeline_parallel_layers_per_stage"): "[parallelism] vpp and [model] "
    "num_layers",
}


@attrs.frozen(kw_only=True, repr=False)  # options are read, never shown
class TorchtitanOptions:
    """The ``[torchtitan]`` table; ``None`` means "not given"."""

    model: str | None = None
    flavor: str | None = None
    dump_folder: str | None = None
    steps: int | None = None
    seq_len: int | None = None
    dp_replicate: int | None = None
    pipeline_schedule: str | None = None
    pipeline_microbatch_size: int | None = None
    config: Mapping[str, Mapping[str, Any]] = attrs.field(factory=dict)


def _options(options: TorchtitanOptions | None) -> TorchtitanOptions:
    return options or TorchtitanOptions()


def _torchrun(plan: Plan) -> TorchrunOptions | None:
    opts = plan.options.get("torchrun")
    return opts if isinstance(opts, TorchrunOptions) else None


def dp_split(plan: Plan, opts: TorchtitanOptions) -> tuple[int, int]:
    """(data_parallel_replicate_degree, data_parallel_shard_degree)."""
    replicate = opts.dp_replicate or 1
    return replicate, max(1, plan.sizes.dp // replicate)


def seq_len(plan: Plan, opts: TorchtitanOptions) -> tuple[int | None, str]:
    """The sequence length mdc writes (None: TorchTitan's default) and where it comes from."""
    if opts.seq_len is not None:
        return opts.seq_len, "/torchtitan/seq_len"
    if plan.model is not None and plan.model.seq_length is not None:
        return plan.model.seq_length, "/model/seq_length"
    return None, ""


def _passed(opts: TorchtitanOptions, section: str, key: str, default: Any) -> Any:
    """A pass-through config value (``default`` when not given)."""
    table = opts.config.get(section, {})
    return table.get(key, default) if isinstance(table, Mapping) else default


def _passed_count(opts: TorchtitanOptions, key: str) -> int:
    """A pass-through ``[parallelism]`` layer count that defaults to 1 in TorchTitan."""
    value = _passed(opts, "parallelism", key, 1)
    return value if isinstance(value, int) and not isinstance(value, bool) else 1


def schedule(plan: Plan, opts: TorchtitanOptions) -> str:
    if opts.pipeline_schedule is not None:
        return opts.pipeline_schedule
    return "Interleaved1F1B" if plan.sizes.vpp else "1F1B"


def layers_per_stage(plan: Plan, opts: TorchtitanOptions) -> int | None:
    """``pipeline_parallel_layers_per_stage`` giving pp * vpp stages (None: none does).

    TorchTitan makes ``ceil((layers + first_less + last_less) / layers_per_stage)``
    stages; without the key a looped schedule gets 2 stages per rank.
    """
    layers = plan.model.num_layers if plan.model else None
    vpp = plan.sizes.vpp
    if layers is None or vpp is None:
        return None
    weighted = (
        layers
        + _passed_count(opts, "pipeline_parallel_first_stage_less_layers")
        + _passed_count(opts, "pipeline_parallel_last_stage_less_layers")
    )
    stages = plan.sizes.pp * vpp
    fitting = [n for n in range(1, weighted + 1) if math.ceil(weighted / n) == stages]
    return max(fitting) if fitting else None


def _needs_layers_per_stage(plan: Plan) -> bool:
    return plan.sizes.vpp is not None and plan.sizes.vpp > 2


def derived(plan: Plan, options: TorchtitanOptions | None) -> dict[str, dict[str, Any]]:
    """The config keys mdc writes, by section, before the pass-through keys."""
    opts = _options(options)
    s = plan.sizes
    replicate, shard = dp_split(plan, opts)
    config: dict[str, dict[str, Any]] = {
        "job": {
            "description": plan.job.name,
            "dump_folder": opts.dump_folder or DEFAULT_DUMP_FOLDER,
        },
        "model": {"name": opts.model or DEFAULT_MODEL, "flavor": opts.flavor or DEFAULT_FLAVOR},
        "training": {},
        "parallelism": {
            "data_parallel_replicate_degree": replicate,
            "data_parallel_shard_degree": shard,
            "tensor_parallel_degree": s.tp,
            "pipeline_parallel_degree": s.pp,
            "context_parallel_degree": s.cp,
            "expert_parallel_degree": s.ep,
            "expert_tensor_parallel_degree": s.etp,
        },
    }
    dtype = plan.model.dtype if plan.model else None
    if dtype == "fp8":
        config["model"]["converters"] = [FLOAT8_CONVERTER]
    training = config["training"]
    if plan.batch is not None:
        training["local_batch_size"] = plan.batch.micro_batch_size
        training["global_batch_size"] = plan.batch.global_batch_size
    length, _ = seq_len(plan, opts)
    if length is not None:
        training["seq_len"] = length
    if opts.steps is not None:
        training["steps"] = opts.steps
    if dtype in PRECISION:
        training["mixed_precision_param"] = PRECISION[dtype]
    parallelism = config["parallelism"]
    if s.pp > 1:
        parallelism["pipeline_parallel_schedule"] = schedule(plan, opts)
        if opts.pipeline_microbatch_size is not None:
            parallelism["pipeline_parallel_microbatch_size"] = opts.pipeline_microbatch_size
        per_stage = layers_per_stage(plan, opts)
        if _needs_layers_per_stage(plan) and per_stage is not None:
            parallelism["pipeline_parallel_layers_per_stage"] = per_stage
    return config


def config_toml(plan: Plan, options: TorchtitanOptions | None) -> str:
    """``launch/torchtitan.toml``: mdc's keys first, then the pass-through keys, sorted."""
    opts = _options(options)
    config = derived(plan, opts)
    for section in sorted(opts.config):
        extra = opts.config[section]
        merged = config.setdefault(section, {})
        for key in sorted(extra):
            merged[key] = _sorted(extra[key])
    comments = [
        (
            f"TorchTitan job config for job {plan.job.name!r}, written by mdc "
            "(TorchTitan 0.2.x reads it through --job.config_file)."
        ),
        (
            "The parallel degrees and the batch are repeated as command-line overrides "
            "in launch/worker.sh."
        ),
    ]
    return toml_text(comments, {name: values for name, values in config.items() if values})


def toml_text(comments: Sequence[str], sections: Mapping[str, Mapping[str, Any]]) -> str:
    """Comment lines, then one table per section, as tomlkit writes them."""
    import tomlkit

    def table(values: Mapping[str, Any]) -> Any:
        made = tomlkit.table()
        for key, value in values.items():
            made.add(key, table(value) if isinstance(value, Mapping) else value)
        return made

    doc = tomlkit.document()
    for comment in comments:
        doc.add(tomlkit.comment(comment))
    for name, values in sections.items():
        doc.add(name, table(values))
    return tomlkit.dumps(doc)


def _sorted(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _sorted(value[k]) for k in sorted(value)}
    if isinstance(value, (list, tuple)):
        return [_sorted(v) for v in value]
    return value


def overrides(plan: Plan, options: TorchtitanOptions | None) -> list[str]:
    """``--section.key value`` for the degrees and the batch (keys every release reads).

    ``expert_tensor_parallel_degree`` only matters, and is passed, when ep > 1.
    """
    config = derived(plan, options)
    words: list[str] = []
    for key, value in config["parallelism"].items():
        if key.endswith("_degree") and (
            key != "expert_tensor_parallel_degree" or plan.sizes.ep > 1
        ):
            words += [f"--parallelism.{key}", str(value)]
    for key in ("local_batch_size", "global_batch_size"):
        if key in config["training"]:
            words += [f"--training.{key}", str(config["training"][key])]
    return words


def torchtitan_env(plan: Plan, options: TorchtitanOptions | None) -> dict[str, str]:
    """madengine's TORCHTITAN_* contract, with the plan's values."""
    _, shard = dp_split(plan, _options(options))
    fsdp = shard > 1 or plan.sizes.cp > 1  # TorchTitan's ParallelDims.fsdp_enabled
    return {
        "TORCHTITAN_TENSOR_PARALLEL_SIZE": str(plan.sizes.tp),
        "TORCHTITAN_PIPELINE_PARALLEL_SIZE": str(plan.sizes.pp),
        "TORCHTITAN_FSDP_ENABLED": "1" if fsdp else "0",
        "TORCHTITAN_CONTEXT_PARALLEL_SIZE": str(plan.sizes.cp),
    }


def emit(plan: Plan, options: TorchtitanOptions | None) -> Launch:
    words: list[Word] = [
        *program(plan.job.argv),
        "--job.config_file",
        out_file(CONFIG_PATH),
        *overrides(plan, options),
    ]
    env = torchtitan_env(plan, options)
    role_env: dict[str, Word] = {**torchrun_env(plan, _torchrun(plan)), **env}
    return Launch(
        roles=(
            Role(
                name="worker", argv=tuple(torchrun_argv(plan, _torchrun(plan), words)), env=role_env
            ),
        ),
        files=(Artifact.text(CONFIG_PATH, config_toml(plan, options)),),
        worker_env={
            **torchrun_worker_env(plan, _torchrun(plan)),
            **runner_worker_env(plan, "torchrun"),
            **env,
        },
    )


# ------------------------------------------------------------------ checks


def _layout(plan: Plan, opts: TorchtitanOptions) -> Iterator[Finding]:
    s = plan.sizes
    for grid in (plan.layout.dense, plan.layout.expert):
        sizes = dict(zip(grid.axes, grid.sizes, strict=True))
        mine = [a for a in grid.axes if sizes[a] > 1]
        theirs = [a for a in TORCHTITAN_ORDER.split("-") if sizes[a] > 1]
        if mine != theirs:
            yield Finding(
                code="MDC330",
                pointer="/parallelism/order",
                message=f"TorchTitan builds its device mesh in one layout, order "
                f"{TORCHTITAN_ORDER!r} (pp, dp, cp, tp from outermost); it "
                f"cannot run order {plan.layout.order!r}",
                hint=f"remove order, or use {TORCHTITAN_ORDER!r}",
            )
            break
    replicate = opts.dp_replicate or 1
    if s.dp % replicate:
        choices = ", ".join(str(d) for d in range(1, s.dp + 1) if s.dp % d == 0)
        yield Finding(
            code="MDC331",
            pointer="/torchtitan/dp_replicate",
            message=f"dp_replicate ({replicate}) must divide dp ({s.dp}): "
            "data_parallel_shard_degree = dp / dp_replicate",
            hint=f"dp_replicate can be one of {choices}",
        )
        return
    shard = s.dp // replicate
    if s.ep > 1 and s.etp not in (s.tp, 1):
        yield Finding(
            code="MDC332",
            pointer="/parallelism/etp",
            message=f"with ep = {s.ep}, TorchTitan needs etp equal to tp ({s.tp}) or "
            f"1, not {s.etp} ('Currently we only support ETP=TP or ETP=1')",
            hint=f"set etp = {s.tp} or etp = 1",
        )
    elif s.ep > 1 and (shard * s.cp * s.tp) % (s.ep * s.etp):
        span = shard * s.cp * s.tp
        yield Finding(
            code="MDC333",
            pointer="/parallelism/ep",
            message=f"TorchTitan lays experts over dp_shard * cp * tp = {shard} * "
            f"{s.cp} * {s.tp} = {span} ranks, which ep * etp = {s.ep} * "
            f"{s.etp} = {s.ep * s.etp} must divide (expert parallelism never "
            "spans dp_replicate)",
            hint=f"choose ep * etp dividing {span}, or a smaller dp_replicate",
        )


def _sequence(plan: Plan, opts: TorchtitanOptions) -> Iterator[Finding]:
    s = plan.sizes
    given, pointer = seq_len(plan, opts)
    model_seq = plan.model.seq_length if plan.model else None
    if opts.seq_len is not None and model_seq is not None and opts.seq_len != model_seq:
        yield Finding(
            code="MDC339",
            pointer="/torchtitan/seq_len",
            message=f"seq_len ({opts.seq_len}) disagrees with [model] seq_length ({model_seq})",
            hint="remove seq_len: it defaults to [model] seq_length",
        )
        return
    length = given if given is not None else DEFAULT_SEQ_LEN
    divisor = s.tp * 2 * s.cp
    core_said = pointer == "/model/seq_length" and s.cp > 1 and length % (2 * s.cp)
    if length % divisor and not core_said:
        where = "" if given is not None else " (TorchTitan's default)"
        below = length // divisor * divisor
        nearest = " or ".join(str(v) for v in (below, below + divisor) if v > 0)
        yield Finding(
            code="MDC334",
            pointer=pointer or "/torchtitan",
            message=f"seq_len ({length}{where}) must be divisible by tp * 2 * cp = "
            f"{s.tp} * 2 * {s.cp} = {divisor} (TorchTitan's sequence and "
            "context parallel split)",
            hint=f"the nearest valid seq_len is {nearest}",
        )


def _pipeline(plan: Plan, opts: TorchtitanOptions) -> Iterator[Finding]:
    s = plan.sizes
    mb = opts.pipeline_microbatch_size
    if s.pp == 1:
        for key, value in (
            ("pipeline_schedule", opts.pipeline_schedule),
            ("pipeline_microbatch_size", mb),
        ):
            if value is not None:
                yield Finding(
                    code="MDC335",
                    pointer=f"/torchtitan/{key}",
                    severity=Severity.WARNING,
                    message=f"{key} has no effect with pp = 1",
                    hint=f"remove {key}, or set pp > 1",
                )
        return
    name = schedule(plan, opts)
    if s.vpp and name in SINGLE_STAGE:
        yield Finding(
            code="MDC336",
            pointer="/torchtitan/pipeline_schedule",
            message=f"schedule {name!r} runs one stage per pipeline rank, but vpp = {s.vpp}",
            hint=f"use a looped schedule ({', '.join(MULTI_STAGE)}), or remove vpp",
        )
    elif s.vpp and name in V_SHAPED and s.vpp != 2:
        yield Finding(
            code="MDC336",
            pointer="/parallelism/vpp",
            message=f"schedule {name!r} needs exactly 2 stages per pipeline rank, "
            f"but vpp = {s.vpp}",
            hint="set vpp = 2",
        )
    elif _needs_layers_per_stage(plan):
        yield from _stages(plan, opts)
    if plan.batch is not None:
        local = plan.batch.micro_batch_size
        size = mb or 1
        stages = s.pp * (s.vpp or 1)
        if local % size:
            yield Finding(
                code="MDC335",
                pointer="/torchtitan/pipeline_microbatch_size",
                message=f"local_batch_size ({local}, [batch] micro_batch_size) must "
                f"be divisible by pipeline_microbatch_size ({size}) (TorchTitan "
                "splits each local batch into pipeline microbatches)",
                hint="pipeline_microbatch_size can be one of "
                + ", ".join(str(d) for d in range(1, local + 1) if local % d == 0),
            )
        elif local // size < stages:
            yield Finding(
                code="MDC335",
                pointer="/batch/micro_batch_size",
                severity=Severity.WARNING,
                message=f"{local // size} pipeline microbatch(es) per step (local "
                f"batch {local} / pipeline microbatch {size}) for {stages} "
                "pipeline stages: the pipeline runs with bubbles",
                hint=f"a micro_batch_size of at least {stages * size} keeps every stage busy",
            )


def _stages(plan: Plan, opts: TorchtitanOptions) -> Iterator[Finding]:
    s = plan.sizes
    layers = plan.model.num_layers if plan.model else None
    if layers is None:
        yield Finding(
            code="MDC336",
            pointer="/parallelism/vpp",
            message=f"vpp = {s.vpp} needs TorchTitan's pipeline_parallel_layers_per_"
            "stage, which mdc derives from [model] num_layers (not given)",
            hint="set [model] num_layers to the flavor's layer count, or vpp = 2",
        )
    elif layers_per_stage(plan, opts) is None:
        first = _passed_count(opts, "pipeline_parallel_first_stage_less_layers")
        last = _passed_count(opts, "pipeline_parallel_last_stage_less_layers")
        weighted = layers + first + last
        yield Finding(
            code="MDC336",
            pointer="/parallelism/vpp",
            message=f"no pipeline_parallel_layers_per_stage gives pp * vpp = "
            f"{s.pp} * {s.vpp} = {s.pp * (s.vpp or 1)} stages: TorchTitan makes "
            f"ceil((num_layers + {first} + {last}) / layers_per_stage) = "
            f"ceil({weighted} / n) stages",
            hint=_vpp_hint(layers, s.pp, first, last),
        )


def _vpp_hint(layers: int, pp: int, first: int, last: int) -> str:
    """The vpp values TorchTitan builds: a layers_per_stage reaches pp * vpp stages, and
    its split of the layers over them succeeds."""
    weighted = layers + first + last
    reachable = sorted(
        {
            -(-weighted // n) // pp
            for n in range(1, weighted + 1)
            if -(-weighted // n) % pp == 0 and -(-weighted // n) // pp > 2
        }
    )
    fitting = [
        v for v in reachable if not isinstance(torchtitan_shares(pp * v, layers, first, last), str)
    ]
    if fitting:
        return "vpp can be 2 or one of " + ", ".join(map(str, fitting))
    return "use vpp = 2"


def _dtype(plan: Plan) -> Iterator[Finding]:
    if plan.model is not None and plan.model.dtype == "fp16":
        yield Finding(
            code="MDC337",
            pointer="/model/dtype",
            message="TorchTitan trains in bfloat16 or float32 mixed precision; it has "
            "no fp16 training",
            hint='use dtype = "bf16"',
        )


def _scalars(value: Any, pointer: str) -> Iterator[str]:
    """Pointers of values TOML cannot hold (null)."""
    if value is None:
        yield pointer
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from _scalars(item, f"{pointer}/{key}")
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            yield from _scalars(item, f"{pointer}/{index}")


#: derived keys mdc writes only with a [model] dtype (free for pass-through otherwise)
DTYPE_KEYS = (("training", "mixed_precision_param"), ("model", "converters"))


def _owner(plan: Plan, section: str, key: str) -> tuple[str, str] | None:
    """Who sets config key ``section.key``: ("option", name) or ("derived", source)."""
    if (section, key) in OPTION_KEYS:
        return "option", OPTION_KEYS[(section, key)]
    dtype = plan.model.dtype if plan.model else None
    if (section, key) in DTYPE_KEYS and dtype is None:
        return None
    if (section, key) == ("model", "converters") and dtype != "fp8":
        return None
    if (section, key) in DERIVED_KEYS:
        return "derived", DERIVED_KEYS[(section, key)]
    return None


def _clash(section: str, key: str, owner: tuple[str, str], where: str, pointer: str) -> Finding:
    kind, source = owner
    if kind == "option":
        return Finding(
            code="MDC338",
            pointer=pointer,
            message=f"{where} sets {section}.{key}, which the torchtitan launcher "
            f"sets from [torchtitan] {source}",
            hint=f"remove it from {where} and set [torchtitan] {source.split(' ')[0]}",
        )
    return Finding(
        code="MDC338",
        pointer=pointer,
        message=f"{where} sets {section}.{key}, which the torchtitan launcher "
        f"derives from {source}",
        hint=f"remove it from {where}; mdc writes {section}.{key} itself",
    )


def _passthrough(plan: Plan, opts: TorchtitanOptions) -> Iterator[Finding]:
    for section in sorted(opts.config):
        for key in sorted(opts.config[section]):
            pointer = f"/torchtitan/config/{section}/{key}"
            owner = _owner(plan, section, key)
            if owner is not None:
                yield _clash(section, key, owner, "config", pointer)
            for bad in _scalars(opts.config[section][key], pointer):
                yield Finding(
                    code="MDC338",
                    pointer=bad,
                    message="TOML has no null: a config value cannot be null",
                    hint="remove the key to keep TorchTitan's default",
                )
    for use in OVERRIDES.find(plan.job.argv):
        section, _, key = use.flag.name[2:].partition(".")
        owner = _owner(plan, section, key)
        if owner is not None:
            yield _clash(
                section,
                key,
                owner,
                "the job's command",
                command_pointer(plan.job.command, use.index),
            )


#: the command-line overrides of the config keys the launcher sets or reads
OVERRIDES = FlagTable(
    [
        *(
            KnownFlag(name=f"--{section}.{key}", source=source, nargs=1)
            for (section, key), source in [*OPTION_KEYS.items(), *DERIVED_KEYS.items()]
        ),
    ],
    normalize=override_name,
)


def check(plan: Plan, options: TorchtitanOptions | None) -> Iterator[Finding]:
    opts = _options(options)
    yield from torchrun_findings(plan, _torchrun(plan))
    yield from _layout(plan, opts)
    yield from _sequence(plan, opts)
    yield from _pipeline(plan, opts)
    yield from _dtype(plan)
    yield from _passthrough(plan, opts)
    yield from override_findings(plan)


#: what the memory hint proposes, in the [torchtitan] table's words
LEVERS = (
    ("recompute full", '[torchtitan.config.activation_checkpoint] mode = "full"'),
    ("optimizer offload", "[torchtitan.config.training] enable_cpu_offload = true"),
)
#: config keys that change what each GPU holds, as (section, key): those whose command-line
#: overrides the launcher reads (the command's value wins, as in TorchTitan)
MEMORY_KEYS = tuple(
    dict.fromkeys(
        (section, key)
        for flag in MEMORY_OVERRIDES.flags
        for section, _, key in [str(flag.key).partition(".")]
    )
)


def memory_config(opts: TorchtitanOptions) -> dict[str, Any]:
    """The memory keys' values in the config table."""
    values = {f"{section}.{key}": _passed(opts, section, key, None) for section, key in MEMORY_KEYS}
    return {k: v for k, v in values.items() if v is not None}


def _recompute(values: Mapping[str, Any]) -> tuple[str, int | None]:
    """(mode, n): TorchTitan's selective checkpointing with an integer option recomputes
    every n-th layer whole (its default: "2"); "op" saves per operator (mdc.plan.per_op)."""
    mode = str(values.get("activation_checkpoint.mode", "selective"))
    if mode in ("full", "none"):
        return mode, None
    if mode == "memory_budget":  # the compiler's choice: counted as full recompute (a floor)
        return "full", None
    option = str(values.get("activation_checkpoint.selective_ac_option", "2"))
    if option.isdigit() and int(option) > 0:
        return "full", int(option)
    return "selective", None


#: training.mixed_precision_reduce -> bytes per element of FSDP2's reduce-scatter
REDUCE_BYTES = {"float32": 4, "bfloat16": 2}


def _float8_gather(opts: TorchtitanOptions) -> bool:
    """torchao's float8 all-gather ([torchtitan.config.quantize.linear.float8], or the
    older [torchtitan.config.float8], enable_fsdp_float8_all_gather), which TorchTitan runs
    with the tensorwise recipe only."""
    quantize = opts.config.get("quantize", {})
    linear = quantize.get("linear", {}) if isinstance(quantize, Mapping) else {}
    table = linear.get("float8", {}) if isinstance(linear, Mapping) else {}
    if not table:
        table = opts.config.get("float8", {})
    if not isinstance(table, Mapping):
        return False
    gathered = table.get("enable_fsdp_float8_all_gather") in (True, "true", "True")
    return gathered and table.get("recipe_name", "tensorwise") == "tensorwise"


def _async_tp(opts: TorchtitanOptions) -> bool:
    """[torchtitan.config.parallelism] enable_async_tensor_parallel."""
    written = _passed(opts, "parallelism", "enable_async_tensor_parallel", False)
    return written in (True, "true", "True")


def _compiled(values: Mapping[str, Any], component: str) -> bool:
    """[compile] enable with ``component`` among its components (TorchTitan's default list:
    "model" and "loss")."""
    components = values.get("compile.components", ["model", "loss"])
    enabled = values.get("compile.enable") in (True, "true", "True")
    return enabled and isinstance(components, list | tuple) and component in components


#: bytes per logit at the loss's backward: cross_entropy(pred.float()) run eagerly keeps the
#: bf16 logits, the saved fp32 log-softmax and the fp32 gradients of the loss and of the
#: log-softmax; compiled (inductor fuses the upcast, the log-softmax and its gradient), the
#: bf16 logits and their bf16 gradient
LOGIT_BYTES = {False: 12, True: 4}


#: TorchTitan's per_op_sac_force_recompute_mm_shapes_by_fqns default
FORCED_DEFAULT = ("moe.router.gate",)


def _forced(values: Mapping[str, Any]) -> tuple[str, ...]:
    """The module paths per-op recompute always recomputes (a list of strings in TorchTitan's
    config; anything else is TorchTitan's to refuse, and the estimate keeps the default)."""
    forced = values.get(
        "activation_checkpoint.per_op_sac_force_recompute_mm_shapes_by_fqns", FORCED_DEFAULT
    )
    if isinstance(forced, list | tuple) and all(isinstance(f, str) for f in forced):
        return tuple(forced)
    return FORCED_DEFAULT


#: TorchTitan's model registry at the pinned version (scripts/torchtitan_flavors.py)
FLAVORS_FILE = "flavors.json"


@functools.cache
def flavors() -> Mapping[str, Any]:
    """{model name: {flavor: {[model] key: value}}} of TorchTitan's registered models."""
    facts: Mapping[str, Any] = read_schema(__name__, FLAVORS_FILE)["models"]
    return facts


def flavor_shape(opts: TorchtitanOptions) -> tuple[Mapping[str, Any], str]:
    """The shape TorchTitan builds for [torchtitan] model/flavor (empty when not registered:
    a model the user registers with TorchTitan's register_train_spec is unknown here)."""
    name, flavor = opts.model or DEFAULT_MODEL, opts.flavor or DEFAULT_FLAVOR
    shape = flavors().get(name, {}).get(flavor)
    if shape is None:
        return {}, ""
    return shape, f"TorchTitan's {name} flavor {flavor!r}"


def pipeline_split(opts: TorchtitanOptions) -> PipelineSplit:
    """TorchTitan's rule for placing layers on pipeline stages, with its stage weights."""
    return PipelineSplit(
        rule="torchtitan",
        first_less=_passed_count(opts, "pipeline_parallel_first_stage_less_layers"),
        last_less=_passed_count(opts, "pipeline_parallel_last_stage_less_layers"),
        v_shaped=opts.pipeline_schedule in V_SHAPED,
        # a looped schedule without pipeline_parallel_layers_per_stage: 2 stages per rank
        default_vpp=2 if opts.pipeline_schedule in MULTI_STAGE else None,
        pointers=(
            ("first", "/torchtitan/config/parallelism/pipeline_parallel_first_stage_less_layers"),
            ("last", "/torchtitan/config/parallelism/pipeline_parallel_last_stage_less_layers"),
        ),
    )


def _read_command(options: TorchtitanOptions | None, words: Sequence[str]) -> TorchtitanOptions:
    read: TorchtitanOptions = read_command(_options(options), words)
    return read


def training(options: TorchtitanOptions | None) -> TrainingSetup:
    """FSDP2 shards weights, gradients and optimizer state (ZeRO-3 style) over its fsdp
    dimension (dp_shard * cp; dp_replicate copies under HSDP). TorchTitan keeps the sharded
    parameters in float32 (compute in mixed_precision_param): 4-byte weights and
    gradients, Adam's two 4-byte moments. ``fsdp_reshard_after_forward = "never"`` keeps
    each layer's gathered weights from forward to backward (sharded like ZeRO-2);
    ``training.enable_cpu_offload`` keeps weights, gradients and optimizer state on the
    host."""
    opts = _options(options)
    shape, source = flavor_shape(opts)
    values = memory_config(opts)
    mode, every = _recompute(values)
    offload = values.get("training.enable_cpu_offload") in (True, "true", "True")
    policy = values.get("parallelism.fsdp_reshard_after_forward", "default")
    never = policy == "never"
    return TrainingSetup(
        zero_stage=2 if never else 3,
        # "default" does not reshard after forward when pipelining (TorchTitan's
        # apply_fsdp: reshard_after_forward = not pp_enabled)
        pp_zero_stage=2 if policy in ("default", "never") else 3,
        grad_bytes=4,
        weight_bytes=4,
        optimizer_bytes=8,
        sequence_parallel=True,
        recompute=mode,
        recompute_every=every,
        # "selective" stays only for the per-op policy ("op"); "2" is full of every 2nd layer
        recompute_per_op=mode == "selective",
        recompute_per_op_forced=_forced(values),
        # TorchTitan's models have no dropout; uncompiled, the MLP runs eagerly
        dropout_masks=False,
        eager_gated_mlp=not _compiled(values, "model"),
        eager_kernels=not _compiled(values, "model"),
        # float8 is torchao's Float8Linear (model.converters = ["float8"]), fp8 rows only
        float8_casts=True,
        # async TP needs the model compiled (TorchTitan refuses it otherwise)
        async_tp=_async_tp(opts) and _compiled(values, "model"),
        fp8_gather_bytes=1 if _float8_gather(opts) else None,
        reduce_bytes=REDUCE_BYTES.get(_passed(opts, "training", "mixed_precision_reduce", "")),
        replicas=opts.dp_replicate or 1,
        pipeline=pipeline_split(opts),
        model_shape=tuple(sorted(shape.items())),
        # the sequence TorchTitan trains on is [torchtitan] seq_len when written
        model_defaults=(("seq_length", opts.seq_len),) if opts.seq_len is not None else (),
        model_source=source,
        param_offload=offload,
        optimizer_offload=1.0 if offload else 0.0,
        # each local batch runs as pipeline microbatches (TorchTitan's default size: 1)
        pipeline_micro_batch=opts.pipeline_microbatch_size or 1,
        # train_step runs one pipeline schedule per local batch of the accumulation
        schedule_per_accumulation=True,
        logit_bytes=LOGIT_BYTES[_compiled(values, "loss")],
        levers=LEVERS,
    )


@mdc.hookimpl
def mdc_register_launchers() -> list[LauncherSpec]:
    return [
        LauncherSpec(
            reads=("torchrun",),  # [torchrun] tunes the torchrun it runs on
            name="torchtitan",
            description="TorchTitan on torchrun: a job config TOML plus command-line overrides "
            "with the plan's degrees and batch",
            parallelism="model",
            emit=emit,
            check=check,
            training=training,
            read_command=_read_command,
            search=SEARCH,
            schema=read_schema("mdc_schemas", "plugins/torchtitan.v1.schema.json"),
            options_type=TorchtitanOptions,
        )
    ]
