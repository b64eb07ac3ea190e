"""``[distributed] network``: the cluster's scale-out NICs, in place of the catalogue's system."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import tomlkit

from mdc.hardware import builtin, with_network
from mdc.loaders import load_file
from mdc.pipeline import Compiler
from mdc.plugin_manager import load_plugins
from mdc.spec import NetworkTable
from mdc.tune.perf import predict_plan
from mdc.tune.search import Tuner

COMPILER = Compiler(load_plugins(autoload=False))
#: DGX H100: eight ConnectX-7 of 400 Gb/s, one per GPU (the catalogue entry's system)
DGX_H100 = {"nics_per_node": 8, "nic_gbit_s": 400}


def _spec(network: dict[str, Any] | None, **distributed: Any) -> dict[str, Any]:
    dist = {"launcher": "megatron", "nnodes": 8, "nproc_per_node": 8} | distributed
    if network is not None:
        dist["network"] = network
    return {
        "job": {"name": "net", "command": ["python", "pretrain_gpt.py"]},
        "distributed": dist,
        "parallelism": {"tp": 8, "pp": 2},
        "batch": {"global_batch_size": 512, "micro_batch_size": 1},
        "model": {"name": "llama3.1-70b", "seq_length": 8192},
    }


def _write(tmp_path: Path, spec: dict[str, Any], name: str = "job.toml") -> Path:
    path = tmp_path / name
    path.write_text(tomlkit.dumps(spec), encoding="utf-8")
    return path


def _predicted(tmp_path: Path, network: dict[str, Any] | None) -> Any:
    spec = _spec(network, accelerator_model="h100-sxm")
    plan = COMPILER.compile(_write(tmp_path, spec), tree=False).plan
    prediction = predict_plan(plan)
    assert prediction is not None
    return prediction


def test_each_gpu_gets_its_share_of_the_node_s_nics() -> None:
    h100 = builtin()["h100-sxm"]
    slower = with_network(h100, NetworkTable(nics_per_node=1, nic_gbit_s=800), 8)
    assert slower.scale_out_gb_s == pytest.approx(800 / 8 / 8)
    assert "[distributed] network" in slower.sources["scale_out"]
    assert with_network(h100, None, 8) is h100


def test_the_catalogue_s_own_system_predicts_as_without_the_key(tmp_path: Path) -> None:
    """8 x 400 Gb/s for 8 GPUs is the DGX H100 the entry describes: nothing changes."""
    assert _predicted(tmp_path, DGX_H100) == _predicted(tmp_path, None)


def test_a_slower_network_slows_only_what_crosses_nodes(tmp_path: Path) -> None:
    fast = _predicted(tmp_path, None).breakdown
    slow = _predicted(tmp_path, {"nics_per_node": 2, "nic_gbit_s": 400}).breakdown
    assert slow["compute"] == fast["compute"] and slow["tp"] == fast["tp"]  # inside a node
    # data-parallel and pipeline traffic cross nodes at a quarter of the bandwidth
    assert slow["dp"] > 2 * fast["dp"] and slow["pp-p2p"] > 2 * fast["pp-p2p"]


def test_tune_ranks_on_the_spec_s_network(tmp_path: Path) -> None:
    rows = {}
    for label, network in (("dgx", None), ("thin", {"nics_per_node": 1, "nic_gbit_s": 400})):
        spec = _spec(network, accelerator_model="h100-sxm")
        del spec["parallelism"]
        doc = load_file(_write(tmp_path, spec, f"{label}.toml"))
        rows[label] = Tuner(COMPILER, doc).run(top=1).rows[0]
    thin = rows["thin"].compiled.plan
    assert thin.hardware is not None
    assert thin.hardware.scale_out_gb_s == pytest.approx(400 / 8 / 8)
    # the best layout on a thin network is predicted no faster than on the full one
    best = {k: predict_plan(r.compiled.plan) for k, r in rows.items()}
    assert best["thin"].step_time_s >= best["dgx"].step_time_s  # type: ignore[union-attr]


def test_without_accelerator_model_the_key_is_a_warning(tmp_path: Path) -> None:
    compiled = COMPILER.compile(_write(tmp_path, _spec(DGX_H100)), tree=False)
    assert [d.code for d in compiled.diagnostics if d.code == "MDC603"] == ["MDC603"]
