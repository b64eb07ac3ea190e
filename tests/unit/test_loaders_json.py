"""The JSON loader: data as json.loads reads it, positions for every pointer, located errors."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mdc.errors import SpecError, join_pointer
from mdc.loaders import LoadedDocument
from mdc.loaders.json import parse

CORPUS = {
    "object": '{"name": "mdc", "count": 3, "ratio": 0.25, "on": true, "off": false, "none": null}',
    "pretty": json.dumps({"a": {"b": [1, 2, {"c": "d"}]}, "e": [], "f": {}}, indent=2),
    "tabs_and_crlf": '{\r\n\t"a" :\t[ 1 ,\r\n\t\t2 ] ,\r\n\t"b" : { }\r\n}',
    "numbers": "[0, -0, 1.5, -2e10, 3E-2, 12345678901234567890, 1.0e+3]",
    "strings": r'["plain", "esc \" \\ \/ \b \f \n \r \t", "\u00e9\ud83d\ude00", "a,b:c{d}[e]", ""]',
    "pointer_escapes": '{"a/b": {"~": 1, "~1": 2}, "": {"": 0}}',
    "nested_arrays": "[[[]], [[1], [2, [3]]], []]",
    "top_scalar_string": '  "just a string"  ',
    "top_scalar_number": "\n\n  42\n",
    "top_null": "null",
    "unicode": '{"clé": "värde", "ключ": ["日本"]}',
}


def walk(value: object, path: tuple[str | int, ...] = ()) -> Iterator[tuple[str, object, bool]]:
    """(pointer, value, is an object member) for every node below the root."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield join_pointer(path + (k,)), v, True
            yield from walk(v, path + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield join_pointer(path + (i,)), v, False
            yield from walk(v, path + (i,))


def offset_of(text: str, pos: tuple[int, int]) -> int:
    line, col = pos
    return sum(len(chunk) + 1 for chunk in text.split("\n")[: line - 1]) + col - 1


def decoded_at(text: str, pos: tuple[int, int]) -> object:
    """The JSON value that starts at ``pos``."""
    return json.JSONDecoder().raw_decode(text, offset_of(text, pos))[0]


def check_source_map(doc: LoadedDocument, text: str) -> None:
    assert decoded_at(text, doc.values[""]) == doc.data
    for pointer, value, member in walk(doc.data):
        assert decoded_at(text, doc.values[pointer]) == value, pointer
        if member:
            key = pointer.rsplit("/", 1)[1].replace("~1", "/").replace("~0", "~")
            assert decoded_at(text, doc.keys[pointer]) == key, pointer
        else:
            assert pointer not in doc.keys


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_corpus_data_and_positions(name: str) -> None:
    text = CORPUS[name]
    doc = parse(text, "spec.json")
    assert doc.data == json.loads(text)
    assert doc.path == "spec.json"
    check_source_map(doc, text)


def test_explicit_positions() -> None:
    text = '{\n  "a": [10,\n        {"b": null}]\n}'
    doc = parse(text, "s.json")
    assert doc.values == {
        "": (1, 1),
        "/a": (2, 8),
        "/a/0": (2, 9),
        "/a/1": (3, 9),
        "/a/1/b": (3, 15),
    }
    assert doc.keys == {"/a": (2, 3), "/a/1/b": (3, 10)}


def test_root_is_located_at_its_first_token() -> None:
    assert parse("\n  [1]", "s.json").values[""] == (2, 3)


def single(exc: pytest.ExceptionInfo[SpecError]) -> tuple[str, int | None, int | None, str]:
    (diag,) = exc.value.diagnostics
    return diag.code, diag.location.line, diag.location.column, diag.message


@pytest.mark.parametrize(
    ("text", "line", "col"),
    [
        ("", 1, 1),
        ('{"a": }', 1, 7),
        ('{\n  "a": 1,\n}', 3, 1),
        ("[1, 2\n", 2, 1),
        ('{"a" 1}', 1, 6),
        ("[1] [2]", 1, 5),
        ("[01]", 1, 3),
        ("{'a': 1}", 1, 2),
        ('["tab\tinside"]', 1, 6),
    ],
)
def test_syntax_errors_are_located(text: str, line: int, col: int) -> None:
    with pytest.raises(SpecError) as exc:
        parse(text, "s.json")
    code, got_line, got_col, _ = single(exc)
    assert (code, got_line, got_col) == ("MDC001", line, col)
    assert exc.value.diagnostics[0].location.path == "s.json"


@pytest.mark.parametrize(
    ("text", "pointer", "line", "col"),
    [
        ("[1, NaN]", "/1", 1, 5),
        ('{"x":\n  Infinity}', "/x", 2, 3),
        ('{"y": [-Infinity]}', "/y/0", 1, 8),
    ],
)
def test_nan_and_infinity_are_rejected(text: str, pointer: str, line: int, col: int) -> None:
    with pytest.raises(SpecError) as exc:
        parse(text, "s.json")
    code, got_line, got_col, message = single(exc)
    assert (code, got_line, got_col) == ("MDC001", line, col)
    assert "not valid JSON" in message
    assert exc.value.diagnostics[0].location.pointer == pointer


@pytest.mark.parametrize("surrogate", ["\\ud800", "\ud800"])  # escaped, or the character
def test_unpaired_surrogate_is_rejected(surrogate: str) -> None:
    with pytest.raises(SpecError) as exc:
        parse('{"k": ["ok", "' + surrogate + '"]}', "s.json")
    assert single(exc)[:3] == ("MDC001", 1, 14)


DUPLICATES = [
    # text, pointer, second occurrence, first occurrence
    ('{"a": 1, "a": 2}', "/a", (1, 10), (1, 2)),
    ('{\n  "a": 1,\n  "b": 2,\n  "a": 3\n}', "/a", (4, 3), (2, 3)),
    ('[{"x": {"k": 1, "k": 2}}]', "/0/x/k", (1, 17), (1, 9)),
    ('{"\\u0061": 1, "a": 2}', "/a", (1, 15), (1, 2)),
    ('{"a/b": 1, "a/b": 2}', "/a~1b", (1, 12), (1, 2)),
]


@pytest.mark.parametrize(("text", "pointer", "second", "first"), DUPLICATES)
def test_duplicates_name_both_occurrences(
    text: str, pointer: str, second: tuple[int, int], first: tuple[int, int]
) -> None:
    with pytest.raises(SpecError) as exc:
        parse(text, "s.json")
    (diag,) = exc.value.diagnostics
    assert diag.code == "MDC002"
    assert (diag.location.line, diag.location.column) == second
    assert diag.location.pointer == pointer
    assert diag.hint is not None and f"line {first[0]}, column {first[1]}" in diag.hint


def test_syntax_error_before_an_unclosed_duplicate_wins() -> None:
    with pytest.raises(SpecError) as exc:
        parse('{"a": 1, "a": 2,', "s.json")
    assert single(exc)[0] == "MDC001"


def test_deep_nesting_is_a_syntax_error() -> None:
    with pytest.raises(SpecError) as exc:
        parse("[" * 100_000 + "]" * 100_000, "s.json")
    assert exc.value.diagnostics[0].code == "MDC001"


DATA = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=6),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=15,
)


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(DATA, st.sampled_from([None, 0, 2, "\t"]), st.booleans())
def test_round_trip_through_json_dumps(
    data: object, indent: int | str | None, ascii_only: bool
) -> None:
    text = json.dumps(data, indent=indent, ensure_ascii=ascii_only)
    doc = parse(text, "s.json")
    assert doc.data == data
    check_source_map(doc, text)
