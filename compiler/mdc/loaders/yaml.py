"""YAML 1.2 loader (ruamel.yaml round-trip), keeping every node's position."""

from __future__ import annotations

import datetime
import warnings
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq, TaggedScalar
from ruamel.yaml.constructor import DuplicateKeyError
from ruamel.yaml.error import MarkedYAMLError, YAMLError

from mdc.errors import join_pointer
from mdc.loaders import LoadedDocument, Position, duplicate_key, syntax_error

#: Nesting deeper than this is not a job spec; refuse before Python's recursion limit.
MAX_DEPTH = 64


def parse(text: str, path: str) -> LoadedDocument:
    yaml = YAML(typ="rt", pure=True)
    yaml.version = (1, 2)
    try:
        with warnings.catch_warnings():
            # ruamel warns (to stderr) about legal YAML such as a reused anchor name
            warnings.simplefilter("ignore")
            docs = list(yaml.load_all(text))
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
    data = _plain(root, [], values, keys, path)
    return LoadedDocument(path=path, data=data, values=values, keys=keys)


def _plain(node: Any, parts: list[str | int], values: dict[str, Position],
           keys: dict[str, Position], path: str) -> object:
    """Convert ruamel's round-trip nodes to plain built-ins, recording positions."""
    tag = getattr(getattr(node, "tag", None), "value", None)
    special = isinstance(node, (CommentedMap, CommentedSeq)) and \
        type(node) not in (CommentedMap, CommentedSeq)  # !!omap, !!set, ...
    if tag is not None or special or isinstance(node, TaggedScalar):
        raise syntax_error(path, f"YAML tag {tag or '(custom)'} is not allowed in a spec",
                           *_position(values, parts), pointer=join_pointer(parts),
                           hint="write the plain value without a tag")
    if len(parts) > MAX_DEPTH:
        raise syntax_error(path, f"nesting deeper than {MAX_DEPTH} levels", None, None,
                           pointer=join_pointer(parts))
    if isinstance(node, CommentedMap):
        out: dict[str, object] = {}
        for key, value in node.items():
            try:
                name = key if isinstance(key, str) else _scalar(key)
            except TypeError:  # a mapping or list used as a key ("? {a: 1}")
                raise syntax_error(path, "YAML keys must be plain values, not tables or lists",
                                   *_position(values, parts), pointer=join_pointer(parts)) \
                    from None
            if not isinstance(name, str):
                name = str(name)
            child = [*parts, name]
            pointer = join_pointer(child)
            kline, kcol, vline, vcol = node.lc.data[key]
            keys[pointer] = (kline + 1, kcol + 1)
            values[pointer] = (vline + 1, vcol + 1)
            out[name] = _plain(value, child, values, keys, path)
        return out
    if isinstance(node, CommentedSeq):
        items: list[object] = []
        for index, value in enumerate(node):
            child = [*parts, index]
            line, col = node.lc.data[index]
            values[join_pointer(child)] = (line + 1, col + 1)
            items.append(_plain(value, child, values, keys, path))
        return items
    try:
        return _scalar(node)
    except TypeError as exc:
        raise syntax_error(path, f"YAML value of type {exc} is not allowed in a spec",
                           *_position(values, parts), pointer=join_pointer(parts)) from None


def _position(values: dict[str, Position], parts: list[str | int]) -> Position | tuple[None, None]:
    return values.get(join_pointer(parts), (None, None))


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
