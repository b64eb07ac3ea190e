"""TOML loader: the standard library reads the data, a small scanner finds the positions.

``tomllib`` keeps no positions, so :class:`_Scanner` walks the text again after
it was accepted. A text ``tomllib`` refuses takes the thorough path: tomlkit,
whose errors carry a line and column (and which also reads TOML 1.1, e.g.
newlines in inline tables). The scanner assumes valid syntax but checks the
rules on defining keys and tables itself: tomlkit reports some duplicates
without a position and lets a few redefinitions through (``x.a = 1`` then
``[x.b]`` then ``[x]``), so the scanner's verdict on those is the one we use.
"""

from __future__ import annotations

import bisect
import contextlib
import datetime
import functools
import re
import tomllib
from collections.abc import Callable
from typing import Any

import attrs

from mdc.errors import SpecError, escape_pointer_token, join_pointer
from mdc.loaders.document import (
    MAX_INT_DIGITS,
    LoadedDocument,
    Position,
    ScannedPositions,
    decimal_digits,
    duplicate_key,
    long_integer,
    syntax_error,
)

Path = tuple[str | int, ...]

_TRAILER = re.compile(r" at line \d+ col \d+$")
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
# A date-time may contain one space ("1979-05-27 07:32:00"); other scalars end at a delimiter.
_SCALAR = re.compile(r"\d{4}-\d{2}-\d{2}[ Tt]\d{2}:\d{2}[^\s,\]}#]*|[^\s,\]}#]+")
_ESCAPE = re.compile(r"\\(u[0-9A-Fa-f]{4}|U[0-9A-Fa-f]{8}|x[0-9A-Fa-f]{2}|.)", re.DOTALL)
_SIMPLE_ESCAPES = {
    "b": "\b",
    "t": "\t",
    "n": "\n",
    "f": "\f",
    "r": "\r",
    "e": "\x1b",
    '"': '"',
    "\\": "\\",
}

# How a path came to exist; decides whether a later statement may reuse it.
_VALUE, _HEADER, _IMPLICIT, _DOTTED, _AOT = "value", "header", "implicit", "dotted", "aot"


def parse(text: str, path: str) -> LoadedDocument:
    """Parse TOML ``text``; raise :class:`SpecError` (MDC001/MDC002) if it is invalid."""
    try:
        raw = tomllib.loads(text)
    except ValueError as exc:  # TOMLDecodeError too: int() past Python's limit, or syntax
        if not isinstance(exc, tomllib.TOMLDecodeError):
            _refuse_long_integer(text, path)
        return _parse_thoroughly(text, path)
    except RecursionError:
        return _parse_thoroughly(text, path)
    # tomllib refuses every redefinition, so the scanner runs only when a finding asks for a
    # position (most specs have none), or a date's text is wanted
    scanned = functools.cache(functools.partial(_positions, text))
    dates: list[_Written] = []
    data = _plain(raw, dates)
    if dates:
        data = _as_written(data, scanned())
    return LoadedDocument(
        path=path,
        data=data,
        values=ScannedPositions(lambda: scanned().values),
        keys=ScannedPositions(lambda: scanned().keys),
    )


def _parse_thoroughly(text: str, path: str) -> LoadedDocument:
    """A text ``tomllib`` refused: tomlkit's located error, or its reading of TOML 1.1."""
    dates: list[_Written] = []
    data = _plain(_read_thoroughly(text, path), dates)
    scanner = _Scanner(text)
    try:
        scanner.run()  # its verdict on redefinitions tomlkit lets through
    except _Duplicate as dup:
        raise _duplicate_error(dup, path) from None
    except _ScanError:
        pass  # positions are a convenience: keep what was found
    if dates:
        data = _as_written(data, scanner)
    return LoadedDocument(path=path, data=data, values=scanner.values, keys=scanner.keys)


def _refuse_long_integer(text: str, path: str) -> None:
    """MDC020 at the first integer literal longer than Python converts, if there is one."""
    scanner = _Scanner(text)
    with contextlib.suppress(_ScanError, _Duplicate, RecursionError):
        scanner.run()
    if scanner.long_integer is not None:
        where, digits = scanner.long_integer
        pointer = join_pointer(where)
        raise long_integer(path, digits, *scanner.values[pointer], pointer)


def _positions(text: str) -> _Scanner:
    scanner = _Scanner(text)
    with contextlib.suppress(_ScanError, _Duplicate):  # neither in a text tomllib read
        scanner.run()
    return scanner


def _read_thoroughly(text: str, path: str) -> object:
    """tomlkit's reading of a text ``tomllib`` refused: a located error, or TOML 1.1 data."""
    import tomlkit
    from tomlkit.exceptions import TOMLKitError

    try:
        return tomlkit.parse(text).unwrap()
    except (TOMLKitError, ValueError, RecursionError) as exc:
        _refuse_long_integer(text, path)  # tomlkit says "Invalid number" (or int()'s error)
        raise _translate(exc, text, path) from None


_SCALARS = frozenset({bool, int, float, str})


@attrs.frozen
class _Written:
    """A date or time, until its text as written replaces it (see :func:`_as_written`)."""

    value: datetime.date | datetime.time


def _plain(value: object, dates: list[_Written]) -> object:
    """Built-in types only; dates and times become :class:`_Written`, each also appended to
    ``dates`` (TOML has them, a spec does not: each is kept as the text written, never
    rewritten in another form)."""
    if type(value) in _SCALARS:  # what tomllib gives: already the type itself
        return value
    if isinstance(value, dict):
        return {str(k): _plain(v, dates) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v, dates) for v in value]
    if isinstance(value, (datetime.date, datetime.time)):  # datetime is a date
        dates.append(_Written(value))
        return dates[-1]
    for kind in (bool, int, float, str):  # bool first: it is an int
        if isinstance(value, kind):
            return kind(value)
    raise TypeError(f"unexpected TOML value {value!r}")  # pragma: no cover


def _as_written(data: object, scanner: _Scanner) -> object:
    """``data`` with each :class:`_Written` replaced by its text in the source."""
    if isinstance(data, _Written):
        return data.value.isoformat()  # the document is the date: no source map needed
    stack: list[tuple[Any, str]] = [(data, "")]
    while stack:
        value, here = stack.pop()
        children = value.items() if isinstance(value, dict) else enumerate(value)
        for key, child in children:
            pointer = f"{here}/{escape_pointer_token(key)}"
            if isinstance(child, _Written):
                value[key] = scanner.written(pointer) or child.value.isoformat()
            elif isinstance(child, (dict, list)):
                stack.append((child, pointer))
    return data


def _translate(exc: Exception, text: str, path: str) -> SpecError:
    from tomlkit.exceptions import KeyAlreadyPresent

    if isinstance(exc, RecursionError):
        return syntax_error(path, "document is nested too deeply", None, None)
    message = _TRAILER.sub("", str(exc)) or type(exc).__name__
    line, col = getattr(exc, "line", None), getattr(exc, "col", None)
    where = _clamp(text, line, col)
    if message == "Unexpected character: '\\x00'" and "\x00" not in text:
        # tomlkit's end-of-input sentinel, reported at a made-up place
        message, where = "unexpected end of file", _end_of(text)
    if (
        isinstance(exc, KeyAlreadyPresent)
        or "already exists" in message
        or "Redefinition" in message
    ):
        dup = _find_duplicate(text, line)
        if dup is not None:
            return _duplicate_error(dup, path)
        return syntax_error(path, message, *where, code="MDC002")
    return syntax_error(path, message, *where)


def _duplicate_error(dup: _Duplicate, path: str) -> SpecError:
    return duplicate_key(path, str(dup.path[-1]), join_pointer(dup.path), *dup.at, first=dup.first)


def _clamp(text: str, line: int | None, col: int | None) -> tuple[int | None, int | None]:
    """tomlkit's 0-based column made 1-based, kept inside the text."""
    if line is None:
        return None, None
    lines = text.split("\n")
    line = min(max(line, 1), len(lines))
    return line, min(max((col or 0) + 1, 1), len(lines[line - 1]) + 1)


def _end_of(text: str) -> Position:
    last = text.rsplit("\n", 1)[-1]
    return text.count("\n") + 1, len(last) + 1


def _find_duplicate(text: str, limit_line: int | None) -> _Duplicate | None:
    """The first redefinition in ``text``, if it is not past where tomlkit stopped."""
    try:
        _Scanner(text).run()
    except _Duplicate as dup:
        if limit_line is None or dup.at[0] <= limit_line:
            return dup
    except _ScanError:
        pass
    return None


def _unescape(raw: str) -> str:
    def one(m: re.Match[str]) -> str:
        body = m.group(1)
        if body[0] in "uUx" and len(body) > 1:
            return chr(int(body[1:], 16))
        return _SIMPLE_ESCAPES.get(body, body)

    return _ESCAPE.sub(one, raw)


class _ScanError(Exception):
    """The text is not what the scanner expected (for text tomlkit accepted, a bug)."""


class _Duplicate(Exception):
    def __init__(self, path: Path, at: Position, first: Position | None) -> None:
        super().__init__(path)
        self.path, self.at, self.first = path, at, first


class _Scanner:
    def __init__(self, text: str) -> None:
        self.text, self.i = text, 0
        self.starts = [0] + [m.end() for m in re.finditer("\n", text)]
        self.values: dict[str, Position] = {"": (1, 1)}
        self.keys: dict[str, Position] = {}
        self.kinds: dict[Path, str] = {}
        self.aot_len: dict[Path, int] = {}
        #: the first integer literal past Python's limit: its path and digits
        self.long_integer: tuple[Path, int] | None = None

    # -- positions and bookkeeping ----------------------------------------
    def pos(self, offset: int) -> Position:
        line = bisect.bisect_right(self.starts, offset)
        return line, offset - self.starts[line - 1] + 1

    def define(self, path: Path, kind: str, key_at: int, value_at: int) -> None:
        self.kinds[path] = kind
        pointer = join_pointer(path)
        self.keys[pointer] = self.pos(key_at)
        self.values[pointer] = self.pos(value_at)

    def written(self, pointer: str) -> str | None:
        """The text of the scalar at ``pointer`` as the source spells it."""
        at = self.values.get(pointer)
        if at is None:
            return None
        m = _SCALAR.match(self.text, self.starts[at[0] - 1] + at[1] - 1)
        return m.group() if m else None

    def conflict(self, path: Path, offset: int) -> None:
        raise _Duplicate(path, self.pos(offset), self.keys.get(join_pointer(path)))

    # -- lexing -------------------------------------------------------------
    def peek(self, n: int = 1) -> str:
        return self.text[self.i : self.i + n]

    def skip_blank(self, newlines: bool) -> None:
        """Skip spaces and tabs, and with ``newlines`` also line breaks and comments."""
        while self.i < len(self.text):
            c = self.text[self.i]
            if c in " \t" or (newlines and c in "\r\n"):
                self.i += 1
            elif newlines and c == "#":
                end = self.text.find("\n", self.i)
                self.i = len(self.text) if end < 0 else end
            else:
                return

    def expect(self, token: str) -> None:
        if self.peek(len(token)) != token:
            raise _ScanError(f"expected {token!r} at {self.pos(self.i)}")
        self.i += len(token)

    def string_end(self, start: int, quote: str) -> int:
        """Offset just past the string opening at ``start`` (``quote`` is 1 or 3 chars)."""
        j, escapes = start + len(quote), quote[0] == '"'
        while j < len(self.text):
            if escapes and self.text[j] == "\\":
                j += 2
            elif self.text.startswith(quote, j):
                run = len(quote)
                # in '"""a""""' up to two quotes before the closing three are content
                while len(quote) == 3 and run < 5 and self.text[j + run : j + run + 1] == quote[0]:
                    run += 1
                return j + run
            elif len(quote) == 1 and self.text[j] == "\n":
                break
            else:
                j += 1
        raise _ScanError(f"unterminated string at {self.pos(start)}")

    def key_path(self) -> list[tuple[str, int]]:
        """A dotted key as (name, offset) parts."""
        parts = []
        while True:
            self.skip_blank(newlines=False)
            start, c = self.i, self.peek()
            if c in ('"', "'"):
                self.i = self.string_end(start, c)
                raw = self.text[start + 1 : self.i - 1]
                parts.append((_unescape(raw) if c == '"' else raw, start))
            else:
                m = _BARE_KEY.match(self.text, start)
                if m is None:
                    raise _ScanError(f"expected a key at {self.pos(start)}")
                self.i = m.end()
                parts.append((m.group(), start))
            self.skip_blank(newlines=False)
            if self.peek() != ".":
                return parts
            self.i += 1

    # -- grammar ------------------------------------------------------------
    def run(self) -> None:
        section: Path = ()
        while True:
            self.skip_blank(newlines=True)
            if self.i >= len(self.text):
                return
            if self.peek() == "[":
                section = self.header()
            else:
                self.key_value(section)

    def header(self) -> Path:
        aot = self.peek(2) == "[["
        self.i += 2 if aot else 1
        parts = self.key_path()
        self.expect("]]" if aot else "]")
        path: Path = ()
        for name, offset in parts[:-1]:
            path += (name,)
            kind = self.kinds.get(path)
            if kind is None:
                self.define(path, _IMPLICIT, offset, offset)
            elif kind == _AOT:
                path += (self.aot_len.get(path, 1) - 1,)  # the latest element
            elif kind == _VALUE:
                self.conflict(path, offset)
        name, offset = parts[-1]
        path += (name,)
        kind, start = self.kinds.get(path), parts[0][1]
        if not aot:
            if kind in (None, _IMPLICIT):
                self.define(path, _HEADER, offset, start)
            else:
                self.conflict(path, offset)
            return path
        if kind is None:
            self.define(path, _AOT, offset, start)
        elif kind != _AOT:
            self.conflict(path, offset)
        index = self.aot_len.get(path, 0)
        self.aot_len[path] = index + 1
        self.kinds[path + (index,)] = _HEADER
        self.values[join_pointer(path + (index,))] = self.pos(start)
        return path + (index,)

    def key_value(self, table: Path) -> None:
        parts = self.key_path()
        self.expect("=")
        self.skip_blank(newlines=False)
        path = table
        for name, offset in parts[:-1]:
            path += (name,)
            kind = self.kinds.get(path)
            if kind is None:
                self.define(path, _DOTTED, offset, offset)
            elif kind == _IMPLICIT:
                self.kinds[path] = _DOTTED
            elif kind != _DOTTED:
                self.conflict(path, offset)
        name, offset = parts[-1]
        path += (name,)
        if path in self.kinds:
            self.conflict(path, offset)
        self.define(path, _VALUE, offset, self.i)
        self.value(path)

    def value(self, path: Path) -> None:
        c = self.peek()
        if c == "[":
            self.items("]", lambda index: self.element(path + (index,)))
        elif c == "{":
            self.items("}", lambda _: self.key_value(path))
        elif c in ('"', "'"):
            quote = c * 3 if self.peek(3) == c * 3 else c
            self.i = self.string_end(self.i, quote)
        else:
            m = _SCALAR.match(self.text, self.i)
            if m is None:
                raise _ScanError(f"expected a value at {self.pos(self.i)}")
            digits = decimal_digits(m.group())
            if self.long_integer is None and digits is not None and digits > MAX_INT_DIGITS:
                self.long_integer = path, digits
            self.i = m.end()

    def items(self, close: str, item: Callable[[int], None]) -> None:
        """Comma-separated items up to ``close``, the opener being at the cursor."""
        self.i += 1
        index = 0
        while True:
            # TOML 1.1 (which tomlkit reads) allows newlines and a trailing comma in
            # inline tables too, so both kinds of item list skip the same way
            self.skip_blank(newlines=True)
            if self.peek() == close:
                self.i += 1
                return
            item(index)
            index += 1
            self.skip_blank(newlines=True)
            if self.peek() == ",":
                self.i += 1
            elif self.peek() != close:
                raise _ScanError(f"expected ',' or {close!r} at {self.pos(self.i)}")

    def element(self, path: Path) -> None:
        self.kinds[path] = _VALUE
        self.values[join_pointer(path)] = self.pos(self.i)
        self.value(path)
