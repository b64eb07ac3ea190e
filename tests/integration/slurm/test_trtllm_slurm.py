"""trtllm on a real SLURM: servers side by side on the GPUs SLURM gives each node, and the
disaggregated proxy's config naming the nodes the servers run on.

The job's nodes have 2 fake GPUs each (GRES). ``trtllm-serve`` is a stand-in on PATH that
records its arguments and environment (and the disaggregated config it is given), then exits,
so the job completes once every server has run. A server over several nodes (an
``srun --mpi=pmix`` step) is not run here: the emulated nodes share one host, where two
nodes' PMIx servers collide (tasks of the second node fail to launch), so that layout is
checked by tests/unit/test_launcher_trtllm.py with a recording srun.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("loopback")]

STAND_IN = """#!/usr/bin/env bash
{python} -c 'import json, os, sys
keys = ("NODE_RANK", "CUDA_VISIBLE_DEVICES", "TRTLLM_DISAGG_ROLE")
record = {{"program": os.path.basename(sys.argv[1]), "argv": sys.argv[2:],
          "env": {{k: os.environ.get(k) for k in keys}}}}
if sys.argv[2:3] == ["disaggregated"]:
    record["config"] = open(sys.argv[4]).read()
name = "-".join([record["program"], os.environ["NODE_RANK"], str(os.getpid())])
with open(os.path.join(os.environ["RECORD_DIR"], name + ".json"), "w") as out:
    json.dump(record, out)' "$0" "$@"
"""


def stand_ins(tmp_path: Path) -> tuple[Path, Path]:
    bin_dir, record = tmp_path / "bin", tmp_path / "record"
    bin_dir.mkdir()
    record.mkdir()
    for name in ("trtllm-llmapi-launch", "trtllm-serve"):
        program = bin_dir / name
        program.write_text(STAND_IN.format(python=sys.executable), encoding="utf-8")
        program.chmod(0o755)
    return bin_dir, record


def run(
    compile_spec: Any, jobs: Any, token: Any, tmp_path: Path, spec: dict[str, Any]
) -> list[dict[str, Any]]:
    bin_dir, record = stand_ins(tmp_path)
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec), encoding="utf-8")
    out = tmp_path / "out"
    compile_spec(path, out)
    env = token.env(RECORD_DIR=str(record))
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    finished = jobs.wait(jobs.submit(out, env), timeout=120)
    assert (finished.state, finished.exit_code) == ("COMPLETED", "0:0"), finished.log[-4000:]
    left = token.leftovers()
    assert not left, "processes left behind after the job:\n" + "\n".join(left)
    return [json.loads(p.read_text()) for p in sorted(record.glob("*.json"))]


def value(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_replicas_side_by_side_get_the_gpus_slurm_gives_each_node(
    compile_spec: Any, jobs: Any, token: Any, tmp_path: Path
) -> None:
    spec = {
        "job": {"name": "slurm-trtllm", "command": ["trtllm-serve"]},
        "distributed": {
            "launcher": "trtllm",
            "backend": "slurm",
            "nnodes": 2,
            "nproc_per_node": 2,
            "accelerator": "nvidia",
            "master_port": 29825,
        },
        "parallelism": {"tp": 1, "pp": 1},
        "trtllm": {"model": "m", "args": ["--trust_remote_code"]},
    }
    runs = run(compile_spec, jobs, token, tmp_path, spec)
    # 4 servers of one GPU: on each node, one per GPU SLURM gave the node, ports 8000, 8001
    placed = sorted(
        (r["env"]["NODE_RANK"], r["env"]["CUDA_VISIBLE_DEVICES"], value(r["argv"], "--port"))
        for r in runs
    )
    assert placed == [
        ("0", "0", "8000"),
        ("0", "1", "8001"),
        ("1", "0", "8000"),
        ("1", "1", "8001"),
    ]
    for r in runs:
        assert r["argv"][:3] == ["m", "--host", "0.0.0.0"]
        assert value(r["argv"], "--tp_size") == "1" and "--trust_remote_code" in r["argv"]


def test_disaggregated_servers_and_the_proxy_on_slurm(
    compile_spec: Any, jobs: Any, token: Any, tmp_path: Path
) -> None:
    import yaml

    spec = {
        "job": {"name": "slurm-trtllm-pd", "command": ["trtllm-serve"]},
        "distributed": {
            "launcher": "trtllm",
            "backend": "slurm",
            "nnodes": 3,
            "nproc_per_node": 2,
            "accelerator": "nvidia",
            "master_port": 29835,
        },
        "trtllm": {
            "model": "m",
            "context": {"servers": 2, "tp_size": 1},
            "generation": {"servers": 2, "tp_size": 2},
        },
    }
    runs = run(compile_spec, jobs, token, tmp_path, spec)
    proxy = [r for r in runs if r["argv"][:1] == ["disaggregated"]]
    servers = sorted(
        (
            r["env"]["TRTLLM_DISAGG_ROLE"],
            r["env"]["NODE_RANK"],
            r["env"]["CUDA_VISIBLE_DEVICES"],
            value(r["argv"], "--port"),
        )
        for r in runs
        if r not in proxy
    )
    # context servers on node 0's two GPUs, a generation server on each later node
    assert servers == [
        ("context", "0", "0", "8001"),
        ("context", "0", "1", "8002"),
        ("generation", "1", "0,1", "8003"),
        ("generation", "2", "0,1", "8004"),
    ]
    assert len(proxy) == 1 and proxy[0]["env"]["NODE_RANK"] == "0"
    config = yaml.safe_load(proxy[0]["config"])
    assert config["hostname"] == "0.0.0.0" and config["port"] == 8000
    context_urls = config["context_servers"]["urls"]
    generation_urls = config["generation_servers"]["urls"]
    assert config["context_servers"]["num_instances"] == 2 == len(context_urls)
    assert config["generation_servers"]["num_instances"] == 2 == len(generation_urls)
    # the URLs name the nodes SLURM ran the servers on (scontrol show hostnames, in order)
    hosts = [url.split(":")[0] for url in context_urls + generation_urls]
    assert hosts[0] == hosts[1] and len({hosts[0], hosts[2], hosts[3]}) == 3
    assert [url.split(":")[1] for url in context_urls + generation_urls] == [
        "8001",
        "8002",
        "8003",
        "8004",
    ]
