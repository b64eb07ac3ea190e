"""Megatron-LM on torchrun: the plan's sizes, batch and model shape as Megatron-LM arguments.

torchrun starts the workers (the same command line as the torchrun launcher,
``[torchrun]`` options included); Megatron-LM's arguments follow the user's
own: every parallel size (even 1, so the command alone says how the job is
laid out and no default of a wrapper script can change it), the virtual
pipeline stages, ``--use-tp-pp-dp-mapping`` for that rank order, the batch,
sequence parallelism, the distributed optimizer, gradient/parameter overlap,
activation recomputation and, from ``[model]``, the model shape and precision.
Flag names and rules are those of Megatron-LM core_v0.16 (``megatron/training/
arguments.py``) and megatron-core 0.16's config classes.

The launcher's parts (modules of this package): flags (the flags it knows), options (the
[megatron] table, extra_args read in), emit (the command line and environment), rules and
memory_rules (Megatron-LM's refusals), training (what the memory estimate reads), search (what
mdc tune may set); precision, bf16_layers and optimizer hold the FP4, bf16-layer and optimizer
keys.
"""

from __future__ import annotations

import mdc
from mdc.api import LauncherSpec
from mdc.api.files import read_schema
from mdc_builtin.launchers.megatron.emit import emit
from mdc_builtin.launchers.megatron.flags import READING
from mdc_builtin.launchers.megatron.options import MegatronOptions, resolved_options
from mdc_builtin.launchers.megatron.rules import check
from mdc_builtin.launchers.megatron.search import SEARCH
from mdc_builtin.launchers.megatron.training import training

__all__ = ["MegatronOptions", "check", "emit", "mdc_register_launchers", "training"]


@mdc.hookimpl
def mdc_register_launchers() -> list[LauncherSpec]:
    return [
        LauncherSpec(
            reads=("torchrun",),  # [torchrun] tunes the torchrun it runs on
            name="megatron",
            description="Megatron-LM on torchrun: parallel sizes, batch and model shape as "
            "Megatron-LM arguments, plus its environment",
            parallelism="model",
            emit=emit,
            check=check,
            training=training,
            read_args=resolved_options,
            arguments=READING,
            search=SEARCH,
            schema=read_schema("mdc_schemas", "plugins/megatron.v1.schema.json"),
            options_type=MegatronOptions,
        )
    ]
