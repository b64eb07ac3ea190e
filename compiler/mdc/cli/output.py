"""Where a command's results (stdout) and diagnostics (stderr) go, in text or JSON."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TextIO

from mdc.errors import Diagnostic, sort_diagnostics


class Output:
    """Where results (stdout) and diagnostics (stderr) go, in text or JSON.

    ``quiet`` silences the closing summaries (never a diagnostic); colour follows each
    stream (a terminal, NO_COLOR, FORCE_COLOR).
    """

    def __init__(self, fmt: str, stdout: TextIO, stderr: TextIO, quiet: bool = False) -> None:
        self.fmt, self.stdout, self.stderr, self.quiet = fmt, stdout, stderr, quiet

    def colour(self, stream: TextIO) -> bool:
        from mdc.cli.report import use_colour

        return use_colour(stream)

    def diagnostics(self, items: Sequence[Diagnostic]) -> None:
        if self.fmt == "text" and items:
            from mdc.cli.report import paint_diagnostic

            colour = self.colour(self.stderr)
            for d in sort_diagnostics(items):
                print(paint_diagnostic(d.render(), colour), file=self.stderr)

    def summary(self, text: str) -> None:
        """A closing summary on stdout: text format only, and not under ``-q``."""
        if self.fmt == "text" and not self.quiet:
            self.stdout.write(text)

    def json(self, value: object) -> None:
        print(json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False), file=self.stdout)
