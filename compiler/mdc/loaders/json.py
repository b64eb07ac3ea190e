"""JSON loader: the standard library reads the data, a small scanner finds the positions.

``json.loads`` reports syntax errors with positions but accepts duplicate keys
and NaN/Infinity silently. We make both stop the parse, then let the scanner,
which knows where every token is, raise the located error. A text with nothing
for the scanner to refuse is scanned only when a position is asked for.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import json
import re

from mdc.errors import join_pointer
from mdc.loaders.document import (
    MAX_INT_DIGITS,
    SURROGATE,
    LoadedDocument,
    Position,
    ScannedPositions,
    decimal_digits,
    duplicate_key,
    long_integer,
    syntax_error,
)

Path = tuple[str | int, ...]

_WHITESPACE = " \t\n\r"
_SCALAR = re.compile(r"-?Infinity|NaN|true|false|null|-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][-+]?\d+)?")
_NOT_JSON = ("NaN", "Infinity", "-Infinity")


def parse(text: str, path: str) -> LoadedDocument:
    """Parse JSON ``text``; raise :class:`SpecError` (MDC001/MDC002) if it is invalid."""
    rejected: _Rejected | None = None
    data: object = None
    try:
        data = json.loads(
            text, object_pairs_hook=_object, parse_constant=_constant, parse_int=_integer
        )
    except json.JSONDecodeError as exc:
        raise syntax_error(path, exc.msg, exc.lineno, exc.colno) from None
    except _Rejected as exc:
        rejected = exc  # the scanner below raises it again, with a position
    except RecursionError:
        raise syntax_error(path, "document is nested too deeply", None, None) from None
    if rejected is None and "\\u" not in text and not SURROGATE.search(text):
        # json.loads refused duplicates and NaN, and no string can hold a surrogate (only a
        # \u escape or the character itself makes one): the scanner has nothing left to
        # refuse, so it runs only when a finding asks for a position (most specs have none)
        scanned = functools.cache(functools.partial(_positions, text, path))
        return LoadedDocument(
            path=path,
            data=data,
            values=ScannedPositions(lambda: scanned().values),
            keys=ScannedPositions(lambda: scanned().keys),
        )
    scanner = _positions(text, path)  # raises what json.loads refused, located
    if rejected is not None:  # the scanner gave up before reaching it (deep nesting)
        raise syntax_error(path, str(rejected), None, None, code=rejected.code)
    return LoadedDocument(path=path, data=data, values=scanner.values, keys=scanner.keys)


def _positions(text: str, path: str) -> _Scanner:
    """The scanned positions; raises a located SpecError for what the scanner refuses."""
    scanner = _Scanner(text, path)
    with contextlib.suppress(_ScanError, RecursionError):  # positions are a convenience
        scanner.value(())
    return scanner


class _Rejected(Exception):
    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


class _ScanError(Exception):
    """The text is not what the scanner expected (a bug, since json.loads accepted it)."""


def _object(pairs: list[tuple[str, object]]) -> dict[str, object]:
    result = dict(pairs)
    if len(result) != len(pairs):
        raise _Rejected("duplicate key", "MDC002")
    return result


def _integer(literal: str) -> int:
    # int() refuses (ValueError, a bug to mdc) past the interpreter's limit: ours is fixed
    if len(literal.lstrip("-")) > MAX_INT_DIGITS:
        raise _Rejected(f"an integer of {len(literal.lstrip('-')):,} digits", "MDC020")
    return int(literal)


def _constant(name: str) -> object:
    raise _Rejected(f"{name} is not valid JSON", "MDC001")


class _Scanner:
    """Recursive descent over text that json.loads accepted up to any duplicate or NaN."""

    def __init__(self, text: str, path: str) -> None:
        self.text, self.path, self.i = text, path, 0
        self.starts = [0] + [m.end() for m in re.finditer("\n", text)]
        self.values: dict[str, Position] = {}
        self.keys: dict[str, Position] = {}

    def pos(self, offset: int) -> Position:
        line = bisect.bisect_right(self.starts, offset)
        return line, offset - self.starts[line - 1] + 1

    def skip(self) -> None:
        while self.i < len(self.text) and self.text[self.i] in _WHITESPACE:
            self.i += 1

    def peek(self) -> str:
        return self.text[self.i : self.i + 1]

    def value(self, path: Path) -> None:
        self.skip()
        self.values[join_pointer(path)] = self.pos(self.i)
        c = self.peek()
        if c == "{":
            self.obj(path)
        elif c == "[":
            self.array(path)
        elif c == '"':
            self.string()
        else:
            self.scalar(path)

    def scalar(self, path: Path) -> None:
        m = _SCALAR.match(self.text, self.i)
        if m is None:
            raise _ScanError(f"expected a value at {self.pos(self.i)}")
        if m.group() in _NOT_JSON:
            line, col = self.pos(self.i)
            raise syntax_error(
                self.path,
                f"{m.group()} is not valid JSON",
                line,
                col,
                hint="JSON has no NaN or infinities; use a number or a string",
                pointer=join_pointer(path),
            )
        digits = decimal_digits(m.group())
        if digits is not None and digits > MAX_INT_DIGITS:
            raise long_integer(self.path, digits, *self.pos(self.i), join_pointer(path))
        self.i = m.end()

    def string(self) -> str:
        """Skip the string at the cursor and return its decoded text."""
        start, j = self.i, self.i + 1
        while j < len(self.text) and self.text[j] != '"':
            j += 2 if self.text[j] == "\\" else 1
        if j >= len(self.text):
            raise _ScanError(f"unterminated string at {self.pos(start)}")
        self.i = j + 1
        decoded: str = json.loads(self.text[start : self.i])
        if SURROGATE.search(decoded):
            # json accepts a lone "\ud800"; no file or terminal could encode it later
            raise syntax_error(
                self.path,
                "string contains an unpaired surrogate escape",
                *self.pos(start),
                hint="escape a non-BMP character as a pair",
            )
        return decoded

    def separator(self, close: str) -> bool:
        """Consume ',' (True: more follows) or ``close`` (False)."""
        self.skip()
        c = self.peek()
        if c not in (",", close):
            raise _ScanError(f"expected ',' or {close!r} at {self.pos(self.i)}")
        self.i += 1
        return c == ","

    def array(self, path: Path) -> None:
        self.i += 1
        self.skip()
        if self.peek() == "]":
            self.i += 1
            return
        index = 0
        while True:
            self.value(path + (index,))
            index += 1
            if not self.separator("]"):
                return

    def obj(self, path: Path) -> None:
        self.i += 1
        self.skip()
        if self.peek() == "}":
            self.i += 1
            return
        seen: dict[str, Position] = {}
        while True:
            self.skip()
            if self.peek() != '"':
                raise _ScanError(f"expected a key at {self.pos(self.i)}")
            at = self.pos(self.i)
            key = self.string()
            child = path + (key,)
            if key in seen:
                raise duplicate_key(self.path, key, join_pointer(child), *at, first=seen[key])
            seen[key] = self.keys[join_pointer(child)] = at
            self.skip()
            if self.peek() != ":":
                raise _ScanError(f"expected ':' at {self.pos(self.i)}")
            self.i += 1
            self.value(child)
            if not self.separator("}"):
                return
