"""``mdc import madengine``: translate madengine's additional context, write the spec, report
what changed, and compile-check the result."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path, PurePath
from typing import TYPE_CHECKING, Any

from mdc.emit import write_file
from mdc.errors import Diagnostic, ExitCode, Severity, SpecError, sort_diagnostics
from mdc.importers.madengine import render_spec, translate
from mdc.loaders import load_file

if TYPE_CHECKING:
    from mdc.cli.output import Output
    from mdc.pipeline import Compiler


def _format_of(path: str | None) -> str:
    if path is None:
        return "toml"
    return {".yaml": "yaml", ".yml": "yaml", ".json": "json"}.get(Path(path).suffix.lower(), "toml")


def cmd_import(args: argparse.Namespace, compiler: Compiler, out: Output) -> int:
    """``mdc import madengine CONFIG [-o SPEC]``: write the spec, report, compile-check it.

    The spec is written even when mdc then finds errors in it: they are findings about
    madengine's values (located in CONFIG), and the written spec is where the user fixes
    them. The exit status is 1 then, 0 when the spec compiles.
    """
    source = load_file(args.config)
    if (
        not isinstance(source.data, dict)
        or "job" in source.data
        or PurePath(source.path).suffix.lower() != ".json"
    ):
        why = (
            "it has a [job] table: it is already an mdc spec"
            if isinstance(source.data, dict) and "job" in source.data
            else "madengine's context file is a JSON object"
        )
        raise SpecError(
            [
                Diagnostic(
                    severity=Severity.ERROR,
                    code="MDC533",
                    message=f"not a madengine additional context: {why}",
                    location=source.locate(""),
                    hint="pass the file given to madengine's --additional-context-file",
                )
            ]
        )
    doc, notes = translate(source)
    data: Mapping[str, Any] = doc.data  # type: ignore[assignment]
    text = render_spec(data, _format_of(args.output), PurePath(source.path).name)
    found: list[Diagnostic] = []
    try:
        compiled = compiler.compile_document(doc, notes=notes)
        found = list(compiled.diagnostics)
    except SpecError as exc:
        found = [*notes, *exc.diagnostics]
    ok = not any(d.is_error for d in found)
    if args.output:
        write_file(args.output, text.encode("utf-8"), force=args.force, inputs=[args.config])
    elif out.fmt == "text":
        out.stdout.write(text)
    out.diagnostics(found)
    if out.fmt == "json":
        out.json(
            {
                "ok": ok,
                "spec": args.output,
                "text": None if args.output else text,
                "diagnostics": [d.to_json() for d in sort_diagnostics(found)],
            }
        )
    elif not ok:
        print(
            f"mdc: the imported spec does not compile yet; fix the errors above"
            f"{' in ' + args.output if args.output else ''}",
            file=out.stderr,
        )
    return int(ExitCode.OK if ok else ExitCode.SPEC_INVALID)
