"""Structuring: mdc's own structurer gives what a cattrs converter gives, for every example
spec, for every kind of type an options class may use, and for tables drawn from each
table's schema (any value the schema lets through, keys present or not)."""

from __future__ import annotations

import dataclasses
import enum
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import attrs
import cattrs
import pytest
from hypothesis import HealthCheck, assume, given, settings
from tests.fuzz.test_fuzz_specs import SCHEMA, from_fragment
from tests.tools import REPO

from mdc.convert import cattrs_converter, structure, structure_spec
from mdc.errors import InternalError
from mdc.importers import translate
from mdc.loaders import FORMATS, load_file
from mdc.plan.named_models import name_model
from mdc.plugin_manager import load_plugins
from mdc.schema import validator_class
from mdc.spec import CORE_TABLES, JobSpec

SPECS = sorted(
    p
    for folder in (REPO / "examples", REPO / "examples" / "mdc-mpi" / "examples")
    for p in folder.iterdir()
    if p.suffix in FORMATS
)


def reference_converter() -> cattrs.Converter:
    """cattrs, with the hooks for the unions it cannot decide alone (mdc.convert's)."""
    converter: cattrs.Converter = cattrs_converter()
    return converter


@pytest.fixture(scope="module")
def option_types() -> dict[str, Any]:
    return dict(load_plugins().option_types())


@pytest.mark.parametrize("path", SPECS, ids=[str(p.relative_to(REPO)) for p in SPECS])
def test_example_specs_structure_as_cattrs_does(path: Path, option_types: dict[str, Any]) -> None:
    # a named model's keys are filled before the spec is structured, as the compiler does
    data = name_model(translate(load_file(path))[0])[0].data
    assert isinstance(data, dict)
    reference = reference_converter()
    expected = JobSpec(
        **{
            name: reference.structure(data[name], cls)
            for name, cls in CORE_TABLES.items()
            if name in data
        },
        plugin_tables={
            name: data[name]
            if option_types.get(name) is None
            else reference.structure(data[name], option_types[name])
            for name in sorted(data)
            if name not in CORE_TABLES and name in option_types
        },
    )
    assert structure_spec(data, option_types) == expected


def test_the_examples_were_found() -> None:
    assert len(SPECS) >= 40


class Colour(enum.Enum):
    RED = "red"


@attrs.frozen
class Inner:
    size: int
    ratio: float | None = None


@attrs.frozen
class Tree:
    label: str
    children: tuple[Tree, ...] = ()


@dataclasses.dataclass(frozen=True)
class Point:
    x: int
    y: int


@attrs.frozen
class Everything:
    words: tuple[str, ...] = ()
    pair: tuple[int, str] | None = None
    numbers: list[int] = attrs.field(factory=list)
    sequence: Sequence[str] = ()
    unique: frozenset[str] = frozenset()
    members: typing.AbstractSet[str] = frozenset()
    changing: typing.MutableSequence[int] = attrs.field(factory=list)
    table: Mapping[str, int] = attrs.field(factory=dict)
    plain: dict[str, Any] = attrs.field(factory=dict)
    colour: Colour | None = None
    mode: Literal["a", "b"] | None = None
    scalar: str | int | bool | None = None
    ratio: float = 0.0
    inner: Inner | None = None
    inners: tuple[Inner, ...] = ()
    tree: Tree | None = None
    point: Point | None = None
    noted: typing.Annotated[int, "a note"] = 0
    _private: int = 0


EVERYTHING = {
    "words": ["a", "b"],
    "pair": [1, "x"],
    "numbers": [1, 2],
    "sequence": ["s"],
    "unique": ["u", "u"],
    "members": ["m"],
    "changing": [1],
    "table": {"k": 1},
    "plain": {"any": [1, {"x": None}]},
    "colour": "red",
    "mode": "b",
    "scalar": True,
    "ratio": 2,
    "inner": {"size": 3},
    "inners": [{"size": 1, "ratio": 0.5}],
    "tree": {"label": "r", "children": [{"label": "c"}]},
    "point": {"x": 1, "y": 2},
    "noted": 4,
    "_private": 7,
}


@attrs.frozen
class Derived(Inner):
    """Fields of a base class too (as the Kubernetes backends' options extend PodOptions)."""

    note: str = ""


def test_every_kind_of_field_as_cattrs_does() -> None:
    expected = reference_converter().structure(EVERYTHING, Everything)
    got = structure(EVERYTHING, Everything)
    assert got == expected
    assert type(got.ratio) is float and type(got.numbers) is list and type(got.words) is tuple
    assert got.colour is Colour.RED and got.tree == Tree("r", (Tree("c"),))
    derived = {"size": 2, "ratio": 0.5, "note": "n"}
    assert structure(derived, Derived) == reference_converter().structure(derived, Derived)


@pytest.mark.parametrize(
    "data",
    [
        {
            "job": {"name": "x", "command": "c", "surplus": 1},
            "distributed": {"launcher": "torchrun"},
        },
        {"job": {"name": "x", "command": "c"}, "distributed": "torchrun"},
        {
            "job": {"name": "x", "command": "c"},
            "distributed": {"launcher": "torchrun"},
            "torchrun": {"no_such_option": 1},
        },
    ],
)
def test_data_the_model_refuses_is_an_internal_error(
    data: dict[str, Any], option_types: dict[str, Any]
) -> None:
    with pytest.raises(InternalError, match="does not fit the model"):
        structure_spec(data, option_types)


def _outcome(structure_it: Any) -> tuple[str, object]:
    try:
        return "structured", structure_it()
    except Exception:  # noqa: BLE001 - either refusal will do; both must refuse
        return "refused", None


TABLES = sorted({*CORE_TABLES, *load_plugins(autoload=False).option_types()})


@pytest.mark.slow
@pytest.mark.parametrize("name", TABLES)
def test_tables_the_schema_accepts_structure_as_cattrs_does(
    name: str, option_types: dict[str, Any]
) -> None:
    tp = CORE_TABLES.get(name) or option_types[name]
    if tp is None:  # the plugin takes its table as plain data
        return
    schema = SCHEMA["properties"][name]
    validator = validator_class()(schema)

    @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
    @given(from_fragment(schema))
    def check(value: Any) -> None:
        assume(validator.is_valid(value))
        mine = _outcome(lambda: structure(value, tp))
        assert mine == _outcome(lambda: reference_converter().structure(value, tp))

    check()
