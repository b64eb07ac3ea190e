"""The madengine context as every step of the translation reads it: its blocks, what
madengine derives from them (several nodes, several GPUs, the GPU count keys), and the
nulls and unknown keys in it, reported.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

from .builder import Builder, escape_token
from .tables import GPU_COUNT_KEYS, NULL_DEFAULTS, QUIET_NULLS


class Context:
    """The madengine context under translation, and the state every step shares."""

    #: the deployment target (kubernetes, slurm, local) and the key of its block
    target: str
    k8s_key: str | None
    target_origin: str | None
    #: the context's blocks (an absent or non-object block reads as empty)
    dist: dict[str, Any]
    k8s: dict[str, Any]
    slurm: dict[str, Any]
    launcher_block: dict[str, Any]
    #: (accelerator, its pointer), the job's name and launcher as resolved
    vendor: tuple[Any, str | None]
    name: str
    launcher: str
    #: the counts mdc uses (1 where the value is not an int)
    nnodes: int
    nnodes_origin: str | None
    nproc: int

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

    def k8s_multi_node(self) -> bool:
        nnodes = self.dist.get("nnodes")
        return isinstance(nnodes, int | float) and not isinstance(nnodes, bool) and nnodes > 1

    def k8s_multi_gpu(self) -> bool:
        count = self.k8s.get("gpu_count")
        counted = isinstance(count, int | float) and not isinstance(count, bool) and count > 1
        return counted or bool(self.dist.get("enabled")) or "launcher" in self.dist

    def gpu_override(self) -> tuple[Any, str] | None:
        for key in GPU_COUNT_KEYS:
            if key in self.ctx:
                return self.ctx[key], f"/{key}"
        return None

    # unknown keys, reported in every block that reads them
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
