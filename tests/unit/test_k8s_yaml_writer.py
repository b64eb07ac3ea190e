"""The Kubernetes backends' YAML writer, :func:`k8s_common.dump_yaml`.

It replaced ruamel.yaml's round-trip dumper, which took about a third of the time mdc spent
on a Kubernetes spec. That dumper, as the backends configured it, is kept here as the
oracle (:func:`ruamel_dump`): the new writer must give the same bytes for everything the
backends write (the goldens, every example's documents, ordinary generated data), and for
any data at all, text that a YAML 1.2 reader (ruamel) and a YAML 1.1 reader (PyYAML, whose
quirks kubectl's go-yaml shares: ``yes``/``on`` booleans, ``12:30`` base 60, ``0b1`` ints)
both read back as exactly that data.

Where the new writer deliberately differs from ruamel (:func:`ruamel_differs`):

- a string holding NEL, LINE SEPARATOR or PARAGRAPH SEPARATOR: ruamel writes the character
  raw inside single quotes, where readers fold it (``"a\\x85b"`` read back as ``"a b"``);
  the new writer escapes it in double quotes (``"a\\Nb"``);
- a multi-line string holding DEL or a C1 control: ruamel writes it raw in a literal block,
  which both readers refuse (ReaderError); the new writer double-quotes it;
- lines over ruamel's width (4096): ruamel folds long scalars, the new writer never does;
- ``.5e3``-style floats (YAML 1.2 core schema, and go-yaml): ruamel leaves them plain, the
  new writer quotes them;
- a key such as ``"0\\n"``: ruamel's resolver matches ``0`` before the final line break
  (``$``), so ruamel single-quotes it over two lines; the new writer writes ``"0\\n"``.
"""

from __future__ import annotations

import copy
import io
import re
import subprocess
import sys
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml as pyyaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError
from ruamel.yaml.nodes import ScalarNode
from ruamel.yaml.resolver import VersionedResolver
from ruamel.yaml.scalarstring import LiteralScalarString, SingleQuotedScalarString

from mdc.pipeline import Compiler
from mdc.plugin_manager import load_plugins
from mdc_builtin.backends import k8s_common as k8s

REPO = Path(__file__).resolve().parents[2]
K8S_FILES = (
    "kubernetes/job.yaml",
    "pytorchjob/job.yaml",
    "trainjob/job.yaml",
    "leaderworkerset/lws.yaml",
)

# ---------------------------------------------------------------- the oracle: the old writer

_YAML11 = VersionedResolver(version=(1, 1))


def _ref_yaml11_not_str(text: str) -> bool:
    return str(
        _YAML11.resolve(ScalarNode, text, (True, False))
    ) != "tag:yaml.org,2002:str" or text in ("y", "Y", "n", "N", "=", "<<")


def _ref_literal_safe(text: str) -> bool:
    if any(ch in text for ch in "\r\t\x85\u2028\u2029\ufeff") or any(
        ord(ch) < 32 and ch != "\n" for ch in text
    ):
        return False
    lines = text.split("\n")
    return not any(line != line.rstrip(" ") for line in lines) and not text.startswith((" ", "\n"))


def _ref_prepare(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {
            (
                SingleQuotedScalarString(str(k)) if _ref_yaml11_not_str(str(k)) else str(k)
            ): _ref_prepare(v)
            for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [_ref_prepare(v) for v in value]
    if isinstance(value, str) and "\n" in value and _ref_literal_safe(value):
        return LiteralScalarString(value)
    if isinstance(value, str) and _ref_yaml11_not_str(value):
        return SingleQuotedScalarString(value)
    return value


def ruamel_dump(docs: Sequence[Mapping[str, Any]]) -> str:
    """dump_yaml as it was: ruamel.yaml's round-trip dumper, block style, width 4096."""
    yaml = YAML(typ="rt")
    yaml.default_flow_style = False
    yaml.width = 4096
    yaml.indent(mapping=2, sequence=4, offset=2)
    yaml.explicit_start = True
    out = io.StringIO()
    yaml.dump_all([_ref_prepare(doc) for doc in docs], out)
    return out.getvalue()


#: not printable for YAML (outside c-printable; NEL, LS, PS, BOM), derived here independently
_NOT_PRINTABLE = re.compile(
    "[^\n\x20-\x7e\xa0-\u2027\u202a-\ud7ff\ue000-\ufefe\uff00-\ufffd\U00010000-\U0010ffff]"
)


def ruamel_differs(text: str) -> bool:
    """A string the new writer deliberately writes otherwise than ruamel (module docstring)."""
    return (
        any(ch in text for ch in "\x85\u2028\u2029")
        or ("\n" in text and bool(_NOT_PRINTABLE.search(text)))
        or len(text.encode("unicode_escape")) > 3800  # near ruamel's width, quoted
        or re.fullmatch(r"[-+]?\.[0-9_]+[eE][0-9]+", text) is not None
        or (text.endswith("\n") and _ref_yaml11_not_str(text))
    )


def strings_in(value: Any) -> list[str]:
    if isinstance(value, Mapping):
        return [s for k, v in value.items() for s in (str(k), *strings_in(v))]
    if isinstance(value, (list, tuple)):
        return [s for v in value for s in strings_in(v)]
    return [value] if isinstance(value, str) else []


def read_both(text: str) -> tuple[list[Any], list[Any]]:
    """The documents as a YAML 1.2 reader (ruamel) and a YAML 1.1 reader (PyYAML) see them."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        v12 = [d for d in YAML(typ="safe", pure=True).load_all(text) if d is not None]
    v11 = [d for d in pyyaml.safe_load_all(text) if d is not None]
    return v12, v11


def check(docs: list[dict[str, Any]], *, exact: bool) -> None:
    """Reads back as ``docs`` under both readers; equal to ruamel's text when ``exact`` (or
    when nothing in ``docs`` is a deliberate difference)."""
    text = k8s.dump_yaml(docs)
    v12, v11 = read_both(text)
    assert v12 == docs, text
    assert v11 == docs, text
    if exact or not any(ruamel_differs(s) for s in strings_in(docs)):
        assert text == ruamel_dump(docs)


# ---------------------------------------------------------------- what the backends write


def golden_yaml_files() -> list[Path]:
    return sorted(
        p
        for p in (REPO / "golden").rglob("*.yaml")
        if p.read_text(encoding="utf-8").startswith("---\n")
    )


def test_there_are_kubernetes_goldens() -> None:
    names = {p.relative_to(p.parents[1]).as_posix() for p in golden_yaml_files()}
    assert set(K8S_FILES) <= names


@pytest.mark.parametrize("path", golden_yaml_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_golden_is_written_again_byte_for_byte(path: Path) -> None:
    """Read back a golden Kubernetes file; writing its documents gives the very same bytes,
    as ruamel did."""
    text = path.read_text(encoding="utf-8")
    docs, docs11 = read_both(text)
    assert docs == docs11
    assert k8s.dump_yaml(docs) == text
    assert ruamel_dump(docs) == text


def test_every_examples_documents_match_ruamel(monkeypatch: pytest.MonkeyPatch) -> None:
    """Compile every example and compare each document list the backends hand dump_yaml."""
    captured: list[list[Any]] = []
    real = k8s.dump_yaml

    def spy(docs: Sequence[Mapping[str, Any]]) -> str:
        captured.append(copy.deepcopy(list(docs)))
        return real(docs)

    monkeypatch.setattr(k8s, "dump_yaml", spy)
    monkeypatch.chdir(REPO)
    compiler = Compiler(load_plugins(autoload=False))
    k8s_examples = sorted({p.parts[-3] for p in golden_yaml_files() if p.parts[-4] == "examples"})
    for stem in k8s_examples:
        [spec] = [
            p
            for p in (REPO / "examples").glob(f"{stem}.*")
            if p.suffix in (".toml", ".yaml", ".yml", ".json")
        ]
        compiler.compile(spec.relative_to(REPO))
    assert len(captured) == len(k8s_examples) >= 8
    for docs in captured:
        assert real(docs) == ruamel_dump(docs)
        assert read_both(real(docs)) == (docs, docs)


# ---------------------------------------------------------------- layout and hostile strings

HOSTILE = [
    "",
    " ",
    "  ",
    "x ",
    " x",
    "yes",
    "Yes",
    "no",
    "NO",
    "on",
    "Off",
    "y",
    "Y",
    "n",
    "N",
    "true",
    "False",
    "null",
    "Null",
    "NULL",
    "~",
    "0x1",
    "0x1F",
    "-0x_1",
    "0o7",
    "017",
    "08",
    "0b1",
    "+0b1_0",
    "1_000",
    "_1",
    "+_",
    "12:30",
    "-1:20:30",
    "1:20:30.5",
    "1e3",
    "1E+3",
    "1.",
    "1.5",
    "-1.5e-3",
    ".5",
    "._",
    ".5e3",
    "1.2.3",
    ".",
    "..",
    ".inf",
    "-.Inf",
    "+.INF",
    ".NaN",
    "nan",
    "2001-12-14",
    "2001-12-14 21:59:43.10 -5",
    "2001-12-14t21:59:43.10Z",
    "2001-1-4\t1:59:43",
    "=",
    "<<",
    "---",
    "...",
    "--- x",
    "-",
    "- x",
    "-x",
    "?",
    "? x",
    "?x",
    ":",
    ": x",
    ":x",
    "a:",
    "a: b",
    "a:b",
    "a #b",
    "a#b",
    "#",
    "# x",
    "'",
    "''",
    '"',
    "it's",
    "\\",
    "\\n",
    "&a",
    "*a",
    "!t",
    "!!str x",
    "%",
    "@",
    "`",
    "|",
    ">",
    "{",
    "}",
    "[",
    "]",
    ",",
    "a, b",
    "{a: 1}",
    "[a]",
    "\t",
    "a\tb",
    "\n",
    "\n\n",
    "\r",
    "\r\n",
    "a\rb",
    "\x00",
    "\x07",
    "\x1b",
    "\x7f",
    "\x80",
    "\x85",
    "a\x85b",
    "\u2028",
    "\u2029",
    "\ufeff",
    "\ufffe",
    "\xa0",
    "\xa0x",
    "é",
    "ünï",
    "日本",
    "\U0001f600",
    "a\nb",
    "a\n",
    "a\n\n",
    "a\n\n\n",
    "\na",
    " a\nb",
    "a \nb",
    "a\n b",
    "a\n\nb",
    "a\nb ",
    "a\n\tb",
    "a\n\x7fb",
    "#!/bin/bash\n",
    "x: 1\ny: 2\n",
    "- a\n- b",
    "a\n---\nb",
    "a\n...\n",
    "'q'\n\"q\"\n",
    "%s %n %(x)s",
    "k" * 122,
    "k" * 123,
    "'" * 122,
    "'" * 123,
    "a b " * 40,
    "w" * 5000,
    "word " * 1000,
]


@pytest.mark.parametrize("text", HOSTILE, ids=lambda s: repr(s)[:40])
def test_a_hostile_string_reads_back_wherever_it_stands(text: str) -> None:
    check(
        [{"value": text, "list": [text, [text], {text: text}], text: {"k": [text]}, "after": text}],
        exact=False,
    )


def test_the_layout_of_nested_collections() -> None:
    docs = [
        {
            "a": [[1, 2], [3]],
            "b": [{"c": [1], "d": None}],
            "e": [{}, [], None, ""],
            "f": {},
            "g": [],
            "h": [[[{"x": 1, "y": 2}]]],
            "i": None,
            "j": True,
            "k": -5,
        },
        {},
    ]
    expected = (
        "---\n"
        "a:\n  -   - 1\n      - 2\n  -   - 3\n"
        "b:\n  - c:\n      - 1\n    d:\n"
        "e:\n  - {}\n  - []\n  - \n  - ''\n"
        "f: {}\ng: []\n"
        "h:\n  -   -   - x: 1\n            'y': 2\n"
        "i:\nj: true\nk: -5\n"
        "--- {}\n"
    )
    assert k8s.dump_yaml(docs) == expected
    check(docs, exact=True)


def test_long_and_multi_line_keys_are_explicit() -> None:
    key = "k" * 123
    docs = [{key: {"a": 1}, "m\nn": [1, 2], "z": {key: "x\n", "short": None}}]
    assert k8s.dump_yaml(docs) == (
        f'---\n? {key}\n: a: 1\n? "m\\nn"\n:   - 1\n    - 2\nz:\n  ? {key}\n  : |\n    x\n'
        "  short:\n"
    )
    check(docs, exact=True)


def test_literal_blocks_keep_their_chomping() -> None:
    docs = [{"strip": "a\nb", "clip": "a\nb\n", "keep": "a\n\nb\n\n\n", "end": "x\n\n"}]
    assert k8s.dump_yaml(docs) == (
        "---\nstrip: |-\n  a\n  b\nclip: |\n  a\n  b\nkeep: |+\n  a\n\n  b\n\n\n"
        "end: |+\n  x\n\n...\n"
    )
    check(docs, exact=True)


def test_keys_that_are_not_strings_are_written_as_strings() -> None:
    docs: list[dict[Any, Any]] = [{1: "a", False: "b", None: "c", "d": 2}]
    text = k8s.dump_yaml(docs)
    assert text == "---\n'1': a\n'False': b\nNone: c\nd: 2\n" == ruamel_dump(docs)
    assert read_both(text) == ([{"1": "a", "False": "b", "None": "c", "d": 2}],) * 2
    # keys equal as strings: one entry, where the first stood, with the last value
    docs = [{1: "a", "x": 0, "1": "b"}]
    assert k8s.dump_yaml(docs) == "---\n'1': b\nx: 0\n" == ruamel_dump(docs)


def test_values_it_cannot_write_are_refused() -> None:
    with pytest.raises(TypeError, match="float"):
        k8s.dump_yaml([{"a": 1.5}])


@pytest.mark.parametrize("text", ["a\x85b", "a\u2028b", "a\n\x7fb", "a\n\x80"], ids=repr)
def test_where_ruamel_was_wrong_the_writer_reads_back(text: str) -> None:
    """ruamel's text for these does not read back (or not under both readers)."""
    docs = [{"k": text}]
    assert ruamel_differs(text)
    check(docs, exact=False)
    try:
        old = read_both(ruamel_dump(docs))
    except (YAMLError, pyyaml.YAMLError):  # refused (ReaderError): not what was written
        return
    assert text == "a\u2028b" or old != (docs, docs)


# ---------------------------------------------------------------- generated data

_WORDS = st.sampled_from(HOSTILE)
_TAME_TEXT = st.text(alphabet="abcxyzAZ019 -_./:=@$\"'#{}[],!*&%|>?\n", max_size=30)
_STRINGS = st.one_of(
    _WORDS,
    st.text(max_size=20),
    st.lists(
        st.one_of(_WORDS, st.sampled_from(["a", "1", " ", "\n", ":", "-", "#"])), max_size=6
    ).map("".join),
    _TAME_TEXT,
    st.builds(
        lambda word, count: word * count,
        st.sampled_from(["ab ", "x", "a'b ", "a\nb ", "é ", "-\t"]),
        st.sampled_from([1, 2, 30, 900, 1100]),
    ),
)


def documents(strings: st.SearchStrategy[str]) -> st.SearchStrategy[list[dict[str, Any]]]:
    scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), strings)
    nodes = st.recursive(
        scalars,
        lambda children: st.one_of(
            st.lists(children, max_size=4), st.dictionaries(strings, children, max_size=4)
        ),
        max_leaves=16,
    )
    return st.lists(st.dictionaries(strings, nodes, max_size=5), min_size=1, max_size=3)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(docs=documents(_TAME_TEXT))
def test_ordinary_data_is_written_as_ruamel_did(docs: list[dict[str, Any]]) -> None:
    check(docs, exact=False)  # short strings of a small alphabet: equal to ruamel's bar a
    # rare key such as "0\n"


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(docs=documents(_STRINGS))
def test_any_data_reads_back_under_yaml_1_1_and_1_2(docs: list[dict[str, Any]]) -> None:
    check(docs, exact=False)


# ---------------------------------------------------------------- cost


@pytest.mark.slow
def test_the_backends_do_not_import_ruamel() -> None:
    """Importing the shared module (every Kubernetes backend does) leaves ruamel unloaded."""
    code = (
        "import sys, mdc_builtin.backends.k8s_common\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('ruamel', 'yaml')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]"
