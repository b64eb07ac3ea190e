"""validate and explain compile without rendering the tree: the same plan, launch and
diagnostics as a compile, from every check and every plugin hook."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.tools import REPO

from mdc.loaders import FORMATS
from mdc.pipeline import Compiler
from mdc.plugin_manager import load_plugins

SPECS = sorted(
    p
    for folder in (REPO / "examples", REPO / "examples" / "mdc-mpi" / "examples")
    for p in folder.iterdir()
    if p.suffix in FORMATS
)


@pytest.fixture(scope="module")
def compiler() -> Compiler:
    """With the plugins installed here: mdc-mpi's examples need the example plugin."""
    return Compiler(load_plugins())


@pytest.mark.parametrize("spec", SPECS, ids=[p.name for p in SPECS])
def test_without_the_tree_everything_else_is_the_same(spec: Path, compiler: Compiler) -> None:
    full = compiler.compile(spec)
    checked = compiler.compile(spec, tree=False)
    assert checked.tree == () and {a.path for a in full.tree} >= {"plan.json", "manifest.json"}
    assert (checked.plan, checked.launch, checked.diagnostics) == (
        full.plan,
        full.launch,
        full.diagnostics,
    )
