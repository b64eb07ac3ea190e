"""The Kubernetes backends' YAML writer: block style, fixed key order, every value reading back
as given (strings that would read back as another type are quoted)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

#
# A small block-style writer. Its layout is that of ruamel.yaml's round-trip dumper with
# indent(mapping=2, sequence=4, offset=2), which wrote these files before (the goldens pin
# those bytes); writing it directly costs a few percent of what ruamel's representer,
# serializer and emitter did, and no import of ruamel.

#: what only a double-quoted scalar holds: characters outside YAML's c-printable set (C0 and
#: C1 controls, tab and line feed included; DEL, surrogates, U+FFFE/U+FFFF), the line breaks
#: NEL, LS and PS, and the byte order mark
_OTHER = r"[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff\ufeff\ufffe\uffff]"

#: a plain scalar that a YAML 1.1 reader (PyYAML; kubectl's go-yaml) or a YAML 1.2 reader
#: resolves to something other than a string: the 1.1 type repository's implicit bool, null,
#: int, float, timestamp, merge and value forms and the 1.2 core schema's (both allow "_"
#: in numbers here, as PyYAML and ruamel read them)
_IMPLICIT = re.compile(
    r"""
    ~ | null | Null | NULL
  | y | Y | yes | Yes | YES | n | N | no | No | NO | on | On | ON | off | Off | OFF  # 1.1
  | true | True | TRUE | false | False | FALSE
  | [-+]?0b[01_]+ | [-+]?0o?[0-7_]+ | [-+]?0x[0-9a-fA-F_]+       # 0b1, 017 (1.1), 0o17 (1.2), 0x1f
  | [-+]?[0-9][0-9_]* | [-+][0-9_]+                              # 12, 1_000
  | [-+]?[1-9][0-9_]*(?::[0-5]?[0-9])+                           # base 60 (1.1): 12:30
  | [-+]?[0-9][0-9_]*(?::[0-5]?[0-9])*\.[0-9_]*(?:[eE][-+]?[0-9]+)?  # 1.5, 1.e3, 12:30.5
  | [-+]?[0-9][0-9_]*[eE][-+]?[0-9]+                             # 1e3 (1.2)
  | [-+]?\.[0-9_]+(?:[eE][-+]?[0-9]+)?                           # .5, .5e3
  | [-+]?\.(?:inf|Inf|INF) | \.(?:nan|NaN|NAN)
  | [0-9]{4}-[0-9]{2}-[0-9]{2}                                   # timestamp: a date
  | [0-9]{4}-[0-9]{1,2}-[0-9]{1,2}(?:[Tt]|[ \t]+)[0-9]{1,2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]*)?
    (?:[ \t]*(?:Z|[-+][0-9]{1,2}(?::[0-9]{2})?))?               # ... or a date and time
  | << | =                                                       # merge, value
""",
    re.VERBOSE,
)

#: what a plain scalar in block context cannot be: starting with an indicator or a document
#: marker, holding ": " or " #", ending in ":" or a space, starting with a space, or holding
#: a character that is not printable (line breaks and tabs included)
_NOT_PLAIN = re.compile(
    r"\A(?:[-?:](?:\ |\Z)|[#,\[\]{}&*!|>'\"%@`]|---|\.\.\.|\ )"
    r"|:\ |\ \#|[:\ ]\Z|" + _OTHER,
    re.VERBOSE,
)
#: what a single-quoted scalar on one line cannot hold
_NOT_SINGLE = re.compile("'|" + _OTHER)
#: what a double-quoted scalar writes as an escape
_ESCAPED = re.compile(r'["\\]|' + _OTHER)
_ESCAPES = {
    "\0": "0",
    "\a": "a",
    "\b": "b",
    "\t": "t",
    "\n": "n",
    "\v": "v",
    "\f": "f",
    "\r": "r",
    "\x1b": "e",
    '"': '"',
    "\\": "\\",
    "\x85": "N",
    "\u2028": "L",
    "\u2029": "P",
}
#: what a literal block cannot hold so as to read back exactly: a leading space or line break
#: (that would need an indentation indicator), a space ending a line, any other character
#: that is not printable
_NOT_LITERAL = re.compile(r"\A[\ \n]|\ \n|\ \Z|(?!\n)" + _OTHER, re.VERBOSE)
_BREAKS = re.compile("[\n\x85\u2028\u2029]")
#: ruamel writes keys this long (or holding a line break) as explicit "? key" entries (its
#: limit, 128, counted the 5 characters of a "!!str" tag it never wrote)
_LONG_KEY = 123


def _string(text: str) -> str:
    """``text`` as a plain scalar when every YAML reader reads that back as the same
    string, else single-quoted, else (a quote, a line break, a control) double-quoted."""
    if text and not _IMPLICIT.fullmatch(text) and not _NOT_PLAIN.search(text):
        return text
    if _NOT_SINGLE.search(text):
        return '"' + _ESCAPED.sub(_escape_char, text) + '"'
    return f"'{text}'"


def _escape_char(match: re.Match[str]) -> str:
    char = match.group()
    if char in _ESCAPES:
        return "\\" + _ESCAPES[char]
    code = ord(char)
    return (
        f"\\x{code:02X}"
        if code <= 0xFF
        else f"\\u{code:04X}"
        if code <= 0xFFFF
        else f"\\U{code:08X}"
    )


def _literal_safe(text: str) -> bool:
    """A multi-line string reads back exactly from a literal block (``|``, ``|-``, ``|+``)."""
    return "\n" in text and not _NOT_LITERAL.search(text)


def _scalar(value: Any) -> str:
    """A one-line scalar (or an empty ``{}``/``[]``); None is the empty plain scalar."""
    if isinstance(value, str):
        return _string(value)
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, Mapping):
        return "{}"
    if isinstance(value, (list, tuple)):
        return "[]"
    raise TypeError(f"cannot write {type(value).__name__} {value!r} as YAML")


def _items(mapping: Mapping[Any, Any]) -> Iterable[tuple[str, Any]]:
    """Entries with string keys (other keys as ``str(key)``, the last value winning)."""
    if all(type(key) is str for key in mapping):
        return mapping.items()
    return {str(key): value for key, value in mapping.items()}.items()


class _Writer:
    """Lines of block YAML. Each node is written after ``head``, the text already on its
    first line ("---", "key:", the ":" of an explicit "? key", "  -" of a sequence item); a
    collection continues an ``inline`` head as ruamel does ("  - key: v", "  -   - item")."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        #: len(lines) after a ``|+`` block: a stream ending with it ends with "..." too
        self.keep_end = -1

    def text(self) -> str:
        if self.keep_end == len(self.lines):
            self.lines.append("...")
        return "\n".join(self.lines) + "\n"

    def node(self, value: Any, head: str, indent: int, seq_indent: int, inline: bool) -> None:
        """``indent``: of a mapping's keys and of a literal block's lines; ``seq_indent``: of
        a sequence's items (a sequence under a key is not indented further)."""
        if isinstance(value, Mapping) and value:
            self.mapping(value, head, indent, inline)
        elif isinstance(value, (list, tuple)) and value:
            self.sequence(value, head, seq_indent, inline)
        elif isinstance(value, str) and _literal_safe(value):
            self.literal(value, head, indent)
        else:
            text = _scalar(value)
            self.lines.append(f"{head} {text}" if text else head)

    def mapping(self, mapping: Mapping[Any, Any], head: str, indent: int, inline: bool) -> None:
        if not inline:
            self.lines.append(head)
            head = ""
        pad = " " * indent
        for key, value in _items(mapping):
            line = head.ljust(indent) if head else pad
            head = ""
            if len(key) < _LONG_KEY and not _BREAKS.search(key):
                self.node(value, f"{line}{_string(key)}:", indent + 2, indent, False)
            else:
                self.lines.append(f"{line}? {_string(key)}")
                self.node(value, pad + ":", indent + 2, indent + 2, True)

    def sequence(self, items: Sequence[Any], head: str, indent: int, inline: bool) -> None:
        if not inline:
            self.lines.append(head)
            head = ""
        pad = " " * indent
        for item in items:
            line = (head.ljust(indent) if head else pad) + "  -"
            head = ""
            if item is None:
                self.lines.append(line + " ")  # ruamel pads even an empty item to its column
            else:
                self.node(item, line, indent + 4, indent + 4, True)

    def literal(self, text: str, head: str, indent: int) -> None:
        chomp = "+" if text.endswith("\n\n") else "" if text.endswith("\n") else "-"
        self.lines.append(f"{head} |{chomp}")
        pad = " " * indent
        lines = text.removesuffix("\n").split("\n")
        self.lines.extend(pad + line if line else "" for line in lines)
        if chomp == "+":
            self.keep_end = len(self.lines)


def dump_yaml(docs: Sequence[Mapping[str, Any]]) -> str:
    """Documents as one multi-document YAML text, deterministic, every value reading back as given.

    Keys keep the insertion order of the dicts (build them apiVersion, kind,
    metadata, spec); strings that look like numbers, booleans or null are quoted.
    """
    writer = _Writer()
    for doc in docs:
        writer.node(doc, "---", 0, 0, False)
    return writer.text()


def load_yaml(text: str) -> list[Any]:
    """Parse back what :func:`dump_yaml` wrote (plain Python values)."""
    from ruamel.yaml import YAML  # only tests and rehearsals read YAML back

    yaml = YAML(typ="safe", pure=True)
    return [doc for doc in yaml.load_all(text) if doc is not None]
