"""Shared fixtures of the integration tier."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tests.tools import REPO

from mdc.cli import main

CompileSpec = Callable[[str | Path, Path], dict[str, Any]]


@pytest.fixture
def compile_spec(monkeypatch: pytest.MonkeyPatch) -> CompileSpec:
    """Compile a spec from the repository root (the examples' commands are relative to it).

    Only mdc's own plugins are loaded, so nothing installed elsewhere changes the output.
    Returns the compiled plan.json.
    """
    monkeypatch.chdir(REPO)

    def compile_(spec: str | Path, out: Path) -> dict[str, Any]:
        stdout, stderr = io.StringIO(), io.StringIO()
        code = main(
            ["compile", str(spec), "-o", str(out), "--no-plugin-autoload"],
            stdout=stdout,
            stderr=stderr,
        )
        assert code == 0, f"mdc compile {spec} exited {code}:\n{stderr.getvalue()}"
        plan: dict[str, Any] = json.loads((out / "plan.json").read_text(encoding="utf-8"))
        return plan

    return compile_
