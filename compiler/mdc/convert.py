"""Structuring plain data into the spec model with one cattrs converter.

Runs only after the schema passed, so a failure here is mdc's bug (schema and
model out of step), reported as an :class:`InternalError`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import types
import typing

import cattrs
from cattrs.v import transform_error

from mdc.errors import InternalError
from mdc.spec import CORE_TABLES, JobSpec


def make_converter() -> cattrs.Converter:
    converter = cattrs.Converter(forbid_extra_keys=True)
    # A command is one string or a list of strings; keep whichever was written.
    converter.register_structure_hook(
        str | tuple[str, ...],
        lambda value, _: value if isinstance(value, str) else tuple(value),
    )
    # Unions of scalars (e.g. str | int | bool): the schema already checked the type.
    converter.register_structure_hook_func(_is_scalar_union, lambda value, _: value)
    return converter


SCALARS = (str, int, float, bool, type(None))


def _is_scalar_union(tp: Any) -> bool:
    origin = typing.get_origin(tp)
    return origin in (types.UnionType, typing.Union) and all(
        arg in SCALARS for arg in typing.get_args(tp)) and tp != (str | None)


#: The top-level key editors read a spec's schema from; not part of the job.
EDITOR_SCHEMA_KEY = "$schema"


def structure_spec(data: Mapping[str, Any], plugin_types: Mapping[str, type | None],
                   converter: cattrs.Converter | None = None) -> JobSpec:
    """Build the :class:`JobSpec`; ``plugin_types`` maps plugin table names to options types."""
    converter = converter or make_converter()
    try:
        core: dict[str, Any] = {name: converter.structure(data[name], cls)
                for name, cls in CORE_TABLES.items() if name in data}
        tables: dict[str, object] = {}
        for name in sorted(data):
            if name in CORE_TABLES or name == EDITOR_SCHEMA_KEY:
                continue
            options_type = plugin_types[name]
            tables[name] = data[name] if options_type is None else converter.structure(
                data[name], options_type)
        return JobSpec(**core, plugin_tables=tables)
    except Exception as exc:
        details = "; ".join(transform_error(exc)) if isinstance(exc, cattrs.BaseValidationError) \
            else repr(exc)
        raise InternalError(f"the spec passed the schema but does not fit the model: {details}") \
            from exc
