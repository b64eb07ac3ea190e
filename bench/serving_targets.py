"""Issue 38's targets for the serving model, on deployments the fit has not seen.

    .venv/bin/python -m bench.serving_fit --targets

Every row of bench/serving_data.toml is predicted with the constants fitted on the other
sources' rows (held out by source; a source never fitted is predicted with the shipped
fit). Against the targets:

* TPOT at the measured layout and load: median |error| <= 15 %, >= 80 % within 25 %;
* output tokens/s per GPU: median <= 20 %, >= 75 % within 30 %, >= 95 % within 2x;
* TTFT where the deployment is not overloaded: median <= 30 %, >= 70 % within 50 %.
  Not overloaded: the requests do not wait for a running slot. A run in steady state
  shows it in its measurement: the requests decoding (output tokens/s x TPOT, Little's
  law) are at least 90 % of those in flight. A closed loop in waves (fixed lengths on an
  engine that prefills every waiting prompt first) is a burst each wave, predicted as one,
  and counts where its wave fits the predicted running slots (batch limit, KV cache);
* choosing: among the measured deployments of one model, GPU, engine, checkpoint and
  workload (a source's rows that differ only in tp, pp, ep, dp or the step budget), under
  each TPOT limit that one of them meets, mdc's pick (the highest predicted tokens/s per
  GPU among those predicted to meet the limit, else the lowest predicted TPOT) meets the
  limit as measured and reaches >= 85 % of the best measured tokens/s per GPU that meets
  it, in >= 75 % of the cases; where aggregated and disaggregated deployments of such a
  group differ by >= 15 %, mdc calls the winner in >= 80 %. A disaggregated deployment
  here is a row measured end to end (its prefill and decode tables), of the same engine
  (vllm_disagg is vLLM's, sglang_disagg SGLang's) and load as the aggregated rows.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from bench import serving_fit
from mdc.tune.serving_records import Constants

Row = Mapping[str, Any]

#: (metric, median limit, [(within, share)]) as the issue states them
TARGETS: tuple[tuple[str, float, tuple[tuple[float, float], ...]], ...] = (
    ("tpot", 0.15, ((0.25, 0.80),)),
    ("throughput", 0.20, ((0.30, 0.75), (1.0, 0.95))),
    ("ttft", 0.30, ((0.50, 0.70),)),
)
#: the requests decoding over those in flight below which a row's TTFT is not counted
DECODING_SHARE = 0.9
CHOICE_SHARE = 0.85
#: a deployment's layout: what the search chooses inside one group
LAYOUT_KEYS = (
    "tp",
    "pp",
    "ep",
    "dp",
    "servers",
    "step_tokens",
    "role",
    "gpus",
    "prefill",
    "decode",
)
#: what a group of deployments shares (and its engine: ``engine``)
GROUP_KEYS = (
    "source",
    "model",
    "dtype",
    "accelerator_model",
    "input_tokens",
    "output_tokens",
    "concurrency",
    "request_rate",
    "workload",
)


@attrs.frozen
class Scored:
    """One held-out row: its measured and predicted numbers."""

    row: Row
    measured: dict[str, float]
    predicted: dict[str, float]


def not_overloaded(row: Row, running: float | None = None) -> bool:
    """Whether the row's TTFT counts: its requests do not wait for a running slot.

    A run in steady state shows it in its measurement (Little's law): its decoding
    requests are at least DECODING_SHARE of those in flight. A closed loop decodes output
    tokens/s x TPOT of its concurrency; an open loop at rate r holds r x (TTFT + (output -
    1) x TPOT) and decodes r x output x TPOT of them, so the share is the request's decode
    time over its latency, whatever the rate. A closed loop in waves (:func:`in_waves`) is
    a burst of ``concurrency`` prompts each wave, its requests queued for their prefill
    behind the others of their wave (the burst the model predicts, not a queue that waits
    for slots): it counts where the wave fits the engine's running slots, ``running`` (the
    requests the prediction runs at once: the batch limit, the KV cache)."""
    load, ttft, tpot = row.get("concurrency"), row.get("ttft_ms"), row.get("tpot_ms")
    if ttft is None or tpot is None or row.get("role"):
        return False
    if in_waves(row):
        return running is not None and isinstance(load, int) and running >= load
    if row.get("request_rate") is not None:
        out = int(row["output_tokens"])
        latency = float(ttft) + (out - 1) * float(tpot)
        return out * float(tpot) >= DECODING_SHARE * latency
    if not isinstance(load, int):
        return False
    decoding = float(row["output_tokens_per_s"]) * float(tpot) / 1e3
    return decoding >= DECODING_SHARE * load


def score(rows: Sequence[Row]) -> list[Scored]:
    """Every row held out by source, with what it measures and what is predicted."""
    out = []
    for _, (c, test) in serving_fit.held_out(rows, "source").items():
        out += [_scored(r, c) for r in test]
    return out


def in_waves(row: Row) -> bool:
    """Whether a closed loop's requests stay in waves, each request's TTFT the time to its
    prefill in its wave (a burst of ``concurrency`` prompts, as an offline run's): the loop's first
    requests are sent at once; an engine that prefills every waiting prompt before it
    decodes again (the source's ``prefill_first``) starts them decoding in one step; at
    one fixed length (``fixed_lengths``) they finish in one step, and the loop sends their
    successors at once."""
    return (
        isinstance(row.get("concurrency"), int)
        and bool(row.get("fixed_lengths"))
        and engine(row) in row.get("prefill_first", ())
    )


def _scored(row: Row, c: Constants) -> Scored:
    if row.get("role"):
        rate = serving_fit.role_rate(row, c)
        return Scored(row, {"throughput": serving_fit.measured(row) or 0.0}, {"throughput": rate})
    p = serving_fit.prediction(row, c)
    predicted = {
        "throughput": p.output_tokens_per_s_per_gpu,
        "ttft": p.ttft_ms,
        "tpot": p.tpot_ms,
    }
    measured: dict[str, float] = {}
    done = serving_fit.measured(row)
    if done is not None:
        measured["throughput"] = done
    if row.get("tpot_ms") is not None:
        measured["tpot"] = float(row["tpot_ms"])
    running = sum(p.batch.values()) * int(row.get("servers", 1))
    if not_overloaded(row, running):
        measured["ttft"] = float(row["ttft_ms"])
    return Scored(row, measured, predicted)


def metric_errors(scored: Sequence[Scored], metric: str) -> list[float]:
    """Signed relative errors of the rows that measure ``metric``."""
    return [s.predicted[metric] / s.measured[metric] - 1 for s in scored if metric in s.measured]


def within(errs: Sequence[float], bound: float) -> float:
    """Share of the errors within ``bound``: |e| <= bound, or within a factor 2 for 1.0."""
    if bound == 1.0:
        return sum(0.5 <= 1 + e <= 2 for e in errs) / len(errs)
    return sum(abs(e) <= bound for e in errs) / len(errs)


def verdicts(scored: Sequence[Scored]) -> list[tuple[str, str, bool]]:
    """(metric, what was measured against its target, met) for each accuracy target."""
    out = []
    for metric, median_limit, shares in TARGETS:
        errs = metric_errors(scored, metric)
        if not errs:
            out.append((metric, "no rows", False))
            continue
        median = statistics.median(abs(e) for e in errs)
        parts = [f"{len(errs)} rows, median {median * 100:.1f} % (<= {median_limit * 100:.0f} %)"]
        met = median <= median_limit
        for bound, share in shares:
            got = within(errs, bound)
            label = "2x" if bound == 1.0 else f"{bound * 100:.0f} %"
            parts.append(f"within {label} {got * 100:.0f} % (>= {share * 100:.0f} %)")
            met = met and got >= share
        out.append((metric, ", ".join(parts), met))
    return out


def engine(row: Row) -> str:
    """The row's engine: a disaggregated launcher runs its aggregated launcher's engine."""
    return str(row["launcher"]).removesuffix("_disagg")


def _value(value: Any) -> Any:
    """A row's value as a key (a role's layout table as its sorted items)."""
    return tuple(sorted(value.items())) if isinstance(value, Mapping) else value


def _group_key(row: Row) -> tuple[Any, ...]:
    return (*(row.get(k) for k in GROUP_KEYS), engine(row))


def groups(scored: Sequence[Scored]) -> list[list[Scored]]:
    """The rows that differ only in their layout, two layouts or more, each measuring
    throughput (the best measured row of each layout: an engine's flags the model does not
    read make no second one)."""
    found: dict[tuple[Any, ...], dict[tuple[Any, ...], Scored]] = {}
    for s in scored:
        if s.row.get("role") or "throughput" not in s.measured:
            continue
        layout = tuple(_value(s.row.get(k)) for k in LAYOUT_KEYS)
        best = found.setdefault(_group_key(s.row), {}).get(layout)
        if best is None or s.measured["throughput"] > best.measured["throughput"]:
            found[_group_key(s.row)][layout] = s
    return [list(g.values()) for _, g in sorted(found.items(), key=repr) if len(g) > 1]


def both_modes(scored: Sequence[Scored]) -> list[list[Scored]]:
    """The workloads (a group's keys) measured both aggregated and disaggregated end to
    end, whatever each row publishes."""
    found: dict[tuple[Any, ...], list[Scored]] = {}
    for s in scored:
        if not s.row.get("role"):
            found.setdefault(_group_key(s.row), []).append(s)
    return [
        g
        for _, g in sorted(found.items(), key=repr)
        if len({serving_fit.disaggregated(s.row) for s in g}) == 2
    ]


def choice_cases(group: Sequence[Scored]) -> list[tuple[float, bool]]:
    """(TPOT limit, mdc's pick good) under each TPOT limit some deployment of the group
    meets as measured: each distinct measured TPOT is one limit."""
    measured = [s for s in group if "tpot" in s.measured]
    cases = []
    for limit in sorted({s.measured["tpot"] for s in measured}):
        meeting = [s for s in measured if s.measured["tpot"] <= limit]
        best = max(s.measured["throughput"] for s in meeting)
        predicted_ok = [s for s in measured if s.predicted["tpot"] <= limit]
        if predicted_ok:
            pick = max(predicted_ok, key=lambda s: s.predicted["throughput"])
        else:
            pick = min(measured, key=lambda s: s.predicted["tpot"])
        good = pick.measured["tpot"] <= limit and (
            pick.measured["throughput"] >= CHOICE_SHARE * best
        )
        cases.append((limit, good))
    return cases


def mode_cases(group: Sequence[Scored]) -> list[bool]:
    """Whether mdc calls the winner of aggregated against disaggregated, where the best
    measured of each mode differ by 15 % or more (one case per such group)."""
    modes: dict[bool, list[Scored]] = {}
    for s in group:
        modes.setdefault(serving_fit.disaggregated(s.row), []).append(s)
    if len(modes) < 2:
        return []
    best = {m: max(v, key=lambda s: s.measured["throughput"]) for m, v in modes.items()}
    agg, dis = best[False], best[True]
    if abs(agg.measured["throughput"] / dis.measured["throughput"] - 1) < 0.15:
        return []
    measured_winner = agg.measured["throughput"] > dis.measured["throughput"]
    predicted_winner = agg.predicted["throughput"] > dis.predicted["throughput"]
    return [measured_winner == predicted_winner]


def report(rows: Sequence[Row]) -> None:
    """The targets, held out by source: each source's medians, then all rows pooled."""
    report_scored(score(rows))


def report_scored(scored: Sequence[Scored]) -> None:
    """The report of rows already scored (held out by source)."""
    print("== issue 38's targets, every row held out by source")
    for source in sorted({s.row["source"] for s in scored}):
        mine = [s for s in scored if s.row["source"] == source]
        parts = []
        for metric, _, _ in TARGETS:
            errs = metric_errors(mine, metric)
            if errs:
                median = statistics.median(abs(e) for e in errs)
                parts.append(f"{metric} {median * 100:.1f} % ({len(errs)})")
        print(f"  {source}: " + ", ".join(parts))
    for metric, said, met in verdicts(scored):
        print(f"  {metric}: {said}: {'met' if met else 'NOT met'}")
    cases = [(g, c) for g in groups(scored) for c in choice_cases(g)]
    if cases:
        good = sum(ok for _, (_, ok) in cases) / len(cases)
        print(
            f"  choosing under a TPOT limit: {len(cases)} cases in {len(groups(scored))} "
            f"groups, {good * 100:.0f} % reach {CHOICE_SHARE * 100:.0f} % of the best "
            f"(>= 75 %): {'met' if good >= 0.75 else 'NOT met'}"
        )
    modes = [ok for g in groups(scored) for ok in mode_cases(g)]
    pairs = both_modes(scored)
    if modes:
        good = sum(modes) / len(modes)
        print(
            f"  aggregated or disaggregated: {len(modes)} cases, {good * 100:.0f} % called "
            f"(>= 80 %): {'met' if good >= 0.8 else 'NOT met'}"
        )
    else:
        print(
            f"  aggregated or disaggregated: no case ({len(pairs)} workload(s) measured in "
            "both modes, none whose modes' throughput per GPU both published differ by "
            ">= 15 %)"
        )
    for g in pairs:
        _print_modes(g)


def _print_modes(group: Sequence[Scored]) -> None:
    """Each mode of a workload measured both ways: measured -> predicted (its TTFT too,
    counted in the TTFT target or not)."""
    for s in sorted(group, key=lambda s: serving_fit.disaggregated(s.row)):
        mode = "disaggregated" if serving_fit.disaggregated(s.row) else "aggregated"
        measured = {**s.measured}
        if s.row.get("ttft_ms") is not None:
            measured["ttft"] = float(s.row["ttft_ms"])
        parts = [
            f"{metric} {measured[metric]:.4g} -> {s.predicted[metric]:.4g}"
            for metric in ("throughput", "tpot", "ttft")
            if metric in measured
        ]
        print(f"    {s.row['source']} {mode}: " + ", ".join(parts))
