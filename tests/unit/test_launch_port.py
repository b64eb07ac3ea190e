"""The rendezvous port a launch script derives at run time (mdc.runtime.port_lines).

The port is derived from a hash of the launch id (MDC_LAUNCH_ID): POSIX ``cksum``'s CRC,
which this file computes itself from the POSIX definition, then stepped on node 0 to the
first port nothing listens on. The lines run in a real bash here; shellcheck reads them.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.tools import hashed_port, posix_cksum, shellcheck

from mdc.api.shell import launch_id_lines, port_lines
from mdc.pipeline import Compiler
from mdc.runtime import PORT_RANGE


def run_lines(lines: list[str], launch_id: str | None = None) -> dict[str, str]:
    """Run the lines in bash (as a backend's script would) and return what they export."""
    head = "set -euo pipefail\nexport MASTER_ADDR=127.0.0.1\n"
    if launch_id is not None:
        head += f"export MDC_LAUNCH_ID={launch_id}\n"
    script = head + "\n".join(lines) + '\nprintf "%s %s\\n" "$MDC_LAUNCH_ID" "$MASTER_PORT"\n'
    done = subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, check=True, timeout=60
    )
    launch, port = done.stdout.split()
    return {"MDC_LAUNCH_ID": launch, "MASTER_PORT": port}


@contextlib.contextmanager
def listening(port: int) -> Iterator[None]:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            pytest.skip(f"port {port} is taken on this host")
        sock.listen()
        yield


def test_the_hash_is_posix_cksum() -> None:
    """The CRC computed here is the one the scripts read from cksum."""
    for text in ("", "a", "12345", "20261129T061429Z-18619-19937"):
        printed = subprocess.run(
            ["cksum"], input=text.encode(), capture_output=True, check=True
        ).stdout.split()[0]
        assert int(printed) == posix_cksum(text.encode()), text


def test_a_derived_port_is_the_hash_of_the_launch_id() -> None:
    for launch_id in ("4711", "4712", "train-92", "train-93"):
        got = run_lines(port_lines(29085, True, probe=None), launch_id)
        assert got["MASTER_PORT"] == str(hashed_port(launch_id))
    # two SLURM jobs (ids 4711, 4712) of one spec: different ports, not one per job name
    assert hashed_port("4711") != hashed_port("4712")


def test_node_0_steps_to_the_first_free_port() -> None:
    launch_id = "5309"
    start = hashed_port(launch_id)
    assert start + 2 < PORT_RANGE[1]
    with listening(start):
        got = run_lines(port_lines(1, True, probe="true"), launch_id)
        assert got["MASTER_PORT"] == str(start + 1)
        with listening(start + 1):
            assert run_lines(port_lines(1, True, probe="true"), launch_id)["MASTER_PORT"] == str(
                start + 2
            )
        # a node other than 0 does not probe: it takes what node 0 is given, the hash
        skipped = port_lines(1, True, probe='[[ "${NOT_NODE_0:-x}" == y ]]')
        assert run_lines(skipped, launch_id)["MASTER_PORT"] == str(start)


def test_a_spec_port_stays_as_written() -> None:
    assert port_lines(29500, False, probe="true") == ["export MASTER_PORT=29500"]
    assert run_lines(port_lines(29500, False, probe="true"), "x")["MASTER_PORT"] == "29500"


def test_a_fresh_launch_id_for_every_run() -> None:
    lines = [*launch_id_lines(None), *port_lines(1, True, probe="true")]
    seen = [run_lines(lines) for _ in range(3)]
    ids = {s["MDC_LAUNCH_ID"] for s in seen}
    assert len(ids) == 3
    for got in seen:
        start = hashed_port(got["MDC_LAUNCH_ID"])
        assert start <= int(got["MASTER_PORT"]) < start + 100


def test_the_scheduler_id_is_the_launch_id() -> None:
    lines = launch_id_lines("SLURM_JOB_ID", "SLURM")
    script = "set -euo pipefail\nSLURM_JOB_ID=812\n" + "\n".join(lines) + '\necho "$MDC_LAUNCH_ID"'
    assert subprocess.run(["bash", "-c", script], capture_output=True, text=True).stdout == "812\n"
    unset = subprocess.run(
        ["bash", "-c", "set -euo pipefail\n" + "\n".join(lines)], text=True, capture_output=True
    )
    assert unset.returncode != 0 and "SLURM_JOB_ID is not set" in unset.stderr


def test_the_lines_pass_shellcheck(tmp_path: Path) -> None:
    for probe in (None, "true", '[[ "${SLURMD_NODENAME:-}" == "${hosts[0]}" ]]'):
        script = tmp_path / "port.sh"
        script.write_text(
            '#!/usr/bin/env bash\nset -euo pipefail\nhosts=(a)\n: "${hosts[0]}"\nexport MASTER_ADDR=a\n'
            + "\n".join([*launch_id_lines(None), *port_lines(1, True, probe=probe)])
            + "\n",
            encoding="utf-8",
        )
        done = subprocess.run([shellcheck(), str(script)], capture_output=True, text=True)
        assert done.returncode == 0, done.stdout


@pytest.mark.parametrize("backend", ["local", "slurm", "kubernetes", "pytorchjob"])
def test_plan_json_states_the_port_the_backend_uses(
    compiler: Compiler, tmp_path: Path, backend: str
) -> None:
    """plan.json's worker env names the port where the backend fixes one (a Kubernetes
    manifest carries it) and the run-time choice where its scripts pick it; neither names
    the other's."""
    import json

    import yaml

    data = {
        "job": {"name": "port-check", "image": "img:1", "command": ["python", "train.py"]},
        "distributed": {"launcher": "torchrun", "backend": backend, "nnodes": 2},
        "torchrun": {"rdzv_backend": "static"},  # the worker env then states the port
    }
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    tree = {a.path: a.data.decode() for a in compiler.compile(path).tree}
    plan = json.loads(tree["plan.json"])
    stated, hashed = plan["worker_env"]["MASTER_PORT"], plan["rendezvous"]["master_port"]
    manifest = tree.get(f"{backend}/job.yaml")
    if manifest is None:  # the scripts pick the port: no number is promised
        assert stated.startswith("chosen at run time from a hash of MDC_LAUNCH_ID"), stated
        assert "manifest" not in stated and str(hashed) not in stated, stated
        return
    ports = {
        str(port["containerPort"])
        for doc in yaml.safe_load_all(manifest)
        if doc and doc["kind"] != "ConfigMap"
        for port in _all(doc, "ports")
        if "containerPort" in port
    }
    assert ports == {stated.split(",")[0]} == {str(hashed)}, (ports, stated)
    assert "fixed in the manifests" in stated and "MDC_LAUNCH_ID" not in stated


def _all(value: object, key: str) -> list[dict[str, object]]:
    """Every item of every ``key`` list anywhere in ``value``."""
    if isinstance(value, dict):
        found = list(value.get(key) or []) if isinstance(value.get(key), list) else []
        return found + [x for v in value.values() for x in _all(v, key)]
    if isinstance(value, list):
        return [x for v in value for x in _all(v, key)]
    return []
