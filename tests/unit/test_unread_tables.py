"""A plugin table the chosen launcher and backend do not read is a warning (MDC253) that
names the table and the plugin that would read it, third-party plugins' tables included."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import mdc
from mdc.api import Launch, LauncherSpec, Plan, Role
from mdc.errors import Diagnostic, PluginOrigin
from mdc.pipeline import Compiler
from mdc.plugin_manager import load_plugins


def echo_launch(plan: Plan, options: object) -> Launch:
    return Launch(roles=tuple(Role(name=r.name, argv=("echo",)) for r in plan.roles))


class EchoPlugin:
    @mdc.hookimpl
    def mdc_register_launchers(self) -> list[LauncherSpec]:
        return [
            LauncherSpec(
                name="echo",
                description="echoes",
                parallelism="data",
                emit=echo_launch,
                schema={"type": "object", "properties": {"words": {"type": "string"}}},
            )
        ]


@pytest.fixture(scope="module")
def compiler() -> Compiler:
    origin = PluginOrigin(entry_point="echo = echo_plugin", distribution="mdc-echo", version="1")
    return Compiler(load_plugins(autoload=False, extra=[("echo", EchoPlugin(), origin)]))


def warnings(
    compiler: Compiler, tmp_path: Path, launcher: str, backend: str, **tables: Any
) -> list[Diagnostic]:
    spec = tmp_path / "spec.json"
    data = {
        "job": {"name": "tables", "command": ["python", "train.py"], "image": "img:1"},
        "distributed": {
            "launcher": launcher,
            "backend": backend,
            "nnodes": 1 if backend == "local" else 2,
            "nproc_per_node": 2,
            "accelerator": "cpu",
        },
        **tables,
    }
    spec.write_text(json.dumps(data), encoding="utf-8")
    return [d for d in compiler.compile(spec).diagnostics if d.code == "MDC253"]


def test_a_backend_table_of_another_backend(compiler: Compiler, tmp_path: Path) -> None:
    found = warnings(compiler, tmp_path, "torchrun", "pytorchjob", slurm={"partition": "gpu"})
    assert len(found) == 1
    assert found[0].location is not None and found[0].location.pointer == "/slurm"
    assert "options of the backend 'slurm'" in found[0].message
    assert found[0].hint == 'remove [slurm], or set backend = "slurm" in [distributed]'


def test_a_launcher_table_of_another_launcher(compiler: Compiler, tmp_path: Path) -> None:
    found = warnings(compiler, tmp_path, "megatron", "local", torchtitan={})
    assert [d.location.pointer for d in found if d.location] == ["/torchtitan"]
    assert "options of the launcher 'torchtitan'" in found[0].message


def test_a_third_party_table_names_its_plugin(compiler: Compiler, tmp_path: Path) -> None:
    found = warnings(compiler, tmp_path, "torchrun", "local", echo={"words": "hi"})
    assert len(found) == 1 and "launcher 'echo' (plugin mdc-echo)" in found[0].message


@pytest.mark.parametrize(
    ("launcher", "backend"),
    [
        ("megatron", "local"),
        ("torchtitan", "local"),
        ("deepspeed", "local"),
        ("torchrun", "pytorchjob"),
    ],
)
def test_the_tables_a_plugin_reads_are_no_warning(
    compiler: Compiler, tmp_path: Path, launcher: str, backend: str
) -> None:
    """torchrun-based launchers and the pytorchjob backend read [torchrun]."""
    tables: dict[str, Any] = {"torchrun": {"max_restarts": 0}}
    assert warnings(compiler, tmp_path, launcher, backend, **tables) == []


def test_a_spec_with_only_its_own_tables_has_no_warning(compiler: Compiler, tmp_path: Path) -> None:
    assert (
        warnings(compiler, tmp_path, "echo", "kubernetes", echo={"words": "hi"}, kubernetes={})
        == []
    )
