"""A third-party launcher's layouts are tuned through its LauncherSpec.search, as megatron's
are: its switches are tried and written into its own table, the keys a spec holds are
kept, and a launcher without a search space is named in MDC610 with those that have one."""

from __future__ import annotations

import json
import tomllib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import attrs
import pytest
from tests.tools import REPO

import mdc
from mdc.api import Launch, LauncherSpec, Plan, Role, SearchSpace, TrainingSetup
from mdc.errors import PluginOrigin, SpecError
from mdc.loaders import load_file
from mdc.pipeline import Compiler
from mdc.plugin_manager import load_plugins
from mdc.tune.search import Tuner

EXAMPLE = REPO / "examples" / "tune-llama70b-64xh100.toml"


@attrs.frozen(kw_only=True)
class TrainerOptions:
    checkpointing: bool = False
    shard_weights: bool = False


def training(options: TrainerOptions | None) -> TrainingSetup:
    opts = options or TrainerOptions()
    return TrainingSetup(
        zero_stage=3 if opts.shard_weights else 1,
        sequence_parallel=True,
        recompute="full" if opts.checkpointing else "none",
    )


def switches(tp: int, chunk_layers: int, held: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    for shard in (False, True):
        for checkpointing in (False, True):
            yield {"shard_weights": shard, "checkpointing": checkpointing}


def emit(plan: Plan, options: object) -> Launch:
    return Launch(roles=tuple(Role(name=r.name, argv=("train",)) for r in plan.roles))


SCHEMA = {
    "type": "object",
    "properties": {"checkpointing": {"type": "boolean"}, "shard_weights": {"type": "boolean"}},
    "additionalProperties": False,
}


class TrainerPlugin:
    @mdc.hookimpl
    def mdc_register_launchers(self) -> list[LauncherSpec]:
        common: dict[str, Any] = {
            "parallelism": "model",  # its sizes are searched, as megatron's are
            "emit": emit,
            "schema": SCHEMA,
            "options_type": TrainerOptions,
            "training": training,
        }
        return [
            LauncherSpec(
                name="trainer",
                description="a tunable trainer",
                search=SearchSpace(switches=switches),
                **common,
            ),
            LauncherSpec(name="fixed", description="a trainer without a search space", **common),
        ]


@pytest.fixture(scope="module")
def compiler() -> Compiler:
    origin = PluginOrigin(
        entry_point="trainer = trainer_plugin", distribution="mdc-trainer", version="1"
    )
    return Compiler(load_plugins(autoload=False, extra=[("trainer", TrainerPlugin(), origin)]))


def _tuner(compiler: Compiler, tmp_path: Path, launcher: str, **table: Any) -> Tuner:
    data = tomllib.loads(EXAMPLE.read_text(encoding="utf-8"))
    data["distributed"].update(launcher=launcher, nnodes=2)
    data["batch"]["global_batch_size"] = 64
    if table:
        data[launcher] = table
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return Tuner(compiler, load_file(str(path)))


def test_the_launchers_switches_are_searched_and_written_to_its_table(
    compiler: Compiler, tmp_path: Path
) -> None:
    result = _tuner(compiler, tmp_path, "trainer").run(top=20)
    assert result.rows
    settings = set()
    for row in result.rows:
        written = row.data["trainer"]
        settings.add((written["shard_weights"], written["checkpointing"]))
        # the training the row was predicted with is the one its written table gives
        assert row.candidate.training == training(TrainerOptions(**written))
        assert row.compiled.plan.sizes.tp == row.candidate.layout.tp
    assert len(settings) > 1  # several of the space's settings ranked among the best
    assert "megatron" not in result.rows[0].data


@pytest.mark.slow
def test_a_key_the_spec_holds_is_not_searched(compiler: Compiler, tmp_path: Path) -> None:
    result = _tuner(compiler, tmp_path, "trainer", shard_weights=False).run(top=20)
    assert result.rows
    for row in result.rows:
        assert row.data["trainer"]["shard_weights"] is False
        assert row.candidate.layout.zero_stage == 1


def test_a_launcher_without_a_search_space_names_those_with_one(
    compiler: Compiler, tmp_path: Path
) -> None:
    with pytest.raises(SpecError) as raised:
        _tuner(compiler, tmp_path, "fixed")
    [found] = [d for d in raised.value.diagnostics if d.code == "MDC610"]
    assert found.location.pointer == "/distributed/launcher"
    assert "'fixed'" in found.message
    assert found.hint is not None and "megatron" in found.hint and "trainer" in found.hint
