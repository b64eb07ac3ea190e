"""Every function of mdc, its built-ins and the example plugin reads in one screen."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.tools import REPO

ROOTS = (REPO / "compiler", REPO / "plugins", REPO / "examples" / "mdc-mpi" / "src")
#: lines from ``def`` to the function's last line, docstring included
LIMIT = 100


def long_functions(path: Path) -> list[tuple[int, str, int]]:
    """(line, name, length) of each function in ``path`` longer than :data:`LIMIT`."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            if length > LIMIT:
                found.append((node.lineno, node.name, length))
    return found


def test_the_scan_measures_methods_and_nested_functions(tmp_path: Path) -> None:
    body = "".join(f"            x{i} = {i}\n" for i in range(LIMIT))
    sample = tmp_path / "sample.py"
    sample.write_text(
        "def short():\n    return 1\n\n\nclass C:\n    def long(self):\n"
        f"        def inner():\n{body}"
    )
    assert [name for _, name, _ in long_functions(sample)] == ["long", "inner"]


def test_no_function_is_longer_than_a_screen() -> None:
    paths = [path for root in ROOTS for path in sorted(root.rglob("*.py"))]
    assert len(paths) > 100
    found = [
        f"{path.relative_to(REPO)}:{line} {name} ({length} lines)"
        for path in paths
        for line, name, length in long_functions(path)
    ]
    assert found == [], "split these into named steps:\n" + "\n".join(found)
