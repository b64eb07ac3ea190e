"""The serving search and prediction in words, JSON and SVG."""

from __future__ import annotations

import math
from typing import Any

import attrs

from mdc.plan.memory import GIB
from mdc.spec import WorkloadTable
from mdc.tune.report import refusals
from mdc.tune.serving_search import Candidate, Result, Shortfall

# -- mdc tune's serving output -----------------------------------------------------------

#: the deployment column's least width (labels past it widen it for the whole table)
LABEL_WIDTH = 34


def _header(width: int) -> str:
    return (
        f"{'#':>2}  {'deployment':<{width}} {'GPUs':>5} {'TTFT ms':>8} {'TPOT ms':>8} "
        f"{'tok/s/user':>10} {'tok/s/GPU':>10} {'GiB/GPU':>8}  binding"
    )


def _memory(c: Candidate) -> float:
    return max(c.prediction.memory_gib.values())


def _row(rank: int, c: Candidate, width: int) -> str:
    p = c.prediction
    mark = " (misses SLO)" if not c.meets_slo else " *" if c.pareto else ""
    return (
        f"{rank:>2}  {c.label():<{width}} {c.deployment.gpus:>5} {_ms(p.ttft_ms):>8} "
        f"{_ms(p.tpot_ms):>8} {p.output_tokens_per_s_per_user:>10.1f} "
        f"{p.output_tokens_per_s_per_gpu:>10.1f} {_memory(c):>8.1f}  {p.binding}{mark}"
    )


def _ms(value: float) -> str:
    return "-" if math.isinf(value) else f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def _workload_words(w: WorkloadTable) -> str:
    load = (
        f"{w.concurrency} requests in flight"
        if w.concurrency is not None
        else f"{w.request_rate:g} requests/s (Poisson)"
    )
    words = f"{w.input_tokens} in / {w.output_tokens} out tokens, {load}"
    if w.slo is not None:
        limits = [
            f"{name} <= {value:g} ms"
            for name, value in (("TTFT", w.slo.ttft_ms), ("TPOT", w.slo.tpot_ms))
            if value is not None
        ]
        words += f"; SLO {', '.join(limits)}"
    return words


def text(result: Result) -> str:
    """The ranked table and why the runners-up lost."""
    lines = [
        f"mdc tune (serving): {result.generated} deployments of {result.gpus} GPUs searched, "
        f"{result.fitting} fit memory; {_workload_words(result.workload)}",
    ]
    width = max([LABEL_WIDTH, *(len(c.label()) for c in result.rows)])
    lines.append(_header(width))
    lines += [_row(i + 1, c, width) for i, c in enumerate(result.rows)]
    if result.refused:
        lines.append(f"refused by the compiler: {refusals(result.refused)}")
    if result.graphs_written:
        lines.append(
            "TensorRT-LLM's CUDA graphs are left to its default (replayed only up to 32 "
            "requests a rank): each row's spec pads them up to its decode batch a rank"
        )
    if any(c.pareto for c in result.rows):
        lines.append(
            "* on the Pareto front: no deployment gives both more tokens/s per GPU and more "
            "per user"
        )
    lines.append(why_line(result))
    return "\n".join(lines) + "\n"


def why_line(result: Result) -> str:
    """One line: what the best wins by, and on what each runner-up lost."""
    if not result.rows:
        return "no deployment compiles"
    best = result.rows[0]
    reasons = []
    for c in result.rows[1:3]:
        if best.meets_slo and not c.meets_slo:
            reasons.append(f"{c.label()} misses the SLO")
            continue
        less = 1 - c.prediction.output_tokens_per_s_per_gpu / max(
            best.prediction.output_tokens_per_s_per_gpu, 1e-9
        )
        reasons.append(
            f"{c.label()} gives {less * 100:.0f} % less per GPU ({c.prediction.binding})"
        )
    tail = "; ".join(reasons) if reasons else "no runner-up compiles"
    return f"best: {best.label()}; {tail}"


def candidate_json(c: Candidate) -> dict[str, Any]:
    names = {"server": "server", "prefill": "prefill", "decode": "decode"}
    roles = {
        names[r.name]: {**r.to_json(), "max_batch": c.prediction.batch.get(r.name)}
        for r in c.deployment.roles
    }
    return {
        "launcher": c.deployment.launcher,
        "mode": c.deployment.mode,
        "gpus": c.deployment.gpus,
        "roles": roles,
        "memory_gib": round(_memory(c), 2),
        "meets_slo": c.meets_slo,
        "pareto_front": c.pareto,
        "predicted": c.prediction.to_json(),
        "spec": dict(c.data),
    }


def result_json(result: Result) -> dict[str, Any]:
    return {
        "searched": {
            "deployments": result.generated,
            "fit_memory": result.fitting,
            "refused_by_compile": dict(sorted(result.refused.items())),
        },
        "candidates": [candidate_json(c) for c in result.rows],
    }


def cmd_tune_serving(args: Any, compiler: Any, doc: Any, out: Any) -> int:
    """``mdc tune SPEC`` for a serving launcher's spec."""
    from mdc.errors import ExitCode, SpecError
    from mdc.plan.named_models import name_model
    from mdc.tune.report import write_spec
    from mdc.tune.serving_search import ServingTuner

    named, found = name_model(doc)
    found = [*found, *compiler.checker.check(named)]
    if any(d.is_error for d in found):
        raise SpecError(found)
    tuner = ServingTuner(compiler, doc)
    result = tuner.run(top=args.top)
    if not result.rows:
        summary = no_fit(result)
        if result.first_refused is not None:
            # the compiler says why, in its own words, of the best deployment it refused
            print(f"{summary}; the compiler on the best of them:", file=out.stderr)
            compiler.compile_document(attrs.evolve(doc, data=result.first_refused), tree=False)
        else:
            print(summary, file=out.stderr)
        if out.fmt == "json":  # what was searched, no candidates, and why
            out.json({**result_json(result), "why": summary})
        return ExitCode.SPEC_INVALID
    if args.write:
        write_spec(args.write, result.rows[0].data, args.spec, force=args.force)
    if args.svg:
        from mdc.emit import write_file

        picture = svg(result, tuner.curves(result))
        write_file(args.svg, picture.encode("utf-8"), force=args.force, inputs=[args.spec])
    if out.fmt == "json":
        out.json(result_json(result))
    else:
        out.stdout.write(text(result))
    return ExitCode.OK


def no_fit(result: Result) -> str:
    """The line a search that found nothing ends with: what it searched, and why none
    fits where it can say."""
    refused = f"; refused by the compiler: {refusals(result.refused)}" if result.refused else ""
    summary = (
        f"mdc tune: no deployment fits and compiles ({result.generated} searched, "
        f"{result.fitting} fit memory{refused})"
    )
    if result.shortfall is not None:
        summary += f": {shortfall_text(result.shortfall)}"
    if result.smallest is not None:
        gpus = result.smallest.deployment.gpus
        summary += (
            f": a prefill/decode split needs a server of each role, and the smallest server "
            f"that holds a request, {result.smallest.family} ({gpus} GPU{'s' * (gpus > 1)}), "
            f"leaves too few of the {result.gpus} GPUs for another"
        )
    return summary


def shortfall_text(s: Shortfall) -> str:
    """Why no deployment holds one request, told of the one that comes closest."""
    m = s.memory
    servers = "" if s.role == "server" else f", in its {s.role} servers"
    activations = f" and {m.workspace / GIB:.1f} GiB of a step's activations" if m.workspace else ""
    gpu = f"a {m.capacity / GIB:.1f} GiB GPU at {m.engine}'s memory share"
    if m.room < 0:
        room = f"{m.weights / GIB:.1f} GiB of weights per GPU{activations} overfill {gpu}"
    else:
        room = (
            f"{m.weights / GIB:.1f} GiB of weights per GPU{activations} leave "
            f"{m.room / GIB:.1f} GiB for the KV cache on {gpu}"
        )
    return (
        f"none holds its weights and one request's KV cache. The closest, "
        f"{s.candidate.label()}{servers}: {room}, where one request of {s.tokens:,} tokens needs "
        f"{s.needed / GIB:.1f} GiB of KV cache. More GPUs, a smaller checkpoint (fp8, fp4) "
        f"or an fp8 KV cache would make room"
    )


def svg(result: Result, curves: Any) -> str:
    """Throughput per GPU against tokens/s per user: each deployment family's curve over
    the load, the TPOT limit as a line, the choice ringed (:mod:`mdc.tune.serving_svg`)."""
    from mdc.tune.serving_svg import pareto_svg

    return pareto_svg(result, curves)
