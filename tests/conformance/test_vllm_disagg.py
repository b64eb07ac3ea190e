"""vllm_disagg's commands as vLLM's own parsers read them, and vLLM's documented P/D layouts.

vLLM cannot be installed here (it pulls a CUDA build of torch), so, as in
test_serving_flags.py, its server parser is rebuilt from the cited flag table, plus:

- ``--kv-transfer-config`` (vllm/engine/arg_utils.py, the VllmConfig group: a JSON object
  read into ``KVTransferConfig``), checked against KVTransferConfig's fields and its
  ``__post_init__`` rule (vllm/config/kv_transfer.py at vllm-project/vllm
  007c643b4abb7a79e69ef2b343b3dc80eb643c0d: kv_role one of kv_producer, kv_consumer,
  kv_both, and required when kv_connector is set);
- ``--enforce-eager`` (a switch, the ModelConfig group);
- the toy proxy's parser (tests/v1/kv_connector/nixl_integration/toy_proxy_server.py,
  vllm-project/vllm at 030ea52effcb05071543c8c42b8f0145e94cee43): --port (int), --host,
  --prefiller-hosts/--prefiller-host and --decoder-hosts/--decoder-host (nargs "+"),
  --prefiller-ports/--prefiller-port and --decoder-ports/--decoder-port (int, nargs "+"),
  each host list as long as its port list.

The documented layouts are vLLM's NixlConnector guide (docs/features/nixl_connector_usage.md,
vLLM v0.11.0, docs.vllm.ai/en/v0.11.0/features/nixl_connector_usage.html). Each node's
scripts run with bash, the programs replaced by a recorder, and every documented flag and
NIXL variable is compared; mdc may differ only where the guide leaves the value to the user
(ports, the proxy's host list naming the same machine) -- each such place is asserted by
mdc's own rule instead.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from tests.conformance.test_serving_flags import (
    VLLM_FLAGS,
    VLLM_PROGRAMS,
    Flag,
    parse,
    parser_of,
)
from tests.conformance.test_serving_recipes import VLLM_EP_NODE_0, VLLM_EP_NODE_1
from tests.tools import REPO, shellcheck

from mdc.emit import write_tree
from mdc.pipeline import Compiled, Compiler
from mdc.plugin_manager import load_plugins
from mdc_builtin.launchers.vllm_disagg import VllmDisaggOptions

COMPILER = Compiler(load_plugins(autoload=False))

KV_ROLES = ("kv_producer", "kv_consumer", "kv_both")
KV_FIELDS: dict[str, tuple[type, ...]] = {
    "kv_connector": (str, type(None)),
    "engine_id": (str, type(None)),
    "kv_buffer_device": (str, type(None)),
    "kv_buffer_size": (float, int),
    "kv_role": (str, type(None)),
    "kv_rank": (int, type(None)),
    "kv_parallel_size": (int,),
    "kv_ip": (str,),
    "kv_port": (int,),
    "kv_connector_extra_config": (dict,),
    "kv_connector_module_path": (str, type(None)),
}


def kv_transfer_config(text: str) -> dict[str, Any]:
    """Read as KVTransferConfig would be built from it: known fields of the right types."""
    config = json.loads(text)
    if not isinstance(config, dict):
        raise argparse.ArgumentTypeError("not a JSON object")
    for key, value in config.items():
        if key not in KV_FIELDS or not isinstance(value, KV_FIELDS[key]):
            raise argparse.ArgumentTypeError(f"KVTransferConfig has no {key}={value!r}")
    if config.get("kv_role") is not None and config["kv_role"] not in KV_ROLES:
        raise argparse.ArgumentTypeError(f"Unsupported kv_role: {config['kv_role']}")
    if config.get("kv_connector") is not None and config.get("kv_role") is None:
        raise argparse.ArgumentTypeError("kv_connector without kv_role")
    return config


SERVER_FLAGS: list[Flag] = [
    *VLLM_FLAGS,
    (("--kv-transfer-config",), "value", kv_transfer_config),
    (("--enforce-eager",), "switch", None),
]
PROXY_FLAGS: list[Flag] = [
    (("--port",), "value", int),
    (("--host",), "value", str),
    (("--prefiller-hosts", "--prefiller-host"), "list", str),
    (("--prefiller-ports", "--prefiller-port"), "list", int),
    (("--decoder-hosts", "--decoder-host"), "list", str),
    (("--decoder-ports", "--decoder-port"), "list", int),
]


def server_args(argv: list[str]) -> dict[str, Any]:
    return vars(parse(SERVER_FLAGS, VLLM_PROGRAMS, argv))


def proxy_args(argv: list[str]) -> dict[str, Any]:
    """The toy proxy's parse, after its program words (python SCRIPT or a stand-in)."""
    at = next(i for i, w in enumerate(argv) if w.startswith("--"))
    try:
        parsed = parser_of(PROXY_FLAGS, False).parse_args(argv[at:])
    except (argparse.ArgumentError, SystemExit) as error:
        raise AssertionError(f"the toy proxy would reject {argv[at:]}: {error}") from error
    values = vars(parsed)
    for role in ("prefiller", "decoder"):
        assert len(values[f"{role}_hosts"]) == len(values[f"{role}_ports"])
    return values


RECORDER = """#!/usr/bin/env bash
exec {python} -c 'import json, os, sys
names = ("CUDA_VISIBLE_DEVICES", "VLLM_NIXL_SIDE_CHANNEL_HOST", "VLLM_NIXL_SIDE_CHANNEL_PORT",
         "VLLM_ALL2ALL_BACKEND", "VLLM_USE_DEEP_GEMM")
env = {{n: os.environ[n] for n in names if n in os.environ}}
with open(os.environ["RECORD"], "a") as out:
    out.write(json.dumps({{"argv": [sys.argv[1], *sys.argv[2:]], "env": env}}) + "\\n")' "$0" "$@"
"""


def bin_with_recorders(tmp_path: Path) -> Path:
    """vllm and python on PATH, each recording its words and NIXL environment."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name in ("vllm", "python"):
        program = bin_dir / name
        program.write_text(RECORDER.format(python=sys.executable), encoding="utf-8")
        program.chmod(0o755)
    return bin_dir


def runs_of(record: Path) -> list[dict[str, Any]]:
    runs = [json.loads(line) for line in record.read_text(encoding="utf-8").splitlines()]
    for run in runs:  # the recorder's own path first: keep its name
        run["argv"][0] = Path(run["argv"][0]).name
    return runs


def compile_example(name: str, tmp_path: Path) -> tuple[Compiled, Path]:
    compiled = COMPILER.compile(REPO / "examples" / name)
    out = tmp_path / "out"
    write_tree(out, compiled.tree)
    return compiled, out


#: docs/features/nixl_connector_usage.md, "Basic Usage (on the same host)" (vLLM v0.11.0)
ONE_HOST = {
    "prefill": (
        {"CUDA_VISIBLE_DEVICES": "0", "VLLM_NIXL_SIDE_CHANNEL_PORT": "5600"},
        "vllm serve Qwen/Qwen3-0.6B --port 8100 --enforce-eager --kv-transfer-config "
        '{"kv_connector":"NixlConnector","kv_role":"kv_both"}',
    ),
    "decode": (
        {"CUDA_VISIBLE_DEVICES": "1", "VLLM_NIXL_SIDE_CHANNEL_PORT": "5601"},
        "vllm serve Qwen/Qwen3-0.6B --port 8200 --enforce-eager --kv-transfer-config "
        '{"kv_connector":"NixlConnector","kv_role":"kv_both"}',
    ),
}
ONE_HOST_PROXY = (
    "python tests/v1/kv_connector/nixl_integration/toy_proxy_server.py --port 8192 "
    "--prefiller-hosts localhost --prefiller-ports 8100 --decoder-hosts localhost "
    "--decoder-ports 8200"
)
#: what mdc writes that the guide's commands leave at vLLM's defaults (tp 1, pp 1), or to
#: the user (every interface for the servers, the proxy)
SERVER_DEFAULTS = {"tensor_parallel_size": 1, "host": "0.0.0.0"}


def same_server(mine: dict[str, Any], theirs: dict[str, Any], allowed: set[str]) -> None:
    for key, value in theirs.items():
        if value is not None and key not in allowed:
            assert mine[key] == value, f"{key}: mdc gives {mine[key]!r}, the docs {value!r}"
    extra = {
        k: v for k, v in mine.items() if theirs[k] is None and v is not None and k not in allowed
    }
    assert extra == {k: SERVER_DEFAULTS[k] for k in extra}, f"mdc adds {extra}"


def test_one_host_is_the_documented_basic_usage(tmp_path: Path) -> None:
    compiled, out = compile_example("vllm-disagg-1x2.toml", tmp_path)
    record = tmp_path / "runs.jsonl"
    bin_dir = bin_with_recorders(tmp_path)
    env = {**os.environ, "RECORD": str(record), "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    env["MDC_READY_SECONDS"] = "0"  # the recorders serve no /health: no wait for them
    options = compiled.plan.options["vllm_disagg"]
    assert isinstance(options, VllmDisaggOptions)
    router = options.router_command
    assert router == ("python3", "toy_proxy_server.py")
    helper = out / "launch" / "vllm_disagg.sh"
    script = helper.read_text(encoding="utf-8").replace("python3 toy_proxy_server.py", "python")
    helper.write_text(script, encoding="utf-8")
    subprocess.run(["bash", str(helper), "vllm", "serve"], env=env, check=True, timeout=60)
    runs = runs_of(record)
    servers = {r["env"]["CUDA_VISIBLE_DEVICES"]: r for r in runs if r["argv"][0] == "vllm"}
    ports = {}
    for role, (doc_env, doc) in ONE_HOST.items():
        (mine,) = [r for r in servers.values() if r["env"] == doc_env]
        parsed = server_args(mine["argv"])
        same_server(parsed, server_args(doc.split()), set())
        ports[role] = parsed["port"]
    assert ports == {"prefill": 8100, "decode": 8200}
    (proxy,) = [r for r in runs if r["argv"][0] == "python"]
    mine, theirs = proxy_args(proxy["argv"]), proxy_args(ONE_HOST_PROXY.split())
    assert mine["port"] == theirs["port"] == 8192
    assert mine["prefiller_ports"] == [ports["prefill"]]
    assert mine["decoder_ports"] == [ports["decode"]]
    # the guide's "localhost" and mdc's 127.0.0.1 name the same machine
    assert mine["prefiller_hosts"] == mine["decoder_hosts"] == ["127.0.0.1"]
    assert theirs["prefiller_hosts"] == theirs["decoder_hosts"] == ["localhost"]


#: "Multi-Instance Setup" (same guide): prefillers on machines A and B, decoders on C and D,
#: tensor parallel 8 each, VLLM_NIXL_SIDE_CHANNEL_HOST the machine's IP, port 5600; the proxy
#: lists them. The guide's kv_producer/kv_consumer roles are placeholders for NixlConnector
#: ("NixlConnector currently does not distinguish kv_role"), so mdc's kv_both is compared as
#: the same connector with a role KVTransferConfig accepts.
MULTI = (
    "vllm serve Qwen/Qwen3-0.6B --port 8000 --tensor-parallel-size 8 --kv-transfer-config "
    '{{"kv_connector":"NixlConnector","kv_role":"{role}"}}'
)
MULTI_PROXY = (
    "python tests/v1/kv_connector/nixl_integration/toy_proxy_server.py --port 8192 "
    "--prefiller-hosts {p1} {p2} --prefiller-ports 8000 8000 --decoder-hosts {d1} {d2} "
    "--decoder-ports 8000 8000"
)


def run_node(
    out: Path, compiled: Compiled, node: int, hosts: list[str], env: dict[str, str]
) -> None:
    (role,) = [r for r in compiled.plan.roles if node in r.nodes]
    node_env = {
        **env,
        "NODE_RANK": str(node),
        "MASTER_ADDR": hosts[0],
        "MASTER_PORT": "29500",
        "NODE_HOSTS": " ".join(hosts),
        "MDC_OUT": str(out),
        "MDC_RESOLVE_SECONDS": "0",
    }
    script = out / "launch" / f"{role.name}.sh"
    subprocess.run(["bash", str(script)], env=node_env, check=True, timeout=60, cwd=out)


def test_four_machines_are_the_documented_multi_instance_setup(tmp_path: Path) -> None:
    compiled, out = compile_example("vllm-disagg-4x8.toml", tmp_path)
    record = tmp_path / "runs.jsonl"
    bin_dir = bin_with_recorders(tmp_path)
    env = {**os.environ, "RECORD": str(record), "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    env["MDC_READY_SECONDS"] = "0"  # the recorders serve no /health: no wait for them
    hosts = [f"10.0.0.{i}" for i in range(1, 5)]
    for node in range(4):  # the proxy runs on node 0 beside the first prefill server
        run_node(out, compiled, node, hosts, env)
    runs = runs_of(record)
    (proxy,) = [r for r in runs if r["argv"][0] == "python"]
    servers = {}
    for node, role in (
        (0, "kv_producer"),
        (1, "kv_producer"),
        (2, "kv_consumer"),
        (3, "kv_consumer"),
    ):
        (mine,) = [
            r
            for r in runs
            if r["argv"][0] == "vllm" and r["env"].get("VLLM_NIXL_SIDE_CHANNEL_HOST") == hosts[node]
        ]
        assert mine["env"]["VLLM_NIXL_SIDE_CHANNEL_PORT"] == str(5600 + node * 8)
        parsed = server_args(mine["argv"])
        theirs = server_args(MULTI.format(role=role).split())
        assert parsed["kv_transfer_config"]["kv_connector"] == "NixlConnector"
        assert parsed["kv_transfer_config"]["kv_role"] in KV_ROLES
        same_server(parsed, theirs, {"port", "kv_transfer_config"})
        assert parsed["port"] == 8100 + node  # the server on node i serves on port + i
        servers[node] = parsed["port"]
    documented = proxy_args(
        MULTI_PROXY.format(p1=hosts[0], p2=hosts[1], d1=hosts[2], d2=hosts[3]).split()
    )
    mine = proxy_args(proxy["argv"])
    for key in ("port", "prefiller_hosts", "decoder_hosts"):
        assert mine[key] == documented[key], key
    assert mine["prefiller_ports"] == [servers[0], servers[1]]
    assert mine["decoder_ports"] == [servers[2], servers[3]]
    assert proxy["argv"][1] == "tests/v1/kv_connector/nixl_integration/toy_proxy_server.py"


#: docs/serving/expert_parallel_deployment.md, "Disaggregated Serving (Prefill/Decode Split)"
#: (vllm-project/vllm at 017025691b3006ed548f763fd394a846affa6064): each instance is the
#: guide's "Example: 2-Node Deployment" (VLLM_EP_NODE_0/1 of test_serving_recipes.py, run
#: with VLLM_USE_DEEP_GEMM=1) with this flag added to both, prefill on the
#: deepep_high_throughput all-to-all backend and decode on deepep_low_latency.
NIXL = ' --kv-transfer-config {"kv_connector":"NixlConnector","kv_role":"kv_both"}'
ALL2ALL = {"prefill": "deepep_high_throughput", "decode": "deepep_low_latency"}


def test_deepseek_is_the_documented_expert_parallel_split(tmp_path: Path) -> None:
    compiled, out = compile_example("vllm-disagg-deepseek-4x8.toml", tmp_path)
    record = tmp_path / "runs.jsonl"
    bin_dir = bin_with_recorders(tmp_path)
    env = {**os.environ, "RECORD": str(record), "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    env["MDC_READY_SECONDS"] = "0"  # the recorders serve no /health: no wait for them
    hosts = [f"10.0.0.{i}" for i in range(1, 5)]
    for node in range(4):
        run_node(out, compiled, node, hosts, env)
    runs = runs_of(record)
    for role, first in (("prefill", 0), ("decode", 2)):
        for node, documented in ((first, VLLM_EP_NODE_0), (first + 1, VLLM_EP_NODE_1)):
            (mine,) = [
                r
                for r in runs
                if r["argv"][0] == "vllm"
                and r["env"].get("VLLM_NIXL_SIDE_CHANNEL_HOST") == hosts[node]
            ]
            assert mine["env"]["VLLM_ALL2ALL_BACKEND"] == ALL2ALL[role]
            assert mine["env"]["VLLM_USE_DEEP_GEMM"] == "1"
            parsed = server_args(mine["argv"])
            theirs = server_args((documented + NIXL).split())
            # the guide's head address and RPC port are the user's: mdc's are the server's
            # first node and MASTER_PORT + that node
            same_server(parsed, theirs, {"data_parallel_address", "data_parallel_rpc_port", "port"})
            assert parsed["data_parallel_address"] == hosts[first]
            assert parsed["data_parallel_rpc_port"] == 29500 + first
            assert parsed["port"] == 8100 + first


def test_the_rebuilt_parsers_are_strict() -> None:
    with pytest.raises(AssertionError, match="would reject"):
        server_args(["vllm", "serve", "m", "--kv-transfer-config", '{"kv_connector":"X"}'])
    with pytest.raises(AssertionError, match="would reject"):
        server_args(["vllm", "serve", "m", "--kv-transfer-config", '{"kv_rol":"kv_both"}'])
    with pytest.raises(AssertionError, match="would reject"):
        proxy_args(["python", "p.py", "--prefill", "http://a:1"])


@pytest.mark.slow
@pytest.mark.parametrize("name", ["vllm-disagg-1x2.toml", "vllm-disagg-4x8.toml"])
def test_the_examples_scripts_pass_bash_n_and_shellcheck(tmp_path: Path, name: str) -> None:
    _, out = compile_example(name, tmp_path)
    scripts = sorted(str(p) for p in out.rglob("*.sh"))
    for script in scripts:
        subprocess.run(["bash", "-n", script], check=True)
    subprocess.run([shellcheck(), "--norc", "-S", "warning", *scripts], check=True)
