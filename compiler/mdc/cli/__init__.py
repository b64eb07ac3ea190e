"""The ``mdc`` command line: compile, validate, explain, schema, plugins, import, rehearse,
init, completion.

``main(argv) -> int`` is for tests and embedding; ``run()`` is the console
script and raises ``SystemExit``.
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import sys
from collections.abc import Callable, Sequence
from typing import TextIO

from mdc import __version__
from mdc.cli.output import Output
from mdc.emit import OutputError
from mdc.errors import Diagnostic, ExitCode, InternalError, PluginError, SpecError, sort_diagnostics
from mdc.pipeline import Compiler

Command = Callable[[argparse.Namespace, Output], int]


def _seconds(text: str) -> float:
    """A positive, finite number of seconds (argparse says so for anything else)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive, finite number of seconds")
    return value


def _compiler(args: argparse.Namespace) -> Compiler:
    from mdc.plugin_manager import load_plugins

    autoload = not (args.no_plugin_autoload or os.environ.get("MDC_DISABLE_PLUGIN_AUTOLOAD"))
    blocked = args.blocked + [n for n in os.environ.get("MDC_BLOCK_PLUGINS", "").split(",") if n]
    trace = sys.stderr.write if os.environ.get("MDC_TRACE_PLUGINS") else None
    return Compiler(load_plugins(autoload=autoload, blocked=blocked, trace=trace))


def cmd_compile(args: argparse.Namespace, out: Output) -> int:
    from pathlib import Path  # here and below: validate does not need pathlib

    from mdc import emit

    compiler = _compiler(args)
    compiled = compiler.compile(args.spec)
    out.diagnostics(compiled.diagnostics)
    target = Path(args.output)
    if args.check:
        lines = emit.drift(target, compiled.tree)
        if out.fmt == "json":
            out.json(
                {
                    "ok": not lines,
                    "drift": lines,
                    "diagnostics": [d.to_json() for d in compiled.diagnostics],
                }
            )
        for line in lines if out.fmt == "text" else ():
            print(f"{target}: {line}", file=out.stderr)
        if lines and out.fmt == "text":
            refresh = shlex.join(["mdc", "compile", args.spec, "-o", args.output])
            print(f"mdc: {target} is out of date; refresh it with: {refresh}", file=out.stderr)
        return ExitCode.SPEC_INVALID if lines else ExitCode.OK
    emit.write_tree(target, compiled.tree)  # OutputError: refused or failed, out/ as it was
    if out.fmt == "json":
        out.json(
            {
                "ok": True,
                "files": [a.path for a in compiled.tree],
                "diagnostics": [d.to_json() for d in compiled.diagnostics],
            }
        )
    if not out.quiet and out.fmt == "text":
        from mdc.api import BackendSpec
        from mdc.cli.report import compile_summary

        plan = compiled.plan
        backend = compiler.plugins.backends[plan.backend].record
        shown = os.path.normpath(args.output)
        run_command = backend.run_command if isinstance(backend, BackendSpec) else None
        out.summary(
            compile_summary(
                plan,
                [a.path for a in compiled.tree],
                shown,
                run_command,
                len(compiled.diagnostics),
                out.colour(out.stdout),
            )
        )
    return ExitCode.OK


def cmd_validate(args: argparse.Namespace, out: Output) -> int:
    files: list[str] = []
    found: list[Diagnostic] = []
    invalid = 0
    for given in args.files:
        if not os.path.isdir(given):
            files.append(given)
            continue
        from pathlib import Path

        from mdc.cli.specs import find_specs, no_specs  # only for a folder: its walk and patterns

        in_folder = find_specs(Path(given))
        files += [str(p) for p in in_folder]
        if not in_folder:
            found.append(no_specs(given))
            invalid += 1
    compiler = _compiler(args)
    ok = 0
    for path in files:
        try:
            found += compiler.compile(path, tree=False).diagnostics
            ok += 1
        except SpecError as exc:
            found += exc.diagnostics
            invalid += 1
    out.diagnostics(found)
    errors = sum(d.is_error for d in found)
    if out.fmt == "json":
        out.json(
            {
                "ok": not errors,
                "diagnostics": [d.to_json() for d in sort_diagnostics(found)],
            }
        )
    else:
        from mdc.cli.report import validate_summary

        warnings = len(found) - errors
        out.summary(validate_summary(ok, invalid, errors, warnings, out.colour(out.stdout)))
    return ExitCode.SPEC_INVALID if errors else ExitCode.OK


def cmd_explain(args: argparse.Namespace, out: Output) -> int:
    from mdc.describe import explain_text, plan_json

    compiled = _compiler(args).compile(args.spec, tree=False)
    out.diagnostics(compiled.notes)
    if args.svg:
        from mdc.emit import write_file
        from mdc.rankmap import rank_map_svg

        svg = rank_map_svg(compiled.plan, compiled.launch.servers)
        write_file(args.svg, svg.encode("utf-8"), force=args.force, inputs=[args.spec])
    if out.fmt == "json":
        out.json(plan_json(compiled.plan, compiled.launch))
    else:
        out.stdout.write(explain_text(compiled.plan, compiled.launch))
    return ExitCode.OK


def cmd_schema(args: argparse.Namespace, out: Output) -> int:
    out.json(_compiler(args).schema)
    return ExitCode.OK


def cmd_plugins(args: argparse.Namespace, out: Output) -> int:
    plugins = _compiler(args).plugins
    rows = [
        {
            "name": name,
            "kind": reg.kind,
            "distribution": reg.origin.distribution,
            "version": reg.origin.version,
            "entry_point": reg.origin.entry_point,
            "description": reg.record.description,
        }
        for name, reg in sorted(plugins.tables().items())
    ]
    if out.fmt == "json":
        out.json(rows)
    else:
        for row in rows:
            print(
                f"{row['name']:<16} {row['kind']:<9} {row['distribution']} {row['version']}"
                f"  ({row['entry_point']})  {row['description']}",
                file=out.stdout,
            )
    return ExitCode.OK


def cmd_import(args: argparse.Namespace, out: Output) -> int:
    from mdc.cli.import_madengine import cmd_import as import_madengine

    return import_madengine(args, _compiler(args), out)


def cmd_rehearse(args: argparse.Namespace, out: Output) -> int:
    from mdc.rehearse import cmd_rehearse as rehearse

    return rehearse(args, _compiler(args), out)


def cmd_tune(args: argparse.Namespace, out: Output) -> int:
    from mdc.tune.cli import cmd_tune as tune

    return tune(args, _compiler(args), out)


def cmd_init(args: argparse.Namespace, out: Output) -> int:
    from mdc.api import BackendSpec
    from mdc.cli.init import starter

    plugins = _compiler(args).plugins
    for kind, name, known in (
        ("launcher", args.launcher, plugins.launchers),
        ("backend", args.backend, plugins.backends),
    ):
        if name not in known:
            from mdc.suggest import did_you_mean

            near = did_you_mean(name, known)
            guess = f"did you mean {near!r}? " if near else ""
            print(
                f"mdc: no {kind} named {name!r} is installed; {guess}"
                f"installed: {', '.join(sorted(known))} (see `mdc plugins`)",
                file=out.stderr,
            )
            return ExitCode.USAGE
    backend = plugins.backends[args.backend].record
    runs = backend.launchers if isinstance(backend, BackendSpec) else None
    if runs is not None and args.launcher not in runs:
        print(
            f"mdc: the {args.backend} backend does not run the {args.launcher} launcher "
            f"(it runs {', '.join(runs)})",
            file=out.stderr,
        )
        return ExitCode.USAGE
    text = starter(args.launcher, args.backend)
    if args.output == "-":
        out.stdout.write(text)
        return ExitCode.OK
    from pathlib import Path

    from mdc.emit import write_file

    target = Path(args.output)
    text = text.replace("THIS_FILE", shlex.quote(str(target)))
    write_file(str(target), text.encode("utf-8"), force=args.force)  # OutputError: exit 2
    out.summary(
        f"wrote {target}: a starter spec, {args.launcher} on {args.backend}\n"
        f"next: edit the lines marked EDIT, then mdc validate {shlex.quote(str(target))}\n"
    )
    return ExitCode.OK


def cmd_completion(args: argparse.Namespace, out: Output) -> int:
    from argcomplete.shell_integration import shellcode

    out.stdout.write(shellcode(["mdc"], shell=args.shell))
    return ExitCode.OK


def _blocked_name(value: str) -> str:
    if not value.startswith("no:") or len(value) == 3:
        raise argparse.ArgumentTypeError(f"expected no:NAME to block a plugin, got {value!r}")
    return value[3:]


def _compile_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("spec", help="the job spec (.toml, .yaml, .yml or .json)")
    p.add_argument(
        "-o",
        "--output",
        required=True,
        help="output directory: mdc's files in it are replaced, all others kept",
    )
    p.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if the output directory differs"
    )


def _validate_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "files",
        nargs="+",
        metavar="FILE",
        help="specs, or folders searched for .toml/.yaml/.yml/.json specs",
    )


def _explain_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("spec")
    p.add_argument("--svg", metavar="FILE", help="also draw the rank map (nodes x GPUs) as SVG")
    p.add_argument("--force", action="store_true", help="replace FILE if it exists")


def _no_arguments(p: argparse.ArgumentParser) -> None:
    pass


def _init_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--launcher", required=True, help="the launcher (see `mdc plugins`)")
    p.add_argument("--backend", default="local", help="the backend (default local)")
    p.add_argument(
        "-o",
        "--output",
        default="job.toml",
        metavar="SPEC",
        help="where (default job.toml; - for stdout)",
    )
    p.add_argument("--force", action="store_true", help="replace SPEC if it exists")


def _completion_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "shell",
        choices=("bash", "zsh", "fish"),
        help='e.g. eval "$(mdc completion bash)" in ~/.bashrc',
    )


def _import_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("tool", choices=("madengine",), help="the tool that wrote CONFIG")
    p.add_argument("config", metavar="CONFIG", help="its config file")
    p.add_argument(
        "-o",
        "--output",
        metavar="SPEC",
        help="where to write the spec (.toml, .yaml or .json; default: stdout as TOML)",
    )
    p.add_argument("--force", action="store_true", help="replace SPEC if it exists")


def _rehearse_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("spec")
    p.add_argument(
        "--max-ranks",
        type=int,
        default=64,
        metavar="N",
        help="refuse a world of more than N ranks (default 64)",
    )
    p.add_argument(
        "--timeout",
        type=_seconds,
        default=180.0,
        metavar="SECONDS",
        help="stop every process after SECONDS (default 180)",
    )
    p.add_argument(
        "--keep",
        metavar="DIR",
        help="write the rehearsed tree, the ranks' reports and the nodes' logs to "
        "DIR and keep them (default: a temporary directory, removed)",
    )


def _tune_arguments(p: argparse.ArgumentParser) -> None:
    from mdc.tune.cli import add_arguments

    add_arguments(p)


#: Each subcommand: what runs it, its one-line help, and what adds its arguments.
COMMANDS: dict[str, tuple[Command, str, Callable[[argparse.ArgumentParser], None]]] = {
    "compile": (cmd_compile, "check a spec and write its artifacts", _compile_arguments),
    "validate": (cmd_validate, "check specs without writing anything", _validate_arguments),
    "explain": (
        cmd_explain,
        "describe the plan: sizes, batch, nodes, groups",
        _explain_arguments,
    ),
    "schema": (cmd_schema, "print the composed JSON Schema", _no_arguments),
    "plugins": (cmd_plugins, "list the launchers and backends installed", _no_arguments),
    "init": (cmd_init, "write an annotated starter spec that compiles", _init_arguments),
    "completion": (cmd_completion, "print the shell completion script", _completion_arguments),
    "import": (
        cmd_import,
        "translate another tool's config into an mdc spec",
        _import_arguments,
    ),
    "rehearse": (
        cmd_rehearse,
        "compile a spec and run the job on this CPU with a probe "
        "program that checks ranks and groups (needs torch)",
        _rehearse_arguments,
    ),
    "tune": (
        cmd_tune,
        "search the layouts the spec leaves open and rank them by predicted throughput",
        _tune_arguments,
    ),
}


def _common_options() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--format", choices=("text", "json"), default="text", help="output format (default text)"
    )
    common.add_argument(
        "-p",
        dest="blocked",
        action="append",
        default=[],
        type=_blocked_name,
        metavar="no:NAME",
        help="block the plugin NAME (repeatable)",
    )
    common.add_argument(
        "--no-plugin-autoload",
        action="store_true",
        help="load only mdc's own plugins (also MDC_DISABLE_PLUGIN_AUTOLOAD=1)",
    )
    common.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="print no summary, only diagnostics and requested output",
    )
    common.add_argument(
        "--traceback",
        action="store_true",
        help="show the full traceback of plugin and internal errors",
    )
    return common


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The ``mdc`` parser. With ``only``, just that subcommand gets its options and
    arguments: the others keep only their name and help, which is all ``mdc --help`` and a
    wrong command's error show, and a command line runs one subcommand."""
    common = _common_options()
    parser = argparse.ArgumentParser(
        prog="mdc", description="Compile a distributed ML job spec into launch artifacts."
    )
    parser.add_argument("--version", action="version", version=f"mdc {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (func, help_text, add_arguments) in COMMANDS.items():
        if only is not None and name != only:
            sub.add_parser(name, help=help_text, add_help=False)
            continue
        p = sub.add_parser(name, parents=[common], help=help_text, description=help_text)
        p.set_defaults(func=func)
        add_arguments(p)
    return parser


def _subcommand(argv: Sequence[str]) -> str | None:
    """The subcommand a command line runs: its first word that is not an option (``mdc``'s
    own options take no value). None when that is not a subcommand's name."""
    first = next((word for word in argv if not word.startswith("-")), None)
    return first if first in COMMANDS else None


def main(
    argv: Sequence[str] | None = None, *, stdout: TextIO | None = None, stderr: TextIO | None = None
) -> int:
    stdout, stderr = stdout or sys.stdout, stderr or sys.stderr
    argv = sys.argv[1:] if argv is None else argv
    completing = "_ARGCOMPLETE" in os.environ
    parser = build_parser(None if completing else _subcommand(argv))
    if completing:  # a shell asks for completions (`mdc completion`)
        import argcomplete

        argcomplete.autocomplete(parser)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    out = Output(args.format, stdout, stderr, quiet=args.quiet)
    try:
        return int(args.func(args, out))
    except SpecError as exc:
        out.diagnostics(exc.diagnostics)
        if out.fmt == "json":
            out.json({"ok": False, "diagnostics": [d.to_json() for d in exc.diagnostics]})
        return ExitCode.SPEC_INVALID
    except OutputError as exc:  # the user's folder or filesystem, not a bug
        print(f"mdc: {exc}", file=stderr)
        return ExitCode.USAGE
    except BrokenPipeError:  # `mdc schema | head`: the reader has all it wanted
        _quiet_stdout()
        return ExitCode.OK
    except PluginError as exc:
        print(f"mdc: error: {exc.render()}", file=stderr)
        if exc.origin is not None:
            name = exc.origin.entry_point.split(" = ")[0]
            print(
                f"  hint: to run without it, pass -p no:{name} (or set "
                "MDC_DISABLE_PLUGIN_AUTOLOAD=1 to load only mdc's own plugins)",
                file=stderr,
            )
        if args.traceback:
            import traceback  # only for --traceback

            traceback.print_exception(exc, file=stderr)
        return ExitCode.PLUGIN_ERROR
    except Exception as exc:  # noqa: BLE001 - an mdc bug: say so; traceback behind a flag
        kind = "" if isinstance(exc, InternalError) else f"{type(exc).__name__}: "
        print(
            f"mdc: internal error: {kind}{exc}\n  this is a bug in mdc; rerun with "
            "--traceback and report it",
            file=stderr,
        )
        if args.traceback:
            import traceback  # only for --traceback

            traceback.print_exception(exc, file=stderr)
        return ExitCode.INTERNAL_ERROR


def _quiet_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's final flush of a closed pipe is silent."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # not a real file descriptor (tests pass StringIO)
        pass


def run() -> None:
    raise SystemExit(main())
