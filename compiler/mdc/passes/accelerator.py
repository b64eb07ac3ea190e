"""The accelerator pass: the catalogue entry ``accelerator_model`` names (its memory and vendor as
defaults), and the GEMM precisions its tensor cores run."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import attrs

from mdc.api import Finding, Severity, TrainingSetup
from mdc.hardware import Accelerator
from mdc.plugin_manager import PluginSet
from mdc.spec import JobSpec

#: [distributed] network without accelerator_model: no prediction to give it to
NETWORK_UNUSED = Finding(
    code="MDC603",
    pointer="/distributed/network",
    message="[distributed] network changes only mdc tune's and explain's predictions, which "
    "need accelerator_model",
    hint="set accelerator_model, or remove network",
    severity=Severity.WARNING,
)


def accelerator_model(
    spec: JobSpec, plugins: PluginSet
) -> tuple[JobSpec, Accelerator | None, list[Finding]]:
    """The catalogue entry ``accelerator_model`` names, and the defaults it sets.

    Its memory becomes ``accelerator_memory_gib`` unless that is written (model-less
    specs get no memory check, so none is set for them), and its vendor the
    ``accelerator`` kind unless that is written.
    """
    dist = spec.distributed
    if dist.accelerator_model is None:
        return spec, None, [] if dist.network is None else [NETWORK_UNUSED]
    known = plugins.accelerators()
    entry = known.get(dist.accelerator_model)
    if entry is None:
        return (
            spec,
            None,
            [
                Finding(
                    code="MDC600",
                    pointer="/distributed/accelerator_model",
                    message=f"accelerator_model {dist.accelerator_model!r} is not in "
                    "mdc's hardware catalogue",
                    hint=f"use one of: {', '.join(known)} (a plugin can add more "
                    "through mdc_register_hardware)",
                )
            ],
        )
    if dist.accelerator is not None and dist.accelerator != entry.vendor:
        return (
            spec,
            None,
            [
                Finding(
                    code="MDC601",
                    pointer="/distributed/accelerator",
                    message=f"accelerator = {dist.accelerator!r} but accelerator_model "
                    f"{entry.id!r} is {entry.vendor!r} hardware ({entry.name})",
                    hint=f'set accelerator = "{entry.vendor}", or remove it (the model sets it)',
                )
            ],
        )
    memory = dist.accelerator_memory_gib
    if memory is None and spec.model is not None:
        memory = entry.memory_gib
    dist = attrs.evolve(dist, accelerator=entry.vendor, accelerator_memory_gib=memory)
    return attrs.evolve(spec, distributed=dist), entry, []


#: GEMM precisions that need the chip's own tensor cores: without them the frameworks'
#: kernels refuse to start (Transformer Engine needs compute capability 8.9 for FP8 and 10.0
#: for FP4, torch._scaled_mm likewise)
QUANTIZED = ("fp8", "fp4")


def tensor_core_findings(
    spec: JobSpec, training: TrainingSetup, hardware: Accelerator, known: Mapping[str, Accelerator]
) -> Iterator[Finding]:
    """A training job whose GEMMs run in a precision its accelerator has no peak for."""
    dtype = spec.model.dtype if spec.model is not None else None
    precision = training.gemms_in(dtype)
    if precision not in QUANTIZED or precision in hardware.dense_tflops:
        return
    having = ", ".join(k for k, a in known.items() if precision in a.dense_tflops)
    written = dtype == precision
    source = f'[model] dtype = "{dtype}"' if written else "the launcher's quantization"
    yield Finding(
        code="MDC602",
        pointer="/model/dtype" if written else "/distributed/accelerator_model",
        message=f"the GEMMs run in {precision} ({source}), and {hardware.name} has no "
        f"{precision} tensor cores: the {precision} kernels refuse to run on it",
        hint=f"train in bf16, or use an accelerator_model with {precision}: {having}",
    )
