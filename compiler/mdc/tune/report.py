"""What ``mdc tune`` prints: the ranked table, its JSON, the chosen spec and the picture."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from html import escape
from pathlib import Path
from typing import Any

from mdc.plan.memory import GIB
from mdc.tune.search import Candidate, Result, Verified

#: what each term of the breakdown is called in the "why" lines
TERMS = {
    "compute": "compute",
    "elementwise": "elementwise kernels",
    "tp": "tensor-parallel communication",
    "cp": "context-parallel communication",
    "ep": "expert all-to-all",
    "pp-p2p": "pipeline sends",
    "pp-bubble": "pipeline bubble",
    "dp": "data-parallel communication",
    "optimizer": "optimizer step",
}


def _memory_gib(row: Verified) -> float:
    memory = row.memory
    return (memory.total if memory else row.candidate.memory_bytes or 0) / GIB


def candidate_json(rank: int, row: Verified) -> dict[str, Any]:
    L = row.candidate.layout
    return {
        "rank": rank,
        "layout": row.candidate.label(),
        "parallelism": {
            "tp": L.tp,
            "pp": L.pp,
            "cp": L.cp,
            "ep": L.ep,
            "etp": L.etp,
            "vpp": L.vpp,
            "dp": L.dp,
        },
        "micro_batch_size": L.micro_batch_size,
        "recompute": L.recompute,
        "recompute_num_layers": L.recompute_layers,
        "sequence_parallel": L.sequence_parallel,
        "distributed_optimizer": L.zero_stage == 1,
        "fsdp": L.zero_stage >= 3,
        "memory_gib": round(_memory_gib(row), 2),
        "predicted": row.candidate.prediction.to_json(),
        "spec": {
            table: dict(row.data[table])
            for table in ("parallelism", "batch", row.data["distributed"]["launcher"])
            if isinstance(row.data.get(table), dict)
        },
    }


def result_json(result: Result) -> dict[str, Any]:
    rows = [candidate_json(i + 1, row) for i, row in enumerate(result.rows)]
    for found, row in zip(rows, result.rows, strict=True):
        found["above_headroom"] = result.tight(row)
    return {
        "accelerator_model": result.hardware.id,
        "precision": result.precision,
        "searched": {
            "candidates": result.generated,
            "memory_estimated": result.estimated,
            "fit_memory": result.fitting,
            "refused_by_compile": dict(result.refused),
        },
        "headroom": result.headroom,
        "chosen": result.best + 1 if result.rows else None,
        "candidates": rows,
    }


def why_lost(best: Candidate, other: Candidate) -> str:
    """One line: how much slower ``other`` is and the term that costs it most."""
    slower = 1 - other.prediction.tokens_per_s_per_gpu / best.prediction.tokens_per_s_per_gpu
    deltas = {
        term: other.prediction.breakdown.get(term, 0.0) - best.prediction.breakdown.get(term, 0.0)
        for term in TERMS
    }
    term, delta = max(sorted(deltas.items()), key=lambda kv: kv[1])
    if slower <= 0:
        same = (other.memory_bytes or 0) <= (best.memory_bytes or 0)
        return (
            "as fast and as large: an equivalent layout"
            if same
            else ("as fast, but needs more memory per GPU")
        )
    per = delta / max(other.prediction.step_time_s, 1e-12) * 100
    return (
        f"{slower * 100:.1f}% slower: more {TERMS[term]} (+{delta:.3g} s, {per:.0f}% of its step)"
    )


def refusals(refused: Mapping[str, int]) -> str:
    """The candidates the compiler refused, by diagnostic code: ``MDC360 x2, MDC602 x1``."""
    return ", ".join(f"{code} x{n}" for code, n in sorted(refused.items()))


def text(result: Result) -> str:
    hw = result.hardware
    lines = [
        f"mdc tune: the {len(result.rows)} fastest of {result.generated} layouts that fit "
        f"and compile, on {hw.name}, {result.precision} ({result.estimated} estimated for "
        f"memory on the way down the ranking, {result.estimated - result.fitting} too large)",
    ]
    if result.refused:
        lines.append(f"refused by the compiler on the way: {refusals(result.refused)}")
    header = (
        f"{'#':>2}  {'layout':<52} {'GiB/GPU':>7} {'step s':>8} {'tok/s/GPU':>9} "
        f"{'TFLOP/s':>7} {'MFU':>5} {'bubble':>6}  dominant comm"
    )
    lines += ["", header]
    for i, row in enumerate(result.rows, 1):
        p = row.candidate.prediction
        mark = "!" if result.tight(row) else " "
        lines.append(
            f"{i:>2}  {row.candidate.label():<52} {_memory_gib(row):>6.1f}{mark} "
            f"{p.step_time_s:>8.3f} "
            f"{p.tokens_per_s_per_gpu:>9.0f} {p.model_tflops_per_gpu:>7.0f} "
            f"{p.mfu * 100:>4.0f}% {p.bubble * 100:>5.1f}%  {p.dominant_communication}"
        )
    if any(result.tight(row) for row in result.rows):
        lines += ["", _headroom_note(result)]
    if len(result.rows) > 1:
        best = result.rows[0].candidate
        lines += ["", "why the runners-up lost:"]
        for i, row in enumerate(result.rows[1:], 2):
            lines.append(f"{i:>2}  {why_lost(best, row.candidate)}")
    return "\n".join(lines) + "\n"


def _headroom_note(result: Result) -> str:
    """What the marked rows are, and which row is chosen."""
    limit = result.capacity * (1 - result.headroom) / GIB
    chosen = (
        f"the fastest that leaves it is #{result.best + 1}, which --write writes"
        if not result.tight(result.rows[result.best])
        else "no row found leaves it; --write writes #1"
    )
    return (
        f"! above {limit:.1f} GiB, {100 - result.headroom * 100:g}% of "
        f"{result.capacity / GIB:.1f} GiB: the estimate leaves out the CUDA/ROCm context,\n"
        f"  communication buffers and fragmentation (compile warns, MDC262); {chosen}\n"
        f"  (--headroom PCT sets the share left free)"
    )


def write_spec(path: str, data: Mapping[str, Any], source: str, *, force: bool = False) -> None:
    """The chosen layout as a spec in OUT_SPEC's format (TOML keeps the source's comments);
    never over the source, nor over another file without ``force``."""
    from mdc.emit import write_file

    write_file(path, spec_text(path, data, source).encode("utf-8"), force=force, inputs=[source])


def spec_text(path: str, data: Mapping[str, Any], source: str) -> str:
    suffix = Path(path).suffix.lower()
    if suffix == ".json":
        return json.dumps(data, indent=2, ensure_ascii=False) + "\n"
    if suffix in (".yaml", ".yml"):
        import io

        from ruamel.yaml import YAML

        yaml = YAML(typ="safe", pure=True)
        yaml.default_flow_style = False
        stream = io.StringIO()
        yaml.dump(dict(data), stream)
        return stream.getvalue()
    import tomlkit

    if source.lower().endswith(".toml"):
        doc = tomlkit.parse(Path(source).read_text(encoding="utf-8"))
        _merge(doc, data)
    else:
        doc = tomlkit.document()
        doc.update(data)
    return tomlkit.dumps(doc)


def _merge(doc: Any, data: Mapping[str, Any]) -> None:
    """Write ``data``'s values into the parsed TOML ``doc``, keeping its layout."""
    for key, value in data.items():
        if isinstance(value, dict) and key in doc and isinstance(doc[key], dict):
            _merge(doc[key], value)
            for gone in [k for k in doc[key] if k not in value]:
                del doc[key][gone]
        elif key not in doc or doc[key] != value:
            doc[key] = value


# ----------------------------------------------------------------------------- picture

WIDTH, HEIGHT, LEFT, RIGHT, TOP, BOTTOM = 760, 500, 70, 30, 40, 90
#: the memory axis runs to this many times the device's limit; layouts beyond sit at its edge
SPAN = 1.3
#: labels are monospace, so a box is exactly CHAR_W per character by LABEL_H
LABEL_FONT, CHAR_W, LABEL_H = "DejaVu Sans Mono, Menlo, Consolas, monospace", 6.0, 12.0
FRONT, LIMIT, BEST, RUNNER, OTHER = "#34495e", "#c0392b", "#27ae60", "#2980b9", "#b2babb"

Box = tuple[float, float, float, float]  # left, top, width, height


def pareto_front(points: Sequence[tuple[float, float]], limit: float) -> list[tuple[float, float]]:
    """The layouts no other beats on both counts (less memory, more tokens/s), within
    ``limit``: by memory, each faster than every one before it."""
    front: list[tuple[float, float]] = []
    for x, y in sorted(p for p in points if p[0] <= limit):
        if not front or y > front[-1][1]:
            front.append((x, y))
    return front


def _overlaps(a: Box, b: Box) -> bool:
    return a[0] < b[0] + b[2] and b[0] < a[0] + a[2] and a[1] < b[1] + b[3] and b[1] < a[1] + a[3]


def place_label(point: tuple[float, float], text: str, taken: list[Box], area: Box) -> Box | None:
    """The first spot around ``point`` (right, left, above, below) where ``text`` stays
    inside ``area`` and clear of every box in ``taken``; None where none is free."""
    px, py = point
    w, h = CHAR_W * len(text), LABEL_H
    for dx, dy in (
        (8, -h - 2),
        (8, 2),
        (-8 - w, -h - 2),
        (-8 - w, 2),
        (8, -h / 2),
        (-8 - w, -h / 2),
    ):
        box = (round(px + dx, 1), round(py + dy, 1), w, h)
        inside = area[0] <= box[0] and box[0] + w <= area[0] + area[2]
        inside = inside and area[1] <= box[1] and box[1] + h <= area[1] + area[3]
        if inside and not any(_overlaps(box, other) for other in taken):
            return box
    return None


def svg(result: Result, capacity_gib: float, others: Sequence[Candidate] = ()) -> str:
    """Predicted tokens/s/GPU against memory per GPU around the device's limit: every
    candidate searched as a dot (those far above the limit counted at the right edge),
    the Pareto front, the chosen layout ringed, the runners-up labelled where room is."""
    points = [((c.memory_bytes or 0) / GIB, c.prediction.tokens_per_s_per_gpu) for c in others]
    rows = [(_memory_gib(r), r.candidate.prediction.tokens_per_s_per_gpu) for r in result.rows]
    x_max = capacity_gib * SPAN
    y_lo, y_max = _throughput_range([y for x, y in points + rows if x <= x_max])
    plot: Box = (LEFT, TOP, WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM)

    def at(x: float, y: float) -> tuple[float, float]:
        px = LEFT + min(x, x_max) / x_max * plot[2]
        py = HEIGHT - BOTTOM - (min(max(y, y_lo), y_max) - y_lo) / (y_max - y_lo) * plot[3]
        return round(px, 1), round(py, 1)

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="11">',
        f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
        f'<text x="{LEFT}" y="20" font-size="13">mdc tune on {escape(result.hardware.name)}: '
        "predicted throughput against memory per GPU</text>",
    ]
    taken = _axes(out, at, x_max, (y_lo, y_max), capacity_gib)
    beyond = sum(1 for x, _ in points + rows if x > x_max)
    if beyond:
        taken.append(_beyond_marker(out, at(x_max, y_max), beyond, x_max))
    for x, y in points:
        px, py = at(x, y)
        out.append(f'<circle class="point" cx="{px}" cy="{py}" r="2" fill="{OTHER}"/>')
    _front_line(out, at, pareto_front(points + rows, capacity_gib), capacity_gib)
    _rows(out, at, result, rows, taken, plot)
    _legend(out)
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _throughput_range(ys: list[float]) -> tuple[float, float]:
    """The throughput axis around the layouts drawn in full: a tenth of their spread
    below, three tenths above for the labels (a twentieth of the top when all tie)."""
    if not ys:
        return 0.0, 1.0
    low, high = min(ys), max(ys)
    spread = max(high - low, high * 0.05, 1e-9)
    return max(0.0, low - 0.1 * spread), high + 0.3 * spread


def _axes(
    out: list[str], at: Any, x_max: float, y_range: tuple[float, float], capacity: float
) -> list[Box]:
    """Axes, ticks, titles and the limit line; returns the boxes labels must keep off."""
    y_lo, y_max = y_range
    x0, y0 = at(0, y_lo)
    x1, y1 = at(x_max, y_max)
    out.append(f'<line x1="{x0}" y1="{y0}" x2="{x1}" y2="{y0}" stroke="black"/>')
    out.append(f'<line x1="{x0}" y1="{y0}" x2="{x0}" y2="{y1}" stroke="black"/>')
    for i in range(6):
        gx, _ = at(x_max * i / 5, y_lo)
        tick = y_lo + (y_max - y_lo) * i / 5
        _, gy = at(0, tick)
        out.append(f'<text x="{gx}" y="{y0 + 15}" text-anchor="middle">{x_max * i / 5:.0f}</text>')
        out.append(f'<text x="{x0 - 5}" y="{gy + 4}" text-anchor="end">{tick:.0f}</text>')
    out.append(
        f'<text x="{(x0 + x1) / 2}" y="{y0 + 32}" text-anchor="middle">memory per GPU (GiB)</text>'
    )
    out.append(
        f'<text x="15" y="{(y0 + y1) / 2}" text-anchor="middle" '
        f'transform="rotate(-90 15 {(y0 + y1) / 2})">tokens/s per GPU</text>'
    )
    lx, _ = at(capacity, y_lo)
    out.append(
        f'<line x1="{lx}" y1="{y0}" x2="{lx}" y2="{y1}" stroke="{LIMIT}" stroke-dasharray="6 4"/>'
    )
    limit_text = f"memory limit {capacity:g} GiB"
    out.append(
        f'<text class="label" x="{round(lx - 4 - CHAR_W * len(limit_text), 1)}" y="{y1 + 10}" '
        f'font-family="{LABEL_FONT}" font-size="10" fill="{LIMIT}">{limit_text}</text>'
    )
    return [(round(lx - 4 - CHAR_W * len(limit_text), 1), y1, CHAR_W * len(limit_text), LABEL_H)]


def _beyond_marker(out: list[str], corner: tuple[float, float], count: int, x_max: float) -> Box:
    """Layouts needing more than the axis shows: one arrow at the right edge with their count."""
    ex, top = corner
    text = f"{count} more above {x_max:.0f} GiB \u2192"
    box = (round(ex - 6 - CHAR_W * len(text), 1), top + LABEL_H + 2, CHAR_W * len(text), LABEL_H)
    out.append(
        f'<text class="label beyond" x="{box[0]}" y="{round(box[1] + 10, 1)}" '
        f'font-family="{LABEL_FONT}" font-size="10" fill="{OTHER}">{escape(text)}</text>'
    )
    return box


def _front_line(out: list[str], at: Any, front: list[tuple[float, float]], limit: float) -> None:
    """The best throughput reachable within each memory budget, as steps up to the limit."""
    if not front:
        return
    steps = [at(*front[0])]
    for (_, y), (nx, ny) in zip(front, front[1:], strict=False):
        steps += [at(nx, y), at(nx, ny)]
    steps.append(at(limit, front[-1][1]))
    path = " ".join(f"{x},{y}" for x, y in steps)
    out.append(
        f'<polyline class="pareto" points="{path}" fill="none" stroke="{FRONT}" '
        'stroke-width="1.5"/>'
    )


def _rows(
    out: list[str],
    at: Any,
    result: Result,
    rows: list[tuple[float, float]],
    taken: list[Box],
    plot: Box,
) -> None:
    """The ranked layouts: markers with their full label on hover, and a drawn label
    where one fits (the chosen first, then by rank; a crowded one keeps its number only)."""
    order = [result.best] + [i for i in range(len(rows)) if i != result.best]
    for i in order:  # no label covers a ranked layout's marker
        px, py = at(*rows[i])
        radius = 7.0 if i == result.best else 4.0
        taken.append((px - radius, py - radius, 2 * radius, 2 * radius))
    for i in order:
        px, py = at(*rows[i])
        label = result.rows[i].candidate.label()
        best = i == result.best
        name = f"best: {label}" if best else f"#{i + 1} {label}"
        colour = BEST if best else RUNNER
        marker = (
            f'<circle class="point" cx="{px}" cy="{py}" r="7" fill="none" stroke="{BEST}" '
            'stroke-width="3"/>'
            if best
            else f'<circle class="point" cx="{px}" cy="{py}" r="4" fill="{RUNNER}"/>'
        )
        out.append(f"<g><title>{escape(name)}</title>{marker}</g>")
        for text in (name, f"#{i + 1}"):
            box = place_label((px, py), text, taken, plot)
            if box is not None:
                taken.append(box)
                weight = ' font-weight="bold"' if best else ""
                out.append(
                    f'<text class="label" x="{box[0]}" y="{round(box[1] + 10, 1)}" '
                    f'font-family="{LABEL_FONT}" font-size="10" fill="{colour}"{weight}>'
                    f"{escape(text)}</text>"
                )
                break


def _legend(out: list[str]) -> None:
    """One line under the axis title naming each mark."""
    y = HEIGHT - 22
    items = [
        (f'<circle cx="6" cy="-4" r="6" fill="none" stroke="{BEST}" stroke-width="3"/>', "chosen"),
        (f'<circle cx="6" cy="-4" r="4" fill="{RUNNER}"/>', "runner-up (#rank)"),
        (f'<circle cx="6" cy="-4" r="2" fill="{OTHER}"/>', "other layout searched"),
        (
            f'<polyline points="0,0 6,0 6,-8 14,-8" fill="none" stroke="{FRONT}" '
            'stroke-width="1.5"/>',
            "Pareto front",
        ),
        (
            f'<line x1="0" y1="-4" x2="14" y2="-4" stroke="{LIMIT}" stroke-dasharray="4 3"/>',
            "memory limit",
        ),
    ]
    x = LEFT
    out.append(f'<g class="legend" transform="translate(0 {y})">')
    for mark, words in items:
        out.append(f'<g transform="translate({x} 0)">{mark}<text x="20" y="0">{words}</text></g>')
        x += 20 + 7 * len(words) + 18
    out.append("</g>")
