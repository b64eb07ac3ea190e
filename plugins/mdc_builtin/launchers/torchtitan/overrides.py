"""TorchTitan's command-line overrides of the config keys that change what each GPU holds:
read as TorchTitan's ConfigManager (tyro) reads them, after the config file, so that the
memory estimate and mdc tune see what the run will do. TorchTitan 0.2.2's forms: a boolean
is a switch (``--compile.enable``, ``--compile.no_enable``), a list one comma-separated
value, and ``-`` and ``_`` are alike in a name."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import attrs

from mdc.api import Finding, Plan
from mdc.api.flags import FlagTable, KnownFlag, command_pointer


def override_name(word: str) -> str:
    """TorchTitan's overrides as one name: --section.key, with - and _ alike (tyro)."""
    return "--" + word[2:].replace("-", "_") if word.startswith("--") else word


def _listed(word: str) -> list[str]:
    return word.split(",")


def _value(section: str, key: str, **how: Any) -> KnownFlag:
    return KnownFlag(
        name=f"--{section}.{key}",
        source=f"[torchtitan.config.{section}] {key}",
        key=f"{section}.{key}",
        nargs=1,
        **how,
    )


def _switch(section: str, key: str) -> tuple[KnownFlag, KnownFlag]:
    on = KnownFlag(
        name=f"--{section}.{key}",
        source=f"[torchtitan.config.{section}] {key}",
        key=f"{section}.{key}",
    )
    return on, attrs.evolve(on, name=f"--{section}.no_{key}", switch_value=False)


#: the overrides of the config keys that change what each GPU holds (the launcher's
#: MEMORY_KEYS are theirs)
MEMORY_OVERRIDES = FlagTable(
    [
        _value(
            "activation_checkpoint", "mode", choices=("selective", "full", "memory_budget", "none")
        ),
        _value("activation_checkpoint", "selective_ac_option"),
        _value(
            "activation_checkpoint",
            "per_op_sac_force_recompute_mm_shapes_by_fqns",
            convert=_listed,
        ),
        *_switch("compile", "enable"),
        _value("compile", "components", convert=_listed),
        *_switch("training", "enable_cpu_offload"),
        _value("parallelism", "fsdp_reshard_after_forward", choices=("default", "always", "never")),
    ],
    normalize=override_name,
)


def read_command(options: Any, words: Sequence[str]) -> Any:
    """``options`` (the [torchtitan] table) with the memory keys the command overrides set
    in its ``config``, the last override winning, as TorchTitan applies them."""
    values, _ = MEMORY_OVERRIDES.read(words)
    if not values:
        return options
    config = {section: dict(table) for section, table in options.config.items()}
    for dotted, value in values.items():
        section, _, key = dotted.partition(".")
        config.setdefault(section, {})[key] = value
    return attrs.evolve(options, config=config)


def override_findings(plan: Plan) -> Iterator[Finding]:
    """An override of a memory key with a value TorchTitan refuses (its choices)."""
    for use in MEMORY_OVERRIDES.find(plan.job.argv):
        if use.error is not None:
            yield Finding(
                code="MDC359",
                pointer=command_pointer(plan.job.command, use.index),
                message=f"the job's command passes {use.error} (TorchTitan refuses it)",
                hint=f"pass one of its choices, or set {use.flag.source}",
            )
