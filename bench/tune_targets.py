"""mdc tune against published layouts: Megatron-LM's Table 1 and NVIDIA's recipes.

    .venv/bin/python -m bench.tune_targets [--only table1|recipes] [--rows SUBSTR,...]

* Narayanan et al. 2021, Table 1: each row's model, GPU count, batch, full recompute and
  data-parallel implementation as its row states them, with tp, pp, the virtual stages and
  the micro batch left open; does the searched best (tp, pp) equal the paper's? Read a
  second way too, with the row's data-parallel size held (``[parallelism] dp``): the table
  grows the GPUs with the model at 32 data-parallel replicas from 1.7B to 76.1B (GPUs /
  (tp x pp) = 32), so its GPU count and dp fix tp x pp and the search splits that product.
* NVIDIA Megatron-Bridge recipes (the rows of tests/published/runs.toml that compile today):
  tp, pp, cp, ep, etp, vpp and the micro batch left open, precision and the rest as the
  recipe sets them; does the published layout rank in mdc tune's top 5 (the whole layout,
  and its parallel sizes tp, pp, cp, ep alone), and does it fit?
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
from typing import Any

from bench.published import AWAITING, RUNS, spec_of
from mdc.errors import SpecError
from mdc.loaders import LoadedDocument
from mdc.pipeline import Compiler
from mdc.plugin_manager import load_plugins
from mdc.tune.search import Result, Tuner

NARAYANAN = "https://arxiv.org/abs/2104.04473"
OPEN = ("tp", "pp", "cp", "ep", "etp", "vpp")
#: the parallel sizes of a layout, without its schedule (virtual stages, micro batch)
PARALLEL = ("tp", "pp", "cp", "ep")


def runs() -> list[dict[str, Any]]:
    return sorted(RUNS, key=lambda r: r["id"])


def _picked(run: dict[str, Any], rows: str) -> bool:
    """Whether the row's id contains one of the comma-separated ``rows`` (all when empty)."""
    return any(part in run["id"] for part in rows.split(","))


def _spec(run: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = spec_of(run)
    spec["distributed"]["accelerator_model"] = run["accelerator_model"]
    return spec


def _tuner(compiler: Compiler, run: dict[str, Any], spec: dict[str, Any]) -> Tuner:
    doc = LoadedDocument(path=f"{run['id']}.json", data=spec, values={}, keys={})
    return Tuner(compiler, doc)


def table1(
    compiler: Compiler, rows: str = "", *, hold_dp: bool = False
) -> list[tuple[str, tuple[int, int], Any]]:
    """(row, the paper's (tp, pp), mdc's best (tp, pp) or None); ``hold_dp``: with the row's
    data-parallel size held, as a spec that sets ``[parallelism] dp`` holds it."""
    found = []
    for run in runs():
        if run["source"] != NARAYANAN or not _picked(run, rows):
            continue
        spec = _spec(run)
        for key in ("tp", "pp", "vpp"):
            spec["parallelism"].pop(key, None)
        if hold_dp:
            spec["parallelism"]["dp"] = run["gpus"] // (run["tp"] * run["pp"])
        spec["batch"].pop("micro_batch_size", None)
        result = _tuner(compiler, run, spec).run(top=1, headroom=0.0)
        best = result.rows[0].candidate.layout if result.rows else None
        found.append((run["id"], (run["tp"], run["pp"]), (best.tp, best.pp) if best else None))
    return found


def _sizes(L: Any) -> dict[str, int]:
    return {"tp": L.tp, "pp": L.pp, "cp": L.cp, "ep": L.ep, "vpp": L.vpp,
            "mbs": L.micro_batch_size}  # fmt: skip


def _has_sizes(want: dict[str, int], group: Any) -> bool:
    """Whether a layout class's candidates have the sizes ``want``."""
    return _class_sizes(group) == want


def _class_sizes(group: Any) -> dict[str, int]:
    """:func:`_sizes` of every candidate of a layout class (without predicting them)."""
    s = group.sizes
    return {"tp": s.tp, "pp": s.pp, "cp": s.cp, "ep": s.ep, "vpp": s.vpp or 1,
            "mbs": group.batch.micro_batch_size}  # fmt: skip


def _rank(result: Any, want: dict[str, int], keys: tuple[str, ...]) -> int | None:
    """The 1-based row of ``result`` whose sizes equal ``want`` in ``keys``, or None."""
    for i, row in enumerate(result.rows, 1):
        sizes = _sizes(row.candidate.layout)
        if all(sizes[k] == want[k] for k in keys):
            return i
    return None


def recipes(compiler: Compiler, rows: str = "") -> list[dict[str, Any]]:
    """Per compiling recipe row: its rank in mdc tune's top 5 (None: not there), whether the
    published layout fits the plan's estimate, and the best layout mdc found. Rows whose
    searched spec is the same (a recipe kept over releases) share one search: mdc's output is
    a function of the spec, so the second would find what the first found."""
    found = []
    searched: dict[str, tuple[Tuner, Result]] = {}
    for run in runs():
        if not _picked(run, rows):
            continue
        if not run["id"].startswith(("mbridge", "nemo")) or run["id"] in AWAITING:
            continue  # NVIDIA's recipes (Megatron-Bridge, NeMo) that compile today
        if "measured" not in run:
            continue
        spec = _spec(run)
        try:
            compiled = compiler.compile_document(
                LoadedDocument(path="x.json", data=spec, values={}, keys={}), tree=False
            )
        except SpecError:
            continue
        memory = compiled.plan.memory
        fits = memory is None or memory.capacity is None or memory.total <= memory.capacity
        want = {k: run.get(k) or 1 for k in ("tp", "pp", "cp", "ep", "vpp")}
        want["mbs"] = run.get("micro_batch_size", 1)
        # what the source leaves unstated is not part of the published layout
        unstated = {"micro_batch_size": "mbs", "vpp": "vpp"}
        whole = tuple(k for k in want if k not in {unstated[u] for u in run.get("unstated", ())})
        for key in OPEN:
            spec["parallelism"].pop(key, None)
        spec["batch"].pop("micro_batch_size", None)
        key = json.dumps(spec, sort_keys=True)
        if key not in searched:
            tuner = _tuner(compiler, run, spec)
            # ranked by speed: the top 5 as printed
            searched[key] = tuner, tuner.run(top=5, headroom=0.0)
        tuner, result = searched[key]
        # the whole layout (sizes, virtual stages, micro batch), and its parallel sizes alone
        rank = _rank(result, want, whole)
        parallel_rank = _rank(result, want, PARALLEL)
        best = result.rows[0].candidate.label() if result.rows else None
        best_sizes = _sizes(result.rows[0].candidate.layout) if result.rows else None
        # how much slower the model predicts the published layout than its own best
        # (the published sizes with the switches mdc would pick for them)
        gap = None
        own = [
            c.prediction.tokens_per_s_per_gpu
            for c in tuner.candidates(functools.partial(_has_sizes, want))
        ]
        if own and result.rows:
            top = result.rows[0].candidate.prediction.tokens_per_s_per_gpu
            gap = 1 - max(own) / top
        found.append(
            {
                "id": run["id"],
                "rank": rank,
                "parallel_rank": parallel_rank,
                "fits": fits,
                "want": want,
                "stated": whole,
                "best": best,
                "best_sizes": best_sizes,
                "gap": gap,
            }
        )
    return found


def faster(found: list[dict[str, Any]]) -> float:
    """The median over the recipe rows of how much faster mdc's best is predicted than the
    published layout (best / published - 1; issue 36's target: at most 5 %)."""
    return float(statistics.median(1 / (1 - r["gap"]) - 1 for r in found if r["gap"] is not None))


#: the settings a miss is grouped by, in :func:`_sizes`' names
SETTINGS = ("tp", "pp", "vpp", "cp", "ep", "mbs")


def misses(found: list[dict[str, Any]]) -> dict[tuple[str, ...], list[str]]:
    """The recipe rows whose parallel sizes are not in the top 5, grouped by the settings in
    which mdc's best differs from the published layout (of those the source states: its
    micro batch or virtual stages left open are not compared)."""
    groups: dict[tuple[str, ...], list[str]] = {}
    for r in found:
        if r["parallel_rank"] is not None or r["best_sizes"] is None:
            continue
        want, best = r["want"], r["best_sizes"]
        differ = tuple(k for k in SETTINGS if k in r["stated"] and want[k] != best[k])
        groups.setdefault(differ, []).append(r["id"])
    return dict(sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=("table1", "recipes"), help="run one of the two")
    parser.add_argument(
        "--rows", default="", help="only the rows whose id contains one of these (comma-separated)"
    )
    args = parser.parse_args()
    compiler = Compiler(load_plugins(autoload=False))
    if args.only != "recipes":
        for hold_dp, how in ((False, ""), (True, ", with the paper's data-parallel size held")):
            rows = table1(compiler, args.rows, hold_dp=hold_dp)
            same = sum(1 for _, paper, mine in rows if paper == mine)
            print(
                f"Table 1{how}: the searched best (tp, pp) equals the paper's in {same} of "
                f"{len(rows)} rows"
            )
            for ident, paper, mine in rows:
                print(f"  {ident}: paper {paper}, mdc {mine}")
    if args.only == "table1":
        return
    found = recipes(compiler, args.rows)
    top = sum(1 for r in found if r["rank"] is not None)
    parallel = sum(1 for r in found if r["parallel_rank"] is not None)
    fit = sum(1 for r in found if r["fits"])
    print(
        f"recipes: published layout in the top 5 for {top} of {len(found)}, its parallel "
        f"sizes (tp, pp, cp, ep) for {parallel}; fits: {fit}"
    )
    gaps = sorted(r["gap"] for r in found if r["gap"] is not None)
    if gaps:
        within = sum(1 for g in gaps if g <= 0.05)
        print(
            f"  predicted slower than mdc's best: median {statistics.median(gaps):.1%}, "
            f"within 5 % for {within} of {len(gaps)}"
        )
        # issue 36's reading of the same gap: mdc's best predicted faster than the published
        print(
            f"  mdc's best predicted faster than the published layout: median {faster(found):.1%}"
        )
    print("  parallel sizes not in the top 5, by the settings mdc's best differs in:")
    for differ, ids in misses(found).items():
        print(f"    {' '.join(differ) or 'none'}: {len(ids)}: {', '.join(ids)}")
    for r in found:
        gap = "-" if r["gap"] is None else f"{r['gap']:.1%}"
        print(f"  {r['id']}: rank {r['rank']} (sizes {r['parallel_rank']}), fits {r['fits']}, {gap} slower, "
              f"published {r['want']}, best {r['best']}")  # fmt: skip


if __name__ == "__main__":
    main()
