"""The serving search and prediction in words, JSON and SVG."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mdc.api import Launch
    from mdc.plan.model import Plan


def predicted_lines(plan: Plan, launch: Launch) -> list[str]:
    """``mdc explain``'s lines for a serving plan with [workload] (none without)."""
    from mdc.tune.serving_perf import predict_plan

    p = predict_plan(plan, launch)
    if p is None or plan.hardware is None or plan.workload is None:
        return []
    w = plan.workload
    load = (
        f"{w.concurrency} requests in flight"
        if w.concurrency is not None
        else f"{w.request_rate:g} requests/s"
    )
    batch = ", ".join(f"{role} {size}" for role, size in p.batch.items())
    return [
        f"predicted on {plan.hardware.name} for {w.input_tokens} in / {w.output_tokens} out "
        f"tokens, {load} (mdc tune's serving model, docs/tune-serving.md):",
        f"  TTFT {p.ttft_ms:,.0f} ms, TPOT {p.tpot_ms:.1f} ms "
        f"({p.output_tokens_per_s_per_user:,.1f} tokens/s per user)",
        f"  output {p.output_tokens_per_s_per_gpu:,.0f} tokens/s per GPU, "
        f"{p.requests_per_s:,.2f} requests/s; running batch per server: {batch}",
        f"  bound by {p.binding}"
        + ("; overloaded: requests queue without end" if p.overloaded else ""),
    ]
