"""Structuring plain data into the spec model and the plugins' options types.

Runs only after the schema passed, so a failure here is mdc's bug (schema and
model out of step), reported as an :class:`InternalError`.

The types the model and options classes use (attrs classes, scalars, unions of
scalars, optionals, tuples, lists, mappings, literals, enums) are structured by
small functions built once per type; :func:`cattrs_converter` structures any
other type, the same way. cattrs generates and compiles a function per class in
every process: with it structuring every table (bench/run.py, "hand-written pieces
against their libraries", CPU time of the whole process), validate of
examples/quickstart.toml took 134 instead of 115 ms (these functions save 14 %),
of the bench's 100 specs 449 instead of 328 ms (27 %), compile of its 2x8 torchrun
spec 145 instead of 125 ms (13 %). tests/unit/test_convert.py holds them to cattrs.
"""

from __future__ import annotations

import enum
import functools
import inspect
import types
import typing
from collections import abc
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from mdc.errors import InternalError
from mdc.spec import CORE_TABLES, EnvValue, JobSpec

#: The top-level key editors read a spec's schema from; not part of the job.
EDITOR_SCHEMA_KEY = "$schema"

SCALARS = (str, int, float, bool, type(None))

Structurer = Callable[[Any], Any]
#: the collection types a field may have, and the built-in that holds it
_COLLECTIONS: dict[Any, type] = {
    list: list,
    tuple: tuple,
    set: set,
    frozenset: frozenset,
    abc.Sequence: tuple,
    abc.MutableSequence: list,
    abc.Set: frozenset,
    abc.MutableSet: set,
}


class Misfit(ValueError):
    """The data does not fit the type (the schema let through what the model refuses)."""


def structure_spec(data: Mapping[str, Any], plugin_types: Mapping[str, type | None]) -> JobSpec:
    """Build the :class:`JobSpec`; ``plugin_types`` maps plugin table names to options types."""
    try:
        core: dict[str, Any] = {
            name: structure(data[name], cls) for name, cls in CORE_TABLES.items() if name in data
        }
        tables: dict[str, object] = {}
        for name in sorted(data):
            if name in CORE_TABLES or name == EDITOR_SCHEMA_KEY:
                continue
            options_type = plugin_types[name]
            tables[name] = (
                data[name] if options_type is None else structure(data[name], options_type)
            )
        return JobSpec(**core, plugin_tables=tables)
    except Exception as exc:
        raise InternalError(
            f"the spec passed the schema but does not fit the model: {exc!r}"
        ) from exc


def structure(value: Any, tp: Any) -> Any:
    """``value`` (plain data) as an instance of ``tp``."""
    return structurer(tp)(value)


def _same(value: Any) -> Any:
    return value


def _command(value: Any) -> Any:
    return value if isinstance(value, str) else tuple(value)


@functools.cache
def structurer(tp: Any) -> Structurer:
    """The function that structures values into ``tp``, built once per type."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Annotated:  # its metadata says nothing about the value's structure
        return structurer(args[0])
    if tp is Any or tp is object or tp in (type(None), None) or origin is typing.Literal:
        return _same
    if tp in (str, int, float, bool):
        return tp  # type: ignore[no-any-return]
    if tp == str | tuple[str, ...]:  # a command: one string or its words, as written
        return _command
    if origin in (types.UnionType, typing.Union):
        return _union(tp, args)
    if attrs.has(tp):
        return _attrs_class(tp)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return tp
    if origin is tuple and args and args[-1] is not Ellipsis:  # tuple[int, str]: by position
        positions = [structurer(a) for a in args]
        return lambda value: tuple(f(v) for f, v in zip(positions, value, strict=True))
    collection = origin or tp
    if collection in _COLLECTIONS:
        kind = _COLLECTIONS[collection]
        item = structurer(args[0]) if args else _same
        return lambda value: kind(item(v) for v in value)
    if collection in (dict, abc.Mapping, abc.MutableMapping):
        key, val = (structurer(args[0]), structurer(args[1])) if args else (_same, _same)
        return lambda value: {key(k): val(v) for k, v in value.items()}
    return _by_cattrs(tp)


def _union(tp: Any, args: tuple[Any, ...]) -> Structurer:
    literal = all(a in SCALARS or typing.get_origin(a) is typing.Literal for a in args)
    if literal:  # str | int | bool, Literal[...] | None: the schema checked the type
        return _same
    members = [a for a in args if a is not type(None)]
    if len(members) == 1:  # an optional
        inner = structurer(members[0])
        return lambda value: None if value is None else inner(value)
    classes = [a for a in members if attrs.has(a)]
    if len(classes) == 1 and all(a in SCALARS for a in members if a is not classes[0]):
        # a scalar or a table (as a [job] env value): the schema checked which
        table = structurer(classes[0])
        return lambda value: table(value) if isinstance(value, dict) else value
    arrays = [a for a in members if typing.get_origin(a) in (tuple, list)]
    if len(arrays) == 1 and all(a in SCALARS for a in members if a is not arrays[0]):
        # a number or a list of them (as [model] moe_layer_freq): the schema checked which
        array = structurer(arrays[0])
        return lambda value: array(value) if isinstance(value, list | tuple) else value
    return _by_cattrs(tp)


def _attrs_class(cls: type) -> Structurer:
    fields: list[tuple[str, str, Structurer]] = []  # filled on first use: classes may recurse
    names: set[str] = set()

    def build(value: Any) -> Any:
        if not fields:
            hints = _field_types(cls)
            fields.extend(
                (f.name, f.alias or f.name, structurer(hints[f.name]))
                for f in attrs.fields(cls)
                if f.init
            )
            names.update(name for name, _, _ in fields)
        if not isinstance(value, Mapping):
            raise Misfit(f"{cls.__name__} needs a table, not {type(value).__name__}")
        extra = value.keys() - names
        if extra:
            raise Misfit(f"{cls.__name__} has no field {min(extra)!r}")
        kwargs = {}
        for name, alias, field_structurer in fields:
            if name in value:
                try:
                    kwargs[alias] = field_structurer(value[name])
                except Exception as exc:
                    raise Misfit(f"{cls.__name__}.{name}: {exc}") from exc
        return cls(**kwargs)

    return build


def _field_types(cls: type) -> dict[str, Any]:
    """The evaluated annotations of ``cls`` and its bases (a subclass's win).

    What ``typing.get_type_hints`` gives for these classes, for less: it also wraps each
    annotation in a ForwardRef and checks it again, about 1% of validating the examples.
    """
    hints: dict[str, Any] = {}
    for base in reversed(cls.__mro__):
        hints.update(inspect.get_annotations(base, eval_str=True))
    return hints


def _by_cattrs(tp: Any) -> Structurer:
    converter = cattrs_converter()
    return lambda value: converter.structure(value, tp)


@functools.cache
def cattrs_converter() -> Any:
    """A cattrs converter that structures every type as :func:`structurer` does: extra keys
    refused, a command kept as written (one string or a tuple of words), a union of scalars
    and a scalar-or-table (``[job]`` env values) or number-or-list (``moe_layer_freq``) value
    as the schema let it through."""
    import cattrs

    converter = cattrs.Converter(forbid_extra_keys=True)
    converter.register_structure_hook(str | tuple[str, ...], lambda value, _: _command(value))
    converter.register_structure_hook_func(
        lambda tp: (
            typing.get_origin(tp) in (types.UnionType, typing.Union)  # type: ignore[comparison-overlap]
            and tp != (str | None)
            and all(a in SCALARS for a in typing.get_args(tp))
        ),
        lambda value, _: value,
    )
    converter.register_structure_hook(
        int | tuple[int, ...] | None,
        lambda value, _: tuple(value) if isinstance(value, list) else value,
    )
    converter.register_structure_hook(
        str | EnvValue,
        lambda value, _: converter.structure(value, EnvValue) if isinstance(value, dict) else value,
    )
    return converter
