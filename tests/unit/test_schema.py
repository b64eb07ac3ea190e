"""The JSON Schemas: valid draft 2020-12, documented everywhere, and in step with the model."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from importlib import resources
from importlib.resources.abc import Traversable
from typing import Any

import attrs
import pytest
from jsonschema import Draft202012Validator
from jsonschema.validators import validator_for

from mdc.cli import main
from mdc.convert import EDITOR_SCHEMA_KEY
from mdc.plugin_manager import PluginSet, load_plugins
from mdc.schema import CORE_SCHEMA, compose, core_schema
from mdc.spec import CORE_TABLES, JobSpec

DRAFT = "https://json-schema.org/draft/2020-12/schema"


def schema_files() -> list[Traversable]:
    root = resources.files("mdc_schemas")
    found = [root.joinpath(CORE_SCHEMA)]
    for folder in (root, root.joinpath("plugins")):
        found += sorted((p for p in folder.iterdir()
                         if p.name.endswith(".json") and p.name != CORE_SCHEMA),
                        key=lambda p: p.name)
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
        elif keyword in ("items", "additionalProperties", "oneOf", "anyOf", "allOf",
                         "prefixItems", "$defs", "not", "if", "then", "else"):
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
    undocumented = [where for where, sub in properties(load(resource))
                    if not (isinstance(sub, dict) and str(sub.get("description", "")).strip())]
    assert not undocumented, f"{resource.name}: properties without a description: {undocumented}"


def test_every_property_in_composed_schema_is_described(composed: dict[str, Any]) -> None:
    undocumented = [where for where, sub in properties(composed)
                    if not (isinstance(sub, dict) and str(sub.get("description", "")).strip())]
    assert not undocumented, f"properties without a description: {undocumented}"


def test_property_walk_sees_nested_levels(composed: dict[str, Any]) -> None:
    seen = {where for where, _ in properties(composed)}
    assert "#/properties/distributed/properties/launcher" in seen
    assert "#/properties/torchrun/properties/rdzv_conf" in seen


def test_composed_schema_identity_and_enums(composed: dict[str, Any], plugins: PluginSet,
                                            declared_builtins: dict[str, list[str]]) -> None:
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
    assert field_names(CORE_TABLES[table]) == set(schema["properties"]), (
        f"mdc.spec.{CORE_TABLES[table].__name__} and the schema's [{table}] disagree")


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
            f"{record.options_type.__name__} and the [{name}] schema disagree")
        checked.append(name)
    assert "torchrun" in checked
