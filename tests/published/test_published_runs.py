"""Published pre-training runs compile: no refusal, the published size, a fit in memory.

Every row of ``runs.toml`` is a run that really ran (a paper's or a vendor's table, see
docs/published-runs.md). Each is compiled as its launcher's spec through mdc's real compile
path, with ``accelerator_memory_gib`` set to the GPU's memory, and must:

* compile: a framework does not refuse a run it ran, so neither may mdc;
* count the model's parameters within 1 % of the published size (or within half the unit
  of the last digit the source prints, when it rounds coarser than that);
* estimate the memory per GPU within the GPU's memory.

Rows mdc cannot express yet are listed in ``bench.published.AWAITING`` with the feature they wait for;
each must still be refused (a strict expected failure), so the list only shrinks.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import attrs
import pytest
from bench.published import (
    AWAITING,
    MODELS,
    OVER_MEMORY,
    PRECISION,
    RUNS,
    RUNS_FILE,
    ModelNotListed,
    recipe_mtp_params,
    spec_of,
)

from mdc.convert import structure
from mdc.errors import SpecError
from mdc.pipeline import Compiled, Compiler
from mdc.plan.memory import parameter_count, resolve_shape
from mdc.spec import ModelTable


def compiled(compiler: Compiler, tmp_path: Path, run: dict[str, Any]) -> Compiled:
    path = tmp_path / f"{run['id']}.json"
    path.write_text(json.dumps(spec_of(run)), encoding="utf-8")
    return compiler.compile(path, tree=False)


def _param(run: dict[str, Any]) -> Any:
    waits = AWAITING.get(run["id"])
    # a memory row is no longer refused: it fails the estimate's own assertion
    raises = (
        (AssertionError,)
        if waits and waits.startswith(OVER_MEMORY)
        else (SpecError, ModelNotListed)
    )
    marks = [pytest.mark.xfail(reason=waits, raises=raises, strict=True)] if waits else []
    return pytest.param(run, id=run["id"], marks=marks)


@pytest.mark.parametrize("run", [_param(r) for r in RUNS])
def test_published_run_compiles_with_its_size_and_fits(
    compiler: Compiler, tmp_path: Path, run: dict[str, Any]
) -> None:
    try:
        result = compiled(compiler, tmp_path, run)
    except SpecError as exc:
        if run["id"] in AWAITING:
            raise
        pytest.fail(
            f"{run['id']} ({run['source']}, {run['table']}) refused:\n"
            + "\n".join(d.render() for d in exc.diagnostics)
        )
    memory = result.plan.memory
    assert memory is not None, "a complete [model] table gives an estimate"
    entry = MODELS[run["model"]]
    published = entry["published_params"]
    tolerance = max(0.01 * published, entry.get("published_params_rounded_to", 0) / 2)
    # a run's recipe may add MTP depths the released model (and its published count) lacks
    counted = memory.params_total - recipe_mtp_params(run)
    if entry.get("published_params_exclude_mtp"):  # the source counts the main model only
        shape = resolve_shape(structure(entry["model"], ModelTable))
        assert shape is not None
        counted = parameter_count(attrs.evolve(shape, mtp_layers=0))
    assert abs(counted - published) <= tolerance, (
        f"{counted:,} parameters, published {published:,.0f} ({entry['params_source']})"
    )
    capacity = run["gpu_memory_gib"] * 2**30
    assert memory.capacity == capacity
    assert memory.total <= capacity, (
        f"estimate {memory.total / 2**30:.1f} GiB > {run['gpu_memory_gib']} GiB"
    )


# ------------------------------------------------------------------ the table itself

REQUIRED = [
    "id",
    "source",
    "table",
    "date",
    "model",
    "launcher",
    "accelerator_model",
    "gpu_memory_gib",
    "gpus",
    "nproc_per_node",
    "precision",
    "seq_length",
]
MEASURED = {
    "tflops_per_gpu",
    "tokens_per_s_per_gpu",
    "mfu",
    "step_time_s",
    "memory_gib",
    "flops_include_recompute",
    "attention_flops",
}


def test_rows_are_complete_and_unique() -> None:
    accelerators = tomllib.loads(RUNS_FILE.read_text(encoding="utf-8"))["accelerators"]
    ids = [r["id"] for r in RUNS]
    assert len(ids) == len(set(ids))
    for run in RUNS:
        assert [k for k in REQUIRED if k not in run] == [], run["id"]
        assert run["source"].startswith("https://"), run["id"]
        assert run["launcher"] in ("megatron", "torchtitan"), run["id"]
        # the only other count is the causal half, which a row says by leaving the key out
        assert run.get("measured", {}).get("attention_flops", "full") == "full", run["id"]
        if "gpu_memory_source" not in run:  # a variant of the accelerator says where its size is
            assert run["gpu_memory_gib"] == accelerators[run["accelerator_model"]]["memory_gib"]
        assert run["gpus"] % run["nproc_per_node"] == 0, run["id"]
        assert set(run.get("measured", {})) <= MEASURED, run["id"]
        assert run["precision"] in PRECISION, run["id"]


def test_left_out_runs_say_where_and_why() -> None:
    """A published run that cannot be stated as a spec is listed under [[left_out]] with its
    source, the table it is in and the reason, and is not also a row."""
    left_out = tomllib.loads(RUNS_FILE.read_text(encoding="utf-8"))["left_out"]
    assert left_out
    rows = {(r["source"], r["table"]) for r in RUNS}
    for entry in left_out:
        assert set(entry) == {"source", "table", "reason"}, entry
        assert entry["source"].startswith("https://"), entry
        assert entry["table"] and len(entry["reason"]) > 40, entry
        assert (entry["source"], entry["table"]) not in rows


def test_awaiting_names_only_rows_of_the_table() -> None:
    assert set(AWAITING) <= {r["id"] for r in RUNS}


MEASURED_MEMORY = [
    r for r in RUNS if "memory_gib" in r.get("measured", {}) and r["id"] not in AWAITING
]


@pytest.mark.parametrize("run", MEASURED_MEMORY, ids=[r["id"] for r in MEASURED_MEMORY])
def test_estimate_is_near_the_measured_peak(
    compiler: Compiler, tmp_path: Path, run: dict[str, Any]
) -> None:
    """Where the source states the peak memory per GPU (TorchTitan's benchmark tables: the
    allocator's peak, with its cache), the estimate stays within -45 % / +10 % of it: it
    leaves the CUDA context, buffers and fragmentation out, and torch.compile's fusions keep
    a little less than the eager layer it counts."""
    estimate = compiled(compiler, tmp_path, run).plan.memory
    assert estimate is not None
    measured = run["measured"]["memory_gib"] * 2**30
    assert 0.55 * measured <= estimate.total <= 1.10 * measured, (
        f"estimate {estimate.total / 2**30:.1f} GiB, measured {run['measured']['memory_gib']} "
        f"GiB ({run['source']}, {run['table']})"
    )
