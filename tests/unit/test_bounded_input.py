"""What a spec file may hold: numbers a spec can carry, null keys, dates as written, and
diagnostics that print every character a terminal would act on as an escape."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from mdc.errors import Diagnostic, Severity, SourceLocation, SpecError
from mdc.loaders import LoadedDocument, load_text
from mdc.pipeline import Compiler
from mdc.plugin_manager import load_plugins
from mdc.schema import SchemaChecker, surely_valid

#: Python's default limit on converting an integer to or from decimal text
MAX_INT_DIGITS = 4300
LONG = "7" * (MAX_INT_DIGITS + 1)
COMPILER = Compiler(load_plugins(autoload=False))


def refused(text: str, fmt: str) -> tuple[Diagnostic, ...]:
    with pytest.raises(SpecError) as info:
        load_text(text, f"spec.{fmt}", fmt)
    return info.value.diagnostics


# ---------------------------------------------------------------- integers past Python's limit

#: (format, text, pointer, line, column): a decimal literal one digit over the limit in each
#: place a number may stand (a value, a list, a nested table, a key), in each format
LONG_INTEGERS = [
    ("toml", f"[distributed]\nnnodes = {LONG}\n", "/distributed/nnodes", 2, 10),
    ("toml", f"x = [1, -{LONG}]\n", "/x/1", 1, 9),
    ("toml", f"t = {{ a = {{ b = +{LONG} }} }}\n", "/t/a/b", 1, 17),
    ("toml", f"[[r]]\nn = 1\n[[r]]\nn = 1_{LONG}\n", "/r/1/n", 4, 5),
    # TOML 1.1 (tomllib refuses the newline in the inline table: the thorough path)
    ("toml", f"t = {{\n  a = {LONG},\n}}\n", "/t/a", 2, 7),
    ("yaml", f"distributed:\n  nnodes: {LONG}\n", "/distributed/nnodes", 2, 11),
    ("yaml", f"x: [1, -{LONG}]\n", "/x/1", 1, 8),
    ("yaml", f"x:\n  - a:\n      b: +{LONG}\n", "/x/0/a/b", 3, 10),
    ("yaml", f"env:\n  ? {LONG}\n  : 1\n", "/env", 2, 5),  # a plain key: 1,024 at most
    ("json", f'{{"distributed": {{"nnodes": {LONG}}}}}', "/distributed/nnodes", 1, 28),
    ("json", f'{{"x": [1, -{LONG}]}}', "/x/1", 1, 11),
]


@pytest.mark.parametrize(("fmt", "text", "pointer", "line", "column"), LONG_INTEGERS)
def test_an_integer_past_pythons_limit_is_a_located_error(
    fmt: str, text: str, pointer: str, line: int, column: int
) -> None:
    # before: ValueError from int() ("Exceeds the limit (4300 digits)"), exit 4
    (found,) = refused(text, fmt)
    assert found.code == "MDC020"
    assert f"{MAX_INT_DIGITS:,}" in found.message
    assert found.hint is not None
    assert (found.location.pointer, found.location.line, found.location.column) == (
        pointer,
        line,
        column,
    )


@pytest.mark.parametrize(
    ("fmt", "text", "where"),
    [
        # base 16: int() has no limit, printing the number has
        ("toml", f"x = 0x{'f' * 4000}\n", ("/x", 1, 5)),
        ("toml", f"x = 0o{'7' * 5000}\n", ("/x", 1, 5)),
        ("yaml", f"x: 0x{'f' * 4000}\n", ("/x", 1, 4)),
        ("yaml", f"x: 0o{'7' * 5000}\n", ("/x", 1, 4)),
        ("yaml", f"x:\n  ? 0x{'f' * 4000}\n  : 1\n", ("/x", 2, 5)),  # a key
    ],
)
def test_a_huge_integer_in_another_base_is_a_located_error(
    fmt: str, text: str, where: tuple[str, int, int]
) -> None:
    (found,) = refused(text, fmt)
    assert found.code == "MDC020"
    assert (found.location.pointer, found.location.line, found.location.column) == where


@pytest.mark.parametrize("fmt", ["toml", "yaml", "json"])
def test_an_integer_at_the_limit_is_read(fmt: str) -> None:
    digits = "9" * MAX_INT_DIGITS
    text = {"toml": f"x = {digits}\n", "yaml": f"x: {digits}\n", "json": f'{{"x": {digits}}}'}
    assert load_text(text[fmt], f"s.{fmt}", fmt).data == {"x": int(digits)}


# ---------------------------------------------------------------- NaN and infinities

NON_FINITE = [
    *(("toml", word) for word in ("nan", "+nan", "-nan", "inf", "+inf", "-inf", "1e999")),
    *(("yaml", word) for word in (".nan", ".NaN", ".NAN", ".inf", "-.Inf", "+.INF", "1e999")),
    *(("json", word) for word in ("1e999", "-1E+999", "1.5e400")),
]


@pytest.mark.parametrize(("fmt", "word"), NON_FINITE)
def test_nan_and_infinities_are_located_errors(fmt: str, word: str) -> None:
    # before: TOML and YAML read them as floats that passed the range checks into the
    # command line (--monitor-interval nan); JSON read 1e999 as an infinity
    text = {
        "toml": f"[torchrun]\nmonitor_interval = {word}\nx = [1, {{ y = {word} }}]\n",
        "yaml": f"torchrun:\n  monitor_interval: {word}\n  x: [1, {{y: {word}}}]\n",
        "json": f'{{"torchrun": {{"monitor_interval": {word},\n "x": [1, {{"y": {word}}}]}}}}',
    }[fmt]
    found = refused(text, fmt)
    assert [d.code for d in found] == ["MDC020", "MDC020"]  # every one, at once
    assert [d.location.pointer for d in found] == ["/torchrun/monitor_interval", "/torchrun/x/1/y"]
    assert [d.location.line for d in found] == ([1, 2] if fmt == "json" else [2, 3])
    assert all(d.location.column is not None and d.hint for d in found)


def spec_file(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


QUICKSTART = """\
[job]
name = "q"
command = ["python", "train.py"]
env = {env}

[distributed]
launcher = "torchrun"
backend = "local"
nnodes = 1
nproc_per_node = 2
accelerator = "cpu"
"""


def test_nan_never_reaches_the_command_line(tmp_path: Path) -> None:
    spec = spec_file(
        tmp_path, "nan.toml", QUICKSTART.format(env="{}") + "[torchrun]\nmonitor_interval = nan\n"
    )
    with pytest.raises(SpecError) as info:
        COMPILER.compile(spec)
    assert [d.code for d in info.value.diagnostics] == ["MDC020"]


# ---------------------------------------------------------------- YAML null keys


@pytest.mark.parametrize(
    ("text", "line", "column"),
    [
        ("job:\n  name: a\n  ~: 1\n", 3, 3),
        ("job:\n  null: 1\n", 2, 3),
        ("job:\n  NULL: 1\n", 2, 3),
        ("job: {name: a, : 1}\n", 1, 16),
        ("job:\n  ? \n  : 1\n", 2, 5),
    ],
)
def test_a_yaml_null_key_is_reported_as_one(text: str, line: int, column: int) -> None:
    # before: read as the key "None", then "unknown key 'None'"
    (found,) = refused(text, "yaml")
    assert found.code == "MDC021"
    assert "null" in found.message and "None" not in found.message
    assert (found.location.pointer, found.location.line) == ("/job", line)
    assert found.location.column is not None


def test_a_quoted_null_is_a_key_like_any_other() -> None:
    assert load_text('job:\n  "null": 1\n', "s.yaml", "yaml").data == {"job": {"null": 1}}


# ---------------------------------------------------------------- dates and times as written


def test_yaml_dates_and_times_are_the_text_written() -> None:
    # YAML 1.2's core schema has no timestamps; ruamel's rewrote them in ISO form
    text = (
        "env:\n  A: 2001-12-14 21:59:43.10 -5\n  B: 2002-12-14\n  C: 2001-12-14t21:59:43.10-05:00\n"
        "  D: [2001-12-15 2:59:43.10]\n"
    )
    assert load_text(text, "s.yaml", "yaml").data == {
        "env": {
            "A": "2001-12-14 21:59:43.10 -5",
            "B": "2002-12-14",
            "C": "2001-12-14t21:59:43.10-05:00",
            "D": ["2001-12-15 2:59:43.10"],
        }
    }


@pytest.mark.parametrize(
    ("name", "env", "written"),
    [
        ("d.toml", "{ START = 1979-05-27 07:32:00Z, T = 07:32:00.5 }", "1979-05-27 07:32:00Z"),
        ("d.yaml", None, "2001-12-14 21:59:43.10 -5"),
    ],
)
def test_a_date_in_env_reaches_the_job_as_written(
    tmp_path: Path, name: str, env: str | None, written: str
) -> None:
    if env is not None:
        spec = spec_file(tmp_path, name, QUICKSTART.format(env=env))
    else:
        data = load_text(QUICKSTART.format(env="{}"), "q.toml", "toml").data
        assert isinstance(data, dict)
        text = json.dumps(data).replace('"env": {}', f'"env": {{"START": {written}}}')
        spec = spec_file(tmp_path, name, text)  # JSON is YAML; the date is a plain scalar
    compiled = COMPILER.compile(spec)
    scripts = b"".join(a.data for a in compiled.tree if a.path.endswith(".sh")).decode()
    assert f"START='{written}'" in scripts or f'START="{written}"' in scripts, scripts


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("i.toml", QUICKSTART.format(env="{ N = 3, B = true }")),
        ("i.yaml", QUICKSTART.format(env="{}").replace("[job]", "")),
    ],
)
def test_a_number_or_boolean_in_env_is_refused_with_the_reason(
    tmp_path: Path, name: str, text: str
) -> None:
    if name.endswith(".yaml"):
        text = (
            "job:\n  name: q\n  command: [python, t.py]\n  env: {N: 3, B: true}\n"
            "distributed:\n  launcher: torchrun\n  backend: local\n  nnodes: 1\n"
            "  nproc_per_node: 2\n  accelerator: cpu\n"
        )
    spec = spec_file(tmp_path, name, text)
    with pytest.raises(SpecError) as info:
        COMPILER.compile(spec)
    found = {d.location.pointer: d for d in info.value.diagnostics}
    assert set(found) == {"/job/env/N", "/job/env/B"}
    assert found["/job/env/N"].hint is not None and '("3")' in found["/job/env/N"].hint
    assert found["/job/env/B"].hint is not None and '("true")' in found["/job/env/B"].hint


# ---------------------------------------------------------------- escaped diagnostics

CONTROLS = "\x1b[2J\x07\n\r\x00\x7f\x9b\u2028\u202e\x08\t"


def test_a_diagnostic_renders_control_characters_as_escapes() -> None:
    forged = "\nspec.toml:1:1: error[MDC101]: forged"
    diagnostic = Diagnostic(
        severity=Severity.ERROR,
        code="MDC106",
        message=f"bad {CONTROLS}{forged}",
        hint=f"hint {CONTROLS}",
        location=SourceLocation(path=f"a{CONTROLS}.toml", pointer=f"/x{CONTROLS}", line=1),
    )
    text = diagnostic.render()
    assert len(text.splitlines()) == 2  # the finding and its hint, nothing forged
    assert not any(c in text for c in CONTROLS if not c.isprintable() and c != "\n")
    assert "\\x1b[2J\\x07\\x0a\\x0d\\x00\\x7f\\x9b\\u2028\\u202e\\x08\\x09" in text


def test_a_file_name_and_value_with_controls_are_escaped_in_the_findings(tmp_path: Path) -> None:
    # before: the name and the value reached the terminal raw (a title, a bell, a forged line)
    spec = tmp_path / "x\x1b]0;owned\x07\nspec.toml:1:1: error[MDC999]: forged.toml"
    spec.write_text('[job]\nname = "a\\u0007\\u001b[31mb"\nbogus = "\\n\\u009b"\n')
    with pytest.raises(SpecError) as info:
        COMPILER.compile(spec)
    assert len(info.value.diagnostics) >= 2
    for diagnostic in info.value.diagnostics:
        text = diagnostic.render()
        assert text.startswith(str(tmp_path) + "/x\\x1b]0;owned\\x07\\x0aspec.toml:1:1: error[")
        assert len(text.splitlines()) == (2 if diagnostic.hint else 1)
        assert all(c.isprintable() for c in text.replace("\n", ""))


def test_printable_text_is_left_alone() -> None:
    text = "plain 'text' with ünïcödé, 日本語, tabs written \\t and a ✓"
    diagnostic = Diagnostic(
        severity=Severity.WARNING,
        code="MDC106",
        message=text,
        location=SourceLocation(path=f"{text}.toml"),
    )
    assert diagnostic.render() == f"{text}.toml: warning[MDC106]: {text}"


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_no_range_holds_nan_or_an_infinity(value: float) -> None:
    # data built in code (a plugin's, an importer's) never passed through a loader: before,
    # NaN met every bound ("nan > 0" is merely false) and inf every lower bound
    checker = SchemaChecker(
        {"type": "object", "properties": {"interval": {"type": "number", "exclusiveMinimum": 0}}}
    )
    doc = LoadedDocument(path="s.json", data={"interval": value}, values={}, keys={})
    found = checker.check(doc)
    assert [(d.code, d.location.pointer) for d in found] == [("MDC105", "/interval")]
    assert surely_valid(doc.data, checker.schema) is False


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("/model/hidden_size", 10**400),  # an integer key: before, OverflowError (exit 4)
        ("/model/num_layers", -(2**63) - 1),
        ("/distributed/accelerator_memory_gib", 1e300),  # a number key: the same
    ],
)
def test_a_number_key_past_64_bits_is_a_range_error(tmp_path: Path, key: str, value: int) -> None:
    data = json.loads(
        (Path(__file__).parents[2] / "examples" / "deepspeed-2x2-cpu.json").read_text()
    )
    table, name = key.strip("/").split("/")
    data.setdefault(table, {})[name] = value
    model = {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 128}
    data["model"] = {**model, **data.get("model", {})}
    data["distributed"]["accelerator_memory_gib"] = data["distributed"].get(
        "accelerator_memory_gib", 16
    )
    spec = spec_file(tmp_path, "big.json", json.dumps(data))
    with pytest.raises(SpecError) as info:
        COMPILER.compile(spec)
    found = [(d.code, d.location.pointer) for d in info.value.diagnostics if d.is_error]
    assert ("MDC105", key) in found
    assert all(d.location.line is not None for d in info.value.diagnostics)


# ---------------------------------------------------------------- long digit strings in text

LONG_DIGITS = "9" * (MAX_INT_DIGITS + 1)
#: (backend, table text): a quantity or time limit written as text of more digits than
#: Python converts; the scheduler reads each (caps it, or takes it), so mdc must not crash
TEXT_NUMBERS = [
    ("slurm", f'time = "{LONG_DIGITS}"'),
    ("slurm", f'time = "1-{LONG_DIGITS}:00"'),
    ("slurm", f'gpus_per_node = "{LONG_DIGITS}"'),
    ("kubernetes", f'memory = "{LONG_DIGITS}Gi"'),
    ("kubernetes", f'cpu = "{LONG_DIGITS}"'),
    ("kubernetes", f'memory = "1e{LONG_DIGITS}"'),
    ("kubernetes", f'shm_size = "0.{LONG_DIGITS}Ei"'),
]


@pytest.mark.parametrize(("backend", "line"), TEXT_NUMBERS)
def test_a_long_digit_string_in_a_quantity_or_time_is_read_not_a_crash(
    tmp_path: Path, backend: str, line: str
) -> None:
    # before: ValueError ("Exceeds the limit (4300 digits)") or decimal.Overflow in the
    # backend's check, reported as a plugin failure (exit 3)
    spec = tmp_path / "job.toml"
    spec.write_text(
        '[job]\nname = "long"\nimage = "img:1"\ncommand = ["python", "train.py"]\n'
        f'[distributed]\nlauncher = "torchrun"\nbackend = "{backend}"\nnnodes = 1\n'
        f"nproc_per_node = 1\n[{backend}]\n{line}\n",
        encoding="utf-8",
    )
    try:
        COMPILER.compile(spec, tree=False)
    except SpecError as exc:  # a refusal is fine, located at the key
        assert all(d.location.pointer.startswith(f"/{backend}/") for d in exc.diagnostics)
