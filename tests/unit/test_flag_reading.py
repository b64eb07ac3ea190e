"""mdc.api.flags and mdc.passes.flags read a framework's flags as argparse reads them,
checked against argparse.

Each case parses the same words with a real ``argparse.ArgumentParser`` built from the
table (the framework's own parser is built the same way: store, store_true/store_const,
nargs "+", allow_abbrev as the framework sets it) and with :meth:`FlagTable.read`; the
values must be the same, and a spec key read from them too.
"""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from mdc.api.flags import ArgPlace, FlagReading, FlagTable, KnownFlag, dashes, disagreeing
from mdc.passes.flags import read_arguments

FLAGS = [
    KnownFlag(
        name="--tp-size",
        source="tp",
        key="tp",
        spec_key="/p/tp",
        nargs=1,
        convert=int,
        aliases=("--tensor-parallel-size",),
    ),  # fmt: skip
    KnownFlag(name="--modules", source="m", key="modules", spec_key="/t/modules", nargs="+"),
    KnownFlag(name="--sp", source="sp", key="sp", spec_key="/t/sp"),
    KnownFlag(
        name="--no-overlap", source="o", key="overlap", spec_key="/t/overlap", switch_value=False
    ),  # fmt: skip
]


def parser(abbreviations: bool) -> argparse.ArgumentParser:
    """argparse's parser of the same flags, unknown words left over."""
    real = argparse.ArgumentParser(allow_abbrev=abbreviations, add_help=False)
    real.add_argument("--tp-size", "--tensor-parallel-size", dest="tp", type=int)
    real.add_argument("--modules", dest="modules", nargs="+")
    real.add_argument("--sp", dest="sp", action="store_true", default=None)
    real.add_argument("--no-overlap", dest="overlap", action="store_false", default=None)
    return real


WORDS = [
    ["--tp-size", "2"],
    ["--tp-size=2", "--tp-size", "4"],  # the last one wins
    ["--tensor-parallel-size", "8", "--sp"],
    ["--modules", "a", "b", "--sp", "--no-overlap"],
    ["--modules=a", "x.py"],
    ["--seed", "1", "--tp-size", "-3"],  # a negative number is a value
    ["--sp", "--", "--tp-size", "2"],  # after --, positional words
]


@pytest.mark.parametrize("words", WORDS)
@pytest.mark.parametrize("abbreviations", [False, True])
def test_the_values_are_argparses(words: list[str], abbreviations: bool) -> None:
    real, _ = parser(abbreviations).parse_known_args(words)
    expected = {k: v for k, v in vars(real).items() if v is not None}
    values, _ = FlagTable(FLAGS, abbreviations=abbreviations).read(words)
    got = {k: list(v) if isinstance(v, tuple) else v for k, v in values.items()}
    assert got == expected


@pytest.mark.parametrize(
    ("words", "expected"),
    [
        (["--tp", "2"], {"tp": 2}),  # unambiguous: --tp-size
        (["--tensor", "2"], {"tp": 2}),
        (["--mod", "a"], {"modules": ["a"]}),
        (["--no-o"], {"overlap": False}),
    ],
)
def test_an_unambiguous_prefix_where_the_parser_allows_it(
    words: list[str], expected: dict[str, Any]
) -> None:
    real, _ = parser(True).parse_known_args(words)
    assert {k: v for k, v in vars(real).items() if v is not None} == expected
    values, _ = FlagTable(FLAGS, abbreviations=True).read(words)
    assert {k: list(v) if isinstance(v, tuple) else v for k, v in values.items()} == expected
    assert FlagTable(FLAGS).read(words)[0] == {}  # Megatron-LM: allow_abbrev=False


def test_an_ambiguous_prefix_is_no_flag() -> None:
    table = FlagTable(
        [*FLAGS, KnownFlag(name="--tp-comm", source="c", key="c", nargs=1)], abbreviations=True
    )
    assert table.get("--tp") is None and table.get("--tp-s") is not None


def test_vllms_underscores_are_dashes() -> None:
    table = FlagTable(FLAGS, normalize=dashes)
    values, _ = table.read(["--tp_size=2", "--tensor_parallel_size", "4"])
    assert values == {"tp": 4}
    assert dashes("--a_b.c_d") == "--a-b.c_d" and dashes("-a_b") == "-a_b"


def test_a_read_removes_the_words_and_sets_the_keys() -> None:
    reading = FlagReading(
        table=FlagTable(FLAGS),
        places=(ArgPlace(pointer="/t/args", where="args", table="/t"),),
        code="X1",
        framework="F",
    )
    data = {"t": {"args": ["--seed", "1", "--tp-size", "2", "--modules", "a", "b", "--sp"]}}
    read = read_arguments(data, reading)
    assert read.findings == ()
    assert read.data == {
        "t": {"args": ["--seed", "1"], "modules": ["a", "b"], "sp": True},
        "p": {"tp": 2},
    }
    assert read.moved["/p/tp"] == "/t/args/2" and read.moved["/t/modules"] == "/t/args/4"
    assert data["t"]["args"][2] == "--tp-size"  # the spec as written is left alone


def test_a_disagreement_names_both_places_and_reads_nothing() -> None:
    reading = FlagReading(
        table=FlagTable(FLAGS),
        places=(
            ArgPlace(pointer="/job/command", where="the command"),
            ArgPlace(pointer="/t/args", where="args", table="/t"),
        ),
        code="X1",
        framework="F",
    )
    data = {"job": {"command": "run --tp-size 2"}, "t": {"args": ["--tp-size", "4"]}}
    read = read_arguments(data, reading)
    (finding,) = read.findings
    assert finding.pointer == "/t/args/0" and "(/job/command)" in finding.message
    assert read.data == data and read.moved == {}
    data = {"p": {"tp": 8}, "job": {"command": ["run", "--tp-size", "8"]}}
    assert read_arguments(data, reading).data == {"p": {"tp": 8}, "job": {"command": ["run"]}}


class _Unread(list[object]):
    """mdc's words, which a check without any flag of the table in the user's must not read."""

    def __iter__(self):  # type: ignore[no-untyped-def]
        raise AssertionError("mdc's words were read")


def test_disagreeing_reads_mdcs_words_only_for_a_flag_of_the_users() -> None:
    table = FlagTable(FLAGS)
    assert disagreeing(table, ["train.py", "--lr", "3"], _Unread(["--tp-size", "2"])) == ([], [])
    agree, differ = disagreeing(table, ["--tp-size", "2", "--sp"], ["--tp-size", "4"])
    assert agree == [] and [(u.value, o.value) for u, o in differ] == [(2, 4)]


def test_a_spec_without_a_keyed_flag_is_not_copied() -> None:
    reading = FlagReading(
        table=FlagTable(FLAGS),
        places=(ArgPlace(pointer="/t/args", where="args", table="/t"),),
        code="X1",
        framework="F",
    )
    data = {"t": {"args": ["--seed", "1"]}, "p": {"tp": 2}}
    read = read_arguments(data, reading)
    assert read.data is data and read.moved == {} and read.findings == ()
