"""Fit and check mdc tune's serving model on published measurements (bench/serving_data.toml).

    .venv/bin/python -m bench.serving_fit [--fit]

Prints, per measurement, the predicted and published output throughput per GPU, and the
error summary: all rows at the shipped constants, and held out by model (each model's
rows predicted with constants fitted on the other models' rows). ``--fit`` searches the
constants' grid on every row and prints the best.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from mdc.convert import structure
from mdc.hardware import Accelerator, builtin
from mdc.plan.memory import Shape, resolve_shape
from mdc.plan.named_models import architecture
from mdc.spec import ModelTable, WorkloadTable
from mdc.tune.serving_perf import DEFAULT, Constants, Deployment, Role, predict

DATA = Path(__file__).with_name("serving_data.toml")
#: an offline run ("max"): every request queued at once
OFFLINE = 1_000_000


def measurements(path: Path = DATA) -> list[dict[str, Any]]:
    data = tomllib.loads(path.read_text())
    sources = data["sources"]
    return [{**sources[row["source"]], **row} for row in data["measurement"]]


def _shape(model: str, dtype: str, seq: int) -> Shape:
    table = structure({**architecture(model), "dtype": dtype, "seq_length": seq}, ModelTable)
    shape = resolve_shape(table)
    assert shape is not None, model
    return shape


def predicted(row: Mapping[str, Any], constants: Constants = DEFAULT) -> float:
    """The model's output tokens/s per GPU for one measurement."""
    hw: Accelerator = builtin()[row["accelerator_model"]]
    inp, out = row["input_tokens"], row["output_tokens"]
    shape = _shape(row["model"], row["dtype"], inp + out)
    tp, pp, ep = row.get("tp", 1), row.get("pp", 1), row.get("ep", 1)
    role = Role(name="server", servers=row.get("servers", 1), gpus=tp * pp, tp=tp, pp=pp, ep=ep)
    dep = Deployment(
        launcher=row["launcher"],
        roles=(role,),
        kv_dtype=row.get("kv_dtype", "auto"),
        share=0.9,
        share_of="free" if row["launcher"] == "trtllm" else "capacity",
        capacity_gib=hw.memory_gib,
        nproc_per_node=8,
    )
    load = row["concurrency"]
    workload = WorkloadTable(
        input_tokens=inp,
        output_tokens=out,
        concurrency=OFFLINE if load == "max" else int(load),
    )
    return predict(shape, hw, dep, workload, constants).output_tokens_per_s_per_gpu


def measured(row: Mapping[str, Any]) -> float:
    gpus: int = row.get("tp", 1) * row.get("pp", 1) * row.get("servers", 1)
    return float(row["output_tokens_per_s"]) / gpus


def errors(rows: Iterable[Mapping[str, Any]], constants: Constants = DEFAULT) -> list[float]:
    """Signed relative errors, (predicted - measured) / measured."""
    return [predicted(r, constants) / measured(r) - 1 for r in rows]


def summary(errs: Sequence[float]) -> str:
    absolute = [abs(e) for e in errs]
    within = sum(a <= 0.30 for a in absolute) / len(absolute)
    twice = sum(1 / 2 <= 1 + e <= 2 for e in errs) / len(errs)
    return (
        f"{len(errs)} rows: median |error| {statistics.median(absolute) * 100:.1f} %, "
        f"within 30 % {within * 100:.0f} %, within 2x {twice * 100:.0f} %"
    )


#: the grid --fit searches: HBM efficiency, prefill efficiency, TensorRT-LLM's step overhead
GRID = {
    "hbm_efficiency": (0.6, 0.7, 0.8, 0.9),
    "prefill_efficiency": (0.3, 0.4, 0.5, 0.6),
    "trtllm_overhead_ms": (1.0, 2.0, 4.0, 8.0),
}


def constants_of(hbm: float, prefill: float, overhead_ms: float) -> Constants:
    return attrs.evolve(
        DEFAULT,
        hbm_efficiency=hbm,
        prefill_efficiency=prefill,
        step_overhead_s={**DEFAULT.step_overhead_s, "trtllm": overhead_ms / 1e3},
    )


def fit(rows: Sequence[Mapping[str, Any]]) -> tuple[Constants, float]:
    """The grid's constants of the least median |log error| on ``rows``."""
    import math

    best: tuple[float, Constants] | None = None
    for values in itertools.product(*GRID.values()):
        c = constants_of(*values)
        score = statistics.median(abs(math.log(1 + e)) for e in errors(rows, c))
        if best is None or score < best[0]:
            best = (score, c)
    assert best is not None
    return best[1], best[0]


def held_out(rows: Sequence[Mapping[str, Any]], key: str) -> dict[str, list[float]]:
    """Each group's errors with constants fitted on the other groups' rows."""
    out = {}
    for group in sorted({r[key] for r in rows}):
        train = [r for r in rows if r[key] != group]
        test = [r for r in rows if r[key] == group]
        c, _ = fit(train)
        out[group] = errors(test, c)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--fit", action="store_true", help="search the grid on every row")
    args = parser.parse_args(argv)
    rows = measurements()
    for row, err in zip(rows, errors(rows), strict=True):
        print(
            f"{row['model']:<16} {row['accelerator_model']:<9} tp{row.get('tp', 1)} "
            f"{row['input_tokens']:>5}/{row['output_tokens']:<5} measured "
            f"{measured(row):8.0f} predicted {predicted(row):8.0f} ({err * 100:+.0f} %)"
        )
    print("shipped constants:", summary(errors(rows)))
    for key in ("model", "accelerator_model"):
        for group, errs in held_out(rows, key).items():
            print(f"held out {group}:", summary(errs))
    if args.fit:
        c, score = fit(rows)
        print(
            f"fit on all rows: {c.hbm_efficiency=} {c.prefill_efficiency=} "
            f"{c.step_overhead_s['trtllm']=} (median |log error| {score:.3f})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
