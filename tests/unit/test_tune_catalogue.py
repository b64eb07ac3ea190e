"""mdc tune on every accelerator of the catalogue, with the launchers that split the model
and declare a search space (DeepSpeed's: test_tune_deepspeed.py): a dense 8B model on two
nodes gets candidates that fit the accelerator's memory, are ranked fastest first, and whose
MFU is their model TFLOP/s over that accelerator's peak."""

from __future__ import annotations

import io
import json
import tomllib
from pathlib import Path
from typing import Any

import pytest

from mdc.cli import main
from mdc.hardware import builtin
from mdc.plan.named_models import CATALOGUE_FILE

#: Llama-3-8B's shape (with its source) from the published runs' models, for Megatron-LM;
#: TorchTitan builds the model from its flavor
MODELS = tomllib.loads(Path(CATALOGUE_FILE).read_text("utf-8"))


def _spec(launcher: str, accelerator: str, gpus_per_node: int) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "job": {"name": "tune-catalogue", "command": ["python", "train.py"]},
        "distributed": {
            "launcher": launcher,
            "backend": "slurm",
            "nnodes": 2,
            "nproc_per_node": gpus_per_node,
            "accelerator_model": accelerator,
        },
        "batch": {"global_batch_size": 64},
        "model": {"seq_length": 8192, "dtype": "bf16"},
    }
    if launcher == "torchtitan":
        spec["torchtitan"] = {"model": "llama3", "flavor": "8B"}
    else:
        spec["model"].update(MODELS["llama3-8b"]["model"])
    return spec


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["megatron", "torchtitan"])
@pytest.mark.parametrize("accelerator", sorted(builtin()))
def test_every_accelerator_gets_ranked_candidates_that_fit_it(
    accelerator: str, launcher: str, tmp_path: Path
) -> None:
    hardware = builtin()[accelerator]
    # an NVL72 rack's compute trays hold 4 GPUs each; the other systems' nodes hold 8
    gpus_per_node = 4 if hardware.scale_up_domain == 72 else 8
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(_spec(launcher, accelerator, gpus_per_node)), encoding="utf-8")
    out, err = io.StringIO(), io.StringIO()
    code = main(["tune", str(path), "--format", "json", "--top", "3"], stdout=out, stderr=err)
    assert code == 0, err.getvalue()
    result = json.loads(out.getvalue())
    assert result["accelerator_model"] == accelerator
    rows = result["candidates"]
    assert rows
    speeds = [row["predicted"]["tokens_per_s_per_gpu"] for row in rows]
    assert speeds == sorted(speeds, reverse=True)
    peak = hardware.peak_tflops(result["precision"])
    for row in rows:
        assert 0 < row["memory_gib"] <= hardware.memory_gib
        predicted = row["predicted"]
        assert 0 < predicted["mfu"] < 1
        assert predicted["mfu"] == pytest.approx(predicted["model_tflops_per_gpu"] / peak, abs=2e-3)
        sizes = row["parallelism"]
        model_parallel = sizes["tp"] * sizes["pp"] * sizes["cp"]
        assert model_parallel * sizes["dp"] == 2 * gpus_per_node
