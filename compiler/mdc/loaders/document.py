"""What every loader builds: the :class:`LoadedDocument`, its positions, the limits a spec is
held to and the findings of a file that does not parse (the format modules and the package's
dispatch both use them)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator, Mapping

import attrs

from mdc.errors import Diagnostic, Severity, SourceLocation, SpecError

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


def unfit(value: object) -> bool:
    """A float that is NaN or infinite, or an integer Python would not print."""
    if type(value) is float:
        return not math.isfinite(value)
    return type(value) is int and not -_INT_BOUND < value < _INT_BOUND
