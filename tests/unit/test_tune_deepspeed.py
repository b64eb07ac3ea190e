"""mdc tune with the deepspeed launcher: ZeRO stages 0-3 and DeepSpeed's host offloads are
searched for the data-parallel size, on every accelerator of the catalogue, and each printed
row compiles into a ds_config.json that runs the row's ZeRO stage and offloads."""

from __future__ import annotations

import io
import json
import tomllib
from pathlib import Path
from typing import Any

import pytest

from mdc.cli import main
from mdc.hardware import builtin
from mdc.loaders import load_file
from mdc.pipeline import Compiler
from mdc.plan.named_models import CATALOGUE_FILE
from mdc.plugin_manager import load_plugins
from mdc.tune.search import Tuner

MODELS = tomllib.loads(Path(CATALOGUE_FILE).read_text("utf-8"))


def _spec(accelerator: str, gpus_per_node: int, model: str = "llama3-8b") -> dict[str, Any]:
    return {
        "job": {"name": "tune-deepspeed", "command": ["python", "train.py"]},
        "distributed": {
            "launcher": "deepspeed",
            "backend": "slurm",
            "nnodes": 2,
            "nproc_per_node": gpus_per_node,
            "accelerator_model": accelerator,
        },
        "batch": {"global_batch_size": 64},
        "model": {**MODELS[model]["model"], "seq_length": 4096, "dtype": "bf16"},
    }


def _merge(base: dict[str, Any], edits: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in edits.items():
        given = merged.get(key)
        merged[key] = (
            _merge(given, value) if isinstance(value, dict) and isinstance(given, dict) else value
        )
    return merged


def _tune(spec: dict[str, Any], tmp_path: Path, *extra: str) -> dict[str, Any]:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec), encoding="utf-8")
    out, err = io.StringIO(), io.StringIO()
    code = main(["tune", str(path), "--format", "json", *extra], stdout=out, stderr=err)
    assert code == 0, err.getvalue()
    result: dict[str, Any] = json.loads(out.getvalue())
    return result


def _ds_config(spec: dict[str, Any], tmp_path: Path, rank: int) -> dict[str, Any]:
    """Compile ``spec`` as mdc compile does and read the ds_config.json DeepSpeed gets."""
    path, out_dir = tmp_path / f"row{rank}.json", tmp_path / f"out{rank}"
    path.write_text(json.dumps(spec), encoding="utf-8")
    stderr = io.StringIO()
    code = main(["compile", str(path), "-o", str(out_dir)], stderr=stderr)
    assert code == 0, stderr.getvalue()
    config: dict[str, Any] = json.loads((out_dir / "launch" / "ds_config.json").read_text())
    return config


@pytest.mark.parametrize("accelerator", sorted(builtin()))
def test_every_printed_row_compiles_to_its_zero_stage(accelerator: str, tmp_path: Path) -> None:
    hardware = builtin()[accelerator]
    gpus_per_node = 4 if hardware.scale_up_domain == 72 else 8
    spec = _spec(accelerator, gpus_per_node)
    result = _tune(spec, tmp_path, "--top", "3")
    rows = result["candidates"]
    assert rows
    speeds = [row["predicted"]["tokens_per_s_per_gpu"] for row in rows]
    assert speeds == sorted(speeds, reverse=True)
    for row in rows:
        # DeepSpeed splits the model only where the script does: the search keeps tp = pp = cp = 1
        sizes = row["parallelism"]
        assert (sizes["tp"], sizes["pp"], sizes["cp"], sizes["dp"]) == (1, 1, 1, 2 * gpus_per_node)
        assert 0 < row["memory_gib"] <= hardware.memory_gib
        stage = row["spec"]["deepspeed"]["zero_stage"]
        config = _ds_config(_merge(spec, row["spec"]), tmp_path, row["rank"])
        assert config["zero_optimization"]["stage"] == stage
        assert config["train_batch_size"] == 64
        assert config["train_micro_batch_size_per_gpu"] * config["gradient_accumulation_steps"] == (
            64 // (2 * gpus_per_node)
        )


def _candidates(spec: dict[str, Any], tmp_path: Path) -> dict[str, Any]:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec), encoding="utf-8")
    tuner = Tuner(Compiler(load_plugins(autoload=False)), load_file(str(path)))
    return {c.label(): c for c in tuner.candidates() if c.batch.micro_batch_size == 1}


def test_stages_and_offloads_are_searched_and_offload_costs_time(tmp_path: Path) -> None:
    found = _candidates(_spec("h100-sxm", 8), tmp_path)
    base = "tp1 pp1 cp1 dp16 mbs1 rc:none "
    labels = {label.removeprefix(base) for label in found}
    assert labels == {
        "ddp", "distopt", "distopt offload-opt", "zero2", "zero2 offload-opt",
        "fsdp", "fsdp offload-opt", "fsdp offload-opt+param",
    }  # fmt: skip
    speed = {k.removeprefix(base): c.prediction.tokens_per_s_per_gpu for k, c in found.items()}
    # stage 3 gathers the weights for every micro batch's forward and backward: slower than
    # stage 2's per-micro-batch reduce-scatter, itself slower than stage 1's once per step
    assert speed["distopt"] > speed["zero2"] > speed["fsdp"]
    # the host's Adam and the PCIe copies are not free, the weights' fetches less so
    for stage in ("distopt", "zero2", "fsdp"):
        assert speed[f"{stage} offload-opt"] < speed[stage]
    assert speed["fsdp offload-opt+param"] < speed["fsdp offload-opt"]
    # what the offload costs is its bytes over PCIe and the host's Adam over the owned state
    stage3 = found[base + "fsdp"].prediction.breakdown["optimizer"]
    offloaded = found[base + "fsdp offload-opt"].prediction.breakdown["optimizer"]
    params = found[base + "fsdp"].layout
    assert (
        params.optimizer_offload == 0
        and found[base + "fsdp offload-opt"].layout.optimizer_offload == 1
    )
    assert offloaded > stage3


def test_a_model_that_fits_only_sharded_gets_zero_3(tmp_path: Path) -> None:
    # Llama-3-70B's weights, gradients and Adam state (16 bytes a parameter, 1.1 TB) need
    # stage 3's sharding of all three over 16 GPUs of 80 GB, or the optimizer on the host
    spec = _spec("h100-sxm", 8, "llama3-70b")
    spec["model"]["seq_length"] = 1024
    rows = _tune(spec, tmp_path, "--top", "3", "--headroom", "0")["candidates"]
    assert rows
    for row in rows:
        deepspeed = row["spec"]["deepspeed"]
        offload = deepspeed.get("config", {}).get("zero_optimization", {})
        assert deepspeed["zero_stage"] == 3 or "offload_optimizer" in offload


def test_a_held_stage_is_kept(tmp_path: Path) -> None:
    spec = _spec("h100-sxm", 8)
    spec["deepspeed"] = {"zero_stage": 2}
    found = _candidates(spec, tmp_path)
    base = "tp1 pp1 cp1 dp16 mbs1 rc:none "
    assert {label.removeprefix(base) for label in found} == {"zero2", "zero2 offload-opt"}
