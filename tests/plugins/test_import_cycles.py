"""No import cycle among mdc's and its built-ins' modules.

Every import counts: at module level, inside a function and under ``TYPE_CHECKING``, since
each of them is a dependency a reader has to follow. An edge goes to the module an import
names (``from mdc.plan import per_op`` to ``mdc.plan.per_op``, ``from mdc.plan.model import
Plan`` to ``mdc.plan.model``); a package's ``__init__`` is not counted as a dependency of its
submodules, as it only re-exports them.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.tools import REPO

ROOTS = (REPO / "compiler", REPO / "plugins")
PACKAGES = ("mdc", "mdc_builtin")


def module_files() -> dict[str, Path]:
    """{dotted module name: its file} of every module under mdc and mdc_builtin."""
    found = {}
    for root in ROOTS:
        for package in PACKAGES:
            for path in sorted((root / package).rglob("*.py")) if (root / package).is_dir() else []:
                parts = path.relative_to(root).with_suffix("").parts
                if parts[-1] == "__init__":
                    parts = parts[:-1]
                found[".".join(parts)] = path
    return found


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> Iterator[str]:
    """The modules of ``modules`` that ``name`` (its file ``path``) imports, anywhere in it."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package
            for _ in range(max(node.level - 1, 0)):
                base = base.rpartition(".")[0]
            stem = node.module or ""
            module = f"{base}.{stem}".strip(".") if node.level else stem
            targets = [f"{module}.{alias.name}" for alias in node.names] + [module]
        else:
            continue
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                yield target
                break


def graph() -> dict[str, set[str]]:
    modules = module_files()
    return {name: set(imports_of(name, path, modules)) for name, path in modules.items()}


def cycles(edges: dict[str, set[str]]) -> list[tuple[str, ...]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[tuple[str, ...]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(tuple(sorted(component)))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return sorted(found)


def test_a_cycle_is_found() -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(edges) == [("a", "b", "c")]


def test_no_import_cycle() -> None:
    found = cycles(graph())
    assert found == [], "\n".join(" <-> ".join(c) for c in found)


@pytest.mark.slow
def test_the_graph_sees_function_level_imports() -> None:
    """describe's predictions import mdc.tune inside functions; the graph counts them."""
    edges = graph()
    assert "mdc.tune.perf" in edges["mdc.describe"]
    assert "mdc.pipeline" in edges["mdc.tune.search"]
