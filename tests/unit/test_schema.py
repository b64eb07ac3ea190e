"""The JSON Schemas: valid draft 2020-12, documented everywhere, and in step with the model."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from collections.abc import Iterator
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

import attrs
import pytest
from jsonschema import Draft202012Validator
from jsonschema.validators import validator_for

from mdc.cli import main
from mdc.convert import EDITOR_SCHEMA_KEY
from mdc.errors import SpecError
from mdc.loaders import load_text
from mdc.plan.named_models import NAMING_KEYS
from mdc.plugin_manager import PluginSet, load_plugins
from mdc.schema import CORE_SCHEMA, ComposedChecker, SchemaChecker, compose, core_schema
from mdc.spec import CORE_TABLES, JobSpec

DRAFT = "https://json-schema.org/draft/2020-12/schema"
REPO_ROOT = Path(__file__).resolve().parents[2]


def schema_files() -> list[Traversable]:
    root = resources.files("mdc_schemas")
    found = [root.joinpath(CORE_SCHEMA)]
    for folder in (root, root.joinpath("plugins")):
        found += sorted(
            (p for p in folder.iterdir() if p.name.endswith(".json") and p.name != CORE_SCHEMA),
            key=lambda p: p.name,
        )
    return found


def load(resource: Traversable) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(resource.read_text(encoding="utf-8"))
    return loaded


@pytest.fixture(scope="module")
def plugins() -> PluginSet:
    return load_plugins(autoload=False)


@pytest.fixture(scope="module")
def composed() -> dict[str, Any]:
    """What `mdc schema` prints, with only mdc's own plugins."""
    out, err = io.StringIO(), io.StringIO()
    assert main(["schema", "--no-plugin-autoload"], stdout=out, stderr=err) == 0, err.getvalue()
    loaded: dict[str, Any] = json.loads(out.getvalue())
    return loaded


def properties(schema: Any, where: str = "#") -> Iterator[tuple[str, Any]]:
    """Every ``(location, subschema)`` under a ``properties`` keyword, at every depth."""
    if isinstance(schema, list):
        for index, item in enumerate(schema):
            yield from properties(item, f"{where}/{index}")
        return
    if not isinstance(schema, dict):
        return
    for name, sub in schema.get("properties", {}).items():
        yield f"{where}/properties/{name}", sub
    for keyword, sub in schema.items():
        if keyword == "properties":
            for name, prop in sub.items():
                yield from properties(prop, f"{where}/properties/{name}")
        elif keyword in (
            "items",
            "additionalProperties",
            "oneOf",
            "anyOf",
            "allOf",
            "prefixItems",
            "$defs",
            "not",
            "if",
            "then",
            "else",
        ):
            if keyword == "$defs":
                for name, prop in sub.items():
                    yield from properties(prop, f"{where}/$defs/{name}")
            else:
                yield from properties(sub, f"{where}/{keyword}")


def test_there_are_plugin_schemas() -> None:
    names = [p.name for p in schema_files()]
    assert names[0] == CORE_SCHEMA
    assert "torchrun.v1.schema.json" in names


@pytest.mark.parametrize("resource", schema_files(), ids=lambda p: p.name)
def test_schema_file_is_valid_draft_2020_12(resource: Traversable) -> None:
    schema = load(resource)
    assert schema.get("$schema") == DRAFT
    assert validator_for(schema) is Draft202012Validator
    Draft202012Validator.check_schema(schema)
    assert schema.get("$id", "").endswith(resource.name), "the $id names the file"


def test_composed_schema_is_valid(composed: dict[str, Any]) -> None:
    Draft202012Validator.check_schema(composed)


@pytest.mark.parametrize("resource", schema_files(), ids=lambda p: p.name)
def test_every_property_in_file_is_described(resource: Traversable) -> None:
    undocumented = [
        where
        for where, sub in properties(load(resource))
        if not (isinstance(sub, dict) and str(sub.get("description", "")).strip())
    ]
    assert not undocumented, f"{resource.name}: properties without a description: {undocumented}"


def test_every_property_in_composed_schema_is_described(composed: dict[str, Any]) -> None:
    undocumented = [
        where
        for where, sub in properties(composed)
        if not (isinstance(sub, dict) and str(sub.get("description", "")).strip())
    ]
    assert not undocumented, f"properties without a description: {undocumented}"


def test_property_walk_sees_nested_levels(composed: dict[str, Any]) -> None:
    seen = {where for where, _ in properties(composed)}
    assert "#/properties/distributed/properties/launcher" in seen
    assert "#/properties/torchrun/properties/rdzv_conf" in seen


def test_composed_schema_identity_and_enums(
    composed: dict[str, Any], plugins: PluginSet, declared_builtins: dict[str, list[str]]
) -> None:
    assert composed["$id"] == core_schema()["$id"]
    assert composed["title"]
    dist = composed["properties"]["distributed"]["properties"]
    declared = declared_builtins
    assert dist["launcher"]["enum"] == sorted(plugins.launchers) == declared["launchers"]
    assert dist["backend"]["enum"] == sorted(plugins.backends) == declared["backends"]
    assert "torchrun" in composed["properties"], "plugin tables are composed in"


def test_composed_schema_drops_fragment_identity(plugins: PluginSet) -> None:
    tables = {name: reg.record.schema for name, reg in plugins.tables().items()}
    schema = compose(tables, plugins.launchers, plugins.backends)
    for name in plugins.tables():
        if tables[name] is not None:
            assert "$id" not in schema["properties"][name]
            assert "$schema" not in schema["properties"][name]


# ---------------------------------------------------------------- schema <-> model parity


def field_names(cls: type) -> set[str]:
    return {f.name for f in attrs.fields(cls)}


def test_core_tables_match_schema() -> None:
    # besides the tables, only the key editors read the spec's schema from
    assert set(core_schema()["properties"]) == {*CORE_TABLES, EDITOR_SCHEMA_KEY}
    assert field_names(JobSpec) - {"plugin_tables"} == set(CORE_TABLES)


@pytest.mark.parametrize("table", sorted(CORE_TABLES))
def test_core_table_fields_match_schema(table: str) -> None:
    schema = core_schema()["properties"][table]
    # a named model's keys replace [model] name and hf_config before the spec is structured
    named = set(NAMING_KEYS) if table == "model" else set()
    assert field_names(CORE_TABLES[table]) == set(schema["properties"]) - named, (
        f"mdc.spec.{CORE_TABLES[table].__name__} and the schema's [{table}] disagree"
    )


def test_required_keys_have_no_default_in_model() -> None:
    for table, cls in CORE_TABLES.items():
        required = set(core_schema()["properties"][table].get("required", []))
        optional = {f.name for f in attrs.fields(cls) if f.default is not attrs.NOTHING}
        assert not required & optional, f"[{table}]: required in the schema, optional in model"


def test_plugin_option_types_match_their_fragments(plugins: PluginSet) -> None:
    checked = []
    for name, reg in sorted(plugins.tables().items()):
        record = reg.record
        if record.options_type is None:
            continue
        assert record.schema is not None, f"{name} has an options_type but no schema"
        assert field_names(record.options_type) == set(record.schema["properties"]), (
            f"{record.options_type.__name__} and the [{name}] schema disagree"
        )
        checked.append(name)
    assert "torchrun" in checked


# ---------------------------------------------------------------- fragments fetched on demand

FRAGMENTS: dict[str, dict[str, Any] | None] = {
    "alpha": {
        "type": "object",
        "additionalProperties": False,
        "properties": {"size": {"type": "integer", "description": "A size."}},
    },
    "beta": {"type": "object", "additionalProperties": False, "properties": {}},
    "gamma": None,
}
HEAD = '[job]\nname = "x"\ncommand = ["t"]\n[distributed]\nlauncher = "alpha"\n'


def composed_checker() -> tuple[ComposedChecker, list[str]]:
    fetched: list[str] = []

    def fragment(name: str) -> dict[str, Any] | None:
        fetched.append(name)
        return FRAGMENTS[name]

    return ComposedChecker(FRAGMENTS, fragment, ["alpha"], ["beta", "gamma"]), fetched


@pytest.mark.parametrize(
    "text",
    [
        HEAD,
        HEAD + "[alpha]\nsize = 2\n",
        HEAD + '[alpha]\nsize = "2"\n',
        HEAD + "[alpha]\nsise = 2\n",
        HEAD + "[gamma]\nx = 1\n",
        HEAD + "[betta]\n",
        HEAD.replace('"alpha"', '"alpah"'),
        "job = 1\n",
    ],
)
def test_fetching_on_demand_reports_what_the_full_schema_does(text: str) -> None:
    doc = load_text(text, "spec.toml", "toml")
    full = SchemaChecker(compose(FRAGMENTS, ["alpha"], ["beta", "gamma"])).check(doc)
    checker, _ = composed_checker()
    assert checker.check(doc) == full


def test_only_the_tables_a_document_has_are_fetched() -> None:
    checker, fetched = composed_checker()
    checker.check(load_text(HEAD, "spec.toml", "toml"))
    assert fetched == []
    checker.check(load_text(HEAD + "[alpha]\n", "spec.toml", "toml"))
    assert fetched == ["alpha"]
    validator = checker._checker
    checker.check(load_text(HEAD + "[alpha]\nsize = 1\n", "spec.toml", "toml"))
    assert fetched == ["alpha"] and checker._checker is validator  # built once, reused
    checker.check(load_text(HEAD + "[unknown]\n", "spec.toml", "toml"))
    assert sorted(fetched) == ["alpha", "beta", "gamma"]  # the hint lists every table
    assert checker.schema == compose(FRAGMENTS, ["alpha"], ["beta", "gamma"])


# ---------------------------------------------------------------- the quick validity check

SPEC_FILES = sorted(
    [
        *(REPO_ROOT / "examples").glob("*.toml"),
        *(REPO_ROOT / "examples").glob("*.yaml"),
        *(REPO_ROOT / "examples").glob("*.json"),
        *(REPO_ROOT / "golden" / "diagnostics").glob("*/spec.*"),
    ]
)
REPLACEMENTS: list[object] = [
    None,
    True,
    False,
    0,
    -1,
    2,
    1.5,
    "",
    "x",
    "A b",
    [],
    ["x"],
    [1],
    {},
    {"x": 1},
]


def mutations(data: object) -> Iterator[object]:
    """``data`` with one value replaced, one key dropped or one unknown key added."""
    if isinstance(data, dict):
        yield {**data, "zz_unknown": 1}
        for key, value in data.items():
            yield {k: v for k, v in data.items() if k != key}
            for other in [*REPLACEMENTS, *mutations(value)]:
                yield {**data, key: other}
    elif isinstance(data, list):
        for index, value in enumerate(data):
            for other in [*REPLACEMENTS, *mutations(value)]:
                yield [*data[:index], other, *data[index + 1 :]]


@pytest.fixture(scope="module")
def full_schema() -> dict[str, Any]:
    from mdc.pipeline import Compiler

    return Compiler(load_plugins(autoload=False)).schema


@pytest.mark.slow
@pytest.mark.parametrize("path", SPEC_FILES, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_the_quick_check_never_passes_what_jsonschema_rejects(
    path: Path, full_schema: dict[str, Any]
) -> None:
    """Differential: on every example, every diagnostics case and each one-edit mutation of
    them, "surely valid" implies jsonschema finds no error; valid examples are proven."""
    from mdc.loaders import load_file
    from mdc.schema import surely_valid, validator_class

    validator = validator_class()(full_schema)
    try:
        data = load_file(path).data
    except SpecError:
        return  # a syntax-error case: nothing reaches the schema
    proven = surely_valid(data, full_schema)
    assert not proven or not list(validator.iter_errors(data))
    if path.parent.name == "examples":
        assert proven, "a valid example takes jsonschema's slow path"
    for mutated in mutations(data):
        if surely_valid(mutated, full_schema):
            assert not list(validator.iter_errors(mutated)), mutated


@pytest.mark.slow
def test_a_valid_spec_does_not_import_jsonschema(clean_env: Any) -> None:
    code = (
        "import sys; from mdc.cli import main\n"
        "assert main(['validate', '-q', 'examples/quickstart.toml']) == 0\n"
        "print('jsonschema' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO_ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert done.stdout.strip() == "False"


@pytest.mark.parametrize(("window", "proven"), [([128, 0], True), ([128, 0, 0], False)])
def test_the_quick_check_proves_max_items(
    window: list[int], proven: bool, full_schema: dict[str, Any]
) -> None:
    """maxItems (window_size, weight_block_size: [rows, columns]) is proven, not left to
    jsonschema: a two-item list within it is valid, a third item is jsonschema's error."""
    from mdc.schema import surely_valid, validator_class

    data = {
        "job": {"name": "window", "command": ["python", "train.py"]},
        "distributed": {"launcher": "torchrun", "nnodes": 1, "nproc_per_node": 1},
        "model": {"window_size": window},
    }
    assert surely_valid(data, full_schema) is proven
    assert bool(list(validator_class()(full_schema).iter_errors(data))) is not proven
