"""The sglang_disagg launcher: the split, the commands, the run-time URLs, its findings.

Specs are compiled in-process through mdc's own pipeline (only mdc's own plugins, the
others blocked so their work in progress cannot change these results). Expected values
come from the split formula written out here (madengine's, cross-checked against the
issue's literal numbers), from SGLang's own flag table and from running the generated
scripts with a stand-in ``python3`` that records its arguments.

SGLang flag names (no sglang install): ``ServerArgs`` in sgl-project/sglang
``python/sglang/srt/server_args.py`` (commit 001067fffe33427bee0ed2f007fb7551a1d76b44):
fields model_path, tp_size, host, port, disaggregation_mode,
disaggregation_transfer_backend (DISAGG_TRANSFER_BACKEND_CHOICES: mooncake, nixl, ascend,
fake, mori, mooncake_tcp), disaggregation_bootstrap_port (default 8998); the flag is the
field name with ``_`` -> ``-``. The router: SGLang's "PD Disaggregation" guide
(docs.sglang.io/docs/advanced_features/pd_disaggregation): ``python -m
sglang_router.launch_router --pd-disaggregation --prefill URL BOOTSTRAP_PORT --decode URL
--host H --port P``.
"""

from __future__ import annotations

import json
import os
import shlex
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest
from tests.tools import free_base, shellcheck

from mdc.api import Ref
from mdc.errors import Diagnostic, SpecError
from mdc.pipeline import Compiled, Compiler
from mdc.plugin_manager import load_plugins

OTHERS = ("deepspeed", "megatron", "torchtitan", "primus", "slurm", "ssh")
COMPILER = Compiler(load_plugins(autoload=False, blocked=OTHERS))

#: from SGLang's ServerArgs (see the module docstring)
SERVER_FLAGS = {
    "--model-path",
    "--tp-size",
    "--host",
    "--port",
    "--disaggregation-mode",
    "--disaggregation-transfer-backend",
    "--disaggregation-bootstrap-port",
}
TRANSFER_BACKENDS = {"mooncake", "nixl", "ascend", "fake", "mori", "mooncake_tcp"}
ROUTER_FLAGS = {"--pd-disaggregation", "--prefill", "--decode", "--host", "--port", "--policy"}
#: the issue's proof, madengine's: its nnodes (one of them the proxy's) -> (prefill, decode)
ISSUE_SPLITS = {3: (1, 1), 5: (1, 3), 7: (2, 4), 11: (4, 6)}


def expected_split(nnodes: int) -> tuple[int, int]:
    """madengine's split of the servers' nodes; mdc's router takes none of them."""
    prefill = max(1, nnodes * 2 // 5)
    return prefill, nnodes - prefill


def spec(
    nnodes: int = 5, nproc: int = 2, options: dict[str, Any] | None = None, **distributed: Any
) -> dict[str, Any]:
    return {
        "job": {"name": "sgd-unit", "command": "python3"},
        "distributed": {
            "launcher": "sglang_disagg",
            "backend": "local",
            "nnodes": nnodes,
            "nproc_per_node": nproc,
            "accelerator": "cpu",
            **distributed,
        },
        "sglang_disagg": {"model_path": "org/model", **(options or {})},
    }


def compile_(tmp_path: Path, data: dict[str, Any]) -> Compiled:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return COMPILER.compile(path)


def errors(tmp_path: Path, data: dict[str, Any]) -> list[Diagnostic]:
    with pytest.raises(SpecError) as caught:
        compile_(tmp_path, data)
    return [d for d in caught.value.diagnostics if d.is_error]


def write_tree(compiled: Compiled, root: Path) -> Path:
    for artifact in compiled.tree:
        target = root / artifact.path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(artifact.data)
        if artifact.executable:
            target.chmod(0o755)
    return root


def test_formula_gives_the_issues_numbers() -> None:
    """madengine's nnodes counts its proxy's node: the servers' nodes are one fewer."""
    assert {n: expected_split(n - 1) for n in ISSUE_SPLITS} == ISSUE_SPLITS


@pytest.mark.parametrize("nnodes", [3, 4, 6, 10])
def test_automatic_split(tmp_path: Path, nnodes: int) -> None:
    """Every node holds a server: prefill from node 0, decode after; no proxy node."""
    prefill, decode = expected_split(nnodes)
    compiled = compile_(tmp_path, spec(nnodes))
    assert compiled.plan.disagg is not None
    assert (compiled.plan.disagg.prefill, compiled.plan.disagg.decode) == (prefill, decode)
    assert {r.name: list(r.nodes) for r in compiled.plan.roles} == {
        "prefill": list(range(prefill)),
        "decode": list(range(prefill, nnodes)),
    }
    for role in compiled.launch.roles:
        env = dict(role.env)
        assert env["SGLANG_DISAGG_PREFILL_NODES"] == str(prefill)
        assert env["SGLANG_DISAGG_DECODE_NODES"] == str(decode)
        assert env["SGLANG_DISAGG_TOTAL_NODES"] == str(nnodes)
        assert env["SGLANG_DISAGG_MODE"] == "enabled"
        assert env["SGLANG_DISAGG_ROLE"] == role.name


def test_custom_split(tmp_path: Path) -> None:
    compiled = compile_(tmp_path, spec(6, prefill_nodes=4, decode_nodes=2))
    assert compiled.plan.disagg is not None
    assert (compiled.plan.disagg.prefill, compiled.plan.disagg.decode) == (4, 2)


def test_a_split_that_does_not_add_up(tmp_path: Path) -> None:
    (bad,) = errors(tmp_path, spec(7, prefill_nodes=3, decode_nodes=2))
    assert bad.code == "MDC210" and "(7)" in bad.message and "got 5" in bad.message
    assert bad.location.pointer == "/distributed/prefill_nodes"


def test_a_split_that_leaves_a_node_for_the_router_says_the_nnodes(tmp_path: Path) -> None:
    """A spec of the layout that gave the router a node of its own (prefill + decode =
    nnodes - 1) is told the node count that holds just the servers."""
    (bad,) = errors(tmp_path, spec(7, prefill_nodes=4, decode_nodes=2))
    assert bad.code == "MDC210" and bad.location.pointer == "/distributed/nnodes"
    assert bad.hint == "set nnodes = 6 (the servers' nodes)"
    # 1 + 1 servers' nodes: 2 nodes, where the split is of GPUs
    (bad,) = errors(tmp_path, spec(3, 8, prefill_nodes=1, decode_nodes=1))
    assert bad.location.pointer == "/distributed/nnodes"
    assert "nnodes = 2 with prefill_gpus = 8 and decode_gpus = 8" in (bad.hint or "")
    compiled = compile_(tmp_path, spec(2, 8, prefill_gpus=8, decode_gpus=8))
    assert [(s.role, s.nodes) for s in compiled.launch.servers if s.gpus] == [
        ("prefill", (0,)),
        ("decode", (1,)),
    ]


def test_missing_table(tmp_path: Path) -> None:
    data = spec()
    del data["sglang_disagg"]
    assert [d.code for d in errors(tmp_path, data)] == ["MDC380"]


def test_commands_use_sglangs_flags(tmp_path: Path) -> None:
    compiled = compile_(tmp_path, spec(5, 8, {"transfer_backend": "nixl"}))
    for mode in ("prefill", "decode"):
        argv = [str(w) for w in compiled.launch.role(mode).argv]
        at = argv.index("sglang.launch_server")
        assert argv[at - 2 : at] == ["python3", "-m"]
        flags = {w for w in argv[at:] if w.startswith("--")}
        assert flags <= SERVER_FLAGS
        assert argv[argv.index("--disaggregation-mode") + 1] == mode
        assert argv[argv.index("--tp-size") + 1] == "8"
        assert argv[argv.index("--model-path") + 1] == "org/model"
        backend = argv[argv.index("--disaggregation-transfer-backend") + 1]
        assert backend == "nixl" and backend in TRANSFER_BACKENDS
    (script,) = [f.data.decode() for f in compiled.tree if f.path == "launch/sglang_disagg.sh"]
    (line,) = [x for x in script.splitlines() if x.startswith("ROUTER=(")]
    router = shlex.split(line[len("ROUTER=(") : -1])
    at = router.index("sglang_router.launch_router")
    assert router[: at + 1] == ["python3", "-m", "sglang_router.launch_router"]
    assert {w for w in router[at:] if w.startswith("--")} <= ROUTER_FLAGS


def test_tp_size(tmp_path: Path) -> None:
    def tp(data: dict[str, Any]) -> str:
        argv = [str(w) for w in compile_(tmp_path, data).launch.role("decode").argv]
        return argv[argv.index("--tp-size") + 1]

    assert tp(spec(3, 8)) == "8"
    assert tp(spec(3, 8, {"tp_size": 4})) == "4"
    data = spec(3, 8)
    data["parallelism"] = {"tp": 2}
    assert tp(data) == "2"
    found = errors(tmp_path, spec(3, 8, {"tp_size": 12}))
    assert [d.code for d in found] == ["MDC383", "MDC383"]  # a prefill and a decode server
    assert "12 GPUs" in found[0].message and "(8)" in found[0].message


def test_a_server_over_two_nodes_needs_roles_of_whole_servers(tmp_path: Path) -> None:
    """tp_size 16 on 8-GPU nodes: each server spans 2 nodes, so 3 prefill nodes are refused."""
    (error,) = errors(tmp_path, spec(5, 8, {"tp_size": 16}, prefill_nodes=3, decode_nodes=2))
    assert error.code == "MDC387" and error.location.pointer == "/distributed/prefill_nodes"
    assert "spans 2 nodes (16 GPUs)" in error.message and "e.g. 2" in (error.hint or "")
    compiled = compile_(tmp_path, spec(4, 8, {"tp_size": 16}, prefill_nodes=2, decode_nodes=2))
    (script,) = [f.data.decode() for f in compiled.tree if f.path == "launch/sglang_disagg.sh"]
    assert "PREFILL_SERVER_NODES=2" in script and "DECODE_SERVER_NODES=2" in script


def test_role_tables_set_one_role_only(tmp_path: Path) -> None:
    options = {
        "tp_size": 2,
        "prefill": {"args": ["--chunked-prefill-size", "4096"]},
        "decode": {"tp_size": 1, "dp_size": 2, "args": ["--max-running-requests", "128"]},
    }
    compiled = compile_(tmp_path, spec(3, 2, options))
    prefill = [str(w) for w in compiled.launch.role("prefill").argv]
    decode = [str(w) for w in compiled.launch.role("decode").argv]
    assert prefill[prefill.index("--tp-size") + 1] == "2" and "--dp-size" not in prefill
    assert "--chunked-prefill-size" in prefill and "--max-running-requests" not in prefill
    assert decode[decode.index("--tp-size") + 1] == "1"
    assert decode[decode.index("--dp-size") + 1] == "2"
    assert "--max-running-requests" in decode and "--chunked-prefill-size" not in decode


def test_flags_that_disagree_with_mdc_are_refused_in_the_arguments(tmp_path: Path) -> None:
    """--port is each server's own (mdc writes it from the server's place); a role's
    --expert-parallel-size is that role's ep_size, here written otherwise."""
    options = {
        "server_args": ["--trust-remote-code", "--tp", "2", "--port=1"],
        "decode": {"ep_size": 2, "args": ["--expert-parallel-size", "4"]},
    }
    found = errors(tmp_path, spec(3, 2, options))
    assert [(d.code, d.location.pointer) for d in found] == [
        ("MDC389", "/sglang_disagg/server_args/3"),
        ("MDC389", "/sglang_disagg/decode/args/0"),
    ]
    assert "[sglang_disagg] server_args passes '--port=1', but mdc writes --port per node" in (
        found[0].message
    )
    assert "passes '--expert-parallel-size 4', but [sglang_disagg.decode] ep_size = 2" in (
        found[1].message
    )


def test_a_flag_in_a_roles_args_is_that_roles_key(tmp_path: Path) -> None:
    """--tp-size in prefill's args is [sglang_disagg.prefill] tp_size: the same servers."""
    keyed = compile_(tmp_path, spec(3, 2, {"prefill": {"tp_size": 1}}))
    flagged = compile_(tmp_path, spec(3, 2, {"prefill": {"args": ["--tp-size=1"]}}))
    assert [r.argv for r in flagged.launch.roles] == [r.argv for r in keyed.launch.roles]
    assert [f.data for f in flagged.launch.files] == [f.data for f in keyed.launch.files]


def test_ports_stay_below_65536(tmp_path: Path) -> None:
    nnodes = 11
    compile_(tmp_path, spec(nnodes, options={"port": 65535 - (nnodes - 1)}))
    (error,) = errors(tmp_path, spec(nnodes, options={"port": 65535 - (nnodes - 1) + 1}))
    assert error.code == "MDC381" and "65536" in error.message
    # 4 prefill nodes (the automatic split of 11), nodes 0-3: bootstrap_port + 3
    (error,) = errors(tmp_path, spec(nnodes, options={"bootstrap_port": 65535 - 3 + 1}))
    assert error.code == "MDC381" and "bootstrap_port" in error.message


def test_ports_that_overlap(tmp_path: Path) -> None:
    (error,) = errors(tmp_path, spec(5, options={"router_port": 30002}))
    assert error.code == "MDC382"
    (error,) = errors(tmp_path, spec(5, options={"port": 8999, "bootstrap_port": 8998}))
    assert error.code == "MDC382"


def test_command_that_is_not_python_warns(tmp_path: Path) -> None:
    data = spec()
    data["job"]["command"] = ["bash", "serve.sh"]
    compiled = compile_(tmp_path, data)
    assert [d.code for d in compiled.diagnostics] == ["MDC384"]


@pytest.mark.slow
def test_scripts_pass_bash_n_and_shellcheck(tmp_path: Path) -> None:
    for options in ({}, {"router": "mini_lb"}):
        root = write_tree(compile_(tmp_path, spec(7, options=options)), tmp_path / "out")
        scripts = sorted(str(p) for p in root.rglob("*.sh"))
        assert len(scripts) == 4  # run.sh, prefill.sh, decode.sh, sglang_disagg.sh
        for script in scripts:
            subprocess.run(["bash", "-n", script], check=True)
        subprocess.run([shellcheck(), *scripts], check=True)


STAND_IN = """#!/usr/bin/env bash
printf '%s\\n' "$@" > "$RECORD_DIR/$SGLANG_DISAGG_ROLE-$NODE_RANK"
"""


def stand_in_path(tmp_path: Path) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    python = bin_dir / "python3"
    python.write_text(STAND_IN, encoding="utf-8")
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    record = tmp_path / "record"
    record.mkdir()
    return {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "RECORD_DIR": str(record),
        # these stand-ins serve no /health: the router starts without waiting for them
        "MDC_READY_SECONDS": "0",
    }


def recorded(env: dict[str, str]) -> dict[str, list[str]]:
    return {
        p.name: p.read_text(encoding="utf-8").splitlines()
        for p in Path(env["RECORD_DIR"]).iterdir()
    }


def after(argv: list[str], module: str) -> list[str]:
    return argv[argv.index(module) + 1 :]


@pytest.mark.slow
def test_local_backend_runs_every_role(tmp_path: Path) -> None:
    nnodes, base, boot = 7, 31000, 9100
    prefill = expected_split(nnodes)[0]
    compiled = compile_(tmp_path, spec(nnodes, options={"port": base, "bootstrap_port": boot}))
    root = write_tree(compiled, tmp_path / "out")
    env = stand_in_path(tmp_path)
    subprocess.run(["bash", str(root / "local" / "run.sh")], env=env, check=True, timeout=60)
    runs = recorded(env)
    names = (
        ["proxy-0"]
        + [f"prefill-{i}" for i in range(prefill)]
        + [f"decode-{i}" for i in range(prefill, nnodes)]
    )
    assert sorted(runs) == sorted(names)
    expected_router = ["--pd-disaggregation", "--host", "0.0.0.0", "--port", "8000"]
    for i in range(prefill):
        expected_router += ["--prefill", f"http://127.0.0.1:{base + i}", str(boot + i)]
    for i in range(prefill, nnodes):
        expected_router += ["--decode", f"http://127.0.0.1:{base + i}"]
    assert after(runs["proxy-0"], "sglang_router.launch_router") == expected_router
    for i in range(nnodes):
        mode = "prefill" if i < prefill else "decode"
        argv = after(runs[f"{mode}-{i}"], "sglang.launch_server")
        assert argv[argv.index("--port") + 1] == str(base + i)
        assert argv[argv.index("--disaggregation-mode") + 1] == mode
        if mode == "prefill":
            assert argv[argv.index("--disaggregation-bootstrap-port") + 1] == str(boot + i)
        else:
            assert "--disaggregation-bootstrap-port" not in argv


READY_STAND_IN = """#!/usr/bin/env bash
# a server: listens a moment later and answers GET /health once; the router: logs itself
log="$RECORD_DIR/log"
if [[ " $* " == *" sglang.launch_server "* ]]; then
  args=("$@")
  for ((i = 0; i < ${{#args[@]}}; i++)); do
    if [[ "${{args[i]}}" == --port ]]; then port="${{args[i + 1]}}"; fi
  done
  sleep 1
  echo "server $port" >> "$log"
  exec {python} -c '
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer
class Health(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
    def log_message(self, *args):
        pass
with HTTPServer(("127.0.0.1", int(sys.argv[1])), Health) as server:
    server.handle_request()
' "$port"
fi
echo "router $SGLANG_DISAGG_ROLE" >> "$log"
"""


@pytest.mark.slow
def test_the_router_starts_once_every_server_is_ready(tmp_path: Path) -> None:
    """3 nodes of the local backend: the router on node 0 beside the prefill server starts
    only after every server (node 0's too) answers GET /health, with no time limit set."""
    import sys

    base = free_base(6)
    options = {"port": base, "bootstrap_port": base + 3, "router_port": base + 5}
    root = write_tree(compile_(tmp_path, spec(3, 1, options)), tmp_path / "out")
    env = stand_in_path(tmp_path)
    del env["MDC_READY_SECONDS"]
    stand_in = READY_STAND_IN.format(python=shlex.quote(sys.executable))
    (Path(env["PATH"].split(":")[0]) / "python3").write_text(stand_in, encoding="utf-8")
    subprocess.run(["bash", str(root / "local" / "run.sh")], env=env, check=True, timeout=90)
    log = (Path(env["RECORD_DIR"]) / "log").read_text(encoding="utf-8").splitlines()
    assert sorted(log[:3]) == [f"server {base + i}" for i in range(3)]
    assert log[3:] == ["router proxy"]


@pytest.mark.slow
def test_router_urls_come_from_node_hosts(tmp_path: Path) -> None:
    compiled = compile_(tmp_path, spec(5, options={"router": "sglang_router"}))
    root = write_tree(compiled, tmp_path / "out")
    env = stand_in_path(tmp_path)
    # a name stays a name in the URLs (localhost, not 127.0.0.1)
    hosts = ["10.0.0.1", "localhost", "fd00::2", "10.0.0.3", "10.0.0.4"]
    run_env = {
        **env,
        "NODE_RANK": "0",
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29500",
        "NODE_HOSTS": " ".join(hosts),
    }
    subprocess.run(
        ["bash", str(root / "launch" / "prefill.sh")], env=run_env, check=True, timeout=30
    )
    argv = after(recorded(env)["proxy-0"], "sglang_router.launch_router")
    assert argv[argv.index("--prefill") :] == [
        "--prefill",
        "http://10.0.0.1:30000",
        "8998",
        "--prefill",
        "http://localhost:30001",
        "8999",
        "--decode",
        "http://[fd00::2]:30002",
        "--decode",
        "http://10.0.0.3:30003",
        "--decode",
        "http://10.0.0.4:30004",
    ]
    wrong = {**run_env, "NODE_HOSTS": "10.0.0.1 localhost"}
    done = subprocess.run(
        ["bash", str(root / "launch" / "prefill.sh")],
        env=wrong,
        check=False,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2 and "expected 5" in done.stderr


@pytest.mark.slow
def test_mini_lb(tmp_path: Path) -> None:
    compiled = compile_(tmp_path, spec(3, options={"router": "mini_lb"}))
    assert [d.code for d in compiled.diagnostics] == ["MDC386"]
    root = write_tree(compiled, tmp_path / "out")
    env = stand_in_path(tmp_path)
    run_env = {
        **env,
        "NODE_RANK": "0",
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29500",
        "NODE_HOSTS": "10.0.0.1 localhost 10.0.0.3",
    }
    subprocess.run(
        ["bash", str(root / "launch" / "prefill.sh")], env=run_env, check=True, timeout=30
    )
    runs = recorded(env)
    assert after(runs["proxy-0"], "sglang.srt.disaggregation.mini_lb") == [
        "--host",
        "0.0.0.0",
        "--port",
        "8000",
        "--prefill",
        "http://10.0.0.1:30000",
        "--decode",
        "http://localhost:30001",
        "--decode",
        "http://10.0.0.3:30002",
    ]
    prefill = runs["prefill-0"]
    assert prefill[prefill.index("--disaggregation-bootstrap-port") + 1] == "8998"


def test_madengines_pod_names_are_in_the_env(tmp_path: Path) -> None:
    """madengine's Kubernetes names (§4.1): POD_INDEX = the node rank, TOTAL_PODS = nnodes."""
    compiled = compile_(tmp_path, spec(5))
    for role in compiled.launch.roles:
        assert role.env["POD_INDEX"] == Ref("NODE_RANK")
        assert role.env["TOTAL_PODS"] == "5"
    assert {"POD_INDEX", "POD_IP", "SGLANG_NODE_IPS", "TOTAL_PODS"} <= set(
        compiled.launch.worker_env
    )


ENV_STAND_IN = """#!/usr/bin/env bash
printf '%s\\n' "$POD_INDEX" "$TOTAL_PODS" "$POD_IP" "$SGLANG_NODE_IPS" \\
  > "$RECORD_DIR/$SGLANG_DISAGG_ROLE-$NODE_RANK"
"""


@pytest.mark.slow
def test_node_addresses_come_from_node_hosts(tmp_path: Path) -> None:
    """POD_IP is this node's address, SGLANG_NODE_IPS every node's (§4.1, §5), in rank order.

    An IP stays as it is, a name becomes its IPv4 address (localhost is 127.0.0.1), and a
    name that does not resolve (after MDC_RESOLVE_SECONDS) stops the node with an error.
    """
    root = write_tree(compile_(tmp_path, spec(4)), tmp_path / "out")
    env = stand_in_path(tmp_path)
    (Path(env["PATH"].split(":")[0]) / "python3").write_text(ENV_STAND_IN, encoding="utf-8")
    hosts = "10.0.0.1 localhost fd00::2 10.0.0.4"
    ips = "10.0.0.1,127.0.0.1,fd00::2,10.0.0.4"
    run_env = {
        **env,
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29500",
        "NODE_HOSTS": hosts,
        "MDC_RESOLVE_SECONDS": "0",
    }
    for rank, role in ((0, "prefill"), (1, "decode"), (3, "decode")):
        subprocess.run(
            ["bash", str(root / "launch" / f"{role}.sh")],
            env={**run_env, "NODE_RANK": str(rank)},
            check=True,
            timeout=30,
        )
    assert recorded(env) == {
        "proxy-0": ["0", "4", "10.0.0.1", ips],  # the router beside node 0's server
        "prefill-0": ["0", "4", "10.0.0.1", ips],
        "decode-1": ["1", "4", "127.0.0.1", ips],
        "decode-3": ["3", "4", "10.0.0.4", ips],
    }
    unresolved = {**run_env, "NODE_RANK": "3", "NODE_HOSTS": "10.0.0.1 a b no-such-host.invalid"}
    done = subprocess.run(
        ["bash", str(root / "launch" / "decode.sh")],
        env=unresolved,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 1
    assert "'a' (in NODE_HOSTS) has no IPv4 address after 0 s" in done.stderr


def test_explain_and_plan_json_describe_servers(tmp_path: Path) -> None:
    """4 x 8 with tp_size 16: one prefill and one decode server of 2 nodes, and the router
    (no GPU) on node 0 beside the prefill server."""
    from mdc.describe import explain_text, plan_json

    compiled = compile_(tmp_path, spec(4, 8, {"tp_size": 16}, prefill_nodes=2, decode_nodes=2))
    servers = plan_json(compiled.plan, compiled.launch)["servers"]
    assert isinstance(servers, list)
    assert [(s["role"], s["nodes"], s["gpus"], s["tp"], s["port"]) for s in servers] == [
        ("router", [0], 0, 1, 8000),
        ("prefill", [0, 1], 16, 16, 30000),
        ("decode", [2, 3], 16, 16, 30002),
    ]
    text = explain_text(compiled.plan, compiled.launch)
    assert "  prefill: nodes 0-1, 16 GPUs (tp 16), HTTP on node 0 port 30000" in text


def test_the_automatic_split_gives_each_role_whole_servers(tmp_path: Path) -> None:
    """4 x 8 with tp 16: servers of 2 nodes. The plain split (1 prefill, 3 decode nodes)
    holds no whole server; the nearest that does is 2 and 2."""
    for key in ("sglang_disagg", "parallelism"):  # tp_size, or [parallelism] tp
        data = spec(4, 8)
        if key == "sglang_disagg":
            data[key]["tp_size"] = 16
        else:
            data[key] = {"tp": 16}
        compiled = compile_(tmp_path, data)
        assert compiled.plan.disagg is not None
        assert (compiled.plan.disagg.prefill, compiled.plan.disagg.decode) == (2, 2)
        assert [(s.role, s.nodes) for s in compiled.launch.servers] == [
            ("router", (0,)),
            ("prefill", (0, 1)),
            ("decode", (2, 3)),
        ]


def one_node(nproc: int = 8, options: dict[str, Any] | None = None, **split: Any) -> dict[str, Any]:
    return spec(1, nproc, options, **split)


@pytest.mark.parametrize(
    ("nproc", "tp", "expected"),
    [
        # 40% of the GPUs, rounded down (at least 1): SGLang's documented 1 + 1 on two GPUs
        (2, 1, (1, 1)),
        (8, 1, (3, 5)),
        # whole servers of 2 GPUs: 3 is none; 2 and 4 are as near, the smaller wins
        (8, 2, (2, 6)),
        # servers of 4 GPUs: one each
        (8, 4, (4, 4)),
    ],
)
def test_one_node_splits_its_gpus(
    tmp_path: Path, nproc: int, tp: int, expected: tuple[int, int]
) -> None:
    compiled = compile_(tmp_path, one_node(nproc, {"tp_size": tp}))
    split = compiled.plan.disagg
    assert split is not None and split.unit == "gpus"
    assert (split.prefill, split.decode) == expected
    assert [r.name for r in compiled.plan.roles] == ["disagg"]
    gpus = [(s.role, s.first_gpu, s.gpus) for s in compiled.launch.servers if s.gpus]
    prefill, decode = expected[0] // tp, expected[1] // tp
    assert gpus == [("prefill", i * tp, tp) for i in range(prefill)] + [
        ("decode", expected[0] + i * tp, tp) for i in range(decode)
    ]


def test_one_node_split_keys_and_their_errors(tmp_path: Path) -> None:
    compiled = compile_(tmp_path, one_node(8, {"tp_size": 2}, prefill_gpus=4, decode_gpus=4))
    assert [(s.role, s.port, s.first_gpu) for s in compiled.launch.servers] == [
        ("router", 8000, 0),
        ("prefill", 30000, 0),
        ("prefill", 30001, 2),
        ("decode", 30002, 4),
        ("decode", 30003, 6),
    ]
    cases: list[tuple[dict[str, Any], list[str]]] = [
        (spec(3, 8, prefill_gpus=4, decode_gpus=4), ["MDC210", "MDC210"]),
        (one_node(8, prefill_nodes=1, decode_nodes=1), ["MDC210", "MDC210"]),
        (one_node(8, prefill_gpus=4, decode_gpus=3), ["MDC210"]),
        (one_node(8, prefill_gpus=4), ["MDC210"]),
        (one_node(1), ["MDC209"]),
        # 3 prefill and 5 decode GPUs hold no whole server of 2
        (one_node(8, {"tp_size": 2}, prefill_gpus=3, decode_gpus=5), ["MDC387", "MDC387"]),
        # a prefill server of 4 GPUs on the 2 prefill GPUs
        (one_node(8, {"tp_size": 4}, prefill_gpus=2, decode_gpus=6), ["MDC383", "MDC387"]),
    ]
    for data, codes in cases:
        assert sorted(d.code for d in errors(tmp_path, data)) == codes, data["distributed"]


def test_one_node_ports_that_overlap(tmp_path: Path) -> None:
    """One node: server k on port + k, prefill server k bootstraps on bootstrap_port + k."""
    options = {"tp_size": 1, "port": 9000, "bootstrap_port": 8998}
    (error,) = errors(tmp_path, one_node(8, options))  # 3 prefill: 8998..9000; HTTP 9000..
    assert error.code == "MDC382" and "[9000]" in error.message
    (error,) = errors(tmp_path, one_node(8, {"router_port": 30004}))
    assert error.code == "MDC382" and "[30004]" in error.message


ONE_NODE_STAND_IN = """#!/usr/bin/env bash
printf '%s\\n' "$SGLANG_DISAGG_ROLE" "$@" > "$RECORD_DIR/$$"
"""


def one_node_runs(root: Path, env: dict[str, str]) -> list[list[str]]:
    """What the one node's processes ran, each as [role, words...], in port order."""
    subprocess.run(
        ["bash", str(root / "launch" / "disagg.sh")],
        env={**env, "NODE_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"},
        check=True,
        timeout=30,
    )
    runs = [p.read_text(encoding="utf-8").splitlines() for p in Path(env["RECORD_DIR"]).iterdir()]
    return sorted(runs, key=lambda r: int(r[r.index("--port") + 1]) if "--port" in r else 0)


@pytest.mark.slow
def test_one_node_runs_every_server_and_the_router(tmp_path: Path) -> None:
    options = {
        "tp_size": 2,
        "prefill": {"args": ["--chunked-prefill-size", "8192"]},
        "decode": {"args": ["--max-running-requests", "128"]},
    }
    compiled = compile_(tmp_path, one_node(8, options, prefill_gpus=4, decode_gpus=4))
    root = write_tree(compiled, tmp_path / "out")
    env = stand_in_path(tmp_path)
    (Path(env["PATH"].split(":")[0]) / "python3").write_text(ONE_NODE_STAND_IN, encoding="utf-8")
    runs = one_node_runs(root, env)
    router = next(r for r in runs if "sglang_router.launch_router" in r)
    assert router[0] == "proxy"
    assert after(router, "sglang_router.launch_router") == [
        "--pd-disaggregation",
        "--host",
        "0.0.0.0",
        "--port",
        "8000",
        "--prefill",
        "http://127.0.0.1:30000",
        "8998",
        "--prefill",
        "http://127.0.0.1:30001",
        "8999",
        "--decode",
        "http://127.0.0.1:30002",
        "--decode",
        "http://127.0.0.1:30003",
    ]
    servers = [r for r in runs if "sglang.launch_server" in r]
    placed = [
        (
            r[0],
            r[r.index("--disaggregation-mode") + 1],
            r[r.index("--port") + 1],
            r[r.index("--base-gpu-id") + 1],
            r[r.index("--disaggregation-bootstrap-port") + 1]
            if "--disaggregation-bootstrap-port" in r
            else None,
        )
        for r in servers
    ]
    for run in servers:  # a role's args reach that role's servers only
        prefill = run[0] == "prefill"
        assert ("--chunked-prefill-size" in run) == prefill
        assert ("--max-running-requests" in run) == (not prefill)
    assert placed == [
        ("prefill", "prefill", "30000", "0", "8998"),
        ("prefill", "prefill", "30001", "2", "8999"),
        ("decode", "decode", "30002", "4", None),
        ("decode", "decode", "30003", "6", None),
    ]


FAILING_STAND_IN = """#!/usr/bin/env bash
if [[ "$SGLANG_DISAGG_ROLE" == decode ]]; then exit 3; fi
exec sleep 60
"""


@pytest.mark.slow
def test_one_node_stops_when_a_server_fails(tmp_path: Path) -> None:
    """A decode server that dies ends the job with its status; the others are stopped."""
    root = write_tree(compile_(tmp_path, one_node(2)), tmp_path / "out")
    env = stand_in_path(tmp_path)
    (Path(env["PATH"].split(":")[0]) / "python3").write_text(FAILING_STAND_IN, encoding="utf-8")
    done = subprocess.run(
        ["bash", str(root / "launch" / "disagg.sh")],
        env={**env, "NODE_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"},
        check=False,
        timeout=30,
    )
    assert done.returncode == 3


@pytest.mark.slow
def test_one_node_scripts_pass_shellcheck(tmp_path: Path) -> None:
    for nnodes, options in ((1, {}), (1, {"router": "mini_lb", "policy": "random"}), (2, {})):
        out = tmp_path / f"{nnodes}-{len(options)}"
        root = write_tree(compile_(tmp_path, spec(nnodes, 8, options)), out)
        scripts = sorted(str(p) for p in root.rglob("*.sh"))
        for script in scripts:
            subprocess.run(["bash", "-n", script], check=True)
        subprocess.run([shellcheck(), *scripts], check=True)


@pytest.mark.slow
def test_one_node_stops_its_servers_when_terminated(tmp_path: Path) -> None:
    """TERM to the node (a cancelled job) reaches every server and the router."""
    import signal
    import time

    root = write_tree(compile_(tmp_path, one_node(2)), tmp_path / "out")
    env = stand_in_path(tmp_path)
    sleeper = (
        '#!/usr/bin/env bash\necho "$$" > "$RECORD_DIR/$SGLANG_DISAGG_ROLE-$$"\nexec sleep 60\n'
    )
    (Path(env["PATH"].split(":")[0]) / "python3").write_text(sleeper, encoding="utf-8")
    node = subprocess.Popen(
        ["bash", str(root / "launch" / "sglang_disagg.sh"), "python3"],
        env={**env, "NODE_RANK": "0"},
    )
    record = Path(env["RECORD_DIR"])
    deadline = time.monotonic() + 20
    while len(list(record.iterdir())) < 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    pids = [int(p.read_text(encoding="utf-8")) for p in record.iterdir()]
    assert len(pids) == 3  # prefill, decode, router
    node.send_signal(signal.SIGTERM)
    assert node.wait(timeout=20) == 143
    time.sleep(0.5)
    for pid in pids:  # gone, or a zombie no one has reaped yet (it no longer runs)
        status = Path(f"/proc/{pid}/status")
        state = status.read_text(encoding="utf-8") if status.exists() else "State:\tX"
        assert "\nState:\tZ" in state or "State:\tX" in state, state.splitlines()[:3]


def test_two_nodes_share_their_gpus(tmp_path: Path) -> None:
    """2 x 8 GPUs, tp 2: 40% of 16 rounded down is 6 prefill GPUs (3 servers on node 0),
    then 10 decode GPUs (one on node 0's last two GPUs, four on node 1); the router on
    node 0."""
    compiled = compile_(tmp_path, spec(2, 8, {"tp_size": 2}))
    split = compiled.plan.disagg
    assert split is not None and (split.prefill, split.decode, split.unit) == (6, 10, "gpus")
    assert [(r.name, r.first_node, r.count) for r in compiled.plan.roles] == [("disagg", 0, 2)]
    placed = [(s.role, s.nodes, s.first_gpu, s.port) for s in compiled.launch.servers]
    assert placed == [
        ("router", (0,), 0, 8000),
        ("prefill", (0,), 0, 30000),
        ("prefill", (0,), 2, 30001),
        ("prefill", (0,), 4, 30002),
        ("decode", (0,), 6, 30003),
        *[("decode", (1,), gpu, 30004 + i) for i, gpu in enumerate((0, 2, 4, 6))],
    ]


def test_two_node_servers_stay_inside_a_node(tmp_path: Path) -> None:
    # prefill servers of 3 GPUs side by side: the third (GPUs 6-8) would cross into node 1
    data = spec(2, 8, {"tp_size": 2, "prefill": {"tp_size": 3}}, prefill_gpus=12, decode_gpus=4)
    (found,) = errors(tmp_path, data)
    assert found.code == "MDC383" and "GPU 6 of node 0" in found.message
    # the automatic split moves prefill to a multiple of both sizes: 4 (then 12 decode)
    compiled = compile_(tmp_path, spec(2, 8, {"tp_size": 2, "decode": {"tp_size": 4}}))
    assert compiled.plan.disagg is not None
    assert (compiled.plan.disagg.prefill, compiled.plan.disagg.decode) == (4, 12)


@pytest.mark.slow
def test_two_nodes_run_their_servers_and_node_0_the_router(tmp_path: Path) -> None:
    root = write_tree(compile_(tmp_path, spec(2, 2, {"tp_size": 1})), tmp_path / "out")
    env = stand_in_path(tmp_path)
    (Path(env["PATH"].split(":")[0]) / "python3").write_text(ONE_NODE_STAND_IN, encoding="utf-8")
    hosts = {"NODE_HOSTS": "node-a node-b", "MASTER_ADDR": "node-a", "MASTER_PORT": "29500"}
    for rank in (0, 1):
        subprocess.run(
            ["bash", str(root / "launch" / "disagg.sh")],
            env={**env, **hosts, "NODE_RANK": str(rank)},
            check=True,
            timeout=30,
        )
    runs = [p.read_text(encoding="utf-8").splitlines() for p in Path(env["RECORD_DIR"]).iterdir()]
    (router,) = [r for r in runs if "sglang_router.launch_router" in r]
    # 4 GPUs: 1 prefill (node 0, GPU 0), 3 decode (node 0 GPU 1, node 1 GPUs 0-1)
    assert router[router.index("--prefill") :] == [
        "--prefill",
        "http://node-a:30000",
        "8998",
        "--decode",
        "http://node-a:30001",
        "--decode",
        "http://node-b:30002",
        "--decode",
        "http://node-b:30003",
    ]
    assert len(runs) == 5


@pytest.mark.slow
def test_an_argument_holding_a_line_break_reaches_the_server_as_written(tmp_path: Path) -> None:
    """The node script's case indents its lines; a line break inside a quoted argument
    is part of the argument, not a line of the script, and stays as written."""
    name = "first line\nsecond line"
    options = {"port": free_base(2), "server_args": ["--served-model-name", name]}
    compiled = compile_(tmp_path, spec(2, 2, options))
    root = write_tree(compiled, tmp_path / "out")
    env = stand_in_path(tmp_path)
    (tmp_path / "bin" / "python3").write_text(
        '#!/usr/bin/env bash\nprintf \'%s\\0\' "$@" > "$RECORD_DIR/$SGLANG_DISAGG_ROLE-$BASHPID"\n',
        encoding="utf-8",
    )
    subprocess.run(["bash", str(root / "local" / "run.sh")], env=env, check=True, timeout=60)
    servers = [
        argv
        for argv in (
            p.read_text(encoding="utf-8").split("\0")[:-1]
            for p in Path(env["RECORD_DIR"]).iterdir()
        )
        if "sglang.launch_server" in argv
    ]
    assert len(servers) == 2  # a prefill server on node 0, a decode server on node 1
    for argv in servers:
        assert argv[argv.index("--served-model-name") + 1] == name
