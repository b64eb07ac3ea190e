"""Helpers for plugins: their own data files, where mdc writes launch scripts, and whether the
files a backend returns are written.

Not part of the contract (:mod:`mdc.api`).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from mdc.package_data import package_text


def read_schema(package: str, resource: str) -> dict[str, Any]:
    """Load a JSON Schema fragment shipped as package data of ``package``."""
    loaded: dict[str, Any] = json.loads(package_text(package, resource))
    return loaded


@functools.cache  # asked for each role by the launcher's scripts and again by the backend
def script_path(role: str) -> str:
    """Where mdc writes the launch script of ``role``, relative to ``out/``."""
    if "/" not in role:  # a plain name, pathlib's answer without importing it
        return f"launch/{role}.sh"
    from pathlib import PurePosixPath

    return str(PurePosixPath("launch") / f"{role}.sh")


#: False while a backend's emit runs for a command that writes no tree (see files_written)
_FILES_WRITTEN: ContextVar[bool] = ContextVar("mdc_files_written", default=True)


def files_written() -> bool:
    """Whether the files a backend's ``emit`` returns are written (``mdc compile``).

    False while ``mdc validate`` and ``mdc explain`` run it: they check the files' paths
    and drop the files, so a backend may leave out what only the bytes need (e.g. the
    YAML text of ``Artifact(path=..., data=b"")``), as long as it still raises every
    error that producing them would raise.
    """
    return _FILES_WRITTEN.get()


@contextmanager
def writing_files(written: bool) -> Iterator[None]:
    """Run a backend's emit with :func:`files_written` answering ``written`` (the compiler's
    part: not for plugins)."""
    token = _FILES_WRITTEN.set(written)
    try:
        yield
    finally:
        _FILES_WRITTEN.reset(token)


__all__ = ["files_written", "read_schema", "script_path"]
