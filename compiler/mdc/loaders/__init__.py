"""Loaders: one module per format, each returning a document and its source map.

A :class:`LoadedDocument` holds plain Python data (dict, list, str, int, float,
bool, None) and, for every JSON pointer in it, the 1-based ``(line, column)``
of the value and, for object members, of the key. Later passes locate their
findings through it. Syntax errors and duplicate keys are :class:`SpecError`\\ s
with positions.
"""

from __future__ import annotations

import os
import re
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
    return doc


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
    try:
        with open(shown, "rb") as file:
            raw = file.read()
    except OSError as exc:
        raise syntax_error(
            shown, f"cannot read the file: {exc.strerror}", None, None, code="MDC003"
        ) from None
    if len(raw) > MAX_BYTES:
        raise syntax_error(
            shown,
            f"file is {len(raw)} bytes; specs are limited to {MAX_BYTES}",
            None,
            None,
            code="MDC003",
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise syntax_error(shown, "file is not valid UTF-8", line, 1, code="MDC001") from None
    return load_text(text.removeprefix("\ufeff"), shown, fmt)
