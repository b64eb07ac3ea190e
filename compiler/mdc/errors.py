"""Diagnostics, the exceptions that carry them, and the CLI's exit codes.

Every user-facing finding is a :class:`Diagnostic`. Passes collect them and
never stop at the first; :class:`SpecError` carries all of them at once.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable

import attrs


class ExitCode(enum.IntEnum):
    #: Success.
    OK = 0
    #: The spec is invalid (or, with ``compile --check``, the output drifted).
    SPEC_INVALID = 1
    #: The command line was wrong (argparse's own code).
    USAGE = 2
    #: A plugin failed to load or raised.
    PLUGIN_ERROR = 3
    #: A bug in mdc.
    INTERNAL_ERROR = 4


class Severity(enum.Enum):
    ERROR = "error"
    WARNING = "warning"


#: What a terminal or a CI log would act on rather than show: C0 and C1 controls (ESC starts
#: colours and cursor moves, BEL rings, a newline starts a forged "file:line: error" line), DEL,
#: the Unicode line and paragraph separators, the bidirectional overrides that reorder text,
#: and lone surrogates (a file name that is not UTF-8), which no terminal can be sent.
_UNPRINTABLE = re.compile(
    "[\x00-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]"
)


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str) -> str:
    """``text`` with every character a terminal would act on written as an escape (``\\x1b``),
    so a file name or value can never draw, ring or forge a line in a diagnostic."""
    return _UNPRINTABLE.sub(_escape, text)


def escape_pointer_token(token: str | int) -> str:
    """One RFC 6901 reference token."""
    return str(token).replace("~", "~0").replace("/", "~1")


def join_pointer(parts: Iterable[str | int]) -> str:
    """The RFC 6901 pointer for a path of keys and indexes ('' is the root)."""
    return "".join("/" + escape_pointer_token(p) for p in parts)


@attrs.frozen(kw_only=True)
class SourceLocation:
    """Where a finding points: the file, the JSON pointer, and the position if known."""

    path: str
    pointer: str = ""
    line: int | None = None
    column: int | None = None


@attrs.frozen(kw_only=True)
class Diagnostic:
    """One finding about a spec, located as precisely as the source allows."""

    severity: Severity
    code: str
    message: str
    location: SourceLocation
    hint: str | None = None

    @property
    def is_error(self) -> bool:
        return self.severity is Severity.ERROR

    def sort_key(self) -> tuple[str, int, int, str, str, str]:
        loc = self.location
        return (loc.path, loc.line or 0, loc.column or 0, loc.pointer, self.code, self.message)

    def render(self) -> str:
        """``path:line:col: error[MDCnnn]: message (at /pointer)`` plus a hint line, with
        control characters escaped (:func:`printable`): always exactly those lines."""
        loc = self.location
        where = printable(loc.path)
        if loc.line is not None:
            where += f":{loc.line}:{loc.column or 1}"
        text = f"{where}: {self.severity.value}[{self.code}]: {printable(self.message)}"
        if loc.pointer:
            text += f" (at {printable(loc.pointer)})"
        if self.hint:
            text += f"\n  hint: {printable(self.hint)}"
        return text

    def to_json(self) -> dict[str, object]:
        loc = self.location
        return {
            "severity": self.severity.value,
            "code": self.code,
            "message": self.message,
            "path": loc.path,
            "pointer": loc.pointer,
            "line": loc.line,
            "column": loc.column,
            "hint": self.hint,
        }


def sort_diagnostics(diagnostics: Iterable[Diagnostic]) -> tuple[Diagnostic, ...]:
    return tuple(sorted(diagnostics, key=Diagnostic.sort_key))


class MdcError(Exception):
    """Base of every error mdc raises on purpose."""


class SpecError(MdcError):
    """The spec is invalid; carries every finding, sorted."""

    def __init__(self, diagnostics: Iterable[Diagnostic]) -> None:
        self.diagnostics = sort_diagnostics(diagnostics)
        super().__init__(f"{len(self.diagnostics)} problem(s) in the spec")


@attrs.frozen(kw_only=True)
class PluginOrigin:
    """Which installed code a plugin came from, for error messages and `mdc plugins`."""

    entry_point: str  # "name = module"
    distribution: str
    version: str


class PluginError(MdcError):
    """A plugin failed to load, failed validation, or raised in a hook."""

    def __init__(self, origin: PluginOrigin | None, hook: str, reason: str) -> None:
        self.origin = origin
        self.hook = hook
        self.reason = reason
        super().__init__(self.render())

    def render(self) -> str:
        if self.origin is None:
            who = "a plugin"
        else:
            o = self.origin
            who = f"plugin {o.entry_point!r} from {o.distribution} {o.version}"
        return printable(f"{who} failed in {self.hook}: {self.reason}")


class InternalError(MdcError):
    """A bug in mdc (for example, schema and model out of step)."""


@attrs.frozen(kw_only=True)
class Finding:
    """A problem a plugin found in the plan; mdc locates it through ``pointer``."""

    code: str
    message: str
    pointer: str
    hint: str | None = None
    severity: Severity = Severity.ERROR
