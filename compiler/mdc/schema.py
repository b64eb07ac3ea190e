"""The composed JSON Schema and validation into located diagnostics.

The core schema (``mdc_schemas/job.v1.schema.json``) gains one property per
plugin table and the registered launcher and backend names as enums. Every
error is reported, each with the user's own keys, its JSON pointer, its
position and a hint.
"""

from __future__ import annotations

import copy
import difflib
import json
from collections.abc import Iterable, Iterator, Mapping
from importlib import resources
from typing import Any

from jsonschema import Draft202012Validator, validators
from jsonschema.exceptions import ValidationError

from mdc.errors import Diagnostic, Severity, join_pointer
from mdc.loaders import LoadedDocument

CORE_SCHEMA = "job.v1.schema.json"

#: jsonschema validator keyword -> diagnostic code
CODES = {
    "additionalProperties": "MDC101", "type": "MDC102", "required": "MDC103",
    "enum": "MDC104", "const": "MDC104",
    "minimum": "MDC105", "maximum": "MDC105", "exclusiveMinimum": "MDC105",
    "exclusiveMaximum": "MDC105", "minItems": "MDC105",
    "pattern": "MDC106", "minLength": "MDC106", "maxLength": "MDC106", "propertyNames": "MDC106",
}

TYPE_NAMES = {"object": "a table", "array": "a list", "string": "a string",
              "integer": "an integer", "number": "a number", "boolean": "true or false",
              "null": "null"}


def core_schema() -> dict[str, Any]:
    text = resources.files("mdc_schemas").joinpath(CORE_SCHEMA).read_text(encoding="utf-8")
    loaded: dict[str, Any] = json.loads(text)
    return loaded


def compose(tables: Mapping[str, Mapping[str, Any] | None], launchers: Iterable[str],
            backends: Iterable[str]) -> dict[str, Any]:
    """The core schema plus each plugin's table fragment, with the plugin names as enums."""
    schema = core_schema()
    dist = schema["properties"]["distributed"]["properties"]
    dist["launcher"]["enum"] = sorted(launchers)
    dist["backend"]["enum"] = sorted(backends)
    for name in sorted(tables):
        fragment = tables[name]
        if fragment is not None:
            table = {k: v for k, v in copy.deepcopy(dict(fragment)).items()
                     if k not in ("$schema", "$id")}
            schema["properties"][name] = table
    return schema


def _python_type(value: object) -> str:
    if isinstance(value, bool):
        return "boolean"
    return {dict: "table", list: "list", str: "string", int: "integer", float: "number",
            type(None): "null"}.get(type(value), type(value).__name__)


def _table_name(path: Iterable[str | int]) -> str:
    parts = [str(p) for p in path]
    return f"in [{'.'.join(parts)}]" if parts else "at the top level"


def _is_integer(checker: object, instance: object) -> bool:
    # JSON Schema counts 4.0 as an integer; a count of nodes written 4.0 is a mistake.
    return isinstance(instance, int) and not isinstance(instance, bool)


#: Draft 2020-12, except that only true integers are integers.
Validator = validators.extend(
    Draft202012Validator,
    type_checker=Draft202012Validator.TYPE_CHECKER.redefine("integer", _is_integer))


class SchemaChecker:
    """Validates documents against one composed schema (built once, reused per file)."""

    def __init__(self, schema: Mapping[str, Any]) -> None:
        self.schema = schema
        self.validator = Validator(schema)

    def check(self, doc: LoadedDocument) -> list[Diagnostic]:
        found: list[Diagnostic] = []
        for error in self.validator.iter_errors(doc.data):
            found.extend(self._diagnose(error, doc))
        return found

    def _diagnose(self, error: ValidationError, doc: LoadedDocument) -> Iterator[Diagnostic]:
        path = list(error.absolute_path)
        pointer = join_pointer(path)
        keyword = str(error.validator)
        schema = error.schema if isinstance(error.schema, dict) else {}

        def diag(message: str, hint: str | None = None, at: str = pointer,
                 key: bool = False) -> Diagnostic:
            return Diagnostic(severity=Severity.ERROR, code=CODES.get(keyword, "MDC100"),
                              message=message, hint=hint, location=doc.locate(at, key=key))

        if keyword == "additionalProperties" and isinstance(error.instance, dict):
            allowed = sorted(schema.get("properties", {}))
            for extra in sorted(k for k in error.instance if k not in allowed):
                near = difflib.get_close_matches(extra, allowed, n=1, cutoff=0.6)
                hint = f"did you mean {near[0]!r}?" if near else (
                    f"allowed keys: {', '.join(allowed)}" if allowed else None)
                yield diag(f"unknown key {extra!r} {_table_name(path)}", hint,
                           join_pointer([*path, extra]), key=True)
        elif keyword == "required":
            missing = str(error.message).split("'")[1]
            description = schema.get("properties", {}).get(missing, {}).get("description")
            yield diag(f"missing required key {missing!r} {_table_name(path)}", description)
        elif keyword == "type":
            expected = error.validator_value
            names = [TYPE_NAMES.get(str(t), str(t)) for t in
                     (expected if isinstance(expected, list) else [expected])]
            yield diag(f"expected {' or '.join(names)}, got {_got(error.instance)}",
                       schema.get("description") if path else None)
        elif keyword in ("enum", "const"):
            choices = [str(c) for c in (error.validator_value if keyword == "enum"
                                        else [error.validator_value])]
            # A high cutoff: "gpu" must not suggest "cpu".
            near = difflib.get_close_matches(str(error.instance), choices, n=1, cutoff=0.75)
            hint = f"did you mean {near[0]!r}?" if near else None
            if not choices:  # plugin names, and every plugin of that kind blocked or absent
                yield diag(f"{_short(error.instance)} is not available: no plugin of this kind "
                           "is loaded", "see `mdc plugins`; was it blocked with -p no:NAME?")
                return
            yield diag(f"{_short(error.instance)} is not one of: {', '.join(choices)}", hint)
        elif keyword in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"):
            op = {"minimum": ">=", "exclusiveMinimum": ">", "maximum": "<=",
                  "exclusiveMaximum": "<"}[keyword]
            yield diag(f"must be {op} {error.validator_value}, got {_short(error.instance)}",
                       schema.get("description"))
        elif keyword == "oneOf":
            options = [sub.schema.get("type") for sub in error.context or []
                       if isinstance(sub.schema, dict)]
            names = [TYPE_NAMES.get(str(t), str(t)) for t in dict.fromkeys(options) if t]
            yield diag(f"expected {' or '.join(names) or 'another value'}, got "
                       f"{_got(error.instance)}", schema.get("description"))
        elif keyword == "propertyNames":
            yield diag(f"invalid name {_short(error.instance)}", "names must match "
                       f"{error.validator_value.get('pattern', 'the schema')}",
                       join_pointer([*path, str(error.instance)]), key=True)
        elif keyword == "pattern":
            yield diag(f"{_short(error.instance)} does not match {error.validator_value}",
                       schema.get("description"))
        elif keyword in ("minLength", "maxLength"):
            bound = "at least" if keyword == "minLength" else "at most"
            yield diag(f"{_short(error.instance)} must be {bound} {error.validator_value} "
                       "characters long", schema.get("description"))
        else:
            yield diag(f"{_short(error.instance)} is invalid: {keyword} "
                       f"{_short(error.validator_value)}", schema.get("description"))


def _got(value: object) -> str:
    kind = _python_type(value)
    return "nothing (null)" if value is None else f"{kind} {_short(value)}"


def _short(value: object, limit: int = 60) -> str:
    text = json.dumps(value, ensure_ascii=False) if not isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
