"""Inputs built to exhaust time or memory are refused with a located message, in bounded memory.

How fast each is refused is measured in ``bench/`` (speed lives in benchmarks, not in
timed tests); here each must be refused (or compiled) with the right diagnostic while
tracemalloc's peak stays under a stated bound.
"""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from mdc.errors import Diagnostic, SpecError
from mdc.loaders import MAX_BYTES
from mdc.loaders.document import MAX_DEPTH
from mdc.loaders.yaml import MAX_VALUES
from mdc.pipeline import Compiled, Compiler

#: peak Python allocation while refusing a bomb; the documents themselves are at most 4 MiB
PEAK_LIMIT = 64 * 2**20


def peak_while(action: Callable[[], object]) -> tuple[object, int]:
    tracemalloc.start()
    try:
        try:
            result: object = action()
        except SpecError as exc:
            result = list(exc.diagnostics)
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def refused(compiler: Compiler, path: Path) -> list[Diagnostic]:
    result, peak = peak_while(lambda: compiler.compile(path))
    assert peak < PEAK_LIMIT, f"peak {peak / 2**20:.0f} MiB"
    assert isinstance(result, list), "expected the spec to be refused"
    return result


def alias_bomb() -> str:
    """Ten levels of nine aliases each: 9**10 scalars once expanded."""
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 10)]
    return "\n".join(lines) + "\n"


@pytest.mark.slow
def test_yaml_alias_bomb_is_refused_before_it_expands(compiler: Compiler, tmp_path: Path) -> None:
    spec = tmp_path / "bomb.yaml"
    spec.write_text(alias_bomb())
    [found] = refused(compiler, spec)
    assert found.code == "MDC004"
    assert f"more than {MAX_VALUES:,} values" in found.message
    assert found.hint is not None and "aliases" in found.hint


def test_a_few_aliases_are_fine(compiler: Compiler, tmp_path: Path) -> None:
    spec = tmp_path / "ok.yaml"
    spec.write_text(
        "job:\n  name: a\n  command: &cmd [python, train.py]\n"
        "distributed: {launcher: torchrun, nnodes: 1, nproc_per_node: 2}\n"
        "x-unused: *cmd\n"
    )
    found = refused(compiler, spec)
    # the alias expands fine; only the unused key is wrong
    assert [(d.code, d.location.pointer) for d in found] == [("MDC101", "/x-unused")]


@pytest.mark.slow
def test_a_50_mb_file_is_refused_without_reading_it(compiler: Compiler, tmp_path: Path) -> None:
    spec = tmp_path / "huge.toml"
    with spec.open("w") as handle:
        handle.write("# " + "x" * (50 * 2**20) + "\n")
    [found] = refused(compiler, spec)
    assert found.code == "MDC003"
    assert f"limited to {MAX_BYTES}" in found.message


def nestings(depth: int) -> Iterator[tuple[str, str]]:
    yield "flow.yaml", "a: " + "[" * depth + "]" * depth + "\n"
    yield "flow-text.yaml", "a: " + "[x, " * depth + "]" * depth + "\n"
    yield "block.yaml", "- " * depth + "x\n"
    yield "maps.yaml", "".join(" " * i + "a:\n" for i in range(min(depth, 2000)))
    yield "deep.json", '{"a": ' + "[" * depth + "]" * depth + "}"
    yield "deep.toml", "a = " + "[" * depth + "]" * depth + "\n"


@pytest.mark.slow
@pytest.mark.parametrize(("name", "text"), list(nestings(10_000)), ids=lambda v: v[:12])
def test_10000_deep_nesting_is_refused(
    name: str, text: str, compiler: Compiler, tmp_path: Path
) -> None:
    spec = tmp_path / name
    spec.write_text(text)
    [found] = refused(compiler, spec)
    assert found.code == "MDC001"
    assert "nest" in found.message


def test_nesting_within_the_limit_is_not_called_deep(compiler: Compiler, tmp_path: Path) -> None:
    spec = tmp_path / "ok.yaml"
    spec.write_text("a: " + "[" * (MAX_DEPTH - 2) + "]" * (MAX_DEPTH - 2) + "\n")
    assert all("nest" not in d.message for d in refused(compiler, spec))


@pytest.mark.parametrize("backend", ["slurm", "kubernetes", "pytorchjob", "trainjob"])
def test_a_million_nodes_compile_in_bounded_memory(
    backend: str, compiler: Compiler, tmp_path: Path
) -> None:
    """10**6 nodes x 8 (an Indexed Job: the apiserver's most, 10**5): the plan is formulas,
    not lists; artifacts do not grow with nnodes."""
    nodes = 100_000 if backend == "kubernetes" else 1_000_000
    spec = tmp_path / "big.toml"
    spec.write_text(
        '[job]\nname = "big"\nimage = "img:1"\ncommand = ["python", "train.py"]\n'
        f'[distributed]\nlauncher = "megatron"\nbackend = "{backend}"\nnnodes = {nodes}\n'
        "nproc_per_node = 8\n[parallelism]\ntp = 8\npp = 16\ncp = 2\n"
        "[batch]\nglobal_batch_size = 250000\nmicro_batch_size = 1\n"
    )
    result, peak = peak_while(lambda: compiler.compile(spec))
    assert isinstance(result, Compiled), result
    assert peak < PEAK_LIMIT, f"peak {peak / 2**20:.0f} MiB"
    size = sum(len(a.data) for a in result.tree)
    assert size < 256 * 2**10, f"{size} bytes of artifacts"


HUGE = [10**30, 2**62]
SIZE_LIMITS = {
    "nnodes": 1_048_576,
    "min_nnodes": 1_048_576,
    "prefill_nodes": 1_048_576,
    "decode_nodes": 1_048_576,
    "nproc_per_node": 1024,
}


@pytest.mark.parametrize("value", HUGE)
@pytest.mark.parametrize("key", sorted(SIZE_LIMITS))
def test_absurd_node_and_process_counts_are_schema_errors(
    key: str, value: int, compiler: Compiler, tmp_path: Path
) -> None:
    """Rank arithmetic over 10**30 processes would never end (a fuzz run found one that
    did not): the counts have a bound, far above any cluster."""
    distributed = {"nnodes": 4, "nproc_per_node": 8, key: value}
    spec = tmp_path / "huge.toml"
    spec.write_text(
        '[job]\nname = "huge"\ncommand = ["python", "train.py"]\n'
        '[distributed]\nlauncher = "torchrun"\n'
        + "".join(f"{k} = {v}\n" for k, v in distributed.items())
        + "[parallelism]\ntp = 2\npp = 2\n"
    )
    found = refused(compiler, spec)
    assert [(d.code, d.location.pointer) for d in found if d.is_error] == [
        ("MDC105", f"/distributed/{key}")
    ]
    assert f"<= {SIZE_LIMITS[key]}" in found[0].message


@pytest.mark.parametrize("order", ["tp-cp-ep-dp-pp", "dp-tp-cp-ep-pp", "pp-dp-cp-ep-tp"])
@pytest.mark.parametrize(("tp", "cp"), [(2, 2), (3, 1), (1024, 1), (6, 2)])
def test_the_largest_counts_plan_in_bounded_memory(
    order: str, tp: int, cp: int, compiler: Compiler, tmp_path: Path
) -> None:
    """At the bounds (2**20 nodes x 1024), tensor-parallel groups that do or do not cross
    nodes are found without listing the groups."""
    spec = tmp_path / "edge.toml"
    spec.write_text(
        '[job]\nname = "edge"\ncommand = ["python", "train.py"]\n'
        '[distributed]\nlauncher = "megatron"\nbackend = "slurm"\nnnodes = 1048576\n'
        f"nproc_per_node = 1024\n[parallelism]\ntp = {tp}\npp = 1\ncp = {cp}\n"
        f'order = "{order}"\n'
    )
    result, peak = peak_while(lambda: compiler.compile(spec, tree=False))
    assert peak < PEAK_LIMIT, f"peak {peak / 2**20:.0f} MiB"
    findings = result if isinstance(result, list) else list(result.diagnostics)  # type: ignore[attr-defined]
    assert all(d.code != "MDC105" for d in findings)
