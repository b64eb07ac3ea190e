"""primus (AMD Primus): the job's own Primus run script, once per node, with Primus's env.

No runner wrapper: the role's command is the job's command itself, typically
Primus's ``examples/run_pretrain.sh``, ``primus-cli direct -- train pretrain``
or madengine's ``primus_pretrain`` run script, which start torchrun themselves
with ``--nnodes $NNODES --node_rank $NODE_RANK --nproc_per_node $GPUS_PER_NODE
--master_addr $MASTER_ADDR --master_port $MASTER_PORT``. mdc exports that node
contract, the experiment config (``PRIMUS_CONFIG_PATH`` for madengine's wrapper,
``EXP`` for Primus's own scripts), ``PRIMUS_ROOT``, ``PRIMUS_CLI_EXTRA`` and
``BACKEND`` (explicit, or inferred from a ``primus_pretrain/<backend>_...``
model name, else from the config's ``examples/<backend>/`` directory).

Primus reads the parallel sizes and the batch from its YAML config, not from
mdc: ``[parallelism]`` and ``[batch]`` are checked against the world size but
not passed on (a warning says so).
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import attrs

import mdc
from mdc.api import (
    MASTER_ADDR,
    MASTER_PORT,
    NODE_RANK,
    Finding,
    Launch,
    LauncherSpec,
    Plan,
    Role,
    Severity,
    Word,
)
from mdc.api.files import read_schema
from mdc.api.shell import shell_join

#: BACKEND values Primus's launch scripts know, by lower-cased name (madengine's token map).
#: run_pretrain.sh tests ``"$BACKEND" = "MaxText"`` literally, so that one keeps its capitals.
BACKENDS = {
    "maxtext": "MaxText",
    "megatron": "megatron",
    "megatron_bridge": "megatron_bridge",
    "moe_package": "moe_package",
    "torchtitan": "torchtitan",
}
#: madengine's model-name convention: primus_pretrain/<backend>_<arch>_<config stem>
MODEL_PREFIX = "primus_pretrain/"
PYTHON = re.compile(r"^python(\d+(\.\d+)?)?$")
#: words that survive plain whitespace splitting unchanged (no quoting needed)
PLAIN_WORD = re.compile(r"^[A-Za-z0-9_@%+=:,./-]+$")


@attrs.frozen(kw_only=True, repr=False)  # options are read, never shown
class PrimusOptions:
    """The ``[primus]`` table."""

    config_path: str
    root: str | None = None
    backend: str | None = None
    model: str | None = None
    #: a string (verbatim) or words (shell-joined); empty: not given
    cli_extra: str | tuple[str, ...] = ()


@attrs.frozen
class BackendSource:
    """One place BACKEND can come from, in precedence order."""

    value: str
    #: how the finding names it, e.g. "[primus] model"
    origin: str
    pointer: str


def backend_from_model(model: str) -> str | None:
    """``primus_pretrain/<backend>_...`` -> BACKEND, the longest known name winning.

    madengine takes the text before the first ``_``, so its
    ``primus_pretrain/megatron_bridge_...`` gives ``megatron``; the longest match does not.
    """
    if not model.startswith(MODEL_PREFIX):
        return None
    rest = model[len(MODEL_PREFIX) :].lower()
    for token in sorted(BACKENDS, key=len, reverse=True):
        if rest == token or rest.startswith(token + "_"):
            return BACKENDS[token]
    return None


def backend_from_config(path: str) -> str | None:
    """The ``examples/<backend>/`` directory of a Primus config path (its last ``examples``)."""
    parts = path.replace("\\", "/").split("/")
    dirs = parts[:-1]  # the file name itself is not a directory
    for i in range(len(dirs) - 2, -1, -1):
        if dirs[i].lower() == "examples":
            return BACKENDS.get(dirs[i + 1].lower())
    return None


def backend_sources(options: PrimusOptions) -> list[BackendSource]:
    """Every source that names a backend, highest precedence first."""
    sources = []
    if options.backend is not None:
        sources.append(
            BackendSource(
                BACKENDS.get(options.backend.lower(), options.backend),
                "[primus] backend",
                "/primus/backend",
            )
        )
    if options.model is not None and (found := backend_from_model(options.model)):
        sources.append(BackendSource(found, "[primus] model", "/primus/model"))
    if found := backend_from_config(options.config_path):
        sources.append(
            BackendSource(
                found, "the examples/<backend>/ directory of config_path", "/primus/config_path"
            )
        )
    return sources


def backend_of(options: PrimusOptions) -> BackendSource | None:
    sources = backend_sources(options)
    return sources[0] if sources else None


def cli_extra_text(extra: str | tuple[str, ...]) -> str | None:
    """PRIMUS_CLI_EXTRA's value: a string verbatim, words shell-joined; None when blank."""
    text = extra if isinstance(extra, str) else shell_join(extra)
    return text if text.strip() else None


def _env(plan: Plan, options: PrimusOptions) -> dict[str, Word]:
    env: dict[str, Word] = {}
    if options.root is not None:
        env["PRIMUS_ROOT"] = options.root
    env["PRIMUS_CONFIG_PATH"] = options.config_path
    env["EXP"] = options.config_path
    extra = cli_extra_text(options.cli_extra)
    if extra is not None:
        env["PRIMUS_CLI_EXTRA"] = extra
    backend = backend_of(options)
    if backend is not None:
        env["BACKEND"] = backend.value
    env.update(
        {
            "NNODES": str(plan.nnodes),
            "NODE_RANK": NODE_RANK,
            "GPUS_PER_NODE": str(plan.nproc_per_node),
            "MASTER_ADDR": MASTER_ADDR,
            "MASTER_PORT": MASTER_PORT,
            "MAD_RUNTIME_NGPUS": str(plan.nproc_per_node),
        }
    )
    return env


def _worker_env(plan: Plan, options: PrimusOptions, env: dict[str, Word]) -> dict[str, str]:
    """What the command sees (and, through Primus's torchrun, every worker)."""
    nproc, last = plan.nproc_per_node, plan.nnodes - 1
    meaning: dict[str, str] = {}
    for name, value in env.items():
        if isinstance(value, str):
            meaning[name] = value
    backend = backend_of(options)
    if backend is not None:
        meaning["BACKEND"] = f"{backend.value} (from {backend.origin})"
    meaning.update(
        {
            "NODE_RANK": f"the backend's node index, 0..{last}" if last else "0 (the only node)",
            "MASTER_ADDR": "node 0's address (set by the backend)",
            "MASTER_PORT": plan.rendezvous.text(),
            "MAD_RUNTIME_NGPUS": f"{nproc} (madengine's name for GPUS_PER_NODE)",
            # run_pretrain.sh / primus-cli start torchrun with --node_rank (static rendezvous)
            "RANK": f"NODE_RANK * {nproc} + LOCAL_RANK (set by the torchrun Primus starts)",
            "LOCAL_RANK": f"0..{nproc - 1} (set by the torchrun Primus starts)",
            "WORLD_SIZE": f"{plan.world_size} (set by the torchrun Primus starts)",
        }
    )
    return dict(sorted(meaning.items()))


def emit(plan: Plan, options: PrimusOptions | None) -> Launch:
    if options is None:  # check() reported MDC340; emit is not reached
        raise ValueError("the primus launcher needs a [primus] table")
    env = _env(plan, options)
    return Launch(
        roles=(Role(name="worker", argv=tuple(plan.job.argv), env=env),),
        worker_env=_worker_env(plan, options, env),
    )


def _sizes_not_passed(plan: Plan) -> list[str]:
    sizes = plan.sizes
    given = [
        f"{name}={value}"
        for name, value in (("tp", sizes.tp), ("pp", sizes.pp), ("cp", sizes.cp), ("ep", sizes.ep))
        if value != 1
    ]
    if sizes.etp != sizes.tp:
        given.append(f"etp={sizes.etp}")
    if sizes.vpp is not None:
        given.append(f"vpp={sizes.vpp}")
    return given


def _backend_findings(options: PrimusOptions) -> Iterator[Finding]:
    if options.backend is not None and options.backend.lower() not in BACKENDS:
        yield Finding(
            code="MDC346",
            pointer="/primus/backend",
            severity=Severity.WARNING,
            message=f"backend {options.backend!r} is not one Primus's launch scripts "
            "are known to take; it is exported as BACKEND verbatim",
            hint=f"use one of: {', '.join(sorted(BACKENDS.values()))}",
        )
    if options.model is not None and backend_from_model(options.model) is None:
        yield Finding(
            code="MDC345",
            pointer="/primus/model",
            severity=Severity.WARNING,
            message=f"model {options.model!r} names no backend: BACKEND is inferred "
            f"only from {MODEL_PREFIX}<backend>_... with <backend> one of "
            f"{', '.join(sorted(BACKENDS))}",
            hint="set [primus] backend, or write the model name in that form",
        )
    sources = backend_sources(options)
    for other in sources[1:]:
        if other.value != sources[0].value:
            yield Finding(
                code="MDC344",
                pointer=sources[0].pointer,
                severity=Severity.WARNING,
                message=f"BACKEND is {sources[0].value!r} (from {sources[0].origin}) but "
                f"{other.origin} says {other.value!r}",
                hint="make them agree; Primus runs the framework its config declares "
                "(modules.pre_trainer.framework)",
            )


def check(plan: Plan, options: PrimusOptions | None) -> Iterator[Finding]:
    if options is None:
        yield Finding(
            code="MDC340",
            pointer="/distributed/launcher",
            message="the primus launcher needs a [primus] table with config_path "
            "(the Primus experiment YAML)",
            hint="add [primus] config_path = "
            '"examples/megatron/configs/MI300X/llama3.1_8B-BF16-pretrain.yaml"',
        )
        return
    if plan.elastic:
        yield Finding(
            code="MDC341",
            pointer="/distributed/min_nnodes",
            message=f"Primus starts torchrun with a fixed --nnodes $NNODES and "
            f"--node_rank $NODE_RANK; it cannot run an elastic job "
            f"(min_nnodes {plan.min_nnodes} < nnodes {plan.nnodes})",
            hint=f"remove min_nnodes, or set it to nnodes ({plan.nnodes})",
        )
    given = _sizes_not_passed(plan)
    if given:
        yield Finding(
            code="MDC342",
            pointer="/parallelism",
            severity=Severity.WARNING,
            message=f"Primus reads its parallel sizes from the experiment config: "
            f"mdc checks {', '.join(given)} against the world size "
            f"({plan.world_size}) but does not pass them on",
            hint="set the same sizes in the config (megatron: "
            "tensor_model_parallel_size, pipeline_model_parallel_size, ...), or "
            "pass them as overrides in [primus] cli_extra; configs written with "
            "${PRIMUS_TP:1}-style placeholders read PRIMUS_TP, PRIMUS_PP, ... "
            "from [job] env",
        )
    if plan.batch is not None:
        yield Finding(
            code="MDC343",
            pointer="/batch",
            severity=Severity.WARNING,
            message=f"Primus reads the batch from the experiment config: mdc "
            f"checks global_batch_size {plan.batch.global_batch_size} and "
            f"micro_batch_size {plan.batch.micro_batch_size} but does not "
            "pass them on",
            hint="set global_batch_size and micro_batch_size in the config to the same values",
        )
    yield from _backend_findings(options)
    if not isinstance(options.cli_extra, str):
        quoted = [w for w in options.cli_extra if not PLAIN_WORD.match(w)]
        if quoted:
            yield Finding(
                code="MDC347",
                pointer="/primus/cli_extra",
                severity=Severity.WARNING,
                message=f"cli_extra words {', '.join(repr(w) for w in quoted)} need "
                f"shell quoting: PRIMUS_CLI_EXTRA holds "
                f"{shell_join(options.cli_extra)}, which a consumer that "
                "splits on whitespace (an unquoted $PRIMUS_CLI_EXTRA) "
                "does not undo",
                hint="use words without spaces, quotes or shell characters, or "
                "check that your run script splits it with shell rules",
            )
    if not options.config_path.endswith((".yaml", ".yml")):
        yield Finding(
            code="MDC348",
            pointer="/primus/config_path",
            severity=Severity.WARNING,
            message=f"config_path {options.config_path!r} is not a .yaml file; "
            "Primus experiment configs are YAML",
            hint="point it at the experiment YAML, e.g. "
            "examples/torchtitan/configs/MI300X/qwen3_1.7B-pretrain.yaml",
        )
    argv = plan.job.argv
    if argv and PYTHON.match(argv[0].rsplit("/", 1)[-1]):
        yield Finding(
            code="MDC349",
            pointer="/job/command",
            severity=Severity.WARNING,
            message=f"the primus launcher runs the command once per node, so "
            f"{argv[0]!r} starts 1 process per node, not "
            f"{plan.nproc_per_node}; Primus's run scripts start torchrun "
            "themselves",
            hint='run Primus\'s script, e.g. command = ["bash", '
            '"examples/run_pretrain.sh"], or use the torchrun launcher',
        )


@mdc.hookimpl
def mdc_register_launchers() -> list[LauncherSpec]:
    return [
        LauncherSpec(
            name="primus",
            description="AMD Primus: the job's Primus run script once per node, with "
            "PRIMUS_CONFIG_PATH, BACKEND and the NNODES/NODE_RANK/GPUS_PER_NODE contract",
            parallelism="data",
            emit=emit,
            check=check,
            schema=read_schema("mdc_schemas", "plugins/primus.v1.schema.json"),
            options_type=PrimusOptions,
        )
    ]
