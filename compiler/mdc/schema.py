"""The composed JSON Schema and validation into located diagnostics.

The core schema (``mdc_schemas/job.v1.schema.json``) gains one property per
plugin table and the registered launcher and backend names as enums. Every
error is reported, each with the user's own keys, its JSON pointer, its
position and a hint.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, cast

from mdc.errors import Diagnostic, Severity, join_pointer
from mdc.loaders import LoadedDocument
from mdc.package_data import package_text
from mdc.suggest import did_you_mean

if TYPE_CHECKING:
    from jsonschema.exceptions import ValidationError

CORE_SCHEMA = "job.v1.schema.json"

#: jsonschema validator keyword -> diagnostic code
#: the spec fields that name a plugin: pointer -> its kind (an unknown name there that is not
#: a misspelling is a plugin that is not installed, MDC107)
PLUGIN_FIELDS = {"/distributed/launcher": "launcher", "/distributed/backend": "backend"}

CODES = {
    "additionalProperties": "MDC101",
    "type": "MDC102",
    "required": "MDC103",
    "enum": "MDC104",
    "const": "MDC104",
    "minimum": "MDC105",
    "maximum": "MDC105",
    "exclusiveMinimum": "MDC105",
    "exclusiveMaximum": "MDC105",
    "minItems": "MDC105",
    "pattern": "MDC106",
    "minLength": "MDC106",
    "maxLength": "MDC106",
    "propertyNames": "MDC106",
}

TYPE_NAMES = {
    "object": "a table",
    "array": "a list",
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "true or false",
    "null": "null",
}


def core_schema() -> dict[str, Any]:
    """A fresh copy of the core schema (callers change it)."""
    loaded: dict[str, Any] = json.loads(_core_schema_text())
    return loaded


@functools.cache
def _core_schema_text() -> str:
    return package_text("mdc_schemas", CORE_SCHEMA)


@functools.cache
def _shared_core_schema() -> dict[str, Any]:
    """The core schema, read once (validate composes it again as each plugin's table arrives)."""
    return core_schema()


def compose(
    tables: Mapping[str, Mapping[str, Any] | None],
    launchers: Iterable[str],
    backends: Iterable[str],
) -> dict[str, Any]:
    """The core schema plus each plugin's table fragment, with the plugin names as enums.

    The core schema and the fragments are shared, not copied (nothing changes a schema once
    built): only the members this sets are new, in the places a copy would hold them.
    """
    core = _shared_core_schema()
    distributed = core["properties"]["distributed"]
    named = distributed["properties"]
    properties = {
        **core["properties"],
        "distributed": {
            **distributed,
            "properties": {
                **named,
                "launcher": {**named["launcher"], "enum": sorted(launchers)},
                "backend": {**named["backend"], "enum": sorted(backends)},
            },
        },
    }
    for name in sorted(tables):
        fragment = tables[name]
        if fragment is not None:
            properties[name] = {k: v for k, v in fragment.items() if k not in ("$schema", "$id")}
    return {**core, "properties": properties}


def _python_type(value: object) -> str:
    if isinstance(value, bool):
        return "boolean"
    return {
        dict: "table",
        list: "list",
        str: "string",
        int: "integer",
        float: "number",
        type(None): "null",
    }.get(type(value), type(value).__name__)


def _table_name(path: Iterable[str | int]) -> str:
    parts = [str(p) for p in path]
    return f"in [{'.'.join(parts)}]" if parts else "at the top level"


def _is_integer(checker: object, instance: object) -> bool:
    # JSON Schema counts 4.0 as an integer; a count of nodes written 4.0 is a mistake.
    return isinstance(instance, int) and not isinstance(instance, bool)


_BOUNDS = ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum")
_NUMERIC = frozenset({"integer", "number"})

#: A number key of a spec is a count, a size, seconds or a ratio, which every framework,
#: scheduler and apiserver holds in 64 bits (torch's sizes, Kubernetes' int64, SLURM's): past
#: these no consumer reads it, and mdc's own arithmetic on it overflows
SIZE_RANGE = (-(2**63), 2**63 - 1)
_OWN_BOUNDS = {
    "minimum": ("minimum", "exclusiveMinimum"),
    "maximum": ("maximum", "exclusiveMaximum"),
}


def _numeric(types: Any) -> bool:
    return bool(_NUMERIC.intersection(types if isinstance(types, list) else [types]))


def _finite(check: Callable[..., Iterator[Any]]) -> Callable[..., Iterator[Any]]:
    """A bound keyword that NaN and the infinities never meet: ``nan >= 1`` is merely false,
    so jsonschema would let NaN through every range (into ``--monitor-interval nan``). Where
    the schema types the value as a number, ``type`` says so once (:func:`_sized`)."""
    from jsonschema.exceptions import ValidationError

    def keyword(validator: Any, bound: Any, instance: Any, schema: Any) -> Iterator[Any]:
        if type(instance) is float and not math.isfinite(instance):
            if not _numeric(schema.get("type")):
                yield ValidationError(f"{instance} is not within {bound}")
            return
        yield from check(validator, bound, instance, schema)

    return keyword


def _sized(check: Callable[..., Iterator[Any]]) -> Callable[..., Iterator[Any]]:
    """The ``type`` keyword, and for a number a finite value within :data:`SIZE_RANGE` (a
    range error, MDC105; the schema's own bound on a side, where it has one, says it)."""
    from jsonschema.exceptions import ValidationError

    def keyword(validator: Any, types: Any, instance: Any, schema: Any) -> Iterator[Any]:
        found = list(check(validator, types, instance, schema))
        yield from found
        if found or not _numeric(types) or not _number(instance):
            return
        finite = instance == instance and abs(instance) != math.inf
        low = instance < SIZE_RANGE[0] or not finite and instance != math.inf
        if not (low or instance > SIZE_RANGE[1]):
            return
        name, bound = ("minimum", SIZE_RANGE[0]) if low else ("maximum", SIZE_RANGE[1])
        if finite and any(k in schema for k in _OWN_BOUNDS[name]):
            return
        yield ValidationError(
            f"{name} {bound}", validator=name, validator_value=bound, instance=instance
        )

    return keyword


@functools.cache
def validator_class() -> Any:
    """Draft 2020-12, except that only true integers are integers, and numbers are finite and
    within :data:`SIZE_RANGE` (imported when first used)."""
    from jsonschema import Draft202012Validator, validators

    checks = {k: _finite(Draft202012Validator.VALIDATORS[k]) for k in _BOUNDS}
    checks["type"] = _sized(Draft202012Validator.VALIDATORS["type"])
    return validators.extend(  # type: ignore[no-untyped-call]
        Draft202012Validator,
        validators=checks,
        type_checker=Draft202012Validator.TYPE_CHECKER.redefine("integer", _is_integer),
    )


def nul_characters(doc: LoadedDocument) -> Iterator[Diagnostic]:
    """MDC106 for every key or string holding a NUL: no script, config or YAML can carry one.

    Iterative, so a deeply nested document costs no recursion; paths are built only when
    a first pass found a NUL, so a huge document costs no more than one walk.
    """
    values: list[object] = [doc.data]
    while values:
        value = values.pop()
        if isinstance(value, str):
            if "\0" in value:
                break
        elif isinstance(value, dict):
            if any(isinstance(key, str) and "\0" in key for key in value):
                break
            values.extend(value.values())
        elif isinstance(value, list):
            values.extend(value)
    else:
        return
    stack: list[tuple[object, list[str | int]]] = [(doc.data, [])]
    while stack:
        value, path = stack.pop()
        if isinstance(value, str):
            if "\0" in value:
                yield Diagnostic(
                    severity=Severity.ERROR,
                    code="MDC106",
                    location=doc.locate(join_pointer(path)),
                    message=f"{value[:40]!r} contains a NUL character (\\x00), which no launch "
                    "script, config file or YAML document can carry",
                    hint="remove the NUL character",
                )
        elif isinstance(value, dict):
            for key, item in value.items():
                if isinstance(key, str) and "\0" in key:
                    yield Diagnostic(
                        severity=Severity.ERROR,
                        code="MDC106",
                        location=doc.locate(join_pointer([*path, key]), key=True),
                        message=f"the key {key[:40]!r} contains a NUL character (\\x00)",
                        hint="remove the NUL character",
                    )
                stack.append((item, [*path, key]))
        elif isinstance(value, list):
            stack.extend((item, [*path, index]) for index, item in enumerate(value))


class SchemaChecker:
    """Validates documents against one composed schema (built once, reused per file).

    A document :func:`surely_valid` proves valid has no schema errors; any other is
    validated by jsonschema, whose errors become the diagnostics. jsonschema (a third of
    a valid spec's start-up) is imported only then.

    The quick check stays because it pays for itself (bench/run.py, "hand-written pieces
    against their libraries", CPU time of the whole process): with jsonschema for every
    spec, validate of examples/quickstart.toml took 172 instead of 115 ms (the check saves
    33 %), of the 100 bench specs 406 instead of 330 ms (19 %), compile of the 2x8 torchrun
    spec 184 instead of 127 ms (31 %). Differential tests against jsonschema:
    tests/unit/test_schema.py (every example and its one-edit mutations) and
    tests/unit/test_bounded_input.py.
    """

    def __init__(self, schema: Mapping[str, Any]) -> None:
        self.schema = schema
        self._validator: Any = None

    @property
    def validator(self) -> Any:
        if self._validator is None:
            self._validator = validator_class()(self.schema)
        return self._validator

    def check(self, doc: LoadedDocument) -> list[Diagnostic]:
        found: list[Diagnostic] = []
        errors = () if surely_valid(doc.data, self.schema) else self.validator.iter_errors(doc.data)
        for error in errors:
            found.extend(self._diagnose(error, doc))
        seen = {d.location.pointer for d in found}
        found.extend(d for d in nul_characters(doc) if d.location.pointer not in seen)
        return found

    def _diagnose(self, error: ValidationError, doc: LoadedDocument) -> Iterator[Diagnostic]:
        failure = _Failure(error, doc)
        return _DIAGNOSES.get(failure.keyword, _invalid)(failure)


class _Failure:
    """One jsonschema error, as its diagnostics say it: where, which keyword, which schema."""

    def __init__(self, error: ValidationError, doc: LoadedDocument) -> None:
        self.error = error
        self.doc = doc
        self.path = list(error.absolute_path)
        self.pointer = join_pointer(self.path)
        self.keyword = str(error.validator)
        self.schema: dict[str, Any] = error.schema if isinstance(error.schema, dict) else {}

    def diag(
        self, message: str, hint: str | None = None, at: str | None = None, key: bool = False
    ) -> Diagnostic:
        return Diagnostic(
            severity=Severity.ERROR,
            code=CODES.get(self.keyword, "MDC100"),
            message=message,
            hint=hint,
            location=self.doc.locate(self.pointer if at is None else at, key=key),
        )


def _unknown_keys(f: _Failure) -> Iterator[Diagnostic]:
    """additionalProperties: each unknown key, with the nearest known one."""
    if not isinstance(f.error.instance, dict):
        yield from _invalid(f)
        return
    allowed = sorted(f.schema.get("properties", {}))
    for extra in sorted(k for k in f.error.instance if k not in allowed):
        near = did_you_mean(extra, allowed, cutoff=0.6)
        hint = (
            f"did you mean {near!r}?"
            if near
            else (f"allowed keys: {', '.join(allowed)}" if allowed else None)
        )
        yield f.diag(
            f"unknown key {extra!r} {_table_name(f.path)}",
            hint,
            join_pointer([*f.path, extra]),
            key=True,
        )


def _missing_key(f: _Failure) -> Iterator[Diagnostic]:
    missing = str(f.error.message).split("'")[1]
    description = f.schema.get("properties", {}).get(missing, {}).get("description")
    yield f.diag(f"missing required key {missing!r} {_table_name(f.path)}", description)


def _wrong_type(f: _Failure) -> Iterator[Diagnostic]:
    expected = f.error.validator_value
    names = [
        TYPE_NAMES.get(str(t), str(t))
        for t in (expected if isinstance(expected, list) else [expected])
    ]
    yield f.diag(
        f"expected {' or '.join(names)}, got {_got(f.error.instance)}",
        (f.schema.get("description") or _quote_hint(expected, f.error.instance))
        if f.path
        else None,
    )


def _not_a_choice(f: _Failure) -> Iterator[Diagnostic]:
    """enum and const; a plugin name that names no installed plugin is MDC107."""
    error = f.error
    choices = [
        str(c)
        for c in cast(
            "list[Any]",
            error.validator_value if f.keyword == "enum" else [error.validator_value],
        )
    ]
    near = did_you_mean(str(error.instance), choices)
    hint = f"did you mean {near!r}?" if near else None
    kind = PLUGIN_FIELDS.get(f.pointer)
    if not choices:  # plugin names, and every plugin of that kind blocked or absent
        yield f.diag(
            f"{_short(error.instance)} is not available: no plugin of this kind is loaded",
            "see `mdc plugins`; was it blocked with -p no:NAME?",
        )
        return
    if kind is not None and near is None:
        yield Diagnostic(
            severity=Severity.ERROR,
            code="MDC107",
            message=f"no {kind} named {_short(error.instance)} is installed "
            f"(installed: {', '.join(choices)})",
            hint=f"`mdc plugins` lists the installed {kind}s; a third-party {kind} "
            "is a distribution to pip install beside mdc (entry point group `mdc`), "
            "and -p no:NAME or MDC_BLOCK_PLUGINS may have blocked it",
            location=f.doc.locate(f.pointer),
        )
        return
    yield f.diag(f"{_short(error.instance)} is not one of: {', '.join(choices)}", hint)


_BOUND_SIGNS = {"minimum": ">=", "exclusiveMinimum": ">", "maximum": "<=", "exclusiveMaximum": "<"}


def _out_of_range(f: _Failure) -> Iterator[Diagnostic]:
    yield f.diag(
        f"must be {_BOUND_SIGNS[f.keyword]} {f.error.validator_value}, got {_short(f.error.instance)}",
        f.schema.get("description"),
    )


def _none_of_the_types(f: _Failure) -> Iterator[Diagnostic]:
    """oneOf: the types its branches take."""
    options = [
        sub.schema.get("type") for sub in f.error.context or [] if isinstance(sub.schema, dict)
    ]
    names = [TYPE_NAMES.get(str(t), str(t)) for t in dict.fromkeys(options) if t]
    yield f.diag(
        f"expected {' or '.join(names) or 'another value'}, got {_got(f.error.instance)}",
        f.schema.get("description"),
    )


def _bad_name(f: _Failure) -> Iterator[Diagnostic]:
    """propertyNames: the key itself is located."""
    yield f.diag(
        f"invalid name {_short(f.error.instance)}",
        f"names must match {cast(Any, f.error.validator_value).get('pattern', 'the schema')}",
        join_pointer([*f.path, str(f.error.instance)]),
        key=True,
    )


def _no_match(f: _Failure) -> Iterator[Diagnostic]:
    yield f.diag(
        f"{_short(f.error.instance)} does not match {f.error.validator_value}",
        f.schema.get("description"),
    )


def _bad_length(f: _Failure) -> Iterator[Diagnostic]:
    bound = "at least" if f.keyword == "minLength" else "at most"
    yield f.diag(
        f"{_short(f.error.instance)} must be {bound} {f.error.validator_value} characters long",
        f.schema.get("description"),
    )


def _invalid(f: _Failure) -> Iterator[Diagnostic]:
    """Any other keyword: named with its value."""
    yield f.diag(
        f"{_short(f.error.instance)} is invalid: {f.keyword} {_short(f.error.validator_value)}",
        f.schema.get("description"),
    )


#: the diagnostics of each JSON Schema keyword's failure
_DIAGNOSES: dict[str, Callable[[_Failure], Iterator[Diagnostic]]] = {
    "additionalProperties": _unknown_keys,
    "required": _missing_key,
    "type": _wrong_type,
    "enum": _not_a_choice,
    "const": _not_a_choice,
    **dict.fromkeys(_BOUND_SIGNS, _out_of_range),
    "oneOf": _none_of_the_types,
    "propertyNames": _bad_name,
    "pattern": _no_match,
    "minLength": _bad_length,
    "maxLength": _bad_length,
}


def _quote_hint(expected: object, value: object) -> str | None:
    """Why a number or true/false is no text, where text is wanted (an env value)."""
    wanted = expected if isinstance(expected, list) else [expected]
    if "string" not in wanted or not isinstance(value, (bool, int, float)):
        return None
    return (
        f"this is text: quote it ({json.dumps(json.dumps(value))}) to pass those characters; "
        "mdc does not guess how a number or true/false was meant to be spelled"
    )


def _got(value: object) -> str:
    kind = _python_type(value)
    return "nothing (null)" if value is None else f"{kind} {_short(value)}"


def _short(value: object, limit: int = 60) -> str:
    text = json.dumps(value, ensure_ascii=False) if not isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class ComposedChecker:
    """Validates documents against the composed schema, fetching plugin fragments as needed.

    A table a document does not have cannot produce an error, so a plugin's fragment is
    fetched (and its plugin imported) only when a document has its table; the other
    tables are placeholders. Unknown top-level keys are reported with every allowed key
    (the hint lists them), so a document with one fetches every fragment first. The
    diagnostics are those of the fully composed schema; the validator is rebuilt only
    when a new fragment arrives.
    """

    def __init__(
        self,
        tables: Iterable[str],
        fragment: Callable[[str], Mapping[str, Any] | None],
        launchers: Iterable[str],
        backends: Iterable[str],
    ) -> None:
        self.tables = tuple(sorted(tables))
        self._fragment = fragment
        self._launchers, self._backends = tuple(launchers), tuple(backends)
        self._core = frozenset(_shared_core_schema()["properties"])
        self._fetched: dict[str, Mapping[str, Any] | None] = {}
        self._checker: SchemaChecker | None = None

    def check(self, doc: LoadedDocument) -> list[Diagnostic]:
        keys = list(doc.data) if isinstance(doc.data, dict) else []
        wanted = [k for k in keys if k in self.tables and k not in self._fetched]
        for name in wanted:
            self._fetched[name] = self._fragment(name)
        if any(k not in self._core and self._fetched.get(k) is None for k in keys):
            wanted += self._fetch_all()
        if wanted or self._checker is None:
            placeholders: dict[str, Mapping[str, Any] | None] = {name: {} for name in self.tables}
            self._checker = SchemaChecker(
                compose({**placeholders, **self._fetched}, self._launchers, self._backends)
            )
        return self._checker.check(doc)

    def _fetch_all(self) -> list[str]:
        missing = [name for name in self.tables if name not in self._fetched]
        for name in missing:
            self._fetched[name] = self._fragment(name)
        return missing

    @property
    def schema(self) -> dict[str, Any]:
        """The fully composed schema (fetches every fragment)."""
        self._fetch_all()
        return compose(self._fetched, self._launchers, self._backends)


#: Keywords that never make a document invalid.
_ANNOTATIONS = frozenset(
    {
        "$schema",
        "$id",
        "$comment",
        "title",
        "description",
        "default",
        "examples",
        "deprecated",
        "format",
        "readOnly",
        "writeOnly",
    }
)
_TYPES: dict[str, Callable[[object], bool]] = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: (
        isinstance(v, int) and not isinstance(v, bool) and SIZE_RANGE[0] <= v <= SIZE_RANGE[1]
    ),
    "number": lambda v: (  # NaN: never within
        isinstance(v, (int, float))
        and not isinstance(v, bool)
        and SIZE_RANGE[0] <= v <= SIZE_RANGE[1]
    ),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}


def surely_valid(instance: object, schema: object) -> bool:
    """True only if ``instance`` is valid against ``schema`` as :func:`validator_class`
    validates it. False if it is not, or if the schema uses a keyword or a value this
    quick check does not know: the verdict (and every diagnostic) is then jsonschema's."""
    return _proof(schema)(instance)


#: Proves an instance valid against one schema (or says it cannot).
Proof = Callable[[object], bool]

#: id of a schema (held, so the id stays its own) -> the schema and its proof
_PROOFS: dict[int, tuple[object, Proof]] = {}


def _proof(schema: object) -> Proof:
    """The proof for ``schema``: its keywords' checks, each bound to the keyword's value.

    Made once per schema object: a spec meets the same few hundred schemas again and again.
    Schemas are not changed once built (see :func:`compose`).
    """
    held = _PROOFS.get(id(schema))
    if held is not None and held[0] is schema:
        return held[1]
    proof = _make_proof(schema)
    if len(_PROOFS) >= 100_000:  # schemas made on the fly (tests): start again
        _PROOFS.clear()
    _PROOFS[id(schema)] = (schema, proof)
    return proof


def _later(schema: object) -> Proof:
    """The proof of ``schema``, made when first used: a spec reaches few of the branches of
    the composed schema, and making the others' would cost more than it saves."""
    made: list[Proof] = []

    def prove(instance: object) -> bool:
        if not made:
            made.append(_proof(schema))
        return made[0](instance)

    return prove


def _yes(instance: object) -> bool:
    return True


def _no(instance: object) -> bool:
    return False


def _make_proof(schema: object) -> Proof:
    if schema is True:
        return _yes
    if not isinstance(schema, dict):
        return _no
    checks: list[Proof] = []
    for keyword, value in schema.items():
        make = _KEYWORDS.get(keyword)
        if make is not None:
            checks.append(make(value, schema))
        elif keyword not in _ANNOTATIONS:
            return _no
    if len(checks) == 1:
        return checks[0]

    def proof(instance: object) -> bool:
        for check in checks:  # noqa: SIM110 - a loop: no generator for every node
            if not check(instance):
                return False
        return True

    return proof


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _same(one: object, two: object) -> bool:
    """JSON equality of scalars (``true`` is not ``1``; ``1`` is ``1.0``)."""
    if _number(one) and _number(two):
        return one == two
    return type(one) is type(two) and one == two


#: Makes a keyword's check from its value and the schema holding it.
Keyword = Callable[[Any, Mapping[str, Any]], Proof]


def _type(value: Any, schema: Mapping[str, Any]) -> Proof:
    if type(value) is str and value in _TYPES:
        return _TYPES[value]
    names = value if isinstance(value, list) else [value]
    known = [_TYPES[name] for name in names if name in _TYPES]
    return lambda instance: any(test(instance) for test in known)


def _enum(value: Any, schema: Mapping[str, Any]) -> Proof:
    if not isinstance(value, list):
        return _no

    def check(instance: object) -> bool:
        if isinstance(instance, (dict, list)):
            return False
        if type(instance) is str:  # equal only to the same string: Python's == says the same
            return instance in value
        return any(_same(instance, choice) for choice in value)

    return check


def _bound(test: Callable[[Any, Any], bool]) -> Keyword:
    def make(value: Any, schema: Mapping[str, Any]) -> Proof:
        if not _number(value):
            return lambda instance: not _number(instance)
        return lambda instance: (
            not _number(instance)
            or (test(instance, value) and (type(instance) is not float or math.isfinite(instance)))
        )

    return make


def _length(test: Callable[[int, Any], bool]) -> Keyword:
    def make(value: Any, schema: Mapping[str, Any]) -> Proof:
        known = isinstance(value, int)
        return lambda instance: (
            not isinstance(instance, str) or (known and test(len(instance), value))
        )

    return make


def _pattern(value: Any, schema: Mapping[str, Any]) -> Proof:
    if not isinstance(value, str):
        return lambda instance: not isinstance(instance, str)
    return lambda instance: not isinstance(instance, str) or re.search(value, instance) is not None


def _required(value: Any, schema: Mapping[str, Any]) -> Proof:
    return lambda instance: not isinstance(instance, dict) or all(key in instance for key in value)


def _properties(value: Any, schema: Mapping[str, Any]) -> Proof:
    if not isinstance(value, dict):
        return _no
    proofs: dict[str, Proof] = {}  # made as a spec first reaches each property

    def check(instance: object) -> bool:
        if not isinstance(instance, dict):
            return True
        for key, item in instance.items():
            prove = proofs.get(key)
            if prove is None:
                if key not in value:
                    continue
                prove = proofs[key] = _proof(value[key])
            if not prove(item):
                return False
        return True

    return check


def _additional(value: Any, schema: Mapping[str, Any]) -> Proof:
    if "patternProperties" in schema:
        return lambda instance: not isinstance(instance, dict)
    named = schema.get("properties", {})
    prove = _later(value)
    return lambda instance: (
        not isinstance(instance, dict)
        or all(prove(item) for key, item in instance.items() if key not in named)
    )


def _items(value: Any, schema: Mapping[str, Any]) -> Proof:
    if "prefixItems" in schema:
        return lambda instance: not isinstance(instance, list)
    prove = _later(value)
    return lambda instance: not isinstance(instance, list) or all(map(prove, instance))


def _property_names(value: Any, schema: Mapping[str, Any]) -> Proof:
    prove = _later(value)
    return lambda instance: not isinstance(instance, dict) or all(map(prove, instance))


def _one_of(value: Any, schema: Mapping[str, Any]) -> Proof:
    # Sure only when one branch is proven valid and every other is ruled out by its type.
    if not isinstance(value, list):
        return _no
    branches = [
        (_later(branch), _type(branch["type"], branch) if _typed(branch) else None)
        for branch in value
    ]

    def check(instance: object) -> bool:
        proven = [prove(instance) for prove, _ in branches]
        return proven.count(True) == 1 and all(
            ok or (typed is not None and not typed(instance))
            for ok, (_, typed) in zip(proven, branches, strict=True)
        )

    return check


def _typed(branch: object) -> bool:
    return isinstance(branch, dict) and "type" in branch


def _min_items(value: Any, schema: Mapping[str, Any]) -> Proof:
    known = isinstance(value, int)
    return lambda instance: not isinstance(instance, list) or (known and len(instance) >= value)


def _max_items(value: Any, schema: Mapping[str, Any]) -> Proof:
    known = isinstance(value, int)
    return lambda instance: not isinstance(instance, list) or (known and len(instance) <= value)


def _unique_items(value: Any, schema: Mapping[str, Any]) -> Proof:
    if value is False:
        return _yes
    if value is not True:
        return lambda instance: not isinstance(instance, list)
    return lambda instance: (
        not isinstance(instance, list)
        or (all(isinstance(i, str) for i in instance) and len(set(instance)) == len(instance))
    )


_KEYWORDS: dict[str, Keyword] = {
    "type": _type,
    "enum": _enum,
    "minimum": _bound(lambda v, b: v >= b),
    "maximum": _bound(lambda v, b: v <= b),
    "exclusiveMinimum": _bound(lambda v, b: v > b),
    "exclusiveMaximum": _bound(lambda v, b: v < b),
    "minLength": _length(lambda n, b: n >= b),
    "maxLength": _length(lambda n, b: n <= b),
    "pattern": _pattern,
    "required": _required,
    "properties": _properties,
    "additionalProperties": _additional,
    "items": _items,
    "propertyNames": _property_names,
    "oneOf": _one_of,
    "minItems": _min_items,
    "maxItems": _max_items,
    "uniqueItems": _unique_items,
}
