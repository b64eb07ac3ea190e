"""Artifact.json writes what json.dumps(indent=2, sort_keys=True) writes, integer lists on one
line: checked against json's own indenting encoder on arbitrary values."""

from __future__ import annotations

import enum
import json
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mdc.api import Artifact

_INTEGER_LIST = re.compile(r"\[\n\s+(-?\d+(?:,\n\s+-?\d+)*)\n\s*\]")


def by_json(value: object) -> str:
    """The reference: json's indenting encoder, then integer lists joined onto one line."""
    text = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)
    joined = _INTEGER_LIST.sub(
        lambda m: "[" + ", ".join(n.strip() for n in m.group(1).split(",")) + "]", text
    )
    return joined + "\n"


SCALARS = st.none() | st.booleans() | st.integers() | st.floats() | st.text()
VALUES = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner)
        | st.lists(st.integers())
        | st.tuples(inner, inner)
        | st.dictionaries(st.text(), inner)
        | st.dictionaries(st.integers() | st.booleans() | st.none(), inner, max_size=2)
    ),
    max_leaves=40,
)


@given(VALUES)
def test_same_text_as_json(value: object) -> None:
    try:
        expected = by_json(value)
    except TypeError:  # keys of mixed types cannot be sorted
        with pytest.raises(TypeError):
            Artifact.json("x.json", value)
        return
    assert Artifact.json("x.json", value).data.decode("utf-8") == expected


class Level(enum.IntEnum):
    LOW = 1


class Name(enum.StrEnum):
    A = "é"


def test_edge_values_as_json_writes_them() -> None:
    """Subclasses of int and str; floats equal to booleans (0.0 == False)."""
    value = {
        "levels": [Level.LOW, 2],
        "name": Name.A,
        "nested": [[1, 2], [], {}],
        "floats": [0.0, 1.0, -0.0],
        "flags": [True, False, None, 0, 1],
    }
    assert Artifact.json("x.json", value).data.decode("utf-8") == by_json(value)
