"""The TOML loader: data as tomllib reads it, positions for every pointer, located errors."""

from __future__ import annotations

import datetime
import math
import re
import tomllib
from collections.abc import Iterator

import pytest
import tomlkit
from hypothesis import given, settings
from hypothesis import strategies as st
from tomlkit.exceptions import KeyAlreadyPresent, TOMLKitError

from mdc.errors import SpecError, join_pointer
from mdc.loaders import MAX_DEPTH, LoadedDocument, load_text
from mdc.loaders.toml import parse

CORPUS = {
    "scalars": """\
# a comment line
title = "mdc"   # trailing comment
count = 42
neg = -17
big = 1_000_000
hex = 0xDEAD_beef
oct = 0o755
bin = 0b1101
ratio = 0.5
exp = -6.626e-34
inf = +inf
yes = true
no = false
empty = ""
""",
    "tables": """\
[server]
host = "localhost"

[a.b."quoted key"]
x = 1

[ spaced . 'lit.key' ]
y = 2

[server.tls]
enabled = true
""",
    "array_of_tables": """\
[[jobs]]
name = "first"

[jobs.env]
A = "1"

[[jobs]]
name = "second"

[[jobs.steps]]
run = "x"

[[jobs.steps]]
run = "y"
""",
    "dotted": """\
a.b.c = 1
a.b.d = 2
site."google.com" = true
"quoted".bare = 3
[tbl]
x.y = "z"
x.w = 'v'
[deep.er.est]
""",
    "tricky_strings": '''\
eq = "a = b"
hash = "# not a comment"
brackets = "[table] {inline}"
lit = 'C:\\path\\[x] = #'
escaped = "tab\\there \\"quoted\\" \\u00e9"
multi = """
[not.a.table]
key = "value" # still a string
"""
multi_lit = \'\'\'
{ not = "inline" }
\'\'\'
quotes_at_end = """ends with two quotes"""""
lit_quotes = \'\'\'it's\'\'\'
after = 1
''',
    "inline_and_arrays": """\
point = {x = 1, y = 2}
nested = {a = 1, b = {c = 2, d = [3, 4]}}
dotted_inline = {p.q = 1, p.r = 2}
empty_inline = {}
numbers = [
  1,   # one
  2,
  # a comment line inside
  3,
]
nested_arrays = [[1, 2], [], ["a", ["b"]]]
points = [{x = 1}, {x = 2, y = {z = 3}}]
mixed = [ "a" , 'b' , \"\"\"c\"\"\" ]
""",
    "dates": """\
odt = 1979-05-27T07:32:00Z
odt_space = 1979-05-27 07:32:00.999999-07:00
ldt = 1979-05-27T00:32:00
ld = 1979-05-27
lt = 07:32:00.5
in_array = [1979-05-27, 1980-01-01 00:00:00]
""",
    "pointer_escapes": """\
"a/b" = 1
"t~x" = 2
["s/l"."~"]
k = 3
""",
    "whitespace": "a=1\n\tb\t=\t2\n[ t ]\nc =3  \n   d= [1,2 ,3]\n\n\n",
    "crlf": "a = 1\r\n[t]\r\nb = [\r\n  1,\r\n  2,\r\n]\r\n",
    "empty": "",
    "only_comments": "# nothing\n\n# at all\n",
}


class ReadsAs:
    """Equal to a text that TOML reads as the date or time ``value``."""

    def __init__(self, value: datetime.date | datetime.time) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, str) and tomllib.loads(f"v = {other}")["v"] == self.value

    def __repr__(self) -> str:
        return f"ReadsAs({self.value!r})"


def plain(value: object) -> object:
    """tomllib's result with dates as text that reads as the same date, like the loader's."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, (datetime.date, datetime.time)):
        return ReadsAs(value)
    return value


def walk(value: object, path: tuple[str | int, ...] = ()) -> Iterator[tuple[str, object, bool]]:
    """(pointer, value, is an object member) for every node."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield join_pointer(path + (k,)), v, True
            yield from walk(v, path + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield join_pointer(path + (i,)), v, False
            yield from walk(v, path + (i,))


def rest_of_line(text: str, pos: tuple[int, int]) -> str:
    line, col = pos
    return text.split("\n")[line - 1][col - 1 :]


_KEY = re.compile(r""""(?:[^"\\]|\\.)*"|'[^']*'|[A-Za-z0-9_-]+""")
_TOKEN = re.compile(r"\d{4}-\d{2}-\d{2}[ Tt]\d{2}:\d{2}[^\s,\]}#]*|[^\s,\]}#]+")


def check_value_token(rest: str, value: object) -> None:
    """The text at a value's position is that value (or, for a table, its name)."""
    if isinstance(value, str):
        assert rest[:1] in ('"', "'"), rest
    elif isinstance(value, (dict, list)):
        # inline / array literal, or the name in a header or dotted key
        assert re.match(r"[\[{\"'A-Za-z0-9_-]", rest), rest
    else:
        m = _TOKEN.match(rest)
        assert m is not None, rest
        reread = tomllib.loads(f"v = {m.group()}")["v"]
        assert reread == value or (isinstance(value, float) and math.isnan(value)), rest


def check_source_map(doc: LoadedDocument, text: str, raw: object) -> None:
    assert doc.values[""] == (1, 1)
    for pointer, value, member in walk(raw):
        assert pointer in doc.values, pointer
        check_value_token(rest_of_line(text, doc.values[pointer]), value)
        if member:
            assert pointer in doc.keys, pointer
            key = pointer.rsplit("/", 1)[1].replace("~1", "/").replace("~0", "~")
            m = _KEY.match(rest_of_line(text, doc.keys[pointer]))
            assert m is not None, pointer
            assert tomllib.loads(f"{m.group()} = 0") == {key: 0}, (pointer, m.group())


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_corpus_data_and_positions(name: str) -> None:
    text = CORPUS[name]
    raw = tomllib.loads(text)
    doc = parse(text, "spec.toml")
    assert doc.data == plain(raw)
    assert doc.path == "spec.toml"
    check_source_map(doc, text, raw)


def test_data_is_plain_builtins() -> None:
    doc = parse(CORPUS["dates"] + CORPUS["scalars"], "spec.toml")
    for _, value, _ in walk(doc.data):
        assert type(value) in (dict, list, str, int, float, bool)
    assert doc.data["ld"] == "1979-05-27"  # type: ignore[index]


def test_dates_and_times_keep_the_text_written() -> None:
    # each is the text of the source, not Python's isoformat() of what tomllib read (which
    # was "1979-05-27T07:32:00+00:00", "07:32:00.500000", a "T" for the space...)
    doc = parse(CORPUS["dates"], "spec.toml")
    assert doc.data == {
        "odt": "1979-05-27T07:32:00Z",
        "odt_space": "1979-05-27 07:32:00.999999-07:00",
        "ldt": "1979-05-27T00:32:00",
        "ld": "1979-05-27",
        "lt": "07:32:00.5",
        "in_array": ["1979-05-27", "1980-01-01 00:00:00"],
    }
    # on the thorough path too (a newline in an inline table is TOML 1.1: tomllib refuses it)
    text = "env = {\n  START = 1979-05-27t07:32:00z,\n  T = 07:32:00.123456789 }\n"
    doc = parse(text, "spec.toml")
    assert doc.data == {"env": {"START": "1979-05-27t07:32:00z", "T": "07:32:00.123456789"}}


def test_documented_positions() -> None:
    doc = parse(CORPUS["array_of_tables"], "s.toml")
    # a header: the value at the start of the name, the key at its last part
    assert doc.values["/jobs/0/env"] == (4, 2)
    assert doc.keys["/jobs/0/env"] == (4, 7)
    # an array of tables: each element at its own header
    assert doc.values["/jobs"] == (1, 3)
    assert doc.values["/jobs/1"] == (7, 3)
    assert doc.values["/jobs/1/steps/1"] == (13, 3)
    # implicit tables from dotted keys: their first key token
    doc = parse(CORPUS["dotted"], "s.toml")
    assert doc.values["/a"] == doc.keys["/a"] == (1, 1)
    assert doc.values["/a/b"] == (1, 3)
    assert doc.values["/a/b/c"] == (1, 9)
    assert doc.keys["/a/b/d"] == (2, 5)
    assert doc.keys["/site/google.com"] == (3, 6)
    assert doc.values["/tbl/x"] == (6, 1)


def test_implicit_table_made_explicit_moves_to_its_header() -> None:
    doc = parse("[a.b]\nx = 1\n[a]\ny = 2\n", "s.toml")
    assert doc.values["/a"] == (3, 2)


def test_toml_1_1_inline_tables_spanning_lines() -> None:
    text = "t = {\n  a = 1,  # one\n  b = [2],\n}\n"
    doc = parse(text, "s.toml")
    assert doc.data == {"t": {"a": 1, "b": [2]}}
    assert doc.keys["/t/b"] == (3, 3)
    assert doc.values["/t/b/0"] == (3, 8)


def single(exc: pytest.ExceptionInfo[SpecError]) -> tuple[str, int | None, int | None, str]:
    (diag,) = exc.value.diagnostics
    return diag.code, diag.location.line, diag.location.column, diag.message


@pytest.mark.parametrize(
    ("text", "line", "col"),
    [
        ("a = \n", 1, 5),
        ("a = 1\nb = ?\n", 2, 5),
        ("a = 1\n\tb = 'x\n", 2, 8),
        ("[t\nx = 1\n", 1, 3),
        ("a = 1 2\n", 1, 7),
    ],
)
def test_syntax_errors_are_located(text: str, line: int, col: int) -> None:
    with pytest.raises(SpecError) as exc:
        parse(text, "s.toml")
    code, got_line, got_col, message = single(exc)
    assert (code, got_line, got_col) == ("MDC001", line, col)
    assert " at line " not in message
    assert exc.value.diagnostics[0].location.path == "s.toml"


def test_end_of_file_error_points_at_the_end() -> None:
    with pytest.raises(SpecError) as exc:
        parse("a = 1\nb = [1,\n", "s.toml")
    assert single(exc) == ("MDC001", 3, 1, "unexpected end of file")


DUPLICATES = [
    # text, pointer, second occurrence, first occurrence
    ("a = 1\nb = 2\na = 3\n", "/a", (3, 1), (1, 1)),
    ('"a" = 1\na = 2\n', "/a", (2, 1), (1, 1)),
    ("[t]\nx = 1\n[t]\n", "/t", (3, 2), (1, 2)),
    ("[t]\nx = 1\nx = 2\n", "/t/x", (3, 1), (2, 1)),
    ("t = {a = 1, a = 2}\n", "/t/a", (1, 13), (1, 6)),
    ("t = {p.a = 1, p.a = 2}\n", "/t/p/a", (1, 17), (1, 8)),
    ("a.b = 1\na.b = 2\n", "/a/b", (2, 3), (1, 3)),
    ("a = 1\na.b = 2\n", "/a", (2, 1), (1, 1)),
    ("[fruit.apple]\nt = 1\n[fruit]\napple.color = 1\n", "/fruit/apple", (4, 1), (1, 8)),
    ("[a]\nb.c = 1\n[a.b]\n", "/a/b", (3, 4), (2, 1)),
    ("[[a]]\nx = 1\n[a]\n", "/a", (3, 2), (1, 3)),
    ("a = []\n[[a]]\n", "/a", (2, 3), (1, 1)),
    ("a = {b = 1}\n[a.c]\n", "/a", (2, 2), (1, 1)),
    ("[[a]]\nx = 1\nx = 2\n", "/a/0/x", (3, 1), (2, 1)),
    ("[x.y]\n[x]\n[x]\n", "/x", (3, 2), (2, 2)),
    ('["s/l"]\n"~" = 1\n"~" = 2\n', "/s~1l/~0", (3, 1), (2, 1)),
    # tomlkit 0.13-0.15 accepts this one; the scanner does not
    ("x.a = 1\n[x.b]\n[x]\n", "/x", (3, 2), (1, 1)),
]


@pytest.mark.parametrize(("text", "pointer", "second", "first"), DUPLICATES)
def test_duplicates_name_both_occurrences(
    text: str, pointer: str, second: tuple[int, int], first: tuple[int, int]
) -> None:
    with pytest.raises(tomllib.TOMLDecodeError):
        tomllib.loads(text)  # the case really is invalid TOML
    with pytest.raises(SpecError) as exc:
        parse(text, "s.toml")
    (diag,) = exc.value.diagnostics
    assert diag.code == "MDC002"
    assert (diag.location.line, diag.location.column) == second
    assert diag.location.pointer == pointer
    assert diag.hint is not None and f"line {first[0]}, column {first[1]}" in diag.hint


def test_unlocated_tomlkit_duplicate_still_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    """When tomlkit and the scanner disagree, tomlkit's complaint stands, as MDC002."""

    def reject(text: str) -> None:
        raise KeyAlreadyPresent("a")

    def refuse(text: str) -> None:  # tomlkit is asked only about what tomllib refused
        raise tomllib.TOMLDecodeError("refused")

    monkeypatch.setattr(tomllib, "loads", refuse)
    monkeypatch.setattr(tomlkit, "parse", reject)
    with pytest.raises(SpecError) as exc:
        parse("a = 1\n", "s.toml")
    assert single(exc) == ("MDC002", None, None, 'Key "a" already exists.')


@pytest.mark.parametrize(
    ("fmt", "text"),
    [
        ("toml", "a = " + "[" * 200 + "]" * 200 + "\n"),
        ("json", '{"a": ' + "[" * 200 + "]" * 200 + "}"),
        ("yaml", "a: " + "[" * 200 + "]" * 200 + "\n"),
    ],
)
def test_nesting_limit_is_a_syntax_error(fmt: str, text: str) -> None:
    """Every format has the same limit, though tomllib and json read far deeper."""
    with pytest.raises(SpecError) as exc:
        load_text(text, f"s.{fmt}", fmt)
    (diag,) = exc.value.diagnostics
    assert diag.code == "MDC001" and diag.message == f"nesting deeper than {MAX_DEPTH} levels"
    assert diag.location.line == 1


def test_nesting_at_the_limit_is_read() -> None:
    """The document is level 0, a's outer list level 1, its innermost list level 64."""
    text = "a = " + "[" * MAX_DEPTH + "]" * MAX_DEPTH + "\n"
    assert load_text(text, "s.toml", "toml").data == {"a": _nested(MAX_DEPTH)}
    deeper = "a = " + "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1) + "\n"
    with pytest.raises(SpecError) as exc:
        load_text(deeper, "s.toml", "toml")
    assert exc.value.diagnostics[0].location.pointer == "/a" + "/0" * MAX_DEPTH


def _nested(depth: int) -> object:
    return [] if depth == 1 else [_nested(depth - 1)]


KEYS = st.text(alphabet="ab_-. /~\"'é#=", max_size=5)
SCALARS = (
    st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False)
    | st.text(alphabet="ab \"'\\\n\t#=[]{}é", max_size=8)
)
DATA = st.dictionaries(
    KEYS,
    st.recursive(
        SCALARS,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEYS, inner, max_size=3),
        max_leaves=12,
    ),
    max_size=4,
)


@settings(max_examples=100, deadline=None)
@given(DATA)
def test_round_trip_through_tomlkit_dumps(data: dict[str, object]) -> None:
    text = tomlkit.dumps(data)
    raw = tomllib.loads(text)
    doc = parse(text, "s.toml")
    assert doc.data == raw
    check_source_map(doc, text, raw)


PARTS = st.sampled_from(["a", "b", '"a"', "'b'", "c"])
KEY_PATH = st.lists(PARTS, min_size=1, max_size=3).map(".".join)
INLINE = st.recursive(
    st.just("1"),
    lambda inner: (
        st.lists(inner, max_size=2).map(lambda xs: "[" + ", ".join(xs) + "]")
        | st.lists(st.tuples(KEY_PATH, inner), max_size=3).map(
            lambda kvs: "{" + ", ".join(f"{k} = {v}" for k, v in kvs) + "}"
        )
    ),
    max_leaves=5,
)
STATEMENT = (
    KEY_PATH.map(lambda k: f"[{k}]")
    | KEY_PATH.map(lambda k: f"[[{k}]]")
    | st.tuples(KEY_PATH, INLINE).map(lambda kv: f"{kv[0]} = {kv[1]}")
)


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(st.lists(STATEMENT, min_size=1, max_size=6).map("\n".join))
def test_redefinition_rules_match_tomllib(text: str) -> None:
    """Every document tomllib rejects is rejected; every one both libraries accept loads."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        with pytest.raises(SpecError):
            parse(text, "s.toml")
        return
    try:
        tomlkit.parse(text).unwrap()
    except TOMLKitError:  # tomlkit rejects a few valid documents; not ours to judge
        return
    doc = parse(text, "s.toml")
    assert doc.data == raw
    check_source_map(doc, text, raw)
