"""The rank map as SVG: nodes as rows, GPUs as cells, one panel per parallel dimension.

``mdc explain SPEC --svg FILE`` writes it. Each panel answers one question about every
rank, by the cell's colour:

* TP, CP, EP: which group the rank belongs to (the ranks that talk to each other every
  layer), so a group that leaves its node is seen at once;
* PP: which pipeline stage the rank runs;
* DP: which data-parallel replica (full copy of the model) the rank is part of.

Only dimensions larger than 1 get a panel (a world with none gets the DP panel). Every
cell is labelled with its rank, its coordinates along each dimension larger than 1, and
the value its colour stands for; its ``<title>`` (the tooltip) says all of it in words.
Node rows are framed, labelled with the node's host name when the backend knows it, and
its role when the job has several.

The picture is bounded: at most ``MAX_NODES`` node rows per panel (the first ones and the
last, as ``mdc explain`` lists them) and ``MAX_COLUMNS`` GPUs per row, the cut said in the
picture. Same plan, same bytes: no timestamps, colours by index.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from xml.sax.saxutils import escape, quoteattr

import attrs

from mdc.api import Server
from mdc.describe import nodes_phrase, sizes_phrase
from mdc.plan.model import Plan
from mdc.plan.ranks import GroupSet, RankGrid

#: Cell fills by value (group, stage or replica number), repeating beyond the last:
#: ColorBrewer's Set3, twelve light categorical colours that carry black text.
PALETTE = (
    "#8dd3c7",
    "#ffffb3",
    "#bebada",
    "#fb8072",
    "#80b1d3",
    "#fdb462",
    "#b3de69",
    "#fccde5",
    "#d9d9d9",
    "#bc80bd",
    "#ccebc5",
    "#ffed6f",
)
#: Hatchings laid over the palette once its colours run out: value v is drawn in
#: PALETTE[v % 12] under hatching (v // 12) % (len(HATCHES) + 1) (0: none), so
#: 12 * 6 values stay apart by look; past that the cell's label says which.
HATCHES = (
    '<path d="M0,8 L8,0" stroke="#000000" stroke-opacity="0.4" stroke-width="1.2"/>',
    '<path d="M0,0 L8,8" stroke="#000000" stroke-opacity="0.4" stroke-width="1.2"/>',
    '<circle cx="4" cy="4" r="1.4" fill="#000000" fill-opacity="0.4"/>',
    '<path d="M0,4 L8,4" stroke="#000000" stroke-opacity="0.4" stroke-width="1.2"/>',
    '<path d="M4,0 L4,8" stroke="#000000" stroke-opacity="0.4" stroke-width="1.2"/>',
)
#: Values told apart by colour and hatching together.
DISTINCT = len(PALETTE) * (len(HATCHES) + 1)
#: Node rows drawn per panel: the first MAX_NODES - 1 and the last.
MAX_NODES = 8
#: GPU cells drawn per row: the first MAX_COLUMNS - 1 and the last.
MAX_COLUMNS = 16
#: Legend entries per panel.
MAX_LEGEND = 12

MARGIN = 16
LABEL_W = 150
CELL_H = 48
CELL_GAP = 4
ROW_PAD = 5
ROW_GAP = 8
LINE = 18
ELLIPSIS_W = 28
CHAR_W = 7  # monospace 11 px, rounded up
HEADER_CHAR_W = 8  # monospace 12-14 px


@attrs.frozen
class Panel:
    kind: str
    #: "group": colour is the group index; "coord": the coordinate along the axis
    colour_by: str
    title: str
    #: what one value is called in labels and the legend ("TP group", "stage", ...)
    noun: str


def _panels(plan: Plan) -> list[Panel]:
    s = plan.sizes
    tp, cp, ep = (plan.layout.groups(k) for k in ("tp", "cp", "ep"))
    vpp = f", {s.vpp} virtual stages per rank" if s.vpp else ""
    every = [
        Panel(
            "tp",
            "group",
            f"TP: {tp.count} tensor-parallel group(s) of {s.tp} rank(s); colour = group",
            "TP group",
        ),
        Panel("pp", "coord", f"PP: {s.pp} pipeline stages{vpp}; colour = stage", "stage"),
        Panel(
            "dp",
            "coord",
            f"DP: {s.dp} data-parallel replica(s) of {s.tp * s.pp * s.cp} "
            "rank(s); colour = replica",
            "replica",
        ),
        Panel(
            "cp",
            "group",
            f"CP: {cp.count} context-parallel group(s) of {s.cp} rank(s); colour = group",
            "CP group",
        ),
        Panel(
            "ep",
            "group",
            f"EP: {ep.count} expert-parallel group(s) of {s.ep} rank(s) "
            f"(expert tp {s.etp}, expert dp {s.edp}); colour = group",
            "EP group",
        ),
    ]
    sizes = {"tp": s.tp, "pp": s.pp, "dp": s.dp, "cp": s.cp, "ep": s.ep}
    shown = [p for p in every if sizes[p.kind] > 1]
    return shown or [every[2]]


def _grid(plan: Plan, axis: str) -> RankGrid:
    return plan.layout.expert if axis == "ep" else plan.layout.dense


def coordinate(plan: Plan, axis: str, rank: int) -> int:
    """The rank's coordinate along ``axis`` (tp, cp, dp, pp from the dense grid; ep expert)."""
    grid = _grid(plan, axis)
    i = grid.axes.index(axis)
    return rank // grid.strides[i] % grid.sizes[i]


def panel_value(plan: Plan, panel: Panel, rank: int) -> int:
    """The number the cell's colour stands for."""
    if panel.colour_by == "group":
        return plan.layout.groups(panel.kind).index_of(rank)
    return coordinate(plan, panel.kind, rank)


def colour(value: int) -> str:
    return PALETTE[value % len(PALETTE)]


def hatch(value: int) -> int:
    """Which hatching (1-based; 0 for none) tells ``value`` from the others of its colour."""
    return (value // len(PALETTE)) % (len(HATCHES) + 1)


def _hatch_rect(value: int, x: int, y: int, w: int, h: int, rx: int = 0) -> str:
    """The hatching laid over a filled rect, or nothing while colours suffice."""
    which = hatch(value)
    if which == 0:
        return ""
    return (
        f'<rect class="hatch" x="{x}" y="{y}" width="{w}" height="{h}" rx="{rx}" '
        f'fill="url(#mdc-hatch-{which})" stroke="none"/>'
    )


def _hatch_defs(body: str) -> str:
    """The pattern definitions the body uses, in a fixed order."""
    used = [i for i in range(1, len(HATCHES) + 1) if f"url(#mdc-hatch-{i})" in body]
    if not used:
        return ""
    patterns = "".join(
        f'<pattern id="mdc-hatch-{i}" width="8" height="8" patternUnits="userSpaceOnUse">'
        f"{HATCHES[i - 1]}</pattern>"
        for i in used
    )
    return f"<defs>{patterns}</defs>\n"


def _shown(count: int, cap: int) -> list[int | None]:
    """Indices drawn out of ``count``: all, or the first cap - 1, a gap (None), the last."""
    if count <= cap:
        return list(range(count))
    return [*range(cap - 1), None, count - 1]


def _coords(plan: Plan, rank: int) -> str:
    s = plan.sizes
    sizes = (("tp", s.tp), ("pp", s.pp), ("dp", s.dp), ("cp", s.cp), ("ep", s.ep))
    return " ".join(f"{axis}{coordinate(plan, axis, rank)}" for axis, size in sizes if size > 1)


def _ranks(group_set: GroupSet, index: int, limit: int = 8) -> str:
    """Group ``index``'s first ``limit`` ranks, the only ones computed."""
    shown = " ".join(map(str, group_set.head(index, limit)))
    return f"[{shown}{' ...' if group_set.group_size > limit else ''}]"


def _text(x: int, y: int, text: str, **attrs_: str) -> str:
    extra = "".join(f" {k.replace('_', '-')}={quoteattr(v)}" for k, v in attrs_.items())
    return f'<text x="{x}" y="{y}"{extra}>{escape(text)}</text>'


def _node_heading(canvas: _Canvas, plan: Plan, node: int, middle: int) -> None:
    """Open a node's group and write its name (and role or host) left of its row."""
    name, detail = _node_label(plan, node)
    canvas.add(f'<g class="node" data-node="{node}">')
    canvas.add(_text(MARGIN, middle, name, font_weight="bold", font_size="12"))
    if detail:
        canvas.add(_text(MARGIN, middle + 15, detail, font_size="10"))


def _node_label(plan: Plan, node: int) -> tuple[str, str]:
    second = []
    if plan.hosts is not None and node < len(plan.hosts):
        second.append(plan.hosts[node])
    if len(plan.roles) > 1 or plan.roles[0].name != "worker":
        second.append(plan.role_of(node).name)
    return f"node {node}", " · ".join(second)


class _Canvas:
    def __init__(self) -> None:
        self.parts: list[str] = []

    def add(self, part: str) -> None:
        self.parts.append(part)


def rank_map_svg(plan: Plan, servers: Sequence[Server] = ()) -> str:
    """The rank map of ``plan`` as a standalone SVG document; a serving job (its
    launcher's ``servers``) is drawn as its servers instead of rank groups."""
    if servers:
        return _servers_svg(plan, servers)
    nproc, world = plan.nproc_per_node, plan.world_size
    nodes = _shown(plan.nnodes, MAX_NODES)
    columns = _shown(nproc, MAX_COLUMNS)
    panels = _panels(plan)

    longest = max(len(_coords(plan, r)) for r in _sample_ranks(plan, nodes, columns))
    nouns = max(len(f"{p.noun} {world - 1}") for p in panels)
    cell_w = max(64, CHAR_W * max(longest, nouns, len(f"r{world - 1}")) + 10)
    cols_w = sum(ELLIPSIS_W if c is None else cell_w for c in columns) + CELL_GAP * (
        len(columns) - 1
    )
    s = plan.sizes
    unit = "process(es)" if plan.accelerator == "cpu" else "GPU(s)"
    header = [
        f"rank map: job {plan.job.name} ({plan.launcher} on {plan.backend})",
        (
            f"{plan.nnodes} node(s) x {nproc} {unit} = {world} ranks; tp {s.tp}, pp {s.pp}, "
            f"dp {s.dp}, cp {s.cp}, ep {s.ep}; order {plan.layout.order} (fastest first)"
        ),
        "cell: rank / its coordinates / what the colour stands for; hover for details",
    ]
    if None in nodes:
        header.append(
            f"drawn: nodes 0..{MAX_NODES - 2} and {plan.nnodes - 1} of "
            f"{plan.nnodes}; the {plan.nnodes - MAX_NODES} in between are "
            "left out (mdc explain and plan.json give every group)"
        )
    if None in columns:
        header.append(
            f"drawn: local ranks 0..{MAX_COLUMNS - 2} and {nproc - 1} of {nproc} per node"
        )
    width = max(
        2 * MARGIN + LABEL_W + cols_w + 2 * ROW_PAD,
        2 * MARGIN + HEADER_CHAR_W * max(len(line) for line in header),
        2 * MARGIN + HEADER_CHAR_W * max(len(p.title) for p in panels),
    )

    canvas = _Canvas()
    y = MARGIN
    for i, line in enumerate(header):
        y += LINE
        canvas.add(
            _text(
                MARGIN,
                y,
                line,
                font_size="14" if i == 0 else "12",
                font_weight="bold" if i == 0 else "normal",
                **{"class": "header"},
            )
        )
    y += LINE // 2

    for panel in panels:
        y = _draw_panel(canvas, plan, panel, nodes, columns, cell_w, y, width)

    body = "\n".join(canvas.parts)
    return _svg_document(
        width, y + MARGIN, f"rank map of job {plan.job.name}", body, _hatch_defs(body)
    )


def _svg_document(width: int, height: int, title: str, body: str, defs: str = "") -> str:
    """The picture's SVG file: its size, a title, ``defs`` and a white ground under ``body``."""
    head = (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="DejaVu Sans Mono, Menlo, Consolas, '
        f'monospace" font-size="11">'
    )
    return (
        f'<?xml version="1.0" encoding="UTF-8"?>\n{head}\n<title>{escape(title)}</title>\n'
        f"{defs}"
        f'<rect width="{width}" height="{height}" fill="#ffffff"/>\n{body}\n</svg>\n'
    )


def _sample_ranks(plan: Plan, nodes: list[int | None], columns: list[int | None]) -> Iterator[int]:
    for node in nodes:
        for local in columns:
            if node is not None and local is not None:
                yield node * plan.nproc_per_node + local


def _draw_panel(
    canvas: _Canvas,
    plan: Plan,
    panel: Panel,
    nodes: list[int | None],
    columns: list[int | None],
    cell_w: int,
    y: int,
    width: int,
) -> int:
    nproc = plan.nproc_per_node
    canvas.add(f'<g class="panel" data-kind="{panel.kind}">')
    y += LINE + 4
    canvas.add(
        _text(
            MARGIN, y, panel.title, font_size="13", font_weight="bold", **{"class": "panel-title"}
        )
    )
    y += 8
    seen: set[int] = set()

    def cell(node: int, local: int, x: int, top: int) -> None:
        rank = node * nproc + local
        value = panel_value(plan, panel, rank)
        seen.add(value)
        _draw_cell(canvas, plan, panel, rank, value, x, top, cell_w)

    first, last = (MAX_NODES - 1) * nproc, (plan.nnodes - 1) * nproc - 1
    gap = f"… {plan.nnodes - MAX_NODES} more node(s), ranks {first}..{last}, not drawn"
    y = _draw_node_rows(canvas, plan, (nodes, columns), cell_w, y, (gap, {"class": "gap"}), cell)
    y = _draw_legend(canvas, plan, panel, sorted(seen), y, width)
    canvas.add("</g>")
    return y


def _draw_cell(
    canvas: _Canvas, plan: Plan, panel: Panel, rank: int, value: int, x: int, y: int, cell_w: int
) -> None:
    s = plan.sizes
    node, local = divmod(rank, plan.nproc_per_node)
    words = ", ".join(
        f"{axis} {coordinate(plan, axis, rank)}"
        for axis, size in (("tp", s.tp), ("pp", s.pp), ("dp", s.dp), ("cp", s.cp), ("ep", s.ep))
        if size > 1
    )
    groups = ", ".join(
        f"{kind} group {plan.layout.groups(kind).index_of(rank)}"
        for kind, size in (("tp", s.tp), ("cp", s.cp), ("ep", s.ep))
        if size > 1
    )
    tip = f"rank {rank}: node {node}, local rank {local}" + "".join(
        f"; {part}" for part in (words, groups) if part
    )
    cx = x + cell_w // 2
    canvas.add(
        f'<g class="cell" data-rank="{rank}" data-value="{value}">'
        f"<title>{escape(tip)}</title>"
        f'<rect x="{x}" y="{y}" width="{cell_w}" height="{CELL_H}" rx="3" '
        f'fill="{colour(value)}" stroke="#555555" stroke-width="0.75"/>'
        + _hatch_rect(value, x, y, cell_w, CELL_H, 3)
        + _text(cx, y + 14, f"r{rank}", text_anchor="middle", font_weight="bold")
        + _text(cx, y + 28, _coords(plan, rank), text_anchor="middle", font_size="10")
        + _text(cx, y + 42, f"{panel.noun} {value}", text_anchor="middle", font_size="10")
        + "</g>"
    )


def _draw_legend(
    canvas: _Canvas, plan: Plan, panel: Panel, values: list[int], y: int, width: int
) -> int:
    listed = values[:MAX_LEGEND]
    group_set = plan.layout.groups(panel.kind) if panel.colour_by == "group" else None
    labels = [
        f"{panel.noun} {value}"
        + (f": ranks {_ranks(group_set, value)}" if group_set is not None else "")
        for value in listed
    ]
    legend_w = 18 + CHAR_W * max(len(label) for label in labels) + 24
    per_line = max(1, (width - 2 * MARGIN) // legend_w)
    canvas.add('<g class="legend">')
    for i, (value, label) in enumerate(zip(listed, labels, strict=True)):
        x = MARGIN + (i % per_line) * legend_w
        row_y = y + (i // per_line) * LINE
        canvas.add(
            f'<rect class="swatch" x="{x}" y="{row_y + 3}" width="12" height="12" '
            f'fill="{colour(value)}" stroke="#555555" stroke-width="0.75"/>'
            + _hatch_rect(value, x, row_y + 3, 12, 12)
        )
        canvas.add(_text(x + 18, row_y + 13, label))
    y += (len(listed) + per_line - 1) // per_line * LINE
    notes = []
    if len(values) > len(listed):
        notes.append(f"… {len(values) - len(listed)} more in the picture, not listed")
    if len(values) > DISTINCT:
        notes.append(f"colour and hatching repeat every {DISTINCT}; the cell says which")
    elif len(values) > len(PALETTE):
        notes.append(f"colours repeat every {len(PALETTE)}, hatched after; the cell says which")
    if notes:
        canvas.add(_text(MARGIN, y + 13, "; ".join(notes), font_style="italic"))
        y += LINE
    canvas.add("</g>")
    return y + 4


def _server_label(index: int, server: Server) -> str:
    """``prefill 0: nodes 1-2, tp 16 dp 8, port 30001`` (the legend and the tooltips)."""
    if server.gpus == 0:
        return f"{server.role}: {nodes_phrase(server)}, port {server.port} (no GPU)"
    return (
        f"{server.role} {index}: {nodes_phrase(server)}, {sizes_phrase(server)}, port {server.port}"
    )


def server_at(servers: Sequence[Server], node: int, gpu: int) -> int | None:
    """The index of the server that runs on ``gpu`` of ``node`` (None: no server does)."""
    return _server_on(servers, range(len(servers)), node, gpu)


def _server_on(
    servers: Sequence[Server], indices: Iterable[int], node: int, gpu: int
) -> int | None:
    for index in indices:
        server = servers[index]
        if server.gpus == 0 or node not in server.nodes:
            continue
        per_node = server.gpus // len(server.nodes)
        if server.first_gpu <= gpu < server.first_gpu + per_node:
            return index
    return None


def _servers_of(servers: Sequence[Server], nodes: Iterable[int | None]) -> dict[int, list[int]]:
    """The servers on each drawn node, in one pass (a job can have millions of servers)."""
    drawn = {node for node in nodes if node is not None}
    found: dict[int, list[int]] = {node: [] for node in drawn}
    for index, server in enumerate(servers):
        if server.gpus:
            for node in drawn.intersection(server.nodes):
                found[node].append(index)
    return found


def _numbers(servers: Sequence[Server], wanted: set[int]) -> dict[int, int]:
    """Each wanted server's number within its role (the 3rd prefill server is prefill 2)."""
    seen: Counter[str] = Counter()
    numbered = {}
    for index, server in enumerate(servers):
        if index in wanted:
            numbered[index] = seen[server.role]
        seen[server.role] += 1
    return numbered


@attrs.frozen
class _ServerDrawing:
    """What the server map's cells and legend are drawn from."""

    servers: Sequence[Server]
    #: the servers on each drawn node
    on_node: dict[int, list[int]]
    #: server index -> its number within its role
    numbered: dict[int, int]
    #: server index -> its legend line
    labels: dict[int, str]
    #: the servers the legend lists
    listed: list[int]
    cell_w: int


def _servers_svg(plan: Plan, servers: Sequence[Server]) -> str:
    """One panel: node rows, each GPU coloured by the server that runs on it."""
    nodes = _shown(plan.nnodes, MAX_NODES)
    columns = _shown(plan.nproc_per_node, MAX_COLUMNS)
    drawing = _server_drawing(servers, nodes, columns)
    cols_w = sum(ELLIPSIS_W if c is None else drawing.cell_w for c in columns) + CELL_GAP * (
        len(columns) - 1
    )
    header = _servers_header(plan, servers, nodes, columns)
    title = "servers: colour = server"
    width = max(
        2 * MARGIN + LABEL_W + cols_w + 2 * ROW_PAD,
        2 * MARGIN + HEADER_CHAR_W * max(len(line) for line in [*header, title]),
    )
    canvas = _Canvas()
    y = MARGIN
    for i, line in enumerate(header):
        y += LINE
        weight = {"font_size": "14", "font_weight": "bold"} if i == 0 else {"font_size": "12"}
        canvas.add(_text(MARGIN, y, line, **weight, **{"class": "header"}))
    y += LINE // 2 + LINE + 4
    canvas.add('<g class="panel" data-kind="servers">')
    canvas.add(
        _text(MARGIN, y, title, font_size="13", font_weight="bold", **{"class": "panel-title"})
    )
    y = _draw_server_rows(canvas, plan, drawing, nodes, columns, y + 8)
    y = _draw_server_legend(canvas, drawing, y)
    canvas.add("</g>")
    body = "\n".join(canvas.parts)
    return _svg_document(width, y + MARGIN, f"server map of job {plan.job.name}", body)


def _server_drawing(
    servers: Sequence[Server], nodes: list[int | None], columns: list[int | None]
) -> _ServerDrawing:
    """The servers drawn on the shown nodes and GPUs, their numbers, labels and cell width."""
    on_node = _servers_of(servers, nodes)
    drawn = {
        index
        for node, indices in on_node.items()
        for local in columns
        if local is not None
        for index in [_server_on(servers, indices, node, local)]
        if index is not None
    }
    listed = [i for i, s in enumerate(servers) if i in drawn or not s.gpus][:MAX_LEGEND]
    numbered = _numbers(servers, drawn | set(listed))
    # the widest name of any server: the last one of the role with the most digits
    per_role = Counter(s.role for s in servers)
    cell_w = max(64, CHAR_W * max(len(f"{role} {count - 1}") for role, count in per_role.items()))
    return _ServerDrawing(
        servers=servers,
        on_node=on_node,
        numbered=numbered,
        labels={i: _server_label(numbered[i], servers[i]) for i in numbered},
        listed=listed,
        cell_w=cell_w + 10,
    )


def _servers_header(
    plan: Plan, servers: Sequence[Server], nodes: list[int | None], columns: list[int | None]
) -> list[str]:
    nproc = plan.nproc_per_node
    gpu_servers = [s for s in servers if s.gpus]
    header = [
        f"server map: job {plan.job.name} ({plan.launcher} on {plan.backend})",
        f"{plan.nnodes} node(s) x {nproc} GPU(s); {len(gpu_servers)} server(s)"
        + "".join(f", {s.role} on node {s.nodes[0]}" for s in servers if not s.gpus),
        "cell: GPU / the server that runs on it; hover for details",
    ]
    if None in nodes:
        header.append(f"drawn: nodes 0..{MAX_NODES - 2} and {plan.nnodes - 1} of {plan.nnodes}")
    if None in columns:
        header.append(f"drawn: GPUs 0..{MAX_COLUMNS - 2} and {nproc - 1} of {nproc} per node")
    return header


def _draw_server_rows(
    canvas: _Canvas,
    plan: Plan,
    drawing: _ServerDrawing,
    nodes: list[int | None],
    columns: list[int | None],
    y: int,
) -> int:
    """A row per shown node, a cell per shown GPU; returns the y below them."""

    def cell(node: int, local: int, x: int, top: int) -> None:
        runs = _server_on(drawing.servers, drawing.on_node[node], node, local)
        _server_cell(canvas, drawing, node, local, runs, x, top)

    gap = f"… {plan.nnodes - MAX_NODES} more node(s), not drawn"
    return _draw_node_rows(canvas, plan, (nodes, columns), drawing.cell_w, y, (gap, {}), cell)


def _draw_node_rows(
    canvas: _Canvas,
    plan: Plan,
    shown: tuple[list[int | None], list[int | None]],
    cell_w: int,
    y: int,
    gap: tuple[str, dict[str, str]],
    cell: Callable[[int, int, int, int], None],
) -> int:
    """A row per shown node (``None``: the line ``gap`` says, with its attributes, for the
    nodes not drawn), in it a cell per shown GPU (``None``: an ellipsis), each drawn by
    ``cell(node, local rank, x, y)``, and the node's frame; returns the y below them."""
    nodes, columns = shown
    row_h = CELL_H + 2 * ROW_PAD
    for node in nodes:
        if node is None:
            canvas.add(_text(MARGIN + LABEL_W, y + 15, gap[0], font_style="italic", **gap[1]))
            y += 22
            continue
        _node_heading(canvas, plan, node, y + row_h // 2)
        x0 = MARGIN + LABEL_W
        x = x0 + ROW_PAD
        for local in columns:
            if local is None:
                canvas.add(_text(x + 8, y + ROW_PAD + CELL_H // 2 + 4, "…"))
                x += ELLIPSIS_W + CELL_GAP
                continue
            cell(node, local, x, y + ROW_PAD)
            x += cell_w + CELL_GAP
        frame_w = x - CELL_GAP + ROW_PAD - x0
        canvas.add(
            f'<rect class="node-frame" x="{x0}" y="{y}" width="{frame_w}" '
            f'height="{row_h}" rx="5" fill="none" stroke="#222222" stroke-width="2"/>'
        )
        canvas.add("</g>")
        y += row_h + ROW_GAP
    return y


def _draw_server_legend(canvas: _Canvas, drawing: _ServerDrawing, y: int) -> int:
    """A swatch and label per listed server, and how many are not; returns the y below."""
    servers, listed = drawing.servers, drawing.listed
    canvas.add('<g class="legend">')
    for i in listed:
        fill = colour(i) if servers[i].gpus else "#ffffff"
        canvas.add(
            f'<rect class="swatch" x="{MARGIN}" y="{y + 3}" width="12" height="12" '
            f'fill="{fill}" stroke="#555555" stroke-width="0.75"/>'
        )
        canvas.add(_text(MARGIN + 18, y + 13, drawing.labels[i]))
        y += LINE
    if len(servers) > len(listed):
        canvas.add(
            _text(
                MARGIN,
                y + 13,
                f"… {len(servers) - len(listed)} more server(s)",
                font_style="italic",
            )
        )
        y += LINE
    canvas.add("</g>")
    return y


def _server_cell(
    canvas: _Canvas, drawing: _ServerDrawing, node: int, gpu: int, index: int | None, x: int, y: int
) -> None:
    """A GPU: the colour and name of its server, or grey when no server runs on it."""
    servers, numbered, labels, cell_w = (
        drawing.servers,
        drawing.numbered,
        drawing.labels,
        drawing.cell_w,
    )
    if index is None:
        tip, fill, role, sizes = f"node {node}, GPU {gpu}: no server", "#f0f0f0", "unused", ""
    else:
        server = servers[index]
        tip, fill = f"node {node}, GPU {gpu}: {labels[index]}", colour(index)
        role = f"{server.role} {numbered[index]}"
        sizes = " ".join(
            f"{name}{value}"
            for name, value in (
                ("tp", server.tp),
                ("pp", server.pp),
                ("dp", server.dp),
                ("ep", server.ep),
            )
            if value > 1
        )
    cx = x + cell_w // 2
    canvas.add(
        f'<g class="cell" data-node="{node}" data-gpu="{gpu}" data-server="'
        f'{"" if index is None else index}">'
        f"<title>{escape(tip)}</title>"
        f'<rect x="{x}" y="{y}" width="{cell_w}" height="{CELL_H}" rx="3" '
        f'fill="{fill}" stroke="#555555" stroke-width="0.75"/>'
        + _text(cx, y + 14, f"g{gpu}", text_anchor="middle", font_weight="bold")
        + _text(cx, y + 28, role, text_anchor="middle", font_size="10")
        + _text(cx, y + 42, sizes, text_anchor="middle", font_size="10")
        + "</g>"
    )
