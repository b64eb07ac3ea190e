"""The YAML fast path (libyaml's events) against the thorough path (ruamel.yaml, YAML 1.2).

Differential: whatever the fast path accepts, it must read exactly as ruamel does (the
data with its types, every value's and key's position); where the two might differ it
declines and :func:`parse` gives ruamel's result or diagnostic. Inputs: every YAML file in
the repository, documents hypothesis builds and dumps in many styles, near-miss text, and
one case per reason to decline.
"""

from __future__ import annotations

import importlib.util
import io
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml as pyyaml  # type: ignore[import-untyped,unused-ignore]
from hypothesis import given, settings
from hypothesis import strategies as st
from ruamel.yaml import YAML
from tests.tools import REPO

import mdc.loaders.yaml as loader
from mdc.errors import Diagnostic, SpecError
from mdc.loaders.document import MAX_DEPTH
from mdc.loaders.yaml import MAX_VALUES, parse, parse_thorough, read_fast

Outcome = tuple[object, ...] | list[Diagnostic]


def typed(value: object) -> object:
    """``value`` with the type of every scalar spelled out (so 1 != 1.0 != True)."""
    if isinstance(value, dict):
        return {key: typed(item) for key, item in value.items()}
    if isinstance(value, list):
        return [typed(item) for item in value]
    return type(value).__name__, repr(value)


def outcome(reader: Any, text: str) -> Outcome:
    try:
        doc = reader(text, "spec.yaml")
    except SpecError as exc:
        return list(exc.diagnostics)
    except Exception as exc:  # noqa: BLE001 - ruamel's own crashes (e.g. on "<<") must match too
        return "crash", type(exc).__name__, str(exc)
    return typed(doc.data), dict(doc.values), dict(doc.keys)


def fast(text: str) -> Outcome | None:
    read = read_fast(text)
    return None if read is None else (typed(read[0]), read[1], read[2])


def agrees(text: str) -> bool:
    """Whether the fast path took ``text``; either way, ``parse`` is ruamel's reading."""
    thorough = outcome(parse_thorough, text)
    taken = fast(text)
    if taken is not None:
        assert taken == thorough, text
    assert outcome(parse, text) == thorough
    return taken is not None


# --- every YAML file in the repository ---------------------------------------------------


def repo_yaml() -> list[Path]:
    """Every *.yaml/*.yml outside hidden and virtual-environment directories."""
    found = []
    for path in REPO.rglob("*.y*ml"):
        folders = path.relative_to(REPO).parts[:-1]
        if path.suffix in (".yaml", ".yml") and not any(
            part.startswith(".") or part in ("node_modules", "bench") for part in folders
        ):
            found.append(path)
    return sorted(found)


def documents(text: str) -> list[str]:
    """A multi-document file (the Kubernetes manifests) as one text per document."""
    docs: list[str] = []
    current: list[str] = []
    for line in text.splitlines(keepends=True):
        if line.rstrip() == "---":
            docs.append("".join(current))
            current = []
        else:
            current.append(line)
    return [doc for doc in [*docs, "".join(current)] if doc.strip()]


def test_the_repository_has_yaml_to_compare() -> None:
    names = {path.relative_to(REPO).parts[0] for path in repo_yaml()}
    assert {"examples", "golden"} <= names


@pytest.mark.slow
@pytest.mark.parametrize("path", repo_yaml(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_repository_yaml_reads_the_same(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    taken = agrees(text)
    for doc in documents(text):
        agrees(doc)
    if path.parent.name == "examples":
        assert taken, "the examples are what the fast path is for"


# --- generated documents, dumped in many styles --------------------------------------------

#: strings YAML 1.1 or 1.2 may read as something else, or that stress quoting
TRICKY = [
    "1",
    "-0",
    "007",
    "0o17",
    "0x1F",
    "0b101",
    "1_000",
    "1e3",
    "1.5e3",
    ".5",
    "1.",
    "+1",
    "-1.5",
    ".inf",
    "-.inf",
    ".nan",
    "NaN",
    "yes",
    "no",
    "on",
    "off",
    "y",
    "n",
    "Yes",
    "ON",
    "~",
    "null",
    "Null",
    "NULL",
    "true",
    "True",
    "tRue",
    "FALSE",
    "2024-01-02",
    "2024-1-2 3:04:05",
    "12:30",
    "1:20:30",
    "=",
    "<<",
    "--flag",
    "--tp=8",
    "-x",
    "+x",
    "-",
    "+",
    ".",
    "...",
    "---",
    "- a",
    "#x",
    "a #b",
    "a: b",
    "a:b",
    "'q'",
    '"dq"',
    "\\/",
    "\\",
    "\t",
    " lead",
    "trail ",
    "two\nlines",
    "\n",
    "",
    " ",
    "\u2028",
    "\x85",
    "\ufeff",
    "é",
    "日本",
    "\U0001d11e",
    "64Gi",
    "1F1B",
    "16B",
    "1-00:00:00",
    "1.2.3",
    "%x",
    "@x",
    "`x",
    "!x",
    "&x",
    "*x",
    "?",
    "? x",
    "|",
    ">",
    "[a]",
    "{a}",
    "a,b",
    "0.1",
    "1e-3",
    "1.0e-3",
    "9" * 30,
    "-" + "9" * 30,
]
scalars = st.one_of(
    st.integers(),
    st.floats(),
    st.booleans(),
    st.none(),
    st.text(max_size=12),
    st.sampled_from(TRICKY),
)
keys = st.one_of(st.text(max_size=12), st.sampled_from(TRICKY), st.integers(), st.booleans())
trees = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=4),
    max_leaves=16,
)
specs = st.dictionaries(keys, trees, min_size=1, max_size=5)


def dump_ruamel(data: object, draw: Any) -> str:
    yaml = YAML(typ=draw(st.sampled_from(["rt", "safe"])), pure=True)
    yaml.default_flow_style = draw(st.sampled_from([False, True, None]))
    sequence, offset = draw(st.sampled_from([(2, 0), (4, 2), (3, 1), (4, 0), (6, 3)]))
    yaml.indent(mapping=draw(st.sampled_from([2, 3, 4, 7])), sequence=sequence, offset=offset)
    yaml.width = draw(st.sampled_from([12, 80, 4096]))
    yaml.explicit_start = draw(st.booleans())
    yaml.allow_unicode = draw(st.booleans())
    if draw(st.booleans()):
        yaml.version = (1, 2)
    out = io.StringIO()
    yaml.dump(data, out)
    return out.getvalue()


def dump_pyyaml(data: object, draw: Any) -> str:
    text: str = pyyaml.dump(
        data,
        Dumper=draw(st.sampled_from([pyyaml.Dumper, pyyaml.CDumper])),
        default_flow_style=draw(st.sampled_from([False, True, None])),
        default_style=draw(st.sampled_from([None, None, "'", '"', "|", ">"])),
        allow_unicode=draw(st.booleans()),
        width=draw(st.sampled_from([12, 80, 4096])),
        indent=draw(st.sampled_from([2, 3, 4, 7])),
        explicit_start=draw(st.booleans()),
        explicit_end=draw(st.booleans()),
        canonical=draw(st.sampled_from([False] * 5 + [True])),
        sort_keys=False,
    )
    return text


def decorate(text: str, seed: int) -> str:
    """Comments on lines of their own and after values, and sometimes CRLF line ends."""
    rng = random.Random(seed)
    lines = text.split("\n")
    out = []
    for line in lines:
        if rng.random() < 0.2:
            out.append(" " * rng.randrange(6) + "# note: a, b [c] {d}")
        if line and rng.random() < 0.2:
            line += rng.choice([" # trailing", "  #", " #: x"])
        out.append(line)
    joined = "\n".join(out)
    return joined.replace("\n", "\r\n") if rng.random() < 0.2 else joined


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(
    data=specs,
    style=st.data(),
    seed=st.integers(0, 2**32),
    pyyaml_dump=st.booleans(),
    comments=st.booleans(),
)
def test_generated_documents_read_the_same(
    data: object, style: st.DataObject, seed: int, pyyaml_dump: bool, comments: bool
) -> None:
    text = (dump_pyyaml if pyyaml_dump else dump_ruamel)(data, style.draw)
    agrees(decorate(text, seed) if comments else text)


#: values a hand-written spec holds; the fast path must take all of these (not None: ruamel
#: writes it as an empty value, which the fast path declines)
ordinary_scalars = st.one_of(
    st.integers(-(10**6), 10**6),
    st.booleans(),
    st.floats(-1e6, 1e6).filter(lambda f: f == 0 or abs(f) > 1e-3),
    st.from_regex(r"[a-z][a-z0-9_./:=-]{0,15}", fullmatch=True),
    st.sampled_from(["yes", "no", "on", "off", "--flag", "64Gi", "1F1B", "1-00:00:00"]),
)
ordinary_keys = st.from_regex(r"[a-z][a-z0-9_-]{0,10}", fullmatch=True)
ordinary_specs = st.dictionaries(
    ordinary_keys,
    st.recursive(
        ordinary_scalars,
        lambda inner: (
            st.lists(inner, max_size=3) | st.dictionaries(ordinary_keys, inner, max_size=3)
        ),
        max_leaves=12,
    ),
    min_size=1,
    max_size=6,
)


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(data=ordinary_specs, flow=st.sampled_from([False, True, None]), seed=st.integers(0, 99))
def test_ordinary_specs_take_the_fast_path(
    data: dict[str, object], flow: bool | None, seed: int
) -> None:
    yaml = YAML(typ="rt", pure=True)
    yaml.default_flow_style = flow
    out = io.StringIO()
    yaml.dump(data, out)
    text = decorate(out.getvalue().replace("\r", ""), seed).replace("\r\n", "\n")
    assert agrees(text), text
    read = read_fast(text)
    assert read is not None and read[0] == data


# --- near-miss text ------------------------------------------------------------------------

NEAR = [
    *"ab1 :-[]{},#&*!|>'\"\n?%.\\~=<+0",
    "a: ",
    "- ",
    "---",
    "...",
    "? ",
    "!!str ",
    "&x ",
    "*x",
    "\r",
    "\r\n",
    "  ",
    "    ",
    "é",
    "\U0001d11e",
    "yes",
    "1.5",
    "-1",
    "1e3",
    "0o7",
    "null",
    "true",
    "|-\n",
    ">+\n",
    ": ",
    ", ",
    "\n  ",
    "\n- ",
    "#c\n",
    " \n",
    '"\\t"',
    "'it''s'",
    '"a\\\nb"',
    "- - ",
    "[[",
    "]]",
    "{a: [b]}",
    "a:b",
    '"\\x41"',
    '"\\N"',
    "\n\n",
    " #x\n",
    "--- |\n",
    "12:30",
    "0x1F",
    ".5",
    "2024-01-02",
    "a : b",
    "\t",
    "\x85",
    "\\/",
]
PREFIXES = [
    "",
    "a: ",
    "a:\n  ",
    "a:\n- ",
    "a: [",
    "a: {",
    "a:\n  - ",
    "a: |\n  ",
    "a: >-\n  ",
    "a:\n  b: ",
]


@pytest.mark.slow
@settings(max_examples=600, deadline=None)
@given(prefix=st.sampled_from(PREFIXES), tokens=st.lists(st.sampled_from(NEAR), max_size=30))
def test_near_miss_text_reads_the_same(prefix: str, tokens: list[str]) -> None:
    agrees(prefix + "".join(tokens))


# --- what the fast path takes, and each reason it declines ---------------------------------


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("0", 0),
        ("-0", 0),
        ("8", 8),
        ("-12", -12),
        ("123456789012345678901234567890", 123456789012345678901234567890),
        ("1.5", 1.5),
        ("-0.25", -0.25),
        ("1.0e-3", 1.0e-3),
        ("2.5E+10", 2.5e10),
        ("-0.0", -0.0),
        ("true", True),
        ("True", True),
        ("TRUE", True),
        ("false", False),
        ("FALSE", False),
        ("~", None),
        ("null", None),
        ("Null", None),
        ("NULL", None),
        ("yes", "yes"),
        ("No", "No"),
        ("on", "on"),
        ("OFF", "OFF"),
        ("y", "y"),
        ("tRue", "tRue"),
        ("nulls", "nulls"),
        ("~x", "~x"),
        ("--flag", "--flag"),
        ("-x", "-x"),
        ("+x", "+x"),
        ("--5", "--5"),
        ("64Gi", "64Gi"),
        ("1F1B", "1F1B"),
        ("16B", "16B"),
        ("1-00:00:00", "1-00:00:00"),
        ("<", "<"),
        ("==", "=="),
        ("'0o17'", "0o17"),
        ('"1e3"', "1e3"),
        ("|\n  0x1F\n", "0x1F\n"),
        (">-\n  yes\n  no\n", "yes no"),
    ],
)
def test_plain_values_the_fast_path_resolves(text: str, value: object) -> None:
    doc = f"key: {text}\n"
    read = read_fast(doc)
    assert read is not None and typed(read[0]) == typed({"key": value})
    assert agrees(doc)


@pytest.mark.parametrize(
    "text",
    [
        "0o17",
        "0x1F",
        "0b101",
        "012",
        "1_000",
        "1e3",
        ".5",
        "1.",
        "+1",
        "+1.5",
        "-.5",
        ".inf",
        "-.inf",
        ".nan",
        "2024-01-02",
        "2024-1-2 3:04:05",
        "=",
        "<<",
        "-",
        "-_",
        "1.2.3",
        "",
    ],
)
def test_plain_values_that_might_resolve_otherwise_are_declined(text: str) -> None:
    doc = f"key: {text}\n"
    assert read_fast(doc) is None
    assert not agrees(doc)


#: shapes the fast path takes: JSON-style flow, CRLF and CR lines, explicit start, trailing
#: commas, block scalars with indicators, escapes, comments, non-ASCII text
TAKEN = [
    '{"a":1,"b":[1,2],"c":{"d":"e"}}\n',
    '{"a": 1, "b": [true, null, "x"]}',
    "a: b\r\nc: d\r\n",
    "a: b\rc: d\r",
    "---\na: 1\n",
    "---\n# c\na: 1\n",
    "a: 1 # c\n#c\n",
    "a: [b, c,]\n",
    "a: {b: c,}\n",
    "a: [b: c]\n",
    "a: {b: [c, {d: e}]}\n",
    "a: [-]\n",
    "a:\n    - 1\n    - 2\nb:\n  - c: 1\n    d: 2\n",
    "a:\n- b\n- c\nd: e\n",
    "a: 'multi\n  line'\n",
    'a: "x\\\n  y"\n',
    "a:  \n  b\n",
    "a: >\n\n  x\n\n  y\n",
    "a: |+\n  x\n\n",
    "a: |2\n   x\n",
    "a: >-\n  x\n   y\n  z\n",
    "a: b # c: d\n",
    "'a''b': 1\n",
    '"a\\tb": 1\n',
    'a: "\\e\\a\\b\\v\\f\\0\\x00\\u00e9\\U0001F600"\n',
    "a: '\u00a0'\n",
    "a: b\u00a0\n",
    "k" * 1000 + ": 1\n",
    "a: " + "x" * 2000 + "\n",
]


@pytest.mark.parametrize("text", TAKEN)
def test_shapes_the_fast_path_takes(text: str) -> None:
    assert agrees(text)


DECLINED = {
    "no document": "",
    "only a comment": "# nothing\n",
    "two documents": "a: 1\n---\nb: 2\n",
    "a document end": "a: 1\n...\n",
    "two document ends": "a:\n  b: c\n... \n... \n",
    "a YAML directive": "%YAML 1.2\n---\na: 1\n",
    "a TAG directive": "%TAG !e! tag:example.com,2000:\n---\na: !e!x 1\n",
    "a standard tag": "a: !!str 1\n",
    "a custom tag": "a: !custom x\n",
    "a set": "a: !!set {x}\n",
    "a tagged root": "!!map {a: 1}\n",
    "binary": "a: !!binary aGk=\n",
    "an anchor": "a: &x 1\n",
    "an alias": "a: &x [1]\nb: *x\n",
    "a sequence as key": "[a, b]: 1\n",
    "a mapping as key": "{a: 1}: x\n",
    "an explicit key": "? a\n: 1\n",
    "a duplicate key": "a: 1\nb: 2\na: 3\n",
    "keys equal once read": "1: a\n1.0: b\n",
    "keys equal as names": "1: a\n'1': b\n",
    "true and 1": "true: a\n1: b\n",
    "a merge": "base: {x: 1}\n<<: {y: 2}\n",
    "a quoted merge": "'<<': 1\n",
    "an empty value": "a:\nb: 1\n",
    "an empty value and a comment": "a: # none\nb: 1\n",
    "an empty entry": "- \n- a\n",
    "a root sequence": "- a\n- b\n",
    "a root scalar": "just text\n",
    "a root block scalar": "|\n#x\n",
    "NEL": "a: b\x85c\n",
    "LINE SEPARATOR": "a: b\u2028c\n",
    "PARAGRAPH SEPARATOR": "a: 'b\u2029c'\n",
    "a BOM inside": "a: \ufeffb\n",
    "the slash escape": 'a: "b\\/c"\n',
    "a tab": "a:\tb\n",
    "a trailing tab": "a: b\t\n",
    "a lone surrogate": "a: \ud800\n",
    "a block header then #": "a: |#\n  x\n",
    "a block scalar's first line of spaces": "a: |\n  \n    x\n",
    "a syntax error": "a: [1, 2\n",
    "a mapping in a scalar": "a: b: c\n",
    "a key over 1024 characters": "k" * 1100 + ": 1\n",
    "a bad escape": 'a: "\\q"\n',
    "a control character": "a: \x07\n",
}


@pytest.mark.parametrize("text", DECLINED.values(), ids=list(DECLINED))
def test_each_reason_to_decline(text: str) -> None:
    assert read_fast(text) is None
    assert outcome(parse, text) == outcome(parse_thorough, text)


def refusal(text: str) -> list[Diagnostic]:
    with pytest.raises(SpecError) as info:
        parse(text, "spec.yaml")
    return list(info.value.diagnostics)


def nested_maps(depth: int) -> str:
    return "".join(" " * level + "a:\n" for level in range(depth)) + " " * depth + "x\n"


def test_nesting_up_to_the_limit_is_taken_and_deeper_declined() -> None:
    assert agrees(nested_maps(MAX_DEPTH))  # the scalar "x" sits at depth MAX_DEPTH
    assert read_fast(nested_maps(MAX_DEPTH + 1)) is None
    [diagnostic] = refusal(nested_maps(MAX_DEPTH + 1))
    assert f"deeper than {MAX_DEPTH}" in diagnostic.message


@pytest.mark.slow
def test_values_up_to_the_limit_are_taken_and_more_declined() -> None:
    def flat(count: int) -> str:  # "" and "/a" and count items
        return "a: [" + ", ".join(["1"] * count) + "]\n"

    read = read_fast(flat(MAX_VALUES - 2))
    assert read is not None and len(read[1]) == MAX_VALUES
    assert read_fast(flat(MAX_VALUES - 1)) is None
    [diagnostic] = refusal(flat(MAX_VALUES - 1))
    assert diagnostic.code == "MDC004"


def test_positions_are_one_based_line_and_column() -> None:
    text = "job:\n  name: demo  # c\n  command: [python, 'train.py']\nenv: {A: \"1\"}\n"
    read = read_fast(text)
    assert read is not None
    _, values, keys = read
    assert values == {
        "": (1, 1),
        "/job": (2, 3),
        "/job/name": (2, 9),
        "/job/command": (3, 12),
        "/job/command/0": (3, 13),
        "/job/command/1": (3, 21),
        "/env": (4, 6),
        "/env/A": (4, 10),
    }
    assert keys == {
        "/job": (1, 1),
        "/job/name": (2, 3),
        "/job/command": (3, 3),
        "/env": (4, 1),
        "/env/A": (4, 7),
    }


def test_columns_count_characters_not_bytes() -> None:
    text = "é\U0001d11e: [日本, x]\n"
    read = read_fast(text)
    assert read is not None and read[1]["/é\U0001d11e/1"] == (1, 10)
    assert agrees(text)


def test_without_libyaml_the_thorough_path_reads_everything(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A fresh copy of the loader, imported where PyYAML has no libyaml (no CBaseLoader)."""
    monkeypatch.delattr(pyyaml, "CBaseLoader")
    spec = importlib.util.spec_from_file_location("mdc_yaml_without_libyaml", loader.__file__)
    assert spec is not None and spec.loader is not None
    copy = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(copy)
    assert copy.CParser is None
    text = "job:\n  name: demo\n  command: [python, train.py]\n"
    assert copy.read_fast(text) is None
    assert outcome(copy.parse, text) == outcome(parse_thorough, text)
    assert read_fast(text) is not None  # the real module still has it


@pytest.mark.slow
def test_the_fast_path_does_not_import_ruamel() -> None:
    probe = (
        "import sys\nfrom mdc.errors import SpecError\nfrom mdc.loaders import load_file\n"
        "load_file(sys.argv[1])\nprint('ruamel.yaml' in sys.modules)\n"
        "try:\n    load_file(sys.argv[2])\nexcept SpecError:\n"
        "    print('ruamel.yaml' in sys.modules)\n"
    )
    bad = REPO / "golden" / "diagnostics" / "duplicate-key-yaml" / "spec.yaml"
    run = subprocess.run(
        [sys.executable, "-c", probe, str(REPO / "examples" / "basic-2x2.yaml"), str(bad)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.stdout.split() == ["False", "True"], run.stderr
