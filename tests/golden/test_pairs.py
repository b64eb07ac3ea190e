"""Golden trees for every launcher x backend pair a backend supports.

Each launcher has one base spec in ``tests/golden/pairs/<launcher>.toml``; each
backend adds its own table (below). ``golden/pairs/<launcher>--<backend>/`` is
the exact tree mdc writes for the pair. Pairs a backend does not run must be
refused with MDC231, so the two sets together cover every combination.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tests.tools import REPO

from mdc import emit
from mdc.errors import SpecError
from mdc.loaders import load_file
from mdc.pipeline import Compiler
from mdc.plugin_manager import load_plugins

BASES = Path(__file__).resolve().parent / "pairs"
GOLDEN = REPO / "golden" / "pairs"

#: each backend's table for a job of ``nnodes`` nodes
BACKEND_TABLES: dict[str, Callable[[int], dict[str, Any] | None]] = {
    "local": lambda nnodes: None,
    "slurm": lambda nnodes: {"partition": "gpu", "time": "01:00:00"},
    "ssh": lambda nnodes: {"hosts": [f"gpu-{i:02d}" for i in range(nnodes)]},
    "kubernetes": lambda nnodes: {"namespace": "ml"},
    "leaderworkerset": lambda nnodes: {"namespace": "serving"},
    "pytorchjob": lambda nnodes: {"namespace": "ml"},
    "trainjob": lambda nnodes: {"namespace": "ml"},
    "jobset": lambda nnodes: {"namespace": "ml"},
    "kuberay": lambda nnodes: {"namespace": "serving"},
}

PLUGINS = load_plugins(autoload=False)
COMPILER = Compiler(PLUGINS)


def runs(launcher: str, backend: str) -> bool:
    allowed = PLUGINS.backend(backend).launchers
    return allowed is None or launcher in allowed


PAIRS = [
    (launcher, backend)
    for launcher in sorted(PLUGINS.launchers)
    for backend in sorted(PLUGINS.backends)
]
SUPPORTED = [pair for pair in PAIRS if runs(*pair)]
REFUSED = [pair for pair in PAIRS if not runs(*pair)]


def pair_spec(launcher: str, backend: str, tmp_path: Path) -> Path:
    data = load_file(BASES / f"{launcher}.toml").data
    assert isinstance(data, dict)
    data["distributed"]["backend"] = backend
    table = BACKEND_TABLES[backend](data["distributed"]["nnodes"])
    if table is not None:
        data[backend] = table
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def test_every_launcher_has_a_base_spec_and_every_backend_a_table() -> None:
    assert sorted(p.stem for p in BASES.glob("*.toml")) == sorted(PLUGINS.launchers)
    assert sorted(BACKEND_TABLES) == sorted(PLUGINS.backends)


@pytest.mark.parametrize(
    ("launcher", "backend"), SUPPORTED, ids=[f"{l}--{b}" for l, b in SUPPORTED]
)
def test_pair_output_matches_golden(
    launcher: str, backend: str, tmp_path: Path, golden: Any
) -> None:
    compiled = COMPILER.compile(pair_spec(launcher, backend, tmp_path))
    out = tmp_path / "out"
    emit.write_tree(out, compiled.tree)
    golden.check_tree(GOLDEN / f"{launcher}--{backend}", out)


@pytest.mark.parametrize(("launcher", "backend"), REFUSED, ids=[f"{l}--{b}" for l, b in REFUSED])
def test_unsupported_pair_is_refused(launcher: str, backend: str, tmp_path: Path) -> None:
    with pytest.raises(SpecError) as failed:
        COMPILER.compile(pair_spec(launcher, backend, tmp_path))
    assert [d.code for d in failed.value.diagnostics if d.is_error] == ["MDC231"]


def test_no_orphan_pair_goldens() -> None:
    expected = {f"{l}--{b}" for l, b in SUPPORTED}
    found = {p.name for p in GOLDEN.iterdir()} if GOLDEN.is_dir() else set()
    assert not found - expected, f"goldens without a pair: {sorted(found - expected)}"
