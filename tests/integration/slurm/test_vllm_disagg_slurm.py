"""vllm_disagg on a real SLURM: every node runs its role with the words and NIXL variables
the plan gives it.

A 4-node job (2 CPU "GPUs" each): node 0 the proxy, node 1 a prefill server of tp 2, nodes
2-3 one decode server of 4 data-parallel engines over both (the later node headless). ``vllm``
and the proxy are stand-ins on PATH that record their arguments and environment and exit,
so the job completes once every node has run its part.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("loopback")]

STAND_IN = """#!/usr/bin/env bash
{python} -c 'import json, os, sys
keys = ("NODE_RANK", "VLLM_NIXL_SIDE_CHANNEL_HOST", "VLLM_NIXL_SIDE_CHANNEL_PORT",
        "VLLM_HOST_IP", "VLLM_DISAGG_ROLE")
record = {{"argv": sys.argv[1:], "env": {{k: os.environ.get(k) for k in keys}}}}
name = os.path.join(os.environ["RECORD_DIR"], os.environ["NODE_RANK"] + ".json")
with open(name, "w") as out:
    json.dump(record, out)' "$@"
"""


def value(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def values(argv: list[str], flag: str) -> list[str]:
    start = argv.index(flag) + 1
    end = start
    while end < len(argv) and not argv[end].startswith("--"):
        end += 1
    return argv[start:end]


def test_every_node_runs_its_vllm_disagg_role(
    compile_spec: Any, jobs: Any, token: Any, tmp_path: Path
) -> None:
    import sys

    bin_dir, record = tmp_path / "bin", tmp_path / "record"
    bin_dir.mkdir()
    record.mkdir()
    for name in ("vllm", "toy-proxy"):
        program = bin_dir / name
        program.write_text(STAND_IN.format(python=sys.executable), encoding="utf-8")
        program.chmod(0o755)
    spec = {
        "job": {"name": "slurm-vllm-pd", "command": ["vllm", "serve"]},
        "distributed": {
            "launcher": "vllm_disagg",
            "backend": "slurm",
            "nnodes": 4,
            "nproc_per_node": 2,
            "accelerator": "cpu",
            "master_port": 29815,
            "prefill_nodes": 1,
            "decode_nodes": 2,
        },
        "vllm_disagg": {
            "model": "m",
            "router_command": ["toy-proxy"],
            "prefill": {"tensor_parallel_size": 2},
            "decode": {"tensor_parallel_size": 1, "data_parallel_size": 4},
        },
    }
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec), encoding="utf-8")
    out = tmp_path / "out"
    compile_spec(path, out)
    env = token.env(RECORD_DIR=str(record))
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    finished = jobs.wait(jobs.submit(out, env), timeout=120)
    assert (finished.state, finished.exit_code) == ("COMPLETED", "0:0"), finished.log[-4000:]
    runs = {int(p.stem): json.loads(p.read_text()) for p in record.glob("*.json")}
    assert sorted(runs) == [0, 1, 2, 3]
    assert [runs[n]["env"]["VLLM_DISAGG_ROLE"] for n in range(4)] == [
        "proxy",
        "prefill",
        "decode",
        "decode",
    ]
    proxy, prefill, head, later = (runs[n]["argv"] for n in range(4))
    hosts = {n: runs[n]["env"]["VLLM_NIXL_SIDE_CHANNEL_HOST"] for n in (1, 2, 3)}
    # the proxy names each server by the address its NIXL side channel listens on
    assert values(proxy, "--prefiller-hosts") == [hosts[1]]
    assert values(proxy, "--prefiller-ports") == ["8101"]
    assert values(proxy, "--decoder-hosts") == [hosts[2]]
    assert values(proxy, "--decoder-ports") == ["8102"]
    assert value(prefill, "--tensor-parallel-size") == "2" and value(prefill, "--port") == "8101"
    assert runs[1]["env"]["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "5602"  # 5600 + node 1 x 2 GPUs
    for node, argv in ((2, head), (3, later)):
        assert value(argv, "--data-parallel-size") == "4"
        assert value(argv, "--data-parallel-size-local") == "2"
        assert value(argv, "--data-parallel-address") == hosts[2]
        assert value(argv, "--data-parallel-rpc-port") == str(29815 + 2)
        assert runs[node]["env"]["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "5604"
    assert "--headless" not in head
    assert "--headless" in later and value(later, "--data-parallel-start-rank") == "2"
    left = token.leftovers()
    assert not left, "processes left behind after the job:\n" + "\n".join(left)
