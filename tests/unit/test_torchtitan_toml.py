"""torchtitan.toml is written by a small writer for plain values, by tomlkit otherwise: the
same bytes wherever the small one writes at all, and TOML that reads back as the values."""

from __future__ import annotations

import math
import tomllib
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mdc_builtin.launchers.torchtitan import _NotPlain, toml_text, toml_text_by_tomlkit

COMMENTS = ["TorchTitan job config for job 'x', written by mdc.", "Second line."]
KEYS = st.text(alphabet='abz_-09 .é"\\\t', min_size=1, max_size=6)
SCALARS = (
    st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=8)
)
# what a config holds: keys and strings without quotes or escapes, finite numbers
PLAIN_KEYS = st.text(alphabet="abz_-09 .é", min_size=1, max_size=6)
PLAIN_SCALARS = (
    st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(
        alphabet=st.characters(
            exclude_characters='"\\',
            exclude_categories=("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp", "Zs"),
        ),
        max_size=8,
    )
)


def sections(
    keys: st.SearchStrategy[str], scalars: st.SearchStrategy[Any], nested: bool
) -> st.SearchStrategy[dict[str, Any]]:
    values = scalars | st.lists(scalars, max_size=4)
    if nested:
        values |= st.lists(st.lists(scalars), max_size=2)
    tables = st.recursive(
        st.dictionaries(keys, values, max_size=4),
        lambda inner: st.dictionaries(keys, values | inner, max_size=3),
        max_leaves=10,
    )
    return st.dictionaries(keys, tables.filter(bool), max_size=4)


SECTIONS = sections(KEYS, SCALARS, nested=True)


@st.composite
def plain_table(draw: st.DrawFn, depth: int = 0) -> dict[str, Any]:
    """Values first, then tables (as a config is built), never empty."""
    values = st.lists(PLAIN_SCALARS, max_size=4) | PLAIN_SCALARS
    table = draw(st.dictionaries(PLAIN_KEYS, values, min_size=0 if depth < 2 else 1, max_size=4))
    if depth < 2:
        tables = draw(st.dictionaries(PLAIN_KEYS, plain_table(depth + 1), max_size=2))
        table.update({k: v for k, v in tables.items() if k not in table})
    return table or {"k": 1}


PLAIN_SECTIONS = st.dictionaries(PLAIN_KEYS, plain_table(), max_size=4)


@given(SECTIONS)
def test_the_small_writer_writes_what_tomlkit_writes(sections: dict[str, Any]) -> None:
    try:
        text = toml_text(COMMENTS, sections)
    except _NotPlain:
        return
    assert text == toml_text_by_tomlkit(COMMENTS, sections)
    assert tomllib.loads(text) == sections


@given(PLAIN_SECTIONS)
def test_a_plain_config_takes_the_small_writer(sections: dict[str, Any]) -> None:
    text = toml_text(COMMENTS, sections)
    assert text == toml_text_by_tomlkit(COMMENTS, sections)
    assert tomllib.loads(text) == sections


def test_plain_values_take_the_small_writer() -> None:
    sections = {
        "job": {"dump_folder": "/ckpt/é", "flag": True},
        "training": {
            "steps": 10,
            "lr": 1e-05,
            "big": 1e20,
            "mix": [1.5, True, "x"],
            "empty": [],
            "quoted key": -0.0,
            "sub": {"deep": {"x": 1}},
        },
    }
    text = toml_text(COMMENTS, sections)
    assert text == toml_text_by_tomlkit(COMMENTS, sections)
    assert "[training.sub.deep]" in text and "[training.sub]" not in text


@pytest.mark.parametrize(
    "value", [[{"a": 1}], [[1], [2]], math.inf, 'say "hi"', "a\\b", "tab\t", None, (1, 2)]
)
def test_other_values_are_left_to_tomlkit(value: Any) -> None:
    with pytest.raises(_NotPlain):
        toml_text(COMMENTS, {"s": {"k": value}})
