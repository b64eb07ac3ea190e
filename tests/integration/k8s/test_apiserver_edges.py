"""What mdc takes at the edges of the apiserver's rules makes documents the API schemas take.

mdc refuses only what the apiserver refuses (tests/unit/test_k8s_apiserver_refusals.py):
the values just inside each rule (a fractional or exponent quantity, ``-0``, a non-GPU
extended resource, the largest int64 ``tolerationSeconds``, a hostPath with ``..`` inside a
name, a mount path written with ``.``) compile, and every document they give validates
strictly against kubernetes-validate's schemas (the oldest and newest versions mdc supports)
or the backend's CRD.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.integration.k8s.validate import OLDEST, newest, validate_document

from mdc.pipeline import Compiler
from mdc.plugin_manager import load_plugins

FILES = {
    "kubernetes": "kubernetes/job.yaml",
    "pytorchjob": "pytorchjob/job.yaml",
    "trainjob": "trainjob/job.yaml",
}
EDGES: dict[str, Any] = {
    "cpu": "-0",
    "memory": ".5Gi",
    "shm_size": "1e9",
    "gpus_per_node": "8.",
    "gpu_resource": "example.com/dongle",
    "tolerations": [
        {
            "key": "maintenance",
            "operator": "Exists",
            "effect": "NoExecute",
            "toleration_seconds": 2**63 - 1,
        }
    ],
    "volumes": [
        {"name": "data", "mount_path": "/data/./sets", "host_path": "/mnt/..data"},
        {"name": "ckpt", "mount_path": "//checkpoints", "claim": "ckpt"},
    ],
}


@pytest.mark.parametrize("backend", sorted(FILES))
def test_the_edges_mdc_takes_validate(backend: str, tmp_path: Path) -> None:
    data = {
        "job": {"name": "edges", "image": "img:1", "command": ["python", "train.py"]},
        "distributed": {"launcher": "torchrun", "backend": backend, "nnodes": 2},
        backend: EDGES,
    }
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(data), encoding="utf-8")
    compiled = Compiler(load_plugins(autoload=False)).compile(spec)
    text = next(a.data.decode() for a in compiled.tree if a.path == FILES[backend])
    docs = list(yaml.safe_load_all(text))
    assert [e for d in docs for e in validate_document(d, (OLDEST, newest()))] == []
    assert "example.com/dongle" in text
    assert str(2**63 - 1) in text
