"""The serving search's picture: output tokens/s per GPU against tokens/s per user, as
serving benchmarks draw it. Each deployment family (mode and server sizes) is its own
curve: its best deployment at 1, 2, 4, ... requests in flight (the Pareto front of those
points); the TPOT limit is a dashed line (a user is served at least 1000 / tpot_ms
tokens/s); the choice, at the workload's load, is ringed."""

from __future__ import annotations

from collections.abc import Sequence
from xml.sax.saxutils import escape

from mdc.tune.serving_search import Candidate, Result

WIDTH, HEIGHT = 760, 460
LEFT, RIGHT, TOP, BOTTOM = 70, 250, 40, 60
#: at most this many families are drawn (those with the highest throughput per GPU)
MAX_FAMILIES = 8
COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")


def front(points: Sequence[Candidate]) -> list[Candidate]:
    """The candidates no other beats on both axes, by tokens/s per user."""
    ordered = sorted(
        points,
        key=lambda c: (
            -c.prediction.output_tokens_per_s_per_user,
            -c.prediction.output_tokens_per_s_per_gpu,
        ),
    )
    kept: list[Candidate] = []
    best = -1.0
    for c in ordered:
        if c.prediction.output_tokens_per_s_per_gpu > best:
            kept.append(c)
            best = c.prediction.output_tokens_per_s_per_gpu
    return sorted(kept, key=lambda c: c.prediction.output_tokens_per_s_per_user)


Curves = Sequence[tuple[Candidate, Sequence[Candidate]]]


def pareto_svg(result: Result, curves: Curves) -> str:
    families = [
        (best.family, front([c for c in points if c.prediction.output_tokens_per_s_per_gpu > 0]))
        for best, points in curves[:MAX_FAMILIES]
    ]
    drawn = [c for _, points in families for c in points] + list(result.rows[:1])
    x_max = max((c.prediction.output_tokens_per_s_per_user for c in drawn), default=1.0) * 1.1
    y_max = max((c.prediction.output_tokens_per_s_per_gpu for c in drawn), default=1.0) * 1.1
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def xy(c: Candidate) -> tuple[float, float]:
        p = c.prediction
        x = LEFT + p.output_tokens_per_s_per_user / x_max * plot_w
        y = TOP + plot_h - p.output_tokens_per_s_per_gpu / y_max * plot_h
        return x, y

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">',
        f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
        f'<text x="{LEFT}" y="22" font-size="14">output tokens/s per GPU against tokens/s '
        f"per user ({result.gpus} GPUs)</text>",
        f'<line x1="{LEFT}" y1="{TOP + plot_h}" x2="{LEFT + plot_w}" y2="{TOP + plot_h}" '
        'stroke="black"/>',
        f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{TOP + plot_h}" stroke="black"/>',
        f'<text x="{LEFT + plot_w / 2:.1f}" y="{HEIGHT - 20}" text-anchor="middle">'
        "tokens/s per user (1000 / TPOT ms)</text>",
        f'<text x="18" y="{TOP + plot_h / 2:.1f}" text-anchor="middle" '
        f'transform="rotate(-90 18 {TOP + plot_h / 2:.1f})">output tokens/s per GPU</text>',
    ]
    for i in range(6):
        x = LEFT + plot_w * i / 5
        y = TOP + plot_h - plot_h * i / 5
        out.append(
            f'<text x="{x:.1f}" y="{TOP + plot_h + 16}" text-anchor="middle">'
            f"{x_max * i / 5:,.0f}</text>"
        )
        out.append(
            f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{y_max * i / 5:,.0f}</text>'
        )
    slo = result.workload.slo
    if slo is not None and slo.tpot_ms is not None and 1000 / slo.tpot_ms < x_max:
        x = LEFT + 1000 / slo.tpot_ms / x_max * plot_w
        out.append(
            f'<line x1="{x:.1f}" y1="{TOP}" x2="{x:.1f}" y2="{TOP + plot_h}" stroke="gray" '
            'stroke-dasharray="6 4"/>'
        )
        out.append(
            f'<text x="{x + 4:.1f}" y="{TOP + 12}" fill="gray">TPOT {slo.tpot_ms:g} ms</text>'
        )
    for k, (name, points) in enumerate(families):
        colour = COLOURS[k % len(COLOURS)]
        path = " ".join(f"{x:.1f},{y:.1f}" for x, y in map(xy, points))
        out.append(f'<polyline points="{path}" fill="none" stroke="{colour}"/>')
        for x, y in map(xy, points):
            out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{colour}"/>')
        ly = TOP + 14 + 18 * k
        out.append(
            f'<rect x="{WIDTH - RIGHT + 16}" y="{ly - 9}" width="10" height="10" fill="{colour}"/>'
        )
        out.append(f'<text x="{WIDTH - RIGHT + 32}" y="{ly}">{escape(name)}</text>')
    if result.rows:
        x, y = xy(result.rows[0])
        out.append(
            f'<circle cx="{x:.1f}" cy="{y:.1f}" r="9" fill="none" stroke="black" stroke-width="2"/>'
        )
        out.append(
            f'<text x="{x + 12:.1f}" y="{y - 10:.1f}">{escape(result.rows[0].label())}</text>'
        )
    out.append("</svg>")
    return "\n".join(out) + "\n"
