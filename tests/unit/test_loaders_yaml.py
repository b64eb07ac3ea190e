"""The YAML loader: YAML 1.2 data, positions, and errors with locations."""

from __future__ import annotations

import pytest
from tests.tools import spec_data

from mdc.errors import SpecError
from mdc.loaders import LoadedDocument, load_text

TEXT = """\
job:
  name: demo
  command: [python, train.py]
  env:
    FLAG: yes
distributed:
  nnodes: 2
  port: 0o17
  when: 2024-01-02
"""


def parse(text: str) -> LoadedDocument:
    return load_text(text, "spec.yaml", "yaml")


def test_yaml_12_scalars_stay_what_they_say() -> None:
    data = spec_data(parse(TEXT))
    assert data["job"]["env"]["FLAG"] == "yes"  # YAML 1.1 would make it True
    assert data["distributed"]["port"] == 15 and type(data["distributed"]["port"]) is int
    assert data["distributed"]["when"] == "2024-01-02"
    assert data["job"]["command"] == ["python", "train.py"]


@pytest.mark.parametrize(
    ("pointer", "token"),
    [
        ("/job", "job"),
        ("/job/name", "name"),
        ("/distributed/nnodes", "nnodes"),
    ],
)
def test_keys_point_at_their_text(pointer: str, token: str) -> None:
    doc = parse(TEXT)
    line, col = doc.keys[pointer]
    assert TEXT.splitlines()[line - 1][col - 1 :].startswith(token)


@pytest.mark.parametrize(
    ("pointer", "token"),
    [
        ("/job/name", "demo"),
        ("/job/command/1", "train.py"),
        ("/distributed/nnodes", "2"),
    ],
)
def test_values_point_at_their_text(pointer: str, token: str) -> None:
    doc = parse(TEXT)
    line, col = doc.values[pointer]
    assert TEXT.splitlines()[line - 1][col - 1 :].startswith(token)


def test_every_pointer_is_located() -> None:
    doc = parse(TEXT)

    def walk(value: object, pointer: str) -> None:
        assert pointer in doc.values
        if isinstance(value, dict):
            for key, child in value.items():
                assert f"{pointer}/{key}" in doc.keys
                walk(child, f"{pointer}/{key}")
        elif isinstance(value, list):
            for index, child in enumerate(value):
                walk(child, f"{pointer}/{index}")

    walk(doc.data, "")


def test_duplicate_key_is_located_at_the_second() -> None:
    with pytest.raises(SpecError) as info:
        parse("a: 1\nb: 2\na: 3\n")
    (d,) = info.value.diagnostics
    assert (d.code, d.location.line, d.location.column) == ("MDC002", 3, 1)
    assert "'a'" in d.message and d.hint


def test_syntax_error_is_located() -> None:
    with pytest.raises(SpecError) as info:
        parse("a:\n  b: [1, 2\n")
    (d,) = info.value.diagnostics
    assert d.code == "MDC001" and d.location.line is not None


def test_several_documents_are_refused() -> None:
    with pytest.raises(SpecError, match="problem"):
        parse("a: 1\n---\nb: 2\n")


def test_deep_nesting_is_refused_not_a_crash() -> None:
    with pytest.raises(SpecError):
        parse("a: " + "[" * 200 + "]" * 200 + "\n")


@pytest.mark.parametrize("text", ["? {a: 1}\n: 2\n", "? [a]\n: 1\n", "? :\n"])
def test_complex_keys_are_located_errors(text: str) -> None:
    with pytest.raises(SpecError) as info:
        parse(text)
    assert info.value.diagnostics[0].code == "MDC001"


def test_parser_failures_are_syntax_errors_not_crashes() -> None:
    with pytest.raises(SpecError) as info:
        parse("!!set ")  # ruamel raises AttributeError here
    assert info.value.diagnostics[0].code == "MDC001"


MERGES = """\
a: &a
  x: 1
b: &b
  y: two
c:
  <<: [*a, *b]
  z: 3
d:
  <<: *a
"""


def test_merge_keys_are_read_and_located_where_the_values_are_written() -> None:
    """A member merged in with ``<<`` has the position it has in its anchored mapping."""
    doc = load_text(MERGES, "m.yaml", "yaml")
    assert doc.data == {
        "a": {"x": 1},
        "b": {"y": "two"},
        "c": {"x": 1, "y": "two", "z": 3},
        "d": {"x": 1},
    }
    assert doc.values["/c/x"] == doc.values["/d/x"] == doc.values["/a/x"] == (2, 6)
    assert doc.keys["/c/y"] == doc.keys["/b/y"] == (4, 3)
    assert doc.values["/c/z"] == (7, 6)


def test_escaped_surrogate_pairs_are_joined_and_unpaired_ones_refused() -> None:
    """JSON writes a character beyond U+FFFF as an escaped pair; as YAML it reads the same."""
    doc = load_text('a: "\\ud83d\\ude00"\n"\\ud800\\udc00": b\n', "s.yaml", "yaml")
    assert doc.data == {"a": "\U0001f600", "\U00010000": "b"}
    with pytest.raises(SpecError) as exc:
        load_text('a:\n  b: "x\\udc00"\n', "s.yaml", "yaml")
    (diag,) = exc.value.diagnostics
    assert (diag.code, diag.location.pointer, diag.location.line) == ("MDC001", "/a/b", 2)


def _by_newline(text: str, index: int) -> tuple[int, int]:
    """The 1-based line and column of ``text[index]`` when only "\\n" ends a line."""
    return text.count("\n", 0, index) + 1, index - text.rfind("\n", 0, index)


def test_positions_count_newlines_where_yaml_breaks_lines_otherwise() -> None:
    # YAML also ends a line at a lone CR: mdc's file:line:col counts "\n" as the JSON and
    # TOML loaders and editors do, so every position stays in the text
    text = "a: 1\rb: 2\nc: 3\n"
    doc = parse(text)
    assert doc.data == {"a": 1, "b": 2, "c": 3}
    for key in "abc":
        assert doc.keys[f"/{key}"] == _by_newline(text, text.index(f"{key}:"))
        assert doc.values[f"/{key}"] == _by_newline(text, text.index(f"{key}:") + 3)


@pytest.mark.parametrize("brk", ["\r", "\x85", "\u2028"])
def test_an_error_after_a_yaml_only_break_is_located_in_the_text(brk: str) -> None:
    # a lone CR breaks a YAML 1.2 line; NEL and LS broke 1.1's, and the parser still counts
    # them in its marks
    broken = f"a: 1{brk}b: [1\n"
    with pytest.raises(SpecError) as caught:
        parse(broken)
    lines = broken.split("\n")
    for d in caught.value.diagnostics:
        line, column = d.location.line, d.location.column
        assert line is not None and column is not None
        assert 1 <= line <= len(lines) and 1 <= column <= len(lines[line - 1]) + 1
