"""The specs in a folder, as the pre-commit hook ``mdc-validate`` picks them.

TOML, YAML and JSON files, skipping what ``mdc compile`` writes (folders ``out/`` and
``launch/``, ``plan.json``, ``manifest.json``, and any folder holding a ``manifest.json``, an
output tree under another name) and hidden folders (``.git``, ``.venv``).
"""

from __future__ import annotations

import os
from pathlib import Path

from mdc.errors import Diagnostic, Severity, SourceLocation

SUFFIXES = (".toml", ".yaml", ".yml", ".json")
#: folder names the hook excludes: trees `mdc compile` writes
COMPILED_FOLDERS = {"out", "launch"}
#: files of such a tree
COMPILED_FILES = {"plan.json", "manifest.json"}


def find_specs(folder: Path) -> list[Path]:
    """Every spec under ``folder``, sorted by path."""
    found = []
    for root, dirs, files in os.walk(folder):
        if "manifest.json" in files and Path(root) != folder:
            dirs[:] = []
            continue
        dirs[:] = [d for d in dirs if d not in COMPILED_FOLDERS and not d.startswith(".")]
        found += [
            Path(root) / name
            for name in files
            if name.endswith(SUFFIXES) and name not in COMPILED_FILES
        ]
    return sorted(found)


def no_specs(folder: str) -> Diagnostic:
    """MDC005: a folder given to ``mdc validate`` holds no spec."""
    return Diagnostic(
        severity=Severity.ERROR,
        code="MDC005",
        message="no spec in this folder: no .toml, .yaml, .yml or .json file outside "
        "compiled trees (out/, launch/, a folder holding manifest.json)",
        hint="give the spec files, or the folder that holds them",
        location=SourceLocation(path=folder),
    )
