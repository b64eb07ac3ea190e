"""Translating a madengine context into an mdc spec, in madengine's order of resolution:
the entry point and the order of its steps (each step's module says what it reads).
"""

from __future__ import annotations

from mdc.errors import Diagnostic, SpecError
from mdc.loaders import LoadedDocument

from .backends import Backends
from .builder import Builder
from .environment import Environment
from .launch import Launch
from .leftovers import Leftovers
from .resolution import Resolution
from .tables import OBJECT_KEYS


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


class _Translation(Resolution, Launch, Backends, Environment, Leftovers):
    """Every step of the translation, run in madengine's order of resolution."""

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
