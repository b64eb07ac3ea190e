"""``mdc tune SPEC``: the command behind the CLI's subcommand."""

from __future__ import annotations

import argparse
from typing import Any

import attrs

from mdc.errors import ExitCode, SpecError
from mdc.importers import translate
from mdc.loaders import load_file
from mdc.pipeline import Compiler


def cmd_tune(args: argparse.Namespace, compiler: Compiler, out: Any) -> int:
    from mdc.plan.memory import GIB
    from mdc.tune.report import refusals, result_json, svg, text, write_spec
    from mdc.tune.search import Tuner

    doc, notes = translate(load_file(args.spec))
    out.diagnostics(notes)
    if _serving(compiler, doc):  # a serving launcher: the deployment search
        from mdc.tune.serving_report import cmd_tune_serving

        return cmd_tune_serving(args, compiler, doc, out)
    tuner = Tuner(compiler, doc)
    result = tuner.run(top=args.top, headroom=args.headroom / 100)
    if not result.rows:
        # the compiler says why, in its own words: of the fastest layout that fit memory
        # (a flag in extra_args that no layout may repeat, ...), else of the spec as
        # written (held-fixed sizes that do not divide the world, a model the layout
        # cannot split, ...)
        refused = result.first_refused
        shown = doc if refused is None else attrs.evolve(doc, data=refused)
        refusing = (
            f"; refused by the compiler: {refusals(result.refused)}" if result.refused else ""
        )
        summary = (
            f"mdc tune: no layout fits and compiles ({result.generated} searched, "
            f"{result.fitting} fit memory{refusing})"
        )
        if result.least_state is not None:
            summary += (
                f": the weights, gradients and optimizer state of every layout take at least "
                f"{result.least_state / GIB:.1f} GiB on its fullest GPU, above the "
                f"{result.capacity / GIB:.1f} GiB of one {result.hardware.name}: more nodes "
                f"would split them further"
            )
        try:
            compiler.compile_document(shown, tree=False)
        except SpecError:
            which = (
                "the spec as written" if refused is None else "the fastest layout that fits memory"
            )
            print(f"{summary}; the compiler on {which}:", file=out.stderr)
            raise
        print(summary, file=out.stderr)
        if out.fmt == "json":  # what was searched, no candidates, and why
            out.json({**result_json(result), "why": summary})
        return ExitCode.SPEC_INVALID
    if args.write:
        write_spec(args.write, result.rows[result.best].data, args.spec, force=args.force)
    if args.svg:
        from mdc.emit import write_file

        picture = svg(result, tuner.capacity / GIB, tuner.sample())
        write_file(args.svg, picture.encode("utf-8"), force=args.force, inputs=[args.spec])
    if out.fmt == "json":
        out.json(result_json(result))
    else:
        out.stdout.write(text(result))
    return ExitCode.OK


def _serving(compiler: Compiler, doc: Any) -> bool:
    """Whether the spec names a serving launcher (the schema check comes later)."""
    data = doc.data if isinstance(doc.data, dict) else {}
    dist = data.get("distributed")
    name = dist.get("launcher") if isinstance(dist, dict) else None
    reg = compiler.plugins.launchers.get(name) if isinstance(name, str) else None
    return reg is not None and getattr(reg.record, "workload", None) == "serving"


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a count of at least 1, got {text}")
    return value


def _percent(text: str) -> float:
    value = float(text)
    if not 0 <= value < 100:
        raise argparse.ArgumentTypeError(f"expected a percentage from 0 to under 100, got {text}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from mdc.tune.search import DEFAULT_HEADROOM

    default = round(DEFAULT_HEADROOM * 100)
    parser.add_argument(
        "spec",
        help="the job spec: model, launcher, nodes, accelerator, and the batch (training) or "
        "[workload] (serving)",
    )
    parser.add_argument(
        "--top",
        type=_positive,
        default=5,
        metavar="N",
        help="show the N best parallel layouts, each once (default 5)",
    )
    parser.add_argument(
        "--write", metavar="OUT_SPEC", help="write the best layout as a spec (.toml/.yaml/.json)"
    )
    parser.add_argument(
        "--svg",
        metavar="FILE",
        help="draw throughput against memory per GPU as SVG (serving: throughput per GPU "
        "against tokens/s per user)",
    )
    parser.add_argument(
        "--force", action="store_true", help="replace OUT_SPEC and FILE if they exist"
    )
    parser.add_argument(
        "--headroom",
        type=_percent,
        default=default,
        metavar="PCT",
        help="the share of GPU memory the chosen layout leaves free for what the estimate "
        f"leaves out (context, buffers, fragmentation); faster rows above it are marked "
        f"(default {default}, where compile warns)",
    )
