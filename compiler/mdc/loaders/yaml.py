"""YAML 1.2 loader (ruamel.yaml round-trip), keeping every node's position."""

from __future__ import annotations

import datetime
import re
import warnings
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq, TaggedScalar
from ruamel.yaml.composer import Composer
from ruamel.yaml.constructor import DuplicateKeyError
from ruamel.yaml.error import MarkedYAMLError, YAMLError

from mdc.errors import SpecError, escape_pointer_token
from mdc.loaders import LoadedDocument, Position, duplicate_key, syntax_error

#: Nesting deeper than this is not a job spec; refuse before Python's recursion limit.
MAX_DEPTH = 64
#: A spec has hundreds of values; more means aliases multiplying a document (a "billion
#: laughs"), which would otherwise take minutes and gigabytes to expand.
MAX_VALUES = 20_000

_FLOW = re.compile(r"[\[\]{}]")


class _BoundedComposer(Composer):
    """Stops composing far below Python's recursion limit (``_plain`` then applies the exact
    :data:`MAX_DEPTH`; ruamel calls ``compose_node`` more than once per level)."""

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
    yaml = YAML(typ="rt", pure=True)
    yaml.version = (1, 2)
    yaml.Composer = _BoundedComposer
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
        raise duplicate_key(path, _duplicate_name(exc), "", mark.line + 1, mark.column + 1) \
            from None
    except MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        message = exc.problem or exc.context or "invalid YAML"
        context = exc.context_mark
        if exc.context and context is not None and context is not mark:
            message += f" ({exc.context} at line {context.line + 1}, column {context.column + 1})"
        line, col = (mark.line + 1, mark.column + 1) if mark is not None else (None, None)
        raise syntax_error(path, f"YAML: {message}", line, col) from None
    except (YAMLError, RecursionError) as exc:
        raise syntax_error(path, f"YAML: {exc}", None, None) from None
    except Exception as exc:  # ruamel fails on some malformed nodes with its own bugs
        raise syntax_error(path, f"YAML: the parser cannot read this document "
                           f"({type(exc).__name__}: {exc})", None, None,
                           hint="check tags (!!...) and anchors near the end of the file") \
            from None
    if len(docs) > 1:
        raise syntax_error(path, f"expected one YAML document, found {len(docs)}", None, None,
                           hint="put one job in each file")
    root = docs[0] if docs else None
    values: dict[str, Position] = {"": (1, 1)}
    keys: dict[str, Position] = {}
    data = _plain(root, "", 0, values, keys, path)
    return LoadedDocument(path=path, data=data, values=values, keys=keys)


def _plain(node: Any, here: str, depth: int, values: dict[str, Position],
           keys: dict[str, Position], path: str) -> object:
    """Convert ruamel's round-trip nodes to plain built-ins, recording positions.

    ``here`` is the node's JSON pointer, ``depth`` its nesting level.
    """
    tag = getattr(getattr(node, "tag", None), "value", None)
    special = isinstance(node, (CommentedMap, CommentedSeq)) and \
        type(node) not in (CommentedMap, CommentedSeq)  # !!omap, !!set, ...
    if tag is not None or special or isinstance(node, TaggedScalar):
        raise syntax_error(path, f"YAML tag {tag or '(custom)'} is not allowed in a spec",
                           *_position(values, here), pointer=here,
                           hint="write the plain value without a tag")
    if depth > MAX_DEPTH:
        raise syntax_error(path, f"nesting deeper than {MAX_DEPTH} levels", None, None,
                           pointer=here)
    if len(values) > MAX_VALUES:
        raise syntax_error(path, f"the document expands to more than {MAX_VALUES:,} values",
                           *_position(values, here), code="MDC004", pointer=here,
                           hint="YAML aliases (*name) repeat whole subtrees; write the values "
                                "out, or use fewer aliases")
    if isinstance(node, CommentedMap):
        out: dict[str, object] = {}
        for key, value in node.items():
            try:
                name = key if isinstance(key, str) else _scalar(key)
            except TypeError:  # a mapping or list used as a key ("? {a: 1}")
                raise syntax_error(path, "YAML keys must be plain values, not tables or lists",
                                   *_position(values, here), pointer=here) \
                    from None
            if not isinstance(name, str):
                name = str(name)
            child = f"{here}/{escape_pointer_token(name)}"
            kline, kcol, vline, vcol = node.lc.data[key]
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
        return _scalar(node)
    except TypeError as exc:
        raise syntax_error(path, f"YAML value of type {exc} is not allowed in a spec",
                           *_position(values, here), pointer=here) from None


def _too_deep(path: str, where: _TooDeep) -> SpecError:
    return syntax_error(path, f"nesting deeper than {MAX_DEPTH} levels", where.line,
                        where.column, hint="a job spec nests a few levels; check the brackets")


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
