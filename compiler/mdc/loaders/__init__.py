"""Loaders: one module per format, each returning a document and its source map.

A :class:`LoadedDocument` holds plain Python data (dict, list, str, int, float,
bool, None) and, for every JSON pointer in it, the 1-based ``(line, column)``
of the value and, for object members, of the key. Later passes locate their
findings through it. Syntax errors and duplicate keys are :class:`SpecError`\\ s
with positions.
"""

from __future__ import annotations

import math
import os
import re
import stat
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING

import attrs

from mdc.errors import Diagnostic, Severity, SourceLocation, SpecError, escape_pointer_token

if TYPE_CHECKING:
    from os import PathLike

Position = tuple[int, int]

#: File suffixes and the format that reads them.
FORMATS = {".toml": "toml", ".yaml": "yaml", ".yml": "yaml", ".json": "json"}

#: Specs are small; anything larger is a mistake, not a job.
MAX_BYTES = 4 * 1024 * 1024
#: A job spec nests a few levels; deeper is a mistake, whatever the format allows.
MAX_DEPTH = 64
#: The longest integer Python converts by default (and so every Python framework reads);
#: mdc holds itself to it whatever PYTHONINTMAXSTRDIGITS says, so a spec reads the same
#: everywhere.
MAX_INT_DIGITS = 4300
_INT_BOUND = 10**MAX_INT_DIGITS
#: Half of a UTF-16 surrogate pair: escapes can make one, no file or terminal can encode it.
SURROGATE = re.compile("[\ud800-\udfff]")


class ScannedPositions(Mapping[str, Position]):
    """A table of positions, scanned when first looked up (most specs never need one)."""

    def __init__(self, table: Callable[[], dict[str, Position]]) -> None:
        self._table = table

    def __getitem__(self, pointer: str) -> Position:
        return self._table()[pointer]

    def __iter__(self) -> Iterator[str]:
        return iter(self._table())

    def __len__(self) -> int:
        return len(self._table())


@attrs.frozen(kw_only=True)
class LoadedDocument:
    path: str
    data: object
    #: pointer -> position of the value ("" is the whole document)
    values: Mapping[str, Position]
    #: pointer -> position of the key naming that member (objects only)
    keys: Mapping[str, Position]

    def locate(self, pointer: str, *, key: bool = False) -> SourceLocation:
        """The location of ``pointer``, falling back to its nearest located ancestor."""
        probe = pointer
        while True:
            table = self.keys if key and probe == pointer else self.values
            pos = table.get(probe) or self.values.get(probe)
            if pos is not None:
                return SourceLocation(path=self.path, pointer=pointer, line=pos[0], column=pos[1])
            if not probe:
                return SourceLocation(path=self.path, pointer=pointer)
            probe = probe.rsplit("/", 1)[0]


def syntax_error(
    path: str,
    message: str,
    line: int | None,
    column: int | None,
    *,
    code: str = "MDC001",
    hint: str | None = None,
    pointer: str = "",
) -> SpecError:
    return SpecError(
        [
            Diagnostic(
                severity=Severity.ERROR,
                code=code,
                message=message,
                hint=hint,
                location=SourceLocation(path=path, pointer=pointer, line=line, column=column),
            )
        ]
    )


def duplicate_key(
    path: str, key: str, pointer: str, line: int, column: int, first: Position | None = None
) -> SpecError:
    hint = "remove one of them"
    if first is not None:
        hint = f"first defined at line {first[0]}, column {first[1]}; remove one of them"
    return syntax_error(
        path, f"duplicate key {key!r}", line, column, code="MDC002", hint=hint, pointer=pointer
    )


def long_integer(
    path: str, digits: int | None, line: int | None, column: int | None, pointer: str = ""
) -> SpecError:
    """MDC020 for an integer of more than :data:`MAX_INT_DIGITS` digits."""
    size = f"of {digits:,} digits" if digits is not None else f"over {MAX_INT_DIGITS:,} digits"
    return syntax_error(
        path,
        f"an integer {size}: mdc, like Python and the frameworks, reads at most "
        f"{MAX_INT_DIGITS:,} digits",
        line,
        column,
        code="MDC020",
        hint="give a number of a sensible size, or quote it if it is text",
        pointer=pointer,
    )


def decimal_digits(literal: str) -> int | None:
    """The digits of a decimal integer literal (sign and "_" aside); None if it is not one."""
    body = literal.lstrip("+-").replace("_", "")
    return len(body) if body.isascii() and body.isdigit() else None


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


def unfit(value: object) -> bool:
    """A float that is NaN or infinite, or an integer Python would not print."""
    if type(value) is float:
        return not math.isfinite(value)
    return type(value) is int and not -_INT_BOUND < value < _INT_BOUND


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
