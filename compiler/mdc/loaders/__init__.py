"""Loaders: one module per format, each returning a document and its source map.

A :class:`LoadedDocument` holds plain Python data (dict, list, str, int, float,
bool, None) and, for every JSON pointer in it, the 1-based ``(line, column)``
of the value and, for object members, of the key. Later passes locate their
findings through it. Syntax errors and duplicate keys are :class:`SpecError`\\ s
with positions.
"""

from __future__ import annotations

import os
import stat
from typing import TYPE_CHECKING

from mdc.errors import Diagnostic, Severity, SpecError, escape_pointer_token
from mdc.loaders.document import (
    FORMATS,
    MAX_BYTES,
    MAX_DEPTH,
    MAX_INT_DIGITS,
    LoadedDocument,
    Position,
    long_integer,
    syntax_error,
    unfit,
)

if TYPE_CHECKING:
    from os import PathLike

__all__ = [
    "FORMATS",
    "MAX_BYTES",
    "MAX_DEPTH",
    "MAX_INT_DIGITS",
    "LoadedDocument",
    "Position",
    "load_file",
    "load_text",
    "unfit",
]


def load_text(text: str, path: str, fmt: str) -> LoadedDocument:
    """Parse ``text`` as ``fmt`` ("toml", "yaml" or "json")."""
    # Only the parser the input needs is imported.
    if fmt == "toml":
        from mdc.loaders import toml as parser
    elif fmt == "yaml":
        from mdc.loaders import yaml as parser  # type: ignore[no-redef]
    elif fmt == "json":
        from mdc.loaders import json as parser  # type: ignore[no-redef]
    else:  # pragma: no cover - callers pass FORMATS values
        raise ValueError(fmt)
    doc = parser.parse(text, path)
    deep = _too_deep(doc.data)
    if deep is not None:
        where = doc.locate(deep)
        raise syntax_error(
            path,
            f"nesting deeper than {MAX_DEPTH} levels",
            where.line,
            where.column,
            pointer=deep,
            hint="a job spec nests a few levels; check the brackets",
        )
    unfit = _unfit_numbers(doc.data)
    if unfit:
        raise SpecError(_number_finding(doc, pointer, value) for pointer, value in unfit)
    return doc


def _unfit_numbers(data: object) -> list[tuple[str, float | int]]:
    """The pointer and value of every number :func:`unfit` finds (pointers are built only
    once a first walk found one, so a good spec pays one walk)."""
    values = [data]
    while values:
        value = values.pop()
        if isinstance(value, dict):
            values.extend(value.values())
        elif isinstance(value, list):
            values.extend(value)
        elif unfit(value):
            break
    else:
        return []
    found: list[tuple[str, float | int]] = []
    stack: list[tuple[object, str]] = [(data, "")]
    while stack:
        value, here = stack.pop()
        if isinstance(value, dict):
            stack += ((v, f"{here}/{escape_pointer_token(k)}") for k, v in value.items())
        elif isinstance(value, list):
            stack += ((v, f"{here}/{i}") for i, v in enumerate(value))
        elif unfit(value):
            found.append((here, value))  # type: ignore[arg-type]
    return found


def _number_finding(doc: LoadedDocument, pointer: str, value: float | int) -> Diagnostic:
    where = doc.locate(pointer)
    if isinstance(value, int):
        return long_integer(doc.path, None, where.line, where.column, pointer).diagnostics[0]
    return Diagnostic(
        severity=Severity.ERROR,
        code="MDC020",
        message=f"{value} is not a number a spec can hold: JSON, the form of every spec and "
        "of plan.json, has no NaN or infinities",
        hint="give a finite number (a float written past 1.8e308 reads as infinity), or quote "
        "it if it is text",
        location=where,
    )


def _too_deep(data: object) -> str | None:
    """The pointer of the first value nested deeper than :data:`MAX_DEPTH`, if any."""
    level, depth = [data], 0  # first whether any is, level by level, building no pointers
    while level and depth <= MAX_DEPTH:
        below: list[object] = []
        for value in level:
            if isinstance(value, dict):
                below.extend(value.values())
            elif isinstance(value, list):
                below.extend(value)
        level, depth = below, depth + 1
    if not level:
        return None
    stack = [(data, "", 0)]
    while stack:
        value, here, depth = stack.pop()
        if depth > MAX_DEPTH:
            return here
        if isinstance(value, dict):
            stack += ((v, f"{here}/{escape_pointer_token(k)}", depth + 1) for k, v in value.items())
        elif isinstance(value, list):
            stack += ((v, f"{here}/{i}", depth + 1) for i, v in enumerate(value))
    return None


def load_file(path: str | PathLike[str]) -> LoadedDocument:
    """Read and parse a spec file, choosing the format by its suffix."""
    shown = os.fspath(path)
    # os.path, not pathlib: validate would import pathlib for this alone
    name = os.path.basename(shown.rstrip(os.sep))
    fmt = FORMATS.get(os.path.splitext(name)[1].lower())
    if fmt is None:
        raise syntax_error(
            shown,
            f"cannot tell the format of {name!r}",
            None,
            None,
            code="MDC003",
            hint="name the file *.toml, *.yaml, *.yml or *.json",
        )
    raw = _read_regular(shown)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise syntax_error(shown, "file is not valid UTF-8", line, 1, code="MDC001") from None
    return load_text(text.removeprefix("\ufeff"), shown, fmt)


def _read_regular(path: str) -> bytes:
    """The bytes of ``path`` if it is a regular file of at most :data:`MAX_BYTES`.

    A FIFO would block the read forever and a device (``/dev/zero``, through a symlink named
    ``*.json``) never ends: neither is opened for reading, and no read goes past the cap.
    """
    try:
        kind = _not_regular(os.stat(path).st_mode)
        if kind is None:
            # O_NONBLOCK: were it swapped for a FIFO since the stat, the open does not wait
            flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
            fd = os.open(path, flags)
            with open(fd, "rb") as file:
                kind = _not_regular(os.fstat(fd).st_mode)
                raw = b"" if kind else file.read(MAX_BYTES + 1)
    except OSError as exc:
        raise syntax_error(
            path, f"cannot read the file: {exc.strerror}", None, None, code="MDC003"
        ) from None
    if kind is not None:
        raise syntax_error(
            path,
            f"not a regular file but {kind}: a spec is read from a file only",
            None,
            None,
            code="MDC003",
            hint="give the spec file itself (a symlink to a file is fine)",
        )
    if len(raw) > MAX_BYTES:
        raise syntax_error(
            path,
            f"file is over {MAX_BYTES} bytes; specs are limited to {MAX_BYTES}",
            None,
            None,
            code="MDC003",
        )
    return raw


_KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _not_regular(mode: int) -> str | None:
    """What a file of ``mode`` is, when it is not a regular file."""
    if stat.S_ISREG(mode):
        return None
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")
