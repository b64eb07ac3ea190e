"""The hooks mdc calls. Plugins implement them with ``@mdc.hookimpl``.

Every launcher and backend, built-in or third-party, is a module named by an
entry point in the group ``mdc``. Registration hooks return frozen records;
the core attributes each record to the plugin that returned it, sorts all of
them by name and rejects duplicates, so pluggy's call order never shows in
the output.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from collections.abc import Sequence

    from mdc.api import BackendSpec, LauncherSpec
    from mdc.hardware import Accelerator

hookspec = pluggy.HookspecMarker("mdc")


@hookspec
def mdc_register_launchers() -> Sequence[LauncherSpec]:  # type: ignore[empty-body]
    """Return the launchers this plugin provides.

    Called once per run, when the plugin set is loaded, before any spec is read.
    Results from all plugins are flattened, sorted by ``name``; a name given
    twice (by one plugin or two) is a plugin error naming both.

    :returns: :class:`mdc.api.LauncherSpec` records (may be empty).

    Example::

        @mdc.hookimpl
        def mdc_register_launchers():
            return [LauncherSpec(name="mpirun", description="...", parallelism="data",
                                 emit=emit, schema=read_schema(__package__, "mpirun.json"))]

    .. versionadded:: 0.1
    """


@hookspec
def mdc_register_backends() -> Sequence[BackendSpec]:  # type: ignore[empty-body]
    """Return the backends this plugin provides.

    Called like :func:`mdc_register_launchers`, and combined the same way
    (sorted by ``name``, duplicates rejected). A record's ``run_command`` (e.g.
    ``"kubectl apply -f {out}/mybackend/job.yaml"``) is what ``mdc compile`` prints as
    the next step, ``{out}`` replaced by the output directory, shell-quoted.

    :returns: :class:`mdc.api.BackendSpec` records (may be empty).

    .. versionadded:: 0.1
    """


@hookspec
def mdc_register_hardware() -> Sequence[Accelerator]:  # type: ignore[empty-body]
    """Return the accelerator models this plugin adds to mdc's catalogue.

    Called once per run, when the plugin set is loaded, before any spec is read.
    ``[distributed] accelerator_model`` then selects an entry by its ``id`` (its
    memory becomes the default ``accelerator_memory_gib``; ``mdc tune`` and
    ``mdc explain`` predict throughput from its peaks and bandwidths). Each entry
    is checked against mdc's hardware schema; an id mdc or another plugin already
    has is a plugin error naming both.

    :returns: :class:`mdc.hardware.Accelerator` records (may be empty).

    Example::

        @mdc.hookimpl
        def mdc_register_hardware():
            return [Accelerator(id="h100-pcie", name="NVIDIA H100 PCIe", vendor="nvidia",
                                memory_gib=80, memory_bandwidth_gb_s=2000,
                                dense_tflops={"bf16": 756, "fp8": 1513},
                                scale_up_domain=2, scale_up_gb_s=300, scale_out_gb_s=50,
                                sources={"compute": "https://...", "memory": "https://...",
                                         "scale_up": "https://...", "scale_out": "https://..."})]

    .. versionadded:: 0.2
    """


__all__ = ["hookspec", "mdc_register_backends", "mdc_register_hardware", "mdc_register_launchers"]
