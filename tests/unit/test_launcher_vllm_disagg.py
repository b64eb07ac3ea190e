"""The vllm_disagg launcher: the split, the commands, the run-time wiring, its findings.

Specs are compiled in-process through mdc's own pipeline (only mdc's own plugins, the
others blocked so their work in progress cannot change these results). Expected values
come from vLLM's documentation and source (vLLM v0.11.0, cited per constant below) and
from running the generated scripts with stand-ins for ``vllm`` and the proxy that record
their arguments and environment.
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
from tests.tools import shellcheck

from mdc.errors import Diagnostic, SpecError
from mdc.pipeline import Compiled, Compiler
from mdc.plugin_manager import load_plugins

OTHERS = ("deepspeed", "megatron", "torchtitan", "primus", "trtllm")
COMPILER = Compiler(load_plugins(autoload=False, blocked=OTHERS))

#: KVTransferConfig's fields, vllm/config/kv_transfer.py (vllm-project/vllm at
#: 007c643b4abb7a79e69ef2b343b3dc80eb643c0d): kv_role is one of these
KV_ROLES = {"kv_producer", "kv_consumer", "kv_both"}
KV_FIELDS = {
    "kv_connector",
    "engine_id",
    "kv_buffer_device",
    "kv_buffer_size",
    "kv_role",
    "kv_rank",
    "kv_parallel_size",
    "kv_ip",
    "kv_port",
    "kv_connector_extra_config",
    "kv_connector_module_path",
}
#: the toy proxy's parser (tests/v1/kv_connector/nixl_integration/toy_proxy_server.py)
PROXY_FLAGS = {
    "--port",
    "--host",
    "--prefiller-hosts",
    "--prefiller-ports",
    "--decoder-hosts",
    "--decoder-ports",
}


def spec(
    nnodes: int = 5, nproc: int = 8, options: dict[str, Any] | None = None, **distributed: Any
) -> dict[str, Any]:
    return {
        "job": {"name": "vd-unit", "command": ["vllm", "serve"]},
        "distributed": {
            "launcher": "vllm_disagg",
            "backend": "local",
            "nnodes": nnodes,
            "nproc_per_node": nproc,
            "accelerator": "cpu",
            **distributed,
        },
        "vllm_disagg": {"model": "org/model", "router_command": ["toy-proxy"], **(options or {})},
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


def argv_of(compiled: Compiled, role: str) -> list[str]:
    return [str(w) for w in compiled.launch.role(role).argv]


def value(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


@pytest.mark.parametrize("nnodes", [1, 2, 3, 5, 7, 11])
def test_the_split_is_sglang_disaggs_rule(tmp_path: Path, nnodes: int) -> None:
    """The same sizes give the same split as sglang_disagg: the core's one rule."""
    ours = compile_(tmp_path, spec(nnodes, 8, {"tensor_parallel_size": 2 if nnodes < 3 else 8}))
    sglang = {
        "job": {"name": "sgd", "command": "python3"},
        "distributed": {**spec(nnodes)["distributed"], "launcher": "sglang_disagg"},
        "sglang_disagg": {"model_path": "m", "tp_size": 2 if nnodes < 3 else 8},
    }
    theirs = compile_(tmp_path, sglang)
    assert ours.plan.disagg == theirs.plan.disagg


def test_server_commands(tmp_path: Path) -> None:
    compiled = compile_(tmp_path, spec(5, 8, {"kv_connector_extra_config": {"backends": ["UCX"]}}))
    for role in ("prefill", "decode"):
        argv = argv_of(compiled, role)
        at = argv.index("vllm")
        assert argv[at : at + 3] == ["vllm", "serve", "org/model"]
        assert value(argv, "--tensor-parallel-size") == "8"
        assert value(argv, "--host") == "0.0.0.0"
        config = json.loads(value(argv, "--kv-transfer-config"))
        assert set(config) <= KV_FIELDS
        assert config["kv_connector"] == "NixlConnector" and config["kv_role"] in KV_ROLES
        assert config["kv_connector_extra_config"] == {"backends": ["UCX"]}
    # the proxy runs beside node 0's prefill server: its words are in the helper
    script = next(f.data.decode() for f in compiled.tree if f.path == "launch/vllm_disagg.sh")
    (line,) = [x for x in script.splitlines() if x.startswith("PROXY=(")]
    proxy = shlex.split(line[len("PROXY=(") : -1])
    assert proxy[0] == "toy-proxy"
    assert {w for w in proxy if w.startswith("--")} <= PROXY_FLAGS
    assert {"--prefiller-hosts", "--decoder-ports"} <= set(script.split()) & PROXY_FLAGS


def test_size_flags_in_args_are_read_as_keys(tmp_path: Path) -> None:
    """A size flag in [vllm_disagg] args is the shared key, in a role's args that role's
    key: each written once, where mdc writes it."""
    options = {
        "args": ["--max-model-len", "8192", "-tp", "2"],
        "decode": {"data_parallel_size": 2, "args": ["--tensor-parallel-size=1", "-ep"]},
    }
    compiled = compile_(tmp_path, spec(1, 8, options))
    servers = {s.role: s for s in compiled.launch.servers}
    assert (servers["prefill"].tp, servers["prefill"].dp) == (2, 1)
    assert (servers["decode"].tp, servers["decode"].dp, servers["decode"].ep) == (1, 2, 2)
    script = next(f.data.decode() for f in compiled.tree if f.path == "launch/vllm_disagg.sh")
    for line in script.splitlines():
        if "VLLM_DISAGG_ROLE=decode" in line:
            assert line.count("--tensor-parallel-size") == 1 and "-tp " not in line
            assert (
                "--tensor-parallel-size 1 --data-parallel-size 2 --enable-expert-parallel" in line
            )
            assert "--max-model-len 8192" in line


def test_a_size_flag_that_disagrees_with_its_key_is_refused(tmp_path: Path) -> None:
    """vLLM would keep the last of the two; mdc says so instead of choosing."""
    options = {"tensor_parallel_size": 4, "args": ["-tp", "2"]}
    (error,) = errors(tmp_path, spec(3, 8, options))
    assert error.code == "MDC728" and error.location.pointer == "/vllm_disagg/args/0"
    assert "tensor_parallel_size = 4" in error.message
    agreeing = compile_(tmp_path, spec(3, 8, {"tensor_parallel_size": 4, "args": ["-tp", "4"]}))
    (server,) = [s for s in agreeing.launch.servers if s.role == "prefill"]
    assert server.tp == 4


def test_missing_table(tmp_path: Path) -> None:
    data = spec()
    del data["vllm_disagg"]
    assert [d.code for d in errors(tmp_path, data)] == ["MDC720"]


def test_flags_mdc_sets_are_refused(tmp_path: Path) -> None:
    found = errors(
        tmp_path, spec(3, 8, {"decode": {"args": ["--port", "9000", "--kv-transfer-config", "{}"]}})
    )
    assert [(d.code, d.location.pointer) for d in found] == [
        ("MDC728", "/vllm_disagg/decode/args/0"),
        ("MDC728", "/vllm_disagg/decode/args/2"),
    ]
    (bad,) = errors(tmp_path, spec(3, 8, {"args": ["--data-parallel-size", "two"]}))
    assert bad.code == "MDC729" and bad.location.pointer == "/vllm_disagg/args/0"


def test_an_engine_wider_than_a_node(tmp_path: Path) -> None:
    found = errors(tmp_path, spec(3, 8, {"tensor_parallel_size": 16}))
    assert [d.code for d in found] == ["MDC721", "MDC721"]  # a prefill and a decode server
    assert "16" in found[0].message and "8 GPUs" in found[0].message


def test_roles_hold_whole_servers(tmp_path: Path) -> None:
    """tp 8 x dp 2 on 8-GPU nodes: a server spans 2 nodes, so 3 prefill nodes are refused."""
    options = {"data_parallel_size": 2}
    (error,) = errors(tmp_path, spec(5, 8, options, prefill_nodes=3, decode_nodes=2))
    assert error.code == "MDC722" and error.location.pointer == "/distributed/prefill_nodes"
    compiled = compile_(tmp_path, spec(4, 8, options, prefill_nodes=2, decode_nodes=2))
    assert [(s.role, s.nodes, s.gpus) for s in compiled.launch.servers] == [
        ("router", (0,), 0),
        ("prefill", (0, 1), 16),
        ("decode", (2, 3), 16),
    ]


def test_the_proxy_takes_no_gpu_and_no_node(tmp_path: Path) -> None:
    """The proxy runs on node 0 beside a prefill server: every GPU the job asks for serves."""
    compiled = compile_(tmp_path, spec(7, 8))
    (router,) = [s for s in compiled.launch.servers if s.role == "router"]
    assert router.gpus == 0 and router.nodes == (0,)
    served = sum(s.gpus for s in compiled.launch.servers)
    assert served == 7 * 8
    assert any(s.gpus and 0 in s.nodes for s in compiled.launch.servers)


def test_ports(tmp_path: Path) -> None:
    (high,) = errors(tmp_path, spec(3, 8, {"side_channel_port": 65530}))
    assert high.code == "MDC726" and high.location.pointer == "/vllm_disagg/side_channel_port"
    (clash,) = errors(tmp_path, spec(3, 8, {"router_port": 8101}))
    assert clash.code == "MDC727" and "8101" in clash.message
    (side,) = errors(tmp_path, spec(1, 8, {"side_channel_port": 8095}))
    assert side.code == "MDC727"


def test_memory_setup_is_the_tighter_role(tmp_path: Path) -> None:
    from mdc_builtin.launchers import vllm_disagg

    options = {
        "args": ["--gpu-memory-utilization", "0.8"],
        "prefill": {"tensor_parallel_size": 4},
        "decode": {"tensor_parallel_size": 2, "args": ["--max-model-len", "4096"]},
    }
    compiled = compile_(tmp_path, spec(1, 8, options))
    read = compiled.plan.options["vllm_disagg"]
    assert isinstance(read, vllm_disagg.VllmDisaggOptions)
    setup = vllm_disagg.serving(compiled.plan, read)
    assert setup is not None
    assert (setup.engine, setup.tp, setup.share, setup.max_len) == ("vLLM (decode)", 2, 0.8, 4096)


def test_a_command_that_is_not_vllm_warns(tmp_path: Path) -> None:
    data = spec(3, 8)
    data["job"]["command"] = ["python3"]
    compiled = compile_(tmp_path, data)
    assert "MDC725" in [d.code for d in compiled.diagnostics]


@pytest.mark.parametrize(("nnodes", "nproc"), [(1, 4), (2, 4), (5, 4)])
def test_scripts_pass_bash_n_and_shellcheck(tmp_path: Path, nnodes: int, nproc: int) -> None:
    root = write_tree(compile_(tmp_path, spec(nnodes, nproc)), tmp_path / "out")
    scripts = sorted(str(p) for p in root.rglob("*.sh"))
    for script in scripts:
        subprocess.run(["bash", "-n", script], check=True)
    subprocess.run([shellcheck(), *scripts], check=True)


STAND_IN = """#!/usr/bin/env bash
{{
  printf 'ENV CUDA_VISIBLE_DEVICES=%s\\n' "${{CUDA_VISIBLE_DEVICES:-}}"
  printf 'ENV VLLM_NIXL_SIDE_CHANNEL_PORT=%s\\n' "${{VLLM_NIXL_SIDE_CHANNEL_PORT:-}}"
  printf 'ENV VLLM_NIXL_SIDE_CHANNEL_HOST=%s\\n' "${{VLLM_NIXL_SIDE_CHANNEL_HOST:-}}"
  printf '%s\\n' "$@"
}} > "$RECORD_DIR/$VLLM_DISAGG_ROLE-${{NODE_RANK:-0}}-{name}-$$"
"""


def stand_ins(tmp_path: Path) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("vllm", "toy-proxy"):
        program = bin_dir / name
        program.write_text(STAND_IN.format(name=name), encoding="utf-8")
        program.chmod(program.stat().st_mode | stat.S_IXUSR)
    record = tmp_path / "record"
    record.mkdir()
    return {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "RECORD_DIR": str(record),
        # these stand-ins serve no /health: the proxy starts without waiting for them
        "MDC_READY_SECONDS": "0",
    }


def recorded(env: dict[str, str]) -> list[list[str]]:
    return [
        p.read_text(encoding="utf-8").splitlines()
        for p in sorted(Path(env["RECORD_DIR"]).iterdir())
    ]


def words_after(lines: list[str], flag: str) -> list[str]:
    """The values after a flag of nargs "+", up to the next flag."""
    start = lines.index(flag) + 1
    end = start
    while end < len(lines) and not lines[end].startswith("--"):
        end += 1
    return lines[start:end]


@pytest.mark.slow
def test_one_node_runs_every_server_and_the_proxy(tmp_path: Path) -> None:
    compiled = compile_(tmp_path, spec(1, 4, {"decode": {"tensor_parallel_size": 2}}))
    root = write_tree(compiled, tmp_path / "out")
    env = stand_ins(tmp_path)
    subprocess.run(["bash", str(root / "local" / "run.sh")], env=env, check=True, timeout=60)
    runs = recorded(env)
    servers = sorted((r for r in runs if "serve" in r), key=lambda r: value(r, "--port"))
    # the automatic split of 4 GPUs with 2-GPU decode servers: 2 prefill, 1 decode
    assert [(r[0], r[1], value(r, "--port")) for r in servers] == [
        ("ENV CUDA_VISIBLE_DEVICES=0", "ENV VLLM_NIXL_SIDE_CHANNEL_PORT=5600", "8100"),
        ("ENV CUDA_VISIBLE_DEVICES=1", "ENV VLLM_NIXL_SIDE_CHANNEL_PORT=5601", "8101"),
        ("ENV CUDA_VISIBLE_DEVICES=2,3", "ENV VLLM_NIXL_SIDE_CHANNEL_PORT=5602", "8102"),
    ]
    (proxy,) = [r for r in runs if "serve" not in r]
    assert words_after(proxy, "--prefiller-hosts") == ["127.0.0.1", "127.0.0.1"]
    assert words_after(proxy, "--prefiller-ports") == ["8100", "8101"]
    assert words_after(proxy, "--decoder-hosts") == ["127.0.0.1"]
    assert words_after(proxy, "--decoder-ports") == ["8102"]


def run_role(root: Path, env: dict[str, str], role: str, rank: int, hosts: list[str]) -> None:
    run_env = {
        **env,
        "NODE_RANK": str(rank),
        "MASTER_ADDR": hosts[0],
        "MASTER_PORT": "29500",
        "NODE_HOSTS": " ".join(hosts),
        "MDC_RESOLVE_SECONDS": "0",
    }
    script = root / "launch" / f"{role}.sh"
    subprocess.run(["bash", str(script)], env=run_env, check=True, timeout=30, cwd=root)


@pytest.mark.slow
def test_nodes_get_their_place_from_node_hosts(tmp_path: Path) -> None:
    """4 nodes of 4 GPUs, prefill tp 4 (a node each), decode tp 2 x dp 4 (two nodes); the
    proxy on node 0 beside the first prefill server."""
    options = {"prefill": {"tensor_parallel_size": 4}, "decode": {"tensor_parallel_size": 2}}
    options["decode"]["data_parallel_size"] = 4
    compiled = compile_(tmp_path, spec(4, 4, options, prefill_nodes=2, decode_nodes=2))
    root = write_tree(compiled, tmp_path / "out")
    env = stand_ins(tmp_path)
    hosts = ["10.0.0.1", "fd00::2", "10.0.0.3", "10.0.0.4"]
    run_role(root, env, "prefill", 0, hosts)
    (proxy,) = [r for r in recorded(env) if "serve" not in r]
    assert proxy[0] == "ENV CUDA_VISIBLE_DEVICES="  # no GPU of its own
    assert words_after(proxy, "--prefiller-hosts") == ["10.0.0.1", "[fd00::2]"]
    assert words_after(proxy, "--prefiller-ports") == ["8100", "8101"]
    assert words_after(proxy, "--decoder-hosts") == ["10.0.0.3"]
    assert words_after(proxy, "--decoder-ports") == ["8102"]
    run_role(root, env, "prefill", 1, hosts)
    run_role(root, env, "decode", 2, hosts)
    run_role(root, env, "decode", 3, hosts)
    served = [r for r in recorded(env) if "serve" in r]
    runs = {value(r, "--port"): r for r in served if "--headless" not in r}
    assert sorted(runs) == ["8100", "8101", "8102"]
    prefill = runs["8101"]
    assert "ENV VLLM_NIXL_SIDE_CHANNEL_HOST=fd00::2" in prefill
    assert "ENV VLLM_NIXL_SIDE_CHANNEL_PORT=5604" in prefill  # 5600 + node 1 x 4 GPUs
    assert "--data-parallel-address" not in prefill
    head, tail = runs["8102"], [r for r in served if "--headless" in r]
    assert value(head, "--data-parallel-size") == "4"
    assert value(head, "--data-parallel-size-local") == "2"
    assert value(head, "--data-parallel-address") == "10.0.0.3"
    assert value(head, "--data-parallel-rpc-port") == "29502"
    assert "--headless" not in head
    (later,) = tail
    assert value(later, "--data-parallel-start-rank") == "2"
    assert value(later, "--data-parallel-address") == "10.0.0.3"
    # both nodes of the decode server count NIXL ports from its first GPU: 5600 + 2 x 4
    assert "ENV VLLM_NIXL_SIDE_CHANNEL_PORT=5608" in head
    assert "ENV VLLM_NIXL_SIDE_CHANNEL_PORT=5608" in later


def test_memory_setup_is_the_smaller_engine(tmp_path: Path) -> None:
    """Prefill tp 4 on 4 GPUs, decode tp 2 x dp 4 on 8: a decode GPU holds half the
    weights, a prefill GPU a quarter, so the decode engine is the one checked."""
    from mdc_builtin.launchers import vllm_disagg

    options = {
        "prefill": {"tensor_parallel_size": 4},
        "decode": {"tensor_parallel_size": 2, "data_parallel_size": 4},
    }
    compiled = compile_(tmp_path, spec(3, 8, options))
    read = compiled.plan.options["vllm_disagg"]
    assert isinstance(read, vllm_disagg.VllmDisaggOptions)
    setup = vllm_disagg.serving(compiled.plan, read)
    assert setup is not None and (setup.engine, setup.tp) == ("vLLM (decode)", 2)


def test_the_serving_memory_estimate_is_made(tmp_path: Path) -> None:
    """Llama-3.3-70B, decode engines of tp 4: 70.6e9 bf16 parameters / 4 on each GPU."""
    data = spec(3, 8, {"decode": {"tensor_parallel_size": 4, "data_parallel_size": 2}})
    data["distributed"].update(accelerator="nvidia", accelerator_model="h100-sxm")
    data["model"] = {"name": "meta-llama/Llama-3.3-70B-Instruct", "seq_length": 32768}
    memory = compile_(tmp_path, data).plan.serving_memory
    assert memory is not None and memory.engine == "vLLM (decode)"
    assert 35.0e9 < memory.weights < 35.5e9


def test_vllms_own_refusal_of_a_tp_that_splits_heads(tmp_path: Path) -> None:
    """vLLM: "Total number of attention heads (40) must be divisible by tensor parallel
    size (16)" (ModelConfig.verify_with_parallel_config) -- here before the job runs."""
    data = spec(3, 16, {"tensor_parallel_size": 8, "decode": {"tensor_parallel_size": 16}})
    data["model"] = {"num_attention_heads": 40}
    (error,) = errors(tmp_path, data)
    assert (
        error.code == "MDC730"
        and error.location.pointer == "/vllm_disagg/decode/tensor_parallel_size"
    )
    assert "40 attention heads" in error.message and "[1, 2, 4, 5, 8, 10]" in (error.hint or "")


@pytest.mark.parametrize(
    ("nnodes", "split", "expected"),
    [
        # one node of 8: 3 prefill servers from 9100, 5 decode servers from 9200
        (
            1,
            {"prefill_gpus": 3, "decode_gpus": 5},
            [9100, 9101, 9102, 9200, 9201, 9202, 9203, 9204],
        ),
        # 4 nodes: prefill nodes 0-1 from 9100, decode nodes 2-3 from 9200
        (4, {"prefill_nodes": 2, "decode_nodes": 2}, [9100, 9101, 9200, 9201]),
    ],
)
def test_a_role_port_is_its_first_servers(
    tmp_path: Path, nnodes: int, split: dict[str, int], expected: list[int]
) -> None:
    options = {"tensor_parallel_size": 1, "prefill": {"port": 9100}, "decode": {"port": 9200}}
    compiled = compile_(tmp_path, spec(nnodes, 8, options, **split))
    assert [s.port for s in compiled.launch.servers if s.role != "router"] == expected


@pytest.mark.slow
def test_role_ports_reach_the_nodes_and_the_proxy(tmp_path: Path) -> None:
    options = {"prefill": {"port": 9100}, "decode": {"port": 9200}}
    compiled = compile_(tmp_path, spec(4, 4, options, prefill_nodes=2, decode_nodes=2))
    root = write_tree(compiled, tmp_path / "out")
    env = stand_ins(tmp_path)
    hosts = [f"10.0.0.{i}" for i in range(1, 5)]
    for role, node in (("prefill", 0), ("prefill", 1), ("decode", 2)):
        run_role(root, env, role, node, hosts)
    runs = recorded(env)
    (proxy,) = [r for r in runs if "serve" not in r]
    assert words_after(proxy, "--prefiller-ports") == ["9100", "9101"]
    assert words_after(proxy, "--decoder-ports") == ["9200", "9201"]
    assert sorted(value(r, "--port") for r in runs if "serve" in r) == ["9100", "9101", "9200"]


def test_role_env_and_head_args_on_one_node(tmp_path: Path) -> None:
    options = {
        "prefill": {"env": {"VLLM_ALL2ALL_BACKEND": "deepep_high_throughput"}},
        "decode": {"head_args": ["--api-server-count", "2"]},
    }
    compiled = compile_(tmp_path, spec(1, 2, options))
    script = next(f.data.decode() for f in compiled.tree if f.path == "launch/vllm_disagg.sh")
    (prefill,) = [line for line in script.splitlines() if "VLLM_DISAGG_ROLE=prefill" in line]
    (decode,) = [line for line in script.splitlines() if "VLLM_DISAGG_ROLE=decode" in line]
    assert "VLLM_ALL2ALL_BACKEND=deepep_high_throughput" in prefill
    assert "VLLM_ALL2ALL_BACKEND" not in decode
    assert decode.endswith("--port 8101 --api-server-count 2 &")
    assert "--api-server-count" not in prefill


def test_role_env_reaches_the_roles_nodes(tmp_path: Path) -> None:
    options = {"decode": {"env": {"VLLM_ALL2ALL_BACKEND": "deepep_low_latency"}}}
    compiled = compile_(tmp_path, spec(3, 8, options))
    assert compiled.launch.role("decode").env["VLLM_ALL2ALL_BACKEND"] == "deepep_low_latency"
    assert "VLLM_ALL2ALL_BACKEND" not in compiled.launch.role("prefill").env


def test_api_server_count_on_a_server_over_nodes_belongs_in_head_args(tmp_path: Path) -> None:
    """vLLM refuses --api-server-count with --headless (ServeSubcommand.cmd)."""
    options = {"decode": {"data_parallel_size": 2, "args": ["--api-server-count=2"]}}
    (error,) = errors(tmp_path, spec(4, 8, options, prefill_nodes=2, decode_nodes=2))
    assert error.code == "MDC731" and error.location.pointer == "/vllm_disagg/decode/args/0"
    assert "head_args" in (error.hint or "")


@pytest.mark.slow
def test_head_args_reach_only_a_servers_first_node(tmp_path: Path) -> None:
    options = {"decode": {"data_parallel_size": 2, "head_args": ["--api-server-count=2"]}}
    compiled = compile_(tmp_path, spec(4, 8, options, prefill_nodes=2, decode_nodes=2))
    root = write_tree(compiled, tmp_path / "out")
    env = stand_ins(tmp_path)
    hosts = [f"10.0.0.{i}" for i in range(1, 5)]
    run_role(root, env, "decode", 2, hosts)
    run_role(root, env, "decode", 3, hosts)
    head, later = sorted(recorded(env), key=lambda r: "--headless" in r)
    assert "--api-server-count=2" in head and "--headless" not in head
    assert "--api-server-count=2" not in later and "--headless" in later


def test_args_are_read_with_vllms_spellings(tmp_path: Path) -> None:
    """vLLM's FlexibleArgumentParser reads --a_b as --a-b, and argparse takes an unambiguous
    prefix of a long option: both are the role's size keys."""
    options = {
        "prefill": {"args": ["--tensor_parallel_size", "2"]},
        "decode": {"data_parallel_size": 2, "args": ["--enable-expert", "-tp=1"]},
    }
    compiled = compile_(tmp_path, spec(1, 8, options))
    servers = {s.role: s for s in compiled.launch.servers}
    assert (servers["prefill"].tp, servers["decode"].tp, servers["decode"].ep) == (2, 1, 2)
    script = next(f.data.decode() for f in compiled.tree if f.path == "launch/vllm_disagg.sh")
    assert "--tensor_parallel_size" not in script and "--enable-expert " not in script


def test_a_role_env_name_is_a_shell_variable_name(tmp_path: Path) -> None:
    (error,) = errors(tmp_path, spec(1, 2, {"decode": {"env": {"A B": "x"}}}))
    assert error.location.pointer.startswith("/vllm_disagg/decode/env")


def test_the_decode_engines_eager_switch_reaches_the_estimate(tmp_path: Path) -> None:
    """--enforce-eager in the decode role's args turns its CUDA graphs off for the serving
    model (the decode steps are the ones a token waits for); in the prefill role's it does
    not, though the prefill engine is the tighter one here."""
    from mdc_builtin.launchers import vllm_disagg

    def setup(role: str) -> Any:
        options: dict[str, dict[str, Any]] = {
            "prefill": {"tensor_parallel_size": 2},
            "decode": {"tensor_parallel_size": 4},
        }
        options[role]["args"] = ["--enforce-eager"]
        compiled = compile_(tmp_path, spec(3, 8, options))
        read = compiled.plan.options["vllm_disagg"]
        assert isinstance(read, vllm_disagg.VllmDisaggOptions)
        return vllm_disagg.serving(compiled.plan, read)

    decode, prefill = setup("decode"), setup("prefill")
    assert decode.engine == prefill.engine == "vLLM (prefill)"
    assert decode.cuda_graphs is False
    assert prefill.cuda_graphs is True
