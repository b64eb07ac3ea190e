"""mdc uses its libraries where a hand-written replacement would not pay for itself.

A replacement stays only where bench/run.py shows it saves at least 10 % of `mdc validate`'s
or `mdc compile`'s whole-process time; the ones that stay are tested against their library
beside their own tests (the schema's quick check, the YAML fast path, the entry-point scan).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from tests.tools import REPO

SOURCES = sorted((REPO / "compiler" / "mdc").rglob("*.py")) + sorted(
    (REPO / "plugins" / "mdc_builtin").rglob("*.py")
)


def _imported(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


@pytest.mark.slow
def test_the_cyclic_collector_is_left_to_python() -> None:
    # gc.disable while importing and gc.freeze saved 2-6 % of a validate or compile
    users = [str(p.relative_to(REPO)) for p in SOURCES if "gc" in _imported(p)]
    assert users == []


@pytest.mark.slow
def test_no_private_module_of_a_library_is_imported() -> None:
    """A library's underscore modules may change in any release (PyYAML's ``yaml._yaml``:
    its public ``yaml.CBaseLoader`` gives the same libyaml events)."""
    private = sorted(
        f"{path.relative_to(REPO)}: {name}"
        for path in SOURCES
        for name in _imported(path)
        if not name.startswith(("mdc", "_"))
        and any(part.startswith("_") and part != "__future__" for part in name.split(".")[1:])
    )
    assert private == []


def test_plugins_are_registered_by_pluggy_itself() -> None:
    """No subclass answering pluggy's "is this name a hook?": it saved 3-4 % of a validate."""
    import pluggy

    from mdc.plugin_manager import _manager

    manager, _ = _manager([], [], None)
    assert type(manager) is pluggy.PluginManager
