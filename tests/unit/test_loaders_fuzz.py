"""Every loader, fed arbitrary or near-miss text, parses or raises a located SpecError."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mdc.errors import SpecError
from mdc.loaders import load_text


def near(tokens: list[str]) -> st.SearchStrategy[str]:
    """Text built from a format's own punctuation, to reach deep into its parser."""
    return st.lists(st.sampled_from(tokens), max_size=40).map("".join)


#: per format: tokens that make near-miss documents of that format
TOKENS = {
    "json": [*'{}[]:,"\\ \n1-.eE', "true", "null", "NaN", "-Infinity", '"a"', '"\\u', "d800"],
    "toml": [*"ab1 .=\"'[]{},#\n\t-:\\", '"""', "'''", "[[", "]]", "a = ", "\n[t]\n"],
    "yaml": [*"ab1 :-[]{},#&*!|>'\"\n\t", "a: ", "- ", "---", "? ", "!!str ", "&x ", "*x"],
}


def assert_parses_or_located_error(text: str, fmt: str) -> None:
    try:
        load_text(text, f"s.{fmt}", fmt)
    except SpecError as exc:
        lines = text.split("\n")
        for diag in exc.diagnostics:
            line, col = diag.location.line, diag.location.column
            if line is not None:
                assert 1 <= line <= len(lines)
                assert col is not None and 1 <= col <= len(lines[line - 1]) + 1


@pytest.mark.slow
@pytest.mark.parametrize("fmt", sorted(TOKENS))
@settings(max_examples=300, deadline=None)
@given(text=st.text())
def test_random_text_never_escapes(fmt: str, text: str) -> None:
    assert_parses_or_located_error(text, fmt)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", sorted(TOKENS))
@settings(max_examples=400, deadline=None)
@given(data=st.data())
def test_near_miss_text_never_escapes(fmt: str, data: st.DataObject) -> None:
    assert_parses_or_located_error(data.draw(near(TOKENS[fmt])), fmt)
