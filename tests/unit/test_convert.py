"""Structuring: mdc's own structurer gives what a cattrs converter gives, for every example
spec and for every kind of type an options class may use."""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import attrs
import cattrs
import pytest
from tests.tools import REPO

from mdc.convert import SCALARS, structure, structure_spec
from mdc.errors import InternalError
from mdc.importers import translate
from mdc.loaders import FORMATS, load_file
from mdc.plan.named_models import name_model
from mdc.plugin_manager import load_plugins
from mdc.spec import CORE_TABLES, EnvValue, JobSpec

SPECS = sorted(
    p
    for folder in (REPO / "examples", REPO / "examples" / "mdc-mpi" / "examples")
    for p in folder.iterdir()
    if p.suffix in FORMATS
)


def reference_converter() -> cattrs.Converter:
    """The cattrs converter mdc structured with before it had its own structurer."""
    converter = cattrs.Converter(forbid_extra_keys=True)
    converter.register_structure_hook(
        str | tuple[str, ...], lambda value, _: value if isinstance(value, str) else tuple(value)
    )
    converter.register_structure_hook_func(
        lambda tp: (
            typing.get_origin(tp) in (types.UnionType, typing.Union)  # type: ignore[comparison-overlap]
            and tp != (str | None)
            and all(a in SCALARS for a in typing.get_args(tp))
        ),
        lambda value, _: value,
    )
    # a number or a list of numbers ([model] moe_layer_freq, window_attn_skip_freq)
    converter.register_structure_hook(
        int | tuple[int, ...] | None,
        lambda value, _: tuple(value) if isinstance(value, list) else value,
    )
    # a [job] env value: a literal string or its explicit form (a table)
    converter.register_structure_hook(
        str | EnvValue,
        lambda value, _: converter.structure(value, EnvValue) if isinstance(value, dict) else value,
    )
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
