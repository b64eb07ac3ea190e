"""The Kubernetes backends' YAML writer, :func:`_k8s.yaml.dump_yaml` (libyaml's emitter).

What it must do, for everything the backends write and for any data at all: give text that
a YAML 1.2 reader (ruamel) and a YAML 1.1 reader (PyYAML, whose quirks kubectl's go-yaml
shares: ``yes``/``on`` booleans, ``12:30`` base 60, ``0b1`` ints) both read back as exactly
that data, deterministically, with scripts as literal blocks a person can read.
"""

from __future__ import annotations

import copy
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
from tests.tools import REPO

from mdc.pipeline import Compiler
from mdc.plugin_manager import load_plugins
from mdc_builtin.backends._k8s import common as k8s

K8S_FILES = (
    "kubernetes/job.yaml",
    "pytorchjob/job.yaml",
    "trainjob/job.yaml",
    "leaderworkerset/lws.yaml",
)


def read_both(text: str) -> tuple[list[Any], list[Any]]:
    """The documents as a YAML 1.2 reader (ruamel) and a YAML 1.1 reader (PyYAML) see them."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        v12 = [d for d in YAML(typ="safe", pure=True).load_all(text) if d is not None]
    v11 = [d for d in pyyaml.safe_load_all(text) if d is not None]
    return v12, v11


def check(docs: list[dict[str, Any]]) -> str:
    """Reads back as ``docs`` under both readers, and the same text twice; the text."""
    text = k8s.dump_yaml(docs)
    v12, v11 = read_both(text)
    assert v12 == docs, text
    assert v11 == docs, text
    assert k8s.dump_yaml(copy.deepcopy(docs)) == text
    return text


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


@pytest.mark.slow
@pytest.mark.parametrize("path", golden_yaml_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_golden_reads_the_same_under_both_readers_and_is_written_again(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    docs, docs11 = read_both(text)
    assert docs == docs11
    assert k8s.dump_yaml(docs) == text


def test_every_examples_documents_read_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """Compile every example and read back each document list the backends hand dump_yaml."""
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
    monkeypatch.undo()  # check() writes again, with the real writer
    assert len(captured) == len(k8s_examples) >= 8
    for docs in captured:
        check(docs)


def test_scripts_are_literal_blocks() -> None:
    text = check([{"data": {"node.sh": "#!/usr/bin/env bash\nset -euo pipefail\nexec x\n"}}])
    assert (
        text
        == "---\ndata:\n  node.sh: |\n    #!/usr/bin/env bash\n    set -euo pipefail\n    exec x\n"
    )


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
        [{"value": text, "list": [text, [text], {text: text}], text: {"k": [text]}, "after": text}]
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
        "a:\n- - 1\n  - 2\n- - 3\n"
        "b:\n- c:\n  - 1\n  d: null\n"
        "e:\n- {}\n- []\n- null\n- ''\n"
        "f: {}\ng: []\n"
        "h:\n- - - x: 1\n      'y': 2\n"
        "i: null\nj: true\nk: -5\n"
        "--- {}\n"
    )
    assert check(docs) == expected


def test_literal_blocks_keep_their_chomping() -> None:
    docs = [{"strip": "a\nb", "clip": "a\nb\n", "keep": "a\n\nb\n\n\n", "end": "x\n\n"}]
    assert check(docs) == (
        "---\nstrip: |-\n  a\n  b\nclip: |\n  a\n  b\nkeep: |+\n  a\n\n  b\n\n\n"
        "end: |+\n  x\n\n...\n"
    )


@pytest.mark.parametrize("text", ["0o17", "1e3", ".5e3", "+1.5E-3", "yes", "on", "12:30", "0b1"])
def test_words_a_reader_takes_for_another_type_are_quoted(text: str) -> None:
    assert check([{"k": text}]) == f"---\nk: '{text}'\n"


def test_a_value_used_twice_is_written_twice_not_aliased() -> None:
    shared = {"command": ["bash", "x"]}
    assert check([{"leader": shared, "worker": shared}]) == (
        "---\nleader:\n  command:\n  - bash\n  - x\nworker:\n  command:\n  - bash\n  - x\n"
    )


def test_keys_that_are_not_strings_are_written_as_strings() -> None:
    docs: list[dict[Any, Any]] = [{1: "a", False: "b", None: "c", "d": 2}]
    text = k8s.dump_yaml(docs)
    assert text == "---\n'1': a\n'False': b\nNone: c\nd: 2\n"
    assert read_both(text) == ([{"1": "a", "False": "b", "None": "c", "d": 2}],) * 2
    # keys equal as strings: one entry, where the first stood, with the last value
    mixed: dict[Any, Any] = {1: "a", "x": 0, "1": "b"}
    assert k8s.dump_yaml([mixed]) == "---\n'1': b\nx: 0\n"


def test_values_it_cannot_write_are_refused() -> None:
    with pytest.raises(TypeError, match="float"):
        k8s.dump_yaml([{"a": 1.5}])


@pytest.mark.parametrize(
    "text", ["a\x85b", "a\u2028b", "a\n\x7fb", "a\n\x80", "tail \nx"], ids=repr
)
def test_what_a_literal_block_cannot_hold_is_double_quoted(text: str) -> None:
    assert check([{"k": text}]).startswith('---\nk: "')


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


@pytest.mark.slow
@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(docs=documents(_STRINGS))
def test_any_data_reads_back_under_yaml_1_1_and_1_2(docs: list[dict[str, Any]]) -> None:
    check(docs)


# ---------------------------------------------------------------- cost


@pytest.mark.slow
def test_importing_the_backends_loads_no_yaml_library() -> None:
    """PyYAML is imported on the first write: validate, which writes nothing, never pays it."""
    code = (
        "import sys, mdc_builtin.backends._k8s.common\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('ruamel', 'yaml')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]"


# ------------------------------------------------- commands that write no files


@pytest.mark.parametrize(
    ("docs", "plain"),
    [
        ([{"a": [1, True, None, "x\n", ("t",)], 2: {"b": {}}}], True),
        ([{"a": 1.5}], False),  # the writer refuses it
        ([{"a": [{"b": 1.5}]}], False),
        ([{"a": b"bytes"}], False),  # another type: only the writer knows
        ([{"a": "é"}], False),
        ([{"é": 1}], False),
        ([{"a": True.__class__.__mro__}], False),  # a tuple holding types
    ],
    ids=repr,
)
def test_plainly_writable(docs: list[dict[Any, Any]], plain: bool) -> None:
    assert k8s.plainly_writable(docs) is plain
    if plain:
        k8s.dump_yaml(docs)  # writes (tuples and int keys read back as lists and strings)


def test_a_structure_inside_itself_is_left_to_the_writer() -> None:
    inner: list[Any] = []
    inner.append(inner)
    assert not k8s.plainly_writable([{"a": inner}])


@pytest.mark.slow
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(docs=documents(_STRINGS))
def test_what_is_called_plainly_writable_is_written(docs: list[dict[str, Any]]) -> None:
    if k8s.plainly_writable(docs):
        check(docs)


def test_validate_writes_no_yaml_and_refuses_what_the_writer_refuses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """validate (``tree=False``) skips writing plain documents; a value the writer refuses
    is refused by validate and compile alike, in the same words."""
    from mdc.errors import PluginError
    from mdc_builtin.backends import kubernetes

    writes: list[int] = []
    real = k8s.dump_yaml

    def counted(docs: Sequence[Mapping[str, Any]]) -> str:
        writes.append(len(docs))
        return real(docs)

    monkeypatch.setattr(k8s, "dump_yaml", counted)
    compiler = Compiler(load_plugins(autoload=False))
    spec = REPO / "examples" / "k8s-torchrun-2x8.toml"
    compiler.compile(spec, tree=False)
    assert writes == []
    tree = compiler.compile(spec).tree
    assert writes == [3] and any(a.path == "kubernetes/job.yaml" and a.data for a in tree)

    documents = kubernetes.documents

    def with_a_float(*args: Any) -> list[dict[str, Any]]:
        return [*documents(*args), {"ratio": 0.5}]

    monkeypatch.setattr(kubernetes, "documents", with_a_float)
    refusals = []
    for tree_wanted in (False, True):
        with pytest.raises(PluginError) as caught:
            compiler.compile(spec, tree=tree_wanted)
        refusals.append(caught.value.render())
    assert refusals[0] == refusals[1] and "cannot write float 0.5 as YAML" in refusals[0]


@pytest.mark.slow
def test_validating_a_toml_kubernetes_spec_loads_no_yaml_library() -> None:
    code = (
        "import sys\nfrom mdc.cli import main\n"
        "assert main(['validate', 'examples/k8s-torchrun-2x8.toml']) == 0\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('ruamel', 'yaml')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        cwd=REPO,
    )
    assert out.stdout.strip().splitlines()[-1] == "[]"
