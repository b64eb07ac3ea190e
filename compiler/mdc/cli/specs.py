"""The specs in a folder, as the pre-commit hook ``mdc-validate`` picks them.

TOML, YAML and JSON files, without what the hook excludes (:data:`EXCLUDE`): the trees
``mdc compile`` writes (folders ``out/`` and ``launch/``, ``plan.json``, ``manifest.json``) and
files that are never specs (a Python project's ``pyproject.toml``, JSON Schemas
``*.schema.json``). Also skipped: a folder holding a ``manifest.json`` that mdc wrote (an
output tree under another name; a web app's manifest.json does not count) and hidden folders
(``.git``, ``.venv``).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from mdc.emit import listed_files
from mdc.errors import Diagnostic, Severity, SourceLocation

SUFFIXES = (".toml", ".yaml", ".yml", ".json")
#: the `exclude:` of the hook mdc-validate in .pre-commit-hooks.yaml (a test holds them equal),
#: matched against a path relative to the folder given
EXCLUDE = re.compile(
    r"(^|/)(out|launch)/|(^|/)(plan|manifest)\.json$|(^|/)pyproject\.toml$|\.schema\.json$"
)


def find_specs(folder: Path) -> list[Path]:
    """Every spec under ``folder``, sorted by path."""
    found = []
    for root, dirs, files in os.walk(folder):
        if "manifest.json" in files and Path(root) != folder and listed_files(root) is not None:
            dirs[:] = []  # a tree mdc wrote: its JSON files are plan.json and the like
            continue
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in files:
            path = Path(root) / name
            if name.endswith(SUFFIXES) and not EXCLUDE.search(path.relative_to(folder).as_posix()):
                found.append(path)
    return sorted(found)


def no_specs(folder: str) -> Diagnostic:
    """MDC005: a folder given to ``mdc validate`` holds no spec."""
    return Diagnostic(
        severity=Severity.ERROR,
        code="MDC005",
        message="no spec in this folder: no .toml, .yaml, .yml or .json file outside "
        "compiled trees (out/, launch/, a folder holding mdc's manifest.json) but pyproject.toml "
        "and JSON Schemas (*.schema.json)",
        hint="give the spec files, or the folder that holds them",
        location=SourceLocation(path=folder),
    )
