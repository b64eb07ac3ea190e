"""YAML 1.2 loader keeping every node's position.

Two readers give the same result: a fast path composes libyaml's events (PyYAML's C
extension, ~50x faster) for the YAML on which libyaml's 1.1 and ruamel's 1.2 agree beyond
doubt, and declines everything else to the thorough path, ruamel.yaml's round-trip loader,
which also gives every diagnostic.

The fast path stays because it pays for itself (bench/run.py, "hand-written pieces against
their libraries", CPU time of the whole process): with every YAML file read by ruamel,
`mdc validate` of the bench's 100 specs took 425 instead of 328 ms (the fast path saves
23 %). A differential test (tests/unit/test_yaml_fast_path.py) holds it to ruamel's data
and positions.
"""

from __future__ import annotations

import datetime
import functools
import re
import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs

from mdc.errors import SourceLocation, SpecError, escape_pointer_token
from mdc.loaders.document import (
    MAX_DEPTH,
    MAX_INT_DIGITS,
    SURROGATE,
    LoadedDocument,
    Position,
    decimal_digits,
    duplicate_key,
    long_integer,
    syntax_error,
    unfit,
)

if TYPE_CHECKING:
    from ruamel.yaml.constructor import DuplicateKeyError

try:
    from yaml import CBaseLoader as CParser  # type: ignore[import-untyped,unused-ignore]
    from yaml import YAMLError as LibyamlError  # type: ignore[import-untyped,unused-ignore]
    from yaml.events import (  # type: ignore[import-untyped,unused-ignore]
        AliasEvent,
        DocumentStartEvent,
        MappingEndEvent,
        MappingStartEvent,
        ScalarEvent,
        SequenceEndEvent,
        SequenceStartEvent,
        StreamEndEvent,
    )
except ImportError:  # PyYAML without libyaml (no CBaseLoader): only the thorough path
    CParser = None  # type: ignore[assignment,misc]

#: A spec has hundreds of values; more means aliases multiplying a document (a "billion
#: laughs"), which would otherwise take minutes and gigabytes to expand.
MAX_VALUES = 20_000

_FLOW = re.compile(r"[\[\]{}]")


@functools.cache
def _bounded_composer() -> type[Any]:
    from ruamel.yaml.composer import Composer

    class BoundedComposer(Composer):
        """Stops composing far below Python's recursion limit (``_plain`` then applies the
        exact :data:`MAX_DEPTH`; ruamel calls ``compose_node`` more than once per level)."""

        def __init__(self, loader: Any = None) -> None:
            super().__init__(loader)
            self.depth = 0

        def compose_node(self, parent: Any, index: Any) -> Any:
            self.depth += 1
            try:
                if self.depth > 4 * MAX_DEPTH:
                    mark = self.parser.peek_event().start_mark
                    raise _TooDeep(mark.line + 1, mark.column + 1)
                return super().compose_node(parent, index)
            finally:
                self.depth -= 1

    return BoundedComposer


@functools.cache
def _spec_constructor() -> type[Any]:
    from ruamel.yaml.constructor import RoundTripConstructor

    class SpecConstructor(RoundTripConstructor):
        """ruamel's round-trip constructor, but for what a spec cannot take as ruamel would:
        a plain scalar that looks like a date stays the text written (YAML 1.2's core schema
        has no timestamps; ruamel's would rewrite "2024-01-02 03:04:05" in ISO form), and an
        integer past Python's limit becomes a :class:`_LongInteger` that ``_plain`` locates
        (int() would raise ValueError)."""

        def construct_verbatim(self, node: Any) -> Any:
            return self.construct_scalar(node)

        def construct_bounded_int(self, node: Any) -> Any:
            digits = decimal_digits(node.value)
            if digits is not None and digits > MAX_INT_DIGITS:
                return _LongInteger(digits, node.start_mark.line, node.start_mark.column)
            return self.construct_yaml_int(node)

    SpecConstructor.add_constructor(
        "tag:yaml.org,2002:timestamp", SpecConstructor.construct_verbatim
    )
    SpecConstructor.add_constructor("tag:yaml.org,2002:int", SpecConstructor.construct_bounded_int)
    return SpecConstructor


@attrs.frozen(eq=False)
class _LongInteger:
    """An integer literal too long to convert: its digits and 0-based position."""

    digits: int
    line: int
    column: int


class _TooDeep(Exception):
    def __init__(self, line: int | None, column: int | None) -> None:
        super().__init__()
        self.line, self.column = line, column


def _flow_too_deep(text: str) -> _TooDeep | None:
    """Where ``[``/``{`` nest deeper than :data:`MAX_DEPTH` (ruamel scans such a line ahead
    in quadratic time, before its composer sees the depth). Quotes are not parsed: only a
    spec with over 64 brackets is scanned at all."""
    if text.count("[") + text.count("{") <= MAX_DEPTH:
        return None
    depth = 0
    for match in _FLOW.finditer(text):
        depth += 1 if match.group() in "[{" else -1
        if depth > MAX_DEPTH:
            line = text.count("\n", 0, match.start()) + 1
            return _TooDeep(line, match.start() - text.rfind("\n", 0, match.start()))
    return None


def parse(text: str, path: str) -> LoadedDocument:
    deep = _flow_too_deep(text)
    if deep is not None:
        raise _too_deep(path, deep)
    fast = read_fast(text)
    if fast is not None:
        data, values, keys = fast
        return LoadedDocument(path=path, data=data, values=values, keys=keys)
    return parse_thorough(text, path)


def parse_thorough(text: str, path: str) -> LoadedDocument:
    """ruamel.yaml's YAML 1.2 reading, with a located diagnostic for anything it refuses."""
    if not _YAML_ONLY_BREAK.search(text):
        return _read_ruamel(text, path)
    to_text = _NewlinePositions(text)
    try:
        doc = _read_ruamel(text, path)
    except SpecError as exc:
        raise SpecError(
            attrs.evolve(d, location=to_text.location(d.location)) for d in exc.diagnostics
        ) from None
    return attrs.evolve(doc, values=to_text.each(doc.values), keys=to_text.each(doc.keys))


#: a line break to YAML (lone CR, NEL, LS, PS) that is none to mdc's positions, which count
#: "\n" as the JSON and TOML loaders and editors' "line:column" jumps do
_YAML_ONLY_BREAK = re.compile("\r(?!\n)|[\x85\u2028\u2029]")
_YAML_BREAK = re.compile("\r\n|[\r\n\x85\u2028\u2029]")


class _NewlinePositions:
    """YAML's 1-based (line, column), where every YAML break starts a line, as mdc's."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.starts = [0, *(m.end() for m in _YAML_BREAK.finditer(text))]

    def __call__(self, line: int, column: int) -> Position:
        index = min(self.starts[min(line, len(self.starts)) - 1] + column - 1, len(self.text))
        return self.text.count("\n", 0, index) + 1, index - self.text.rfind("\n", 0, index)

    def each(self, positions: Mapping[str, Position]) -> dict[str, Position]:
        return {pointer: self(*at) for pointer, at in positions.items()}

    def location(self, where: SourceLocation) -> SourceLocation:
        if where.line is None or where.column is None:
            return where
        line, column = self(where.line, where.column)
        return attrs.evolve(where, line=line, column=column)


def _read_ruamel(text: str, path: str) -> LoadedDocument:
    from ruamel.yaml import YAML
    from ruamel.yaml.constructor import DuplicateKeyError
    from ruamel.yaml.error import MarkedYAMLError, YAMLError

    yaml = YAML(typ="rt", pure=True)
    yaml.version = (1, 2)
    yaml.Composer = _bounded_composer()
    yaml.Constructor = _spec_constructor()
    try:
        with warnings.catch_warnings():
            # ruamel warns (to stderr) about legal YAML such as a reused anchor name
            warnings.simplefilter("ignore")
            docs = list(yaml.load_all(text))
    except _TooDeep as exc:
        raise _too_deep(path, exc) from None
    except DuplicateKeyError as exc:
        # ruamel marks the second key; its context mark is the mapping, not the first key.
        mark = exc.problem_mark
        raise duplicate_key(
            path, _duplicate_name(exc), "", mark.line + 1, mark.column + 1
        ) from None
    except MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        message = exc.problem or exc.context or "invalid YAML"
        context = exc.context_mark
        if exc.context and context is not None and context is not mark:
            message += f" ({exc.context} at line {context.line + 1}, column {context.column + 1})"
        line, col = (mark.line + 1, mark.column + 1) if mark is not None else (None, None)
        hint = indentation_hint(exc.problem or "")
        raise syntax_error(path, f"YAML: {message}", line, col, hint=hint) from None
    except (YAMLError, RecursionError) as exc:
        raise syntax_error(path, f"YAML: {exc}", None, None) from None
    except Exception as exc:  # noqa: BLE001 - ruamel's own bugs on some malformed nodes
        raise syntax_error(
            path,
            f"YAML: the parser cannot read this document ({type(exc).__name__}: {exc})",
            None,
            None,
            hint="check tags (!!...) and anchors near the end of the file",
        ) from None
    if len(docs) > 1:
        raise syntax_error(
            path,
            f"expected one YAML document, found {len(docs)}",
            None,
            None,
            hint="put one job in each file",
        )
    root = docs[0] if docs else None
    values: dict[str, Position] = {"": (1, 1)}
    keys: dict[str, Position] = {}
    data = _plain(root, "", 0, values, keys, path)
    return LoadedDocument(path=path, data=data, values=values, keys=keys)


def _plain(
    node: Any,
    here: str,
    depth: int,
    values: dict[str, Position],
    keys: dict[str, Position],
    path: str,
) -> object:
    """Convert ruamel's round-trip nodes to plain built-ins, recording positions.

    ``here`` is the node's JSON pointer, ``depth`` its nesting level.
    """
    from ruamel.yaml.comments import CommentedMap, CommentedSeq, TaggedScalar

    tag = getattr(getattr(node, "tag", None), "value", None)
    special = isinstance(node, (CommentedMap, CommentedSeq)) and type(node) not in (
        CommentedMap,
        CommentedSeq,
    )  # !!omap, !!set, ...
    if tag is not None or special or isinstance(node, TaggedScalar):
        raise syntax_error(
            path,
            f"YAML tag {tag or '(custom)'} is not allowed in a spec",
            *_position(values, here),
            pointer=here,
            hint="write the plain value without a tag",
        )
    if depth > MAX_DEPTH:
        raise syntax_error(
            path, f"nesting deeper than {MAX_DEPTH} levels", None, None, pointer=here
        )
    if len(values) > MAX_VALUES:
        raise syntax_error(
            path,
            f"the document expands to more than {MAX_VALUES:,} values",
            *_position(values, here),
            code="MDC004",
            pointer=here,
            hint="YAML aliases (*name) repeat whole subtrees; write the values "
            "out, or use fewer aliases",
        )
    if isinstance(node, _LongInteger):
        raise long_integer(path, node.digits, node.line + 1, node.column + 1, here)
    if isinstance(node, CommentedMap):
        out: dict[str, object] = {}
        for key, value in node.items():
            if key is None or isinstance(key, _LongInteger):
                raise _unfit_key(path, node, key, here)
            try:
                name = key if isinstance(key, str) else _scalar(key)
            except TypeError:  # a mapping or list used as a key ("? {a: 1}")
                raise syntax_error(
                    path,
                    "YAML keys must be plain values, not tables or lists",
                    *_position(values, here),
                    pointer=here,
                ) from None
            if isinstance(name, int) and unfit(name):  # a key 0x... that str() cannot print
                raise _unfit_key(path, node, key, here)
            name = _paired(name if isinstance(name, str) else str(name), path, values, here)
            child = f"{here}/{escape_pointer_token(name)}"
            kline, kcol, vline, vcol = _member_position(node, key)
            keys[child] = (kline + 1, kcol + 1)
            values[child] = (vline + 1, vcol + 1)
            out[name] = _plain(value, child, depth + 1, values, keys, path)
        return out
    if isinstance(node, CommentedSeq):
        items: list[object] = []
        for index, value in enumerate(node):
            child = f"{here}/{index}"
            line, col = node.lc.data[index]
            values[child] = (line + 1, col + 1)
            items.append(_plain(value, child, depth + 1, values, keys, path))
        return items
    try:
        value = _scalar(node)
    except TypeError as exc:
        raise syntax_error(
            path,
            f"YAML value of type {exc} is not allowed in a spec",
            *_position(values, here),
            pointer=here,
        ) from None
    return _paired(value, path, values, here) if isinstance(value, str) else value


def _unfit_key(path: str, node: Any, key: Any, here: str) -> SpecError:
    """A null key (``~:``, ``null:``, ``? :``), or an integer too long to print, located."""
    line, column = _member_position(node, key)[:2]
    if key is not None:
        digits = key.digits if isinstance(key, _LongInteger) else None
        return long_integer(path, digits, line + 1, column + 1, here)
    return syntax_error(
        path,
        "a key that is null (~, null, or nothing before the ':'): every key is a name",
        line + 1,
        column + 1,
        code="MDC021",
        hint='write the key\'s name, or quote it ("null") if that is the name',
        pointer=here,
    )


def _paired(text: str, path: str, values: dict[str, Position], here: str) -> str:
    """``text`` with escaped surrogate pairs (``"\\ud83d\\ude00"``, as JSON writes a
    character beyond the BMP) joined into their character, as a JSON reader would; an
    unpaired one is an error, since no file or terminal could encode it later."""
    if not SURROGATE.search(text):
        return text
    try:
        return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le")
    except UnicodeDecodeError:
        raise syntax_error(
            path,
            "string contains an unpaired surrogate escape",
            *_position(values, here),
            pointer=here,
            hint="escape a character beyond U+FFFF as a pair, or write it as it is",
        ) from None


def _member_position(node: Any, key: Any) -> tuple[int, int, int, int]:
    """ruamel's 0-based (key line, key column, value line, value column) of a member. A member
    merged in with ``<<: *anchor`` is found in the mapping it came from."""
    own = node.lc.data or {}  # None for a mapping of merges only
    if key in own:
        return own[key]  # type: ignore[no-any-return]
    for merged in getattr(node, "merge", ()):
        if isinstance(merged, tuple):  # (index, mapping) in older ruamel releases
            merged = merged[1]
        try:
            return _member_position(merged, key)
        except KeyError:
            continue
    raise KeyError(key)


def _too_deep(path: str, where: _TooDeep) -> SpecError:
    return syntax_error(
        path,
        f"nesting deeper than {MAX_DEPTH} levels",
        where.line,
        where.column,
        hint="a job spec nests a few levels; check the brackets",
    )


def _position(values: dict[str, Position], pointer: str) -> Position | tuple[None, None]:
    return values.get(pointer, (None, None))


def _scalar(value: Any) -> object:
    # ruamel's ScalarInt/ScalarFloat/ScalarString subclass the built-ins.
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, (datetime.date, datetime.datetime)):
        return value.isoformat()
    # Anything else (binary, sets, custom objects) has no place in a spec.
    raise TypeError(type(value).__name__)


def _duplicate_name(exc: DuplicateKeyError) -> str:
    # ruamel says: found duplicate key "name" with value ... (original value: ...)
    problem = exc.problem or ""
    start = problem.find('"')
    end = problem.find('"', start + 1)
    return problem[start + 1 : end] if 0 <= start < end else "?"


# The fast path. libyaml reads YAML 1.1, ruamel here YAML 1.2; on these they differ (found
# by tests/unit/test_yaml_fast_path.py), so text holding one goes to the thorough path.
_DISAGREE = re.compile(
    r"""
    [\t\x85\u2028\u2029\ufeff]  # tabs (ruamel refuses some); 1.1's extra line breaks; a BOM
  | \\/                         # the escape "\/" (1.2 only)
  | ^%                          # a %YAML or %TAG directive
  | ^\.\.\.                     # a document end ("...\n..." ruamel refuses)
  | \?(?:\s|$)                  # "? key": where an absent value is placed
  | [|>][-+0-9]*\x20*(?:        # a block scalar's header followed by
        \#                      #   a comment with no space before it,
      | (?:\#.*)?(?:\r\n?|\n)\x20+(?:\r\n?|\n))  # or a line of spaces (ruamel: error)
""",
    re.MULTILINE | re.VERBOSE,
)
_INT = re.compile(r"-?(?:0|[1-9][0-9]*)")
_FLOAT = re.compile(r"-?(?:0|[1-9][0-9]*)\.[0-9]+(?:[eE][-+]?[0-9]+)?")
#: looser than every YAML 1.2 int and float form ruamel resolves (and its timestamps)
_NUMBER_LIKE = re.compile(r"[-+]?(?:[0-9_.]+(?:[eE][-+]?[0-9]+)?|0[box][0-9a-fA-F_]+|\.[a-zA-Z]+)")
_TIMESTAMP_LIKE = re.compile(r"[0-9]{4}-")
#: the YAML 1.2 core schema's words; "yes", "on", "tRue", ... are strings
_WORDS: dict[str, object] = {
    "~": None,
    "null": None,
    "Null": None,
    "NULL": None,
    "true": True,
    "True": True,
    "TRUE": True,
    "false": False,
    "False": False,
    "FALSE": False,
}


class _Declined(Exception):
    """The fast path cannot vouch that ruamel reads this document the same way."""


def read_fast(text: str) -> tuple[object, dict[str, Position], dict[str, Position]] | None:
    """``(data, values, keys)`` as :func:`parse_thorough` gives them, composed from
    libyaml's events; None where ruamel might read the text otherwise, or refuse it."""
    read = _read_libyaml(text)
    if read is None or not _YAML_ONLY_BREAK.search(text):
        return read
    to_text = _NewlinePositions(text)
    return read[0], to_text.each(read[1]), to_text.each(read[2])


def _read_libyaml(text: str) -> tuple[object, dict[str, Position], dict[str, Position]] | None:
    if CParser is None or _DISAGREE.search(text):
        return None
    values: dict[str, Position] = {"": (1, 1)}
    keys: dict[str, Position] = {}
    try:
        events = CParser(text)
        events.get_event()  # the stream's start
        start = events.get_event()
        if (
            type(start) is not DocumentStartEvent
            or start.version
            or start.tags
            or type(events.peek_event()) is not MappingStartEvent
        ):
            return None  # no document, a directive, or not a table (e.g. a root block scalar
            # whose "#..." lines at column 0 ruamel reads as text, libyaml as comments)
        data = _fast_node(events, "", 0, values, keys)
        events.get_event()  # the document's end
        if type(events.get_event()) is not StreamEndEvent:
            return None  # a second document
    except (_Declined, LibyamlError, UnicodeError):  # UnicodeError: a lone surrogate
        return None
    return data, values, keys


def _fast_node(
    events: Any, here: str, depth: int, values: dict[str, Position], keys: dict[str, Position]
) -> object:
    """Compose the node whose events come next (its position is already recorded)."""
    event = events.get_event()
    kind = type(event)
    if (
        kind is AliasEvent
        or event.anchor is not None
        or event.tag is not None
        or depth > MAX_DEPTH
        or len(values) > MAX_VALUES
    ):
        raise _Declined
    if kind is ScalarEvent:
        return event.value if event.style else _plain_scalar(event.value)
    if kind is SequenceStartEvent:
        items: list[object] = []
        while type(item := events.peek_event()) is not SequenceEndEvent:
            child = f"{here}/{len(items)}"
            values[child] = (item.start_mark.line + 1, item.start_mark.column + 1)
            items.append(_fast_node(events, child, depth + 1, values, keys))
        events.get_event()
        return items
    table: dict[str, object] = {}
    seen: set[object] = set()  # keys as ruamel compares them: 1 == 1.0 == True
    while type(key := events.get_event()) is not MappingEndEvent:
        if type(key) is not ScalarEvent or key.anchor is not None or key.tag is not None:
            raise _Declined
        resolved = key.value if key.style else _plain_scalar(key.value)
        if resolved is None:
            raise _Declined  # a null key: the thorough path's diagnostic
        name = resolved if isinstance(resolved, str) else str(resolved)
        if resolved in seen or name in table or name == "<<":
            raise _Declined  # a duplicate (ruamel's diagnostic) or a merge
        seen.add(resolved)
        child = f"{here}/{escape_pointer_token(name)}"
        value = events.peek_event()
        key_mark, value_mark = key.start_mark, value.start_mark
        assert key_mark is not None and value_mark is not None  # libyaml marks every event
        keys[child] = (key_mark.line + 1, key_mark.column + 1)
        values[child] = (value_mark.line + 1, value_mark.column + 1)
        table[name] = _fast_node(events, child, depth + 1, values, keys)
    return table


def _plain_scalar(text: str) -> object:
    """A plain scalar's value where YAML 1.2 resolves it beyond doubt, else decline.

    ruamel tries its number and timestamp resolvers only on text starting with one of
    "-+.0123456789"; what cannot match them ("64Gi", "1F1B", "--flag") is a string."""
    if not text:  # "key:" with no value: ruamel places it by the comments and spaces after
        raise _Declined
    if text in _WORDS:
        return _WORDS[text]
    if _INT.fullmatch(text):
        if len(text) > MAX_INT_DIGITS:  # the thorough path's diagnostic
            raise _Declined
        return int(text)
    if _FLOAT.fullmatch(text):
        return float(text)
    if (
        text in ("<<", "=")
        or text[0] in "-+.0123456789"
        and (_NUMBER_LIKE.fullmatch(text) or _TIMESTAMP_LIKE.match(text))
    ):
        raise _Declined  # merge, value, octal, hex, "1_000", "1e3", ".inf", dates, ...
    return text


def indentation_hint(problem: str) -> str | None:
    """A hint for the parser's complaints that mean a line is indented wrongly."""
    if "character '\\t'" in problem or "\t" in problem:  # ruamel shows a tab as \t
        return "YAML indents with spaces only: replace the tab with spaces"
    if problem == "mapping values are not allowed here":
        return (
            "this key is indented deeper than the key above it, which YAML reads as part of "
            "that key's value: give every key of a table the same indentation (or quote a "
            "value that holds ': ')"
        )
    if problem.startswith("expected <block end>") or "did not find expected key" in problem:
        return (
            "a line here is indented differently from the keys of its table: every key of "
            "a table takes the same number of spaces, and a nested table more"
        )
    return None
