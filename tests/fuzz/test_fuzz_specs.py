"""Fuzzing the whole compiler through its command line: valid specs and mutated ones.

Specs are drawn over mdc's real vocabulary: every registered launcher × backend pair
(supported or not), node and process counts, parallel sizes of which some divide the world
and some do not, optional ``[batch]`` and ``[model]``, and plugin tables taken from the
examples or generated from the plugin's own schema fragment (:func:`from_fragment`: objects
and arrays walked here, every scalar through hypothesis-jsonschema).
Mutations then break them: wrong types, out-of-range and huge numbers, NaN, deleted
required keys, unknown keys spelled one letter off, empty strings. Each spec is written as
TOML, YAML or JSON and given to ``mdc compile`` in-process. The contract:

* the exit code is 0 or 1: never 3 (no built-in plugin may fail), never 4 (no mdc bug);
* on 1, every diagnostic names the spec file and a code ``MDCnnn``, and is located
  (``path:line:col``), except a file-level one (``path:``, pointer ``""``);
* on 0, compiling the same file again gives the same bytes, and the tree was written.

Profiles: see ``conftest.py`` (``ci``: bounded and derandomized; ``deep``: 10,000 examples
per property, ``pytest tests/fuzz --hypothesis-profile=deep``).
"""

from __future__ import annotations

import copy
import io
import json
import math
import re
import shutil
import string
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import tomlkit
from hypothesis import HealthCheck, assume, event, given, note, settings
from hypothesis import strategies as st
from hypothesis_jsonschema import from_schema  # type: ignore[import-not-found,unused-ignore]
from ruamel.yaml import YAML
from tests.tools import REPO

import mdc.cli
from mdc.cli import main
from mdc.loaders import load_file
from mdc.pipeline import Compiler
from mdc.plugin_manager import load_plugins

PLUGINS = load_plugins(autoload=False)
COMPILER = Compiler(PLUGINS)
LAUNCHERS = sorted(PLUGINS.launchers)
BACKENDS = sorted(PLUGINS.backends)
SCHEMA: dict[str, Any] = COMPILER.schema


def fuzz_settings() -> settings:
    """The deep profile when it is the active one, else the project's ci profile (conftest).

    Whatever the profile, generated specs are large and some are filtered out; those health
    checks are about the generator's cost, not the compiler, so they do not fail a run here.
    """
    name = "deep" if settings.get_current_profile_name() == "deep" else "ci"
    return settings(settings.get_profile(name), suppress_health_check=list(HealthCheck))


FUZZ = fuzz_settings()


def example_tables() -> dict[str, list[Any]]:
    """Every plugin table the examples use, by table name."""
    tables: dict[str, list[Any]] = {}
    for path in sorted((REPO / "examples").iterdir()):
        if path.suffix not in (".toml", ".yaml", ".yml", ".json"):
            continue
        data = load_file(path).data
        for name in PLUGINS.tables():
            if isinstance(data, dict) and name in data:
                tables.setdefault(name, []).append(data[name])
    return tables


EXAMPLE_TABLES = example_tables()

# ---------------------------------------------------------------- strategies: valid specs

SIZES = st.sampled_from([1, 1, 1, 2, 2, 4, 8, 3, 16])
NAMES = st.one_of(
    st.sampled_from(["demo", "a", "gpt-hybrid", "x1", "train-0", "a" * 40]),
    st.from_regex(re.compile(r"[a-z0-9]([-a-z0-9]{0,20}[a-z0-9])?", re.ASCII), fullmatch=True),
)
WORDS = st.one_of(
    st.sampled_from(
        [
            "train.py",
            "-m",
            "pkg.train",
            "--lr",
            "0.1",
            "--data",
            "/data/x",
            "--deepspeed",
            "--tensor-model-parallel-size",
            "--",
            "-x",
            "",
        ]
    ),
    st.text(max_size=12),
)
COMMANDS = st.one_of(
    st.lists(WORDS, max_size=5).map(lambda rest: ["python", "train.py", *rest]),
    st.lists(WORDS, max_size=4).map(lambda rest: ["python", "-m", "pkg.train", *rest]),
    st.lists(WORDS, min_size=1, max_size=4),
    st.sampled_from(["python train.py --lr 0.1", "bash run.sh", "true"]),
    st.text(max_size=20),  # the string form, split like a shell: quotes may not close
)
ENV_NAMES = st.from_regex(re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,12}", re.ASCII), fullmatch=True)
ORDERS = st.permutations(["tp", "cp", "ep", "dp", "pp"]).map("-".join)


def divisor_or_any(n: int) -> st.SearchStrategy[int]:
    divisors = [d for d in range(1, min(n, 64) + 1) if n % d == 0]
    return st.one_of(st.sampled_from(divisors), SIZES)


def from_fragment(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Values valid against a schema fragment.

    hypothesis-jsonschema 0.23.1 cannot draw objects with the hypothesis installed here
    (6.170: its object strategy calls ``conjecture.utils.many(...).more()``, which no longer
    exists), so objects and arrays are walked here and only scalars (patterns, bounds,
    enums) go through ``from_schema``.
    """
    base = {k: v for k, v in schema.items() if k not in ("oneOf", "anyOf")}
    for key in ("oneOf", "anyOf"):
        if key in schema:
            return st.one_of([from_fragment({**base, **branch}) for branch in schema[key]])
    if "enum" in schema or "const" in schema:
        return scalar(schema)
    kind = schema.get("type")
    if isinstance(kind, list):
        return st.one_of([from_fragment({**schema, "type": k}) for k in kind])
    if kind == "object" or "properties" in schema:
        return object_from(schema)
    if kind == "array":
        items = from_fragment(schema.get("items", {"type": "string"}))
        low = schema.get("minItems", 0)
        return st.lists(
            items,
            min_size=low,
            max_size=max(low, min(schema.get("maxItems", 4), 4)),
            unique_by=(lambda v: json.dumps(v, sort_keys=True))
            if schema.get("uniqueItems")
            else None,
        )
    return scalar(schema)


def scalar(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    strategy: st.SearchStrategy[Any] = from_schema(schema)
    return strategy


@st.composite
def object_from(draw: st.DrawFn, schema: dict[str, Any]) -> dict[str, Any]:
    required = set(schema.get("required", ()))
    out: dict[str, Any] = {}
    for key, sub in schema.get("properties", {}).items():
        if key in required or draw(st.booleans()):
            out[key] = draw(from_fragment(sub))
    extra = schema.get("additionalProperties", True)
    if isinstance(extra, dict):
        pattern = schema.get("propertyNames", {}).get("pattern")
        keys = (
            st.from_regex(pattern, fullmatch=True)
            if pattern
            else st.text(string.ascii_letters + "_.-/", min_size=1, max_size=10)
        )
        for key, value in draw(st.dictionaries(keys, from_fragment(extra), max_size=3)).items():
            out.setdefault(key, value)
    for pattern, sub in schema.get("patternProperties", {}).items():
        for key, value in draw(
            st.dictionaries(st.from_regex(pattern, fullmatch=True), from_fragment(sub), max_size=2)
        ).items():
            out.setdefault(key, value)
    return out


@st.composite
def plugin_table(draw: st.DrawFn, name: str) -> Any:
    """A table for plugin ``name``: from the examples, or generated from its schema."""
    choices = EXAMPLE_TABLES.get(name, [])
    fragment = SCHEMA["properties"].get(name)
    if choices and not rare(draw, 4):
        return copy.deepcopy(draw(st.sampled_from(choices)))
    if fragment is not None and draw(st.booleans()):
        return draw(from_fragment(fragment))
    return {}


SUPPORTED = [
    (launcher, backend)
    for backend in BACKENDS
    for launcher in LAUNCHERS
    if PLUGINS.backend(backend).launchers is None
    or launcher in (PLUGINS.backend(backend).launchers or ())
]


def rare(draw: st.DrawFn, one_in: int) -> bool:
    """True about once in ``one_in`` draws, and never in hypothesis's simplest examples."""
    return bool(draw(st.integers(0, one_in - 1)) == one_in - 1)


def divisors(n: int) -> list[int]:
    return [d for d in range(1, min(n, 64) + 1) if n % d == 0]


@st.composite
def valid_specs(draw: st.DrawFn) -> dict[str, Any]:
    """A spec of the right shape; mostly consistent, some numbers that do not add up.

    Pairs: mostly supported ones, sometimes any launcher with any backend (MDC231).
    """
    if not rare(draw, 6):
        launcher, backend = draw(st.sampled_from(SUPPORTED))
    else:
        launcher, backend = draw(st.sampled_from(LAUNCHERS)), draw(st.sampled_from(BACKENDS))
    consistent = not rare(draw, 4)
    nnodes = draw(SIZES if consistent else st.one_of(SIZES, st.integers(1, 1024)))
    nproc = draw(SIZES)
    world = nnodes * nproc
    job: dict[str, Any] = {"name": draw(NAMES), "command": draw(COMMANDS)}
    if draw(st.booleans()):
        job["image"] = draw(
            st.sampled_from(["nvcr.io/nvidia/pytorch:25.01-py3", "busybox", "rocm/primus:v25.9"])
        )
    if draw(st.booleans()):
        job["workdir"] = draw(st.sampled_from(["/workspace", "work dir", "/tmp/x y"]))
    if draw(st.booleans()):
        job["env"] = draw(st.dictionaries(ENV_NAMES, st.text(max_size=10), max_size=3))
    dist: dict[str, Any] = {
        "launcher": launcher,
        "backend": backend,
        "nnodes": nnodes,
        "nproc_per_node": nproc,
        "accelerator": draw(st.sampled_from(["nvidia", "amd", "cpu"])),
    }
    if rare(draw, 8):
        dist["min_nnodes"] = draw(st.integers(1, nnodes + 1))
    if draw(st.booleans()):
        dist["master_port"] = draw(st.integers(1, 65535))
    if launcher == "sglang_disagg" and nnodes >= 3 and draw(st.booleans()) or rare(draw, 16):
        prefill = draw(st.integers(1, max(1, nnodes - 2)))
        dist["prefill_nodes"] = prefill
        dist["decode_nodes"] = draw(st.sampled_from([max(1, nnodes - 1 - prefill), 1, 2]))
    if rare(draw, 5):
        dist["accelerator_memory_gib"] = draw(st.sampled_from([80, 192, 0.5, 16.0]))
    spec: dict[str, Any] = {"job": job, "distributed": dist}

    tp = pp = cp = 1
    if rare(draw, 3):
        par: dict[str, Any] = {}
        if consistent:
            tp, pp = draw(st.sampled_from(divisors(nproc))), draw(st.sampled_from(divisors(nnodes)))
            cp = draw(st.sampled_from([c for c in (1, 2) if (world // (tp * pp)) % c == 0]))
            par.update(tp=tp, pp=pp, cp=cp)
            if draw(st.booleans()):
                par["vpp"] = draw(st.sampled_from([1, 2] if pp > 1 else [1]))
        else:
            for key in ("tp", "pp", "cp", "ep", "etp", "vpp", "dp"):
                if rare(draw, 3):
                    par[key] = draw(st.one_of(st.sampled_from(divisors(world)), SIZES))
        if rare(draw, 4):
            par["order"] = draw(ORDERS)
        spec["parallelism"] = par
    if draw(st.booleans()):
        micro = draw(SIZES)
        dp = max(1, world // (tp * pp * cp))
        spec["batch"] = {
            "micro_batch_size": micro,
            "global_batch_size": draw(
                st.integers(1, 4).map(lambda k: micro * dp * k)
                if consistent
                else st.integers(1, 4096)
            ),
        }
    if draw(st.booleans()):
        heads = draw(st.sampled_from([8, 16, 32, 12]))
        model: dict[str, Any] = {
            "num_layers": draw(st.sampled_from([2, 4, 32, 30])),
            "hidden_size": heads * 64,
            "num_attention_heads": heads,
            "seq_length": draw(st.sampled_from([128, 2048, 4097])),
        }
        for key, values in (
            ("num_query_groups", [1, 2, 8, 3]),
            ("vocab_size", [32000, 50257]),
            ("ffn_hidden_size", [2048, 11008]),
            ("num_experts", [8, 6]),
            ("dtype", ["bf16", "fp16", "fp32", "fp8"]),
            ("gated_mlp", [True, False]),
            ("position_embedding", ["rope"]),
            ("normalization", ["rmsnorm", "layernorm"]),
        ):
            if rare(draw, 3):
                model[key] = draw(st.sampled_from(values))
        spec["model"] = model
    for name in (launcher, backend):
        if draw(st.booleans()):
            spec[name] = draw(plugin_table(name))
    return spec


# ---------------------------------------------------------------- strategies: mutations

WRONG_VALUES = st.one_of(
    st.sampled_from(
        [
            None,
            True,
            False,
            0,
            -1,
            1.5,
            "",
            " ",
            "8",
            [],
            {},
            [1, "a"],
            {"x": 1},
            2**31,
            2**63 - 1,
            2**63,
            2**64 + 1,
            -(2**63) - 1,
            10**30,
            math.nan,
            math.inf,
            -math.inf,
            1e308,
            "yes",
            "null",
            "0x1",
            "\x00",
        ]
        # a copy each time: a later mutation may write into a drawn {} or []
    ).map(copy.deepcopy),
    st.integers(),
    st.floats(),
    st.text(max_size=20),
)


def paths(value: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every key/index path inside a spec (the root excluded)."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield (*prefix, key)
            yield from paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield (*prefix, index)
            yield from paths(item, (*prefix, index))


def near_miss(key: str, data: st.DataObject) -> str:
    """``key`` with one letter dropped, doubled, swapped or replaced."""
    if not key:
        return "x"
    i = data.draw(st.integers(0, len(key) - 1), label="at")
    how = data.draw(
        st.sampled_from(["drop", "double", "swap", "replace", "case", "dash"]), label="how"
    )
    if how == "drop" and len(key) > 1:
        return key[:i] + key[i + 1 :]
    if how == "swap" and i + 1 < len(key):
        return key[:i] + key[i + 1] + key[i] + key[i + 2 :]
    if how == "replace":
        return key[:i] + data.draw(st.sampled_from(string.ascii_lowercase)) + key[i + 1 :]
    if how == "case":
        return key.upper()
    if how == "dash":
        return key.replace("_", "-") if "_" in key else key + "-"
    return key[:i] + key[i] + key[i:]


def mutate(spec: dict[str, Any], data: st.DataObject) -> dict[str, Any]:
    spec = copy.deepcopy(spec)
    for _ in range(data.draw(st.integers(1, 3), label="mutations")):
        where = [()] + list(paths(spec))
        path = data.draw(st.sampled_from(where), label="path")
        parent: Any = spec
        for part in path[:-1]:
            parent = parent[part]
        kind = data.draw(
            st.sampled_from(["replace", "delete", "unknown", "replace", "table"]), label="kind"
        )
        if not path:  # the root: add or break a whole table
            table = data.draw(
                st.sampled_from(
                    [
                        "job",
                        "distributed",
                        "parallelism",
                        "batch",
                        "model",
                        *PLUGINS.tables(),
                        "jobs",
                        "torchrum",
                    ]
                )
            )
            spec[table] = data.draw(WRONG_VALUES, label="table value")
            continue
        key = path[-1]
        if kind == "delete":
            del parent[key]
        elif kind == "unknown" and isinstance(parent, dict):
            parent[near_miss(str(key), data)] = parent[key]
        elif kind == "table":
            parent[key] = data.draw(st.dictionaries(st.text(max_size=8), WRONG_VALUES, max_size=3))
        else:
            parent[key] = data.draw(WRONG_VALUES, label="value")
    return spec


# ---------------------------------------------------------------- writing and compiling


def dump(spec: Any, fmt: str, path: Path) -> Path:
    """Write ``spec`` as ``fmt``; a value the format cannot hold falls back to JSON."""
    target = path.with_suffix("." + fmt)
    try:
        if fmt == "toml":
            text = tomlkit.dumps(spec)
        elif fmt == "yaml":
            stream = io.StringIO()
            yaml = YAML(typ="safe", pure=True)
            yaml.default_flow_style = False
            yaml.dump(spec, stream)
            text = stream.getvalue()
        else:
            text = json.dumps(spec, ensure_ascii=False)
    except (TypeError, ValueError, tomlkit.exceptions.TOMLKitError):
        target, text = path.with_suffix(".json"), json.dumps(spec, ensure_ascii=False)
    try:
        target.write_text(text, encoding="utf-8", errors="surrogatepass")
    except UnicodeEncodeError:  # pragma: no cover - lone surrogates are written as bytes
        target.write_bytes(text.encode("utf-8", "surrogatepass"))
    return target


DIAGNOSTIC = re.compile(
    r"^(?P<path>.+?)(?::(?P<line>\d+):(?P<col>\d+))?: (?P<sev>error|warning)"
    r"\[(?P<code>MDC\d{3})\]: "
)


@contextmanager
def shared_compiler() -> Iterator[None]:
    """The CLI with the built-ins loaded once (loading them is most of a small compile)."""
    with mock.patch.object(mdc.cli, "_compiler", lambda args: COMPILER):
        yield


def run_compile(spec_path: Path, out: Path) -> tuple[int, str, list[dict[str, Any]]]:
    """``mdc compile`` in text and in JSON form: exit code, stderr text, JSON diagnostics."""
    stdout, stderr = io.StringIO(), io.StringIO()
    with shared_compiler():
        code = main(
            ["compile", str(spec_path), "-o", str(out), "--no-plugin-autoload"],
            stdout=stdout,
            stderr=stderr,
        )
        js_out, js_err = io.StringIO(), io.StringIO()
        js_code = main(
            ["validate", "--format", "json", str(spec_path), "--no-plugin-autoload"],
            stdout=js_out,
            stderr=js_err,
        )
    text = stderr.getvalue()
    note(text)
    assert code in (0, 1), f"mdc compile exited {code}:\n{text}"
    assert "internal error" not in text and "Traceback" not in text, text
    assert js_code == code, (js_code, code, js_err.getvalue())
    report = json.loads(js_out.getvalue())
    return code, text, report["diagnostics"]


def check_diagnostics(
    spec_path: Path, code: int, text: str, diagnostics: list[dict[str, Any]]
) -> None:
    errors = [d for d in diagnostics if d["severity"] == "error"]
    assert bool(errors) == (code == 1), diagnostics
    for diag in diagnostics:
        assert re.fullmatch(r"MDC\d{3}", diag["code"]), diag
        assert diag["path"] == str(spec_path), diag
        if diag["line"] is None:
            assert diag["column"] is None and diag["pointer"] in ("", None), (
                f"an unlocated diagnostic that points into the spec: {diag}"
            )
        else:
            assert diag["line"] >= 1 and diag["column"] >= 1, diag
    # the text form: every diagnostic starts a line with path[:line:col]: severity[code]:
    heads = [m for m in map(DIAGNOSTIC.match, text.splitlines()) if m]
    assert len(heads) == len(diagnostics), text
    for head in heads:
        assert head["path"] == str(spec_path), head.group(0)


def compile_and_check(spec: dict[str, Any], fmt: str, tmp: Path) -> int:
    return compile_file_and_check(dump(spec, fmt, tmp / "spec"), tmp)


def compile_file_and_check(spec_path: Path, tmp: Path) -> int:
    note(spec_path.read_text(encoding="utf-8", errors="replace"))
    out = tmp / "out"
    code, text, diagnostics = run_compile(spec_path, out)
    check_diagnostics(spec_path, code, text, diagnostics)
    event(f"exit {code}")
    for diag in diagnostics:
        event(diag["code"])
    if code == 0:
        assert (out / "manifest.json").is_file()
        first = [(a.path, a.data, a.executable) for a in COMPILER.compile(spec_path).tree]
        again = [(a.path, a.data, a.executable) for a in COMPILER.compile(spec_path).tree]
        assert first == again, "the same spec compiled to different bytes"
        written = {
            p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()
        }
        assert written == {path: data for path, data, _exe in first}
    return code


FORMATS = st.sampled_from(["toml", "yaml", "json"])


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


def fresh(base: Path) -> Path:
    """An empty directory for one example (hypothesis reuses the test's fixtures)."""
    target = base / "case"
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir()
    return target


# ---------------------------------------------------------------- the properties


@FUZZ
@given(spec=valid_specs(), fmt=FORMATS)
def test_valid_specs_compile_or_fail_located(spec: dict[str, Any], fmt: str, workdir: Path) -> None:
    compile_and_check(spec, fmt, fresh(workdir))


@FUZZ
@given(spec=valid_specs(), fmt=FORMATS, data=st.data())
def test_mutated_specs_compile_or_fail_located(
    spec: dict[str, Any], fmt: str, data: st.DataObject, workdir: Path
) -> None:
    broken = mutate(spec, data)
    assume(broken != spec)
    compile_and_check(broken, fmt, fresh(workdir))


@st.composite
def schema_specs(draw: st.DrawFn) -> dict[str, Any]:
    """A spec whose launcher and backend tables come from their schema fragments."""
    launcher, backend = draw(st.sampled_from(SUPPORTED))
    spec: dict[str, Any] = {
        "job": {"name": "fuzz", "command": ["python", "train.py"]},
        "distributed": {
            "launcher": launcher,
            "backend": backend,
            "nnodes": draw(SIZES),
            "nproc_per_node": draw(SIZES),
            "accelerator": "cpu",
        },
    }
    for name in (launcher, backend):
        fragment = SCHEMA["properties"].get(name)
        if fragment is not None:
            spec[name] = draw(from_fragment(fragment))
    return spec


@FUZZ
@given(spec=schema_specs(), fmt=FORMATS)
def test_schema_generated_plugin_tables(spec: dict[str, Any], fmt: str, workdir: Path) -> None:
    """Tables that satisfy the schema never crash a plugin's check or emit."""
    compile_and_check(spec, fmt, fresh(workdir))


def yaml_with_references(spec: dict[str, Any], data: st.DataObject) -> str:
    """``spec`` as YAML whose tables take their first members through a merge key
    (``<<: {...}``), and whose job name is anchored and aliased into the job's env.
    Values are written as JSON, which YAML reads as flow nodes."""
    lines = []
    merged = data.draw(st.sampled_from(sorted(spec)), label="merged table")
    for name, table in spec.items():
        if not isinstance(table, dict):
            lines.append(f"{json.dumps(name)}: {json.dumps(table)}")
            continue
        lines.append(f"{json.dumps(name)}:")
        items = list(table.items())
        if name == merged and items:
            count = data.draw(st.integers(1, len(items)), label="members merged")
            lines.append(f"  <<: {json.dumps(dict(items[:count]))}")
            items = items[count:]
        for key, value in items:
            if name == "job" and key == "name" and isinstance(value, str):
                lines.append(f"  name: &name {json.dumps(value)}")
            elif (
                name == "job"
                and key == "env"
                and isinstance(value, dict)
                and isinstance(table.get("name"), str)
            ):
                pairs = [f"{json.dumps(k)}: {json.dumps(v)}" for k, v in value.items()]
                lines.append(f"  env: {{{', '.join([*pairs, 'FUZZ_ALIAS: *name'])}}}")
            else:
                lines.append(f"  {json.dumps(key)}: {json.dumps(value)}")
    return "\n".join(lines) + "\n"


@FUZZ
@given(spec=valid_specs(), data=st.data())
def test_yaml_anchors_aliases_and_merge_keys(
    spec: dict[str, Any], data: st.DataObject, workdir: Path
) -> None:
    """YAML's references (which only the thorough reader takes) compile or fail located."""
    tmp = fresh(workdir)
    spec_path = tmp / "spec.yaml"
    spec_path.write_text(yaml_with_references(spec, data), encoding="utf-8", errors="surrogatepass")
    compile_file_and_check(spec_path, tmp)


def test_the_fuzz_profile_is_the_projects_own() -> None:
    """Whatever hypothesis loaded for CI, the fuzz tests run the profile of conftest.py."""
    expected = 10_000 if settings.get_current_profile_name() == "deep" else 100
    assert FUZZ.max_examples == expected
    assert FUZZ.deadline is None and FUZZ.database is None
