"""What the command line says besides the diagnostics: colour, and the closing summaries."""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Sequence
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from mdc.api import Plan

#: ANSI styles, by what they mark
STYLES = {"error": "1;31", "warning": "1;33", "hint": "36", "ok": "32", "bold": "1"}
_SEVERITY = re.compile(r"^(.*?: )(error|warning)(\[MDC\d+\])", re.MULTILINE)
_HINT = re.compile(r"^(  )(hint:)", re.MULTILINE)
#: at most this many written files are named; more are counted
MAX_FILES_SHOWN = 8


def use_colour(stream: TextIO) -> bool:
    """Colour on a terminal; ``NO_COLOR`` turns it off, ``FORCE_COLOR`` on (no-color.org).

    NO_COLOR wins over FORCE_COLOR, as in CPython's own colour rules; ``TERM=dumb`` is off.
    """
    if os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("FORCE_COLOR"):
        return True
    if os.environ.get("TERM") == "dumb":
        return False
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:  # a closed stream
        return False


def paint(text: str, style: str, colour: bool) -> str:
    return f"\033[{STYLES[style]}m{text}\033[0m" if colour else text


def paint_diagnostic(rendered: str, colour: bool) -> str:
    """A rendered diagnostic with its severity and ``hint:`` coloured."""
    if not colour:
        return rendered
    text = _SEVERITY.sub(lambda m: m[1] + paint(m[2] + m[3], m[2], True), rendered, count=1)
    return _HINT.sub(lambda m: m[1] + paint(m[2], "hint", True), text)


def plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def layout(plan: Plan) -> str:
    """The job's shape in one line: ``2 nodes x 8 = 16 ranks, tp 8 x dp 2``."""
    nodes = plural(plan.nnodes, "node")
    if plan.min_nnodes < plan.nnodes:
        nodes = f"{plan.min_nnodes}-{plan.nnodes} nodes"
    if plan.disagg is not None:  # whole servers per node: the roles are the layout
        split = plan.disagg
        if split.unit == "gpus":
            return (
                f"{nodes} x {plan.nproc_per_node}: router, {split.prefill} prefill and "
                f"{split.decode} decode GPUs"
            )
        return (
            f"{nodes} x {plan.nproc_per_node}: {split.prefill} prefill, {split.decode} decode, "
            "router on node 0"
        )
    sizes = plan.sizes
    axes = [
        f"{name} {value}"
        for name, value in (("tp", sizes.tp), ("cp", sizes.cp), ("ep", sizes.ep), ("pp", sizes.pp))
        if value > 1
    ]
    if sizes.vpp:
        axes.append(f"vpp {sizes.vpp}")
    axes.append(f"dp {sizes.dp}")
    return f"{nodes} x {plan.nproc_per_node} = {plural(plan.world_size, 'rank')}, " + " x ".join(
        axes
    )


def compile_summary(
    plan: Plan,
    files: Sequence[str],
    out_dir: str,
    run_command: str | None,
    warnings: int,
    colour: bool,
) -> str:
    """What ``mdc compile`` prints on success: the job, its layout, the files, what to run."""
    shown = list(files[:MAX_FILES_SHOWN])
    if len(files) > len(shown):
        shown.append(f"... ({len(files)} files)")
    head = f"{plan.launcher} on {plan.backend}: {layout(plan)}"
    if warnings:
        head += f" ({paint(plural(warnings, 'warning'), 'warning', colour)} above)"
    lines = [
        f"{paint('compiled', 'ok', colour)} {plan.job.name}: {head}",
        f"wrote {out_dir}/: {' '.join(shown)}",
    ]
    if run_command:
        command = run_command.replace("{out}", shlex.quote(out_dir))
        lines.append(f"next: {paint(command, 'bold', colour)}")
    return "\n".join(lines) + "\n"


def validate_summary(ok: int, invalid: int, errors: int, warnings: int, colour: bool) -> str:
    """``N specs ok, W warnings``, and the invalid ones first when there are any."""
    parts = [paint(f"{plural(ok, 'spec')} ok", "ok", colour)]
    if invalid:
        parts.append(paint(f"{invalid} invalid ({plural(errors, 'error')})", "error", colour))
    parts.append(plural(warnings, "warning"))
    return ", ".join(parts) + "\n"
