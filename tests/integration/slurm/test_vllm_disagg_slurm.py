"""vllm_disagg on a real SLURM: every node runs its role with the words and NIXL variables
the plan gives it.

A 3-node job (2 CPU "GPUs" each): node 0 a prefill server of tp 2 and, beside it, the proxy;
nodes 1-2 one decode server of 4 data-parallel engines over both (the later node headless).
``vllm`` and the proxy are stand-ins on PATH that record their arguments and environment; a
server's first node answers the proxy's readiness probe (GET /health) once and ends, so the
job completes once every node has run its part and the proxy has waited for the servers.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from tests.tools import free_base

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("loopback")]

STAND_IN = """#!/usr/bin/env bash
exec {python} -c '
import json, os, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
keys = ("NODE_RANK", "VLLM_NIXL_SIDE_CHANNEL_HOST", "VLLM_NIXL_SIDE_CHANNEL_PORT",
        "VLLM_HOST_IP", "VLLM_DISAGG_ROLE", "CUDA_VISIBLE_DEVICES")
program, argv = sys.argv[1], sys.argv[2:]
record = {{"argv": argv, "env": {{k: os.environ.get(k) for k in keys}}}}
name = os.path.join(os.environ["RECORD_DIR"], os.environ["NODE_RANK"] + "-" + program + ".json")
with open(name, "w") as out:
    json.dump(record, out)
if program == "vllm" and "--headless" not in argv:
    # a server ready at once: it answers the proxy readiness probe, then ends
    class Health(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()
        def log_message(self, *args):
            pass
    with HTTPServer(("", int(argv[argv.index("--port") + 1])), Health) as server:
        server.handle_request()
' "$(basename "$0")" "$@"
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
            "nnodes": 3,
            "nproc_per_node": 2,
            "accelerator": "cpu",
            "master_port": 29815,
            "prefill_nodes": 1,
            "decode_nodes": 2,
        },
        "vllm_disagg": {
            "model": "m",
            "port": (base := free_base(3)),
            "router_port": base + 2,
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
    runs = {p.stem: json.loads(p.read_text()) for p in record.glob("*.json")}
    # node 0 runs the prefill server and, beside it, the proxy: no node of its own
    assert sorted(runs) == ["0-toy-proxy", "0-vllm", "1-vllm", "2-vllm"]
    roles = [runs[k]["env"]["VLLM_DISAGG_ROLE"] for k in sorted(runs)]
    assert roles == ["proxy", "prefill", "decode", "decode"]
    proxy, prefill, head, later = (runs[k]["argv"] for k in sorted(runs))
    hosts = {n: runs[f"{n}-vllm"]["env"]["VLLM_NIXL_SIDE_CHANNEL_HOST"] for n in (0, 1, 2)}
    # the proxy names each server by the address its NIXL side channel listens on
    assert values(proxy, "--prefiller-hosts") == [hosts[0]]
    assert values(proxy, "--prefiller-ports") == [str(base)]
    assert values(proxy, "--decoder-hosts") == [hosts[1]]
    assert values(proxy, "--decoder-ports") == [str(base + 1)]
    assert value(prefill, "--tensor-parallel-size") == "2" and value(prefill, "--port") == str(base)
    assert runs["0-vllm"]["env"]["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "5600"  # node 0 x 2 GPUs
    for node, argv in ((1, head), (2, later)):
        assert value(argv, "--data-parallel-size") == "4"
        assert value(argv, "--data-parallel-size-local") == "2"
        assert value(argv, "--data-parallel-address") == hosts[1]
        assert value(argv, "--data-parallel-rpc-port") == str(29815 + 1)
        assert runs[f"{node}-vllm"]["env"]["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "5602"
    assert "--headless" not in head
    assert "--headless" in later and value(later, "--data-parallel-start-rank") == "2"
    # each server's stand-in ends only after answering one GET /health: the job's completing
    # shows the proxy probed both servers (it starts only after they answer)
    assert "is not ready after" not in finished.log
    left = token.leftovers()
    assert not left, "processes left behind after the job:\n" + "\n".join(left)
