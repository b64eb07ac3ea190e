"""Every TPOT row held out by source, and the predicted / measured ratio grouped.

    .venv/bin/python -m bench.serving_fit --tpot

Each row's engine, model, checkpoint, GPU, layout (tp, pp, ep, dp), requests in flight (or
sent at once), lengths and step budget, its measured and predicted TPOT (the constants
fitted on the other sources' rows, as bench.serving_targets reads them); then the ratio's
median by source, engine, dense or MoE, GPU, requests in flight and burst or not: a
systematic bias shows as a group's median away from 1.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from bench import serving_fit, serving_targets

Row = Mapping[str, Any]

#: the axes the ratio is grouped by: name and the row's value on it
AXES: tuple[tuple[str, Callable[[Row], Any]], ...] = (
    ("source", lambda r: r["source"]),
    ("engine", lambda r: r["launcher"]),
    ("dense or MoE", lambda r: serving_fit.family(r)["model"]),
    ("GPU", lambda r: r["accelerator_model"]),
    ("in flight", lambda r: r.get("concurrency", f"rate {r.get('request_rate')}")),
    ("sent at once", lambda r: bool(r.get("sent_at_once"))),
)


def ratios(scored: Sequence[serving_targets.Scored]) -> list[tuple[Row, float]]:
    """(row, predicted / measured TPOT) of every row that measures TPOT."""
    return [
        (s.row, s.predicted["tpot"] / s.measured["tpot"]) for s in scored if "tpot" in s.measured
    ]


def grouped(
    pairs: Sequence[tuple[Row, float]], key: Callable[[Row], Any]
) -> dict[str, tuple[int, float, float]]:
    """{group: (rows, median ratio, median |ratio - 1|)} of the pairs by ``key``."""
    out: dict[str, list[float]] = {}
    for row, ratio in pairs:
        out.setdefault(str(key(row)), []).append(ratio)
    return {
        g: (len(v), statistics.median(v), statistics.median(abs(x - 1) for x in v))
        for g, v in sorted(out.items(), key=_natural)
    }


def _natural(item: tuple[str, list[float]]) -> tuple[bool, int, str]:
    """Groups in order, numbers by value (4 before 16)."""
    group = item[0]
    return (not group.isdigit(), int(group) if group.isdigit() else 0, group)


def _line(row: Row, ratio: float, measured: float) -> str:
    layout = "".join(f"{k}{row.get(k, 1)}" for k in ("tp", "pp", "ep", "dp"))
    load = row.get("concurrency", row.get("request_rate"))
    return (
        f"{row['source'][:10]:<10} {row['launcher']:<11} {row['model']:<16} {row['dtype']:<4} "
        f"{row['accelerator_model']:<9} {layout:<13} n={load!s:<5} "
        f"{row['input_tokens']:>6}/{row['output_tokens']:<5} step={row.get('step_tokens', '-')!s:<6}"
        f"{'burst ' if row.get('sent_at_once') else '      '}"
        f"TPOT {measured:8.1f} -> {measured * ratio:8.1f} ms  x{ratio:.2f}"
    )


def report(rows: Sequence[Row]) -> None:
    scored = serving_targets.score(rows)
    measured = {id(s.row): s.measured["tpot"] for s in scored if "tpot" in s.measured}
    pairs = ratios(scored)
    for row, ratio in sorted(
        pairs, key=lambda p: (p[0]["source"], p[0]["launcher"], p[0]["model"])
    ):
        print(_line(row, ratio, measured[id(row)]))
    for name, key in AXES:
        print(f"== TPOT predicted / measured by {name}")
        for group, (n, median, off) in grouped(pairs, key).items():
            print(
                f"  {group:<28} {n:4d} rows  median x{median:.2f}  median |error| {off * 100:.1f} %"
            )
