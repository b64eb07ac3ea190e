"""The serving layouts of vLLM's and SGLang's own deployment documentation, flag for flag.

Each test compiles a spec of a documented layout, runs the generated node scripts with
bash (the server program replaced by ``printf``, so the words are those the program
would get), parses every node's command with the strict parsers rebuilt from the
projects' CLIs (test_serving_flags.py) and compares it with the documented command of
that node, parsed the same way. A documented flag mdc leaves out, or sets to another
value, fails; mdc may add only flags whose value is the CLI's own default or a value the
documentation leaves to the user (host, port).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tomllib
from pathlib import Path
from typing import Any

from tests.conformance.test_serving_flags import (
    SGLANG_FLAGS,
    SGLANG_PROGRAMS,
    VLLM_FLAGS,
    VLLM_PROGRAMS,
    parse,
)
from tests.tools import REPO

from mdc.emit import write_tree
from mdc.pipeline import Compiled, Compiler
from mdc.plugin_manager import load_plugins

COMPILER = Compiler(load_plugins(autoload=False))


def compile_file(path: Path) -> Compiled:
    return COMPILER.compile(path)


def compile_data(tmp_path: Path, data: dict[str, Any]) -> Compiled:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return COMPILER.compile(path)


#: flags mdc writes that a documented command may leave at the CLI's default (ParallelConfig:
#: tensor_parallel_size = pipeline_parallel_size = 1; FrontendArgs: port 8000, host every
#: interface)
VLLM_DEFAULTS = {
    "tensor_parallel_size": 1,
    "pipeline_parallel_size": 1,
    "host": "0.0.0.0",
    "port": 8000,
}


def run_node(
    out: Path,
    compiled: Compiled,
    node: int,
    hosts: list[str],
    port: int,
    extra: dict[str, str] | None = None,
) -> list[str]:
    """The argv node ``node``'s server program receives, through the generated scripts."""
    (role,) = [r for r in compiled.plan.roles if node in r.nodes]
    env = {
        **os.environ,
        "NODE_RANK": str(node),
        "MASTER_ADDR": hosts[0],
        "MASTER_PORT": str(port),
        "NODE_HOSTS": " ".join(hosts),
        "MDC_RESOLVE_SECONDS": "0",
        **(extra or {}),
    }
    script = (out / "launch" / f"{role.name}.sh").read_text(encoding="utf-8")
    # the last line execs the server; print its words instead, one per NUL
    body, last = script.rstrip("\n").rsplit("\n", 1)
    assert last.startswith("exec "), last
    printer = body + "\n" + last.replace("exec ", "exec printf '%s\\0' ", 1) + "\n"
    wrapped = out / "launch" / f"print-{role.name}.sh"
    wrapped.write_text(printer, encoding="utf-8")
    # the node script execs "$@": put printf in front of the server's words there too
    done = subprocess.run(["bash", str(wrapped)], env=env, capture_output=True, check=True, cwd=out)
    words = done.stdout.decode().split("\0")[:-1]
    helpers = {
        str(out / "launch" / "vllm-node.sh"): 2,  # vllm-node.sh CMD...
        str(out / "launch" / "sglang_disagg.sh"): 3,  # sglang_disagg.sh ROLE CMD...
    }
    if words[0] == "bash" and words[1] in helpers:
        cut = helpers[words[1]]
        done = subprocess.run(
            ["bash", *words[1:cut], "printf", "%s\\0", *words[cut:]],
            env=env,
            capture_output=True,
            check=True,
        )
        words = done.stdout.decode().split("\0")[:-1]
    return words


def namespace(argv: list[str]) -> dict[str, Any]:
    parsed: argparse.Namespace = parse(VLLM_FLAGS, VLLM_PROGRAMS, argv)
    values = vars(parsed)
    model = values.pop("model_tag", None)
    values["model"] = model or values.get("model")
    return values


def same_command(ours: list[str], documented: str) -> None:
    mine, theirs = namespace(ours), namespace(documented.split())
    for key, value in theirs.items():
        if value is not None:
            assert mine[key] == value, f"{key}: mdc gives {mine[key]!r}, the docs {value!r}"
    for key, value in mine.items():
        if theirs[key] is None and value is not None:
            assert VLLM_DEFAULTS.get(key) == value, f"mdc adds {key} = {value!r}"


#: vLLM docs/serving/expert_parallel_deployment.md, "Example: 2-Node Deployment"
#: (vllm-project/vllm at 017025691b3006ed548f763fd394a846affa6064), with node 1's IP
#: 192.168.1.100 and RPC port 13345; comments and line continuations removed.
VLLM_EP_NODE_0 = (
    "vllm serve deepseek-ai/DeepSeek-V3-0324 --tensor-parallel-size 1 --enable-expert-parallel "
    "--data-parallel-size 16 --data-parallel-size-local 8 --data-parallel-address "
    "192.168.1.100 --data-parallel-rpc-port 13345 --api-server-count=8"
)
VLLM_EP_NODE_1 = (
    "vllm serve deepseek-ai/DeepSeek-V3-0324 --tensor-parallel-size 1 --enable-expert-parallel "
    "--data-parallel-size 16 --data-parallel-size-local 8 --data-parallel-start-rank 8 "
    "--data-parallel-address 192.168.1.100 --data-parallel-rpc-port 13345 --headless"
)


def test_vllm_dp_ep_on_two_nodes_is_the_documented_deepseek_command(tmp_path: Path) -> None:
    compiled = compile_file(REPO / "examples" / "vllm-dp-ep-2x8.toml")
    write_tree(tmp_path, compiled.tree)
    hosts = ["192.168.1.100", "192.168.1.101"]
    nodes = [run_node(tmp_path, compiled, n, hosts, 13345) for n in (0, 1)]
    same_command(nodes[0], VLLM_EP_NODE_0)
    same_command(nodes[1], VLLM_EP_NODE_1)


#: vLLM docs/serving/data_parallel_deployment.md, "Internal Load Balancing" (same commit):
#: DP=4 with ranks 0 and 1 on the head node (10.99.48.128), 2 and 3 on the second.
VLLM_DP_NODE_0 = (
    "vllm serve m --data-parallel-size 4 --data-parallel-size-local 2 "
    "--data-parallel-address 10.99.48.128 --data-parallel-rpc-port 13345"
)
VLLM_DP_NODE_1 = (
    "vllm serve m --headless --data-parallel-size 4 --data-parallel-size-local 2 "
    "--data-parallel-start-rank 2 --data-parallel-address 10.99.48.128 "
    "--data-parallel-rpc-port 13345"
)


def test_vllm_internal_load_balancing_over_two_nodes(tmp_path: Path) -> None:
    data = {
        "job": {"name": "vllm-dp", "command": ["vllm", "serve"]},
        "distributed": {
            "launcher": "vllm",
            "backend": "local",
            "nnodes": 2,
            "nproc_per_node": 2,
            "master_port": 13345,
        },
        "parallelism": {"tp": 1, "pp": 1},
        "vllm": {"model": "m"},
    }
    compiled = compile_data(tmp_path, data)
    out = tmp_path / "out"
    write_tree(out, compiled.tree)
    hosts = ["10.99.48.128", "10.99.48.129"]
    same_command(run_node(out, compiled, 0, hosts, 13345), VLLM_DP_NODE_0)
    same_command(run_node(out, compiled, 1, hosts, 13345), VLLM_DP_NODE_1)


def test_vllm_single_node_dp_ep_is_the_documented_command(tmp_path: Path) -> None:
    """docs/serving/expert_parallel_deployment.md, "Single Node Deployment"."""
    data = {
        "job": {"name": "vllm-ep", "command": ["vllm", "serve"]},
        "distributed": {"launcher": "vllm", "backend": "local", "nproc_per_node": 8},
        "parallelism": {"tp": 1, "ep": 8},
        "vllm": {"model": "deepseek-ai/DeepSeek-V3-0324"},
    }
    compiled = compile_data(tmp_path, data)
    out = tmp_path / "out"
    write_tree(out, compiled.tree)
    same_command(
        run_node(out, compiled, 0, ["127.0.0.1"], 29500),
        "vllm serve deepseek-ai/DeepSeek-V3-0324 --tensor-parallel-size 1 "
        "--data-parallel-size 8 --enable-expert-parallel",
    )


#: vLLM docs/serving/data_parallel_deployment.md, "Internal Load Balancing" (vllm-project/vllm
#: at 01e4fce07423dafcc832600ba05159fb28dc1126): data parallel over Ray, one command on one
#: node; "when a single DP group requires multiple nodes ... set VLLM_RAY_DP_PACK_STRATEGY=
#: "span" in which case --data-parallel-size-local is ignored", so it is left out here.
VLLM_RAY_DP = "vllm serve m --data-parallel-size 4 --data-parallel-backend=ray"


def test_vllm_data_parallel_ranks_over_nodes_is_the_documented_ray_command(
    tmp_path: Path,
) -> None:
    """8 nodes x 8 GPUs, tp 16: four ranks of two nodes each, as the documented command."""
    data = {
        "job": {"name": "vllm-ray-dp", "command": ["vllm", "serve"]},
        "distributed": {"launcher": "vllm", "backend": "local", "nnodes": 8, "nproc_per_node": 8},
        "parallelism": {"tp": 16, "pp": 1},
        "vllm": {"model": "m"},
    }
    compiled = compile_data(tmp_path, data)
    (role,) = compiled.launch.roles
    assert role.argv[0] == "bash"  # launch/vllm-node.sh: the Ray cluster, then node 0 serves
    serve = [str(w) for w in role.argv[2:]]
    # the documented command with the rank's size that makes it span two nodes
    same_command(serve, VLLM_RAY_DP + " --tensor-parallel-size 16")
    assert role.env["VLLM_RAY_DP_PACK_STRATEGY"] == "span"


SGLANG_DOC_DEFAULTS = {"host": "0.0.0.0", "disaggregation_transfer_backend": "mooncake"}


def sglang_namespace(argv: list[str]) -> dict[str, Any]:
    return vars(parse(SGLANG_FLAGS, SGLANG_PROGRAMS, argv))


#: SGLang docs/advanced_features/pd_disaggregation.md, Mooncake, "DeepSeek Multi-Node"
#: (sgl-project/sglang at 08edc506b2da77e7fa8a6a3a1ec7a704241703d4): the flags every
#: prefill/decode node of the documented command has; the documented host (${local_ip}),
#: ports (30000/30001, 5000) and IB device are the user's to choose, so they are compared
#: by rule below instead of by value.
SGLANG_PD_DEEPSEEK = (
    "python -m sglang.launch_server --model-path deepseek-ai/DeepSeek-V3-0324 "
    "--disaggregation-ib-device mlx5_0 --disaggregation-mode {role} --trust-remote-code "
    "--nnodes 2 --node-rank {rank} --tp-size 16 --dp-size 8 --enable-dp-attention "
    "--moe-a2a-backend deepep --mem-fraction-static 0.8"
)


def test_sglang_pd_with_two_node_servers_is_the_documented_deepseek_command(
    tmp_path: Path,
) -> None:
    data = tomllib.loads(
        (REPO / "examples" / "sglang-disagg-deepseek-4x8.toml").read_text(encoding="utf-8")
    )
    data["sglang_disagg"]["server_args"] += ["--disaggregation-ib-device", "mlx5_0"]
    data["distributed"]["backend"] = "local"
    del data["slurm"]
    import sys

    compiled = compile_data(tmp_path, data)
    out = tmp_path / "out"
    write_tree(out, compiled.tree)
    # node 0 also runs the router (python3 -m sglang_router...): a python3 that records it;
    # the stand-ins serve no /health, so the router does not wait for them
    bin_dir, record = tmp_path / "bin", tmp_path / "router.jsonl"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text(
        ROUTER_RECORDER.format(python=sys.executable), encoding="utf-8"
    )
    (bin_dir / "python3").chmod(0o755)
    extra = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "RECORD": str(record),
        "MDC_READY_SECONDS": "0",
    }
    hosts = [f"10.0.0.{i}" for i in range(1, 5)]
    port = compiled.plan.rendezvous.master_port
    nodes = {n: run_node(out, compiled, n, hosts, port, extra) for n in range(4)}
    for node, role, rank, first in (
        (0, "prefill", 0, 0),
        (1, "prefill", 1, 0),
        (2, "decode", 0, 2),
        (3, "decode", 1, 2),
    ):
        mine = sglang_namespace(nodes[node])
        theirs = sglang_namespace(
            ["python", *SGLANG_PD_DEEPSEEK.format(role=role, rank=rank).split()[1:]]
        )
        if role == "decode":
            theirs["max_running_requests"] = 128
        for key, value in theirs.items():
            if value is not None and key not in ("port",):
                assert mine[key] == value, f"node {node} {key}: {mine[key]!r}, docs {value!r}"
        # the server's nodes meet at its first node, serve (and bootstrap) from it
        assert mine["dist_init_addr"] == f"{hosts[first]}:{port + first}"
        assert mine["port"] == 30000 + first
        if role == "prefill":
            assert mine["disaggregation_bootstrap_port"] == 8998 + first
        extra = {k: v for k, v in mine.items() if theirs[k] is None and v is not None}
        (
            extra.pop("dist_init_addr"),
            extra.pop("port"),
            extra.pop("disaggregation_bootstrap_port", 0),
        )
        assert extra == {k: v for k, v in SGLANG_DOC_DEFAULTS.items() if k in extra}, (
            f"node {node}: mdc adds {extra}"
        )
    (router,) = [json.loads(line) for line in record.read_text(encoding="utf-8").splitlines()]
    assert router[:3] == ["python3", "-m", "sglang_router.launch_router"]
    assert router[router.index("--prefill") :] == [
        "--prefill",
        "http://10.0.0.1:30000",
        "8998",
        "--decode",
        "http://10.0.0.3:30002",
    ]


#: SGLang docs/advanced_features/pd_disaggregation.md, "Llama Single Node", under Mooncake
#: and NIXL (sgl-project/sglang at 08edc506b2da77e7fa8a6a3a1ec7a704241703d4): a prefill
#: server on GPU 0, a decode server on GPU 1 (--base-gpu-id 1) and the router, one machine.
SGLANG_PD_ONE_NODE = {
    "mooncake": (
        "python -m sglang.launch_server --model-path meta-llama/Llama-3.1-8B-Instruct "
        "--disaggregation-mode prefill --port 30000 --disaggregation-ib-device mlx5_roce0",
        "python -m sglang.launch_server --model-path meta-llama/Llama-3.1-8B-Instruct "
        "--disaggregation-mode decode --port 30001 --base-gpu-id 1 "
        "--disaggregation-ib-device mlx5_roce0",
    ),
    "nixl": (
        "python -m sglang.launch_server --model-path meta-llama/Llama-3.1-8B-Instruct "
        "--disaggregation-mode prefill --port 30000 --disaggregation-transfer-backend nixl",
        "python -m sglang.launch_server --model-path meta-llama/Llama-3.1-8B-Instruct "
        "--disaggregation-mode decode --port 30001 --base-gpu-id 1 "
        "--disaggregation-transfer-backend nixl",
    ),
}
SGLANG_PD_ONE_NODE_ROUTER = (
    "python -m sglang_router.launch_router --pd-disaggregation --prefill "
    "http://127.0.0.1:30000 --decode http://127.0.0.1:30001 --host 0.0.0.0 --port 8000"
)
#: ServerArgs defaults (server_args.py at the commit of SGLANG_FLAGS): tp_size 1,
#: base_gpu_id 0, disaggregation_bootstrap_port 8998, transfer backend mooncake; the
#: documented servers leave host at its default, which mdc opens to every interface
SGLANG_SERVER_DEFAULTS = {
    "tp_size": 1,
    "base_gpu_id": 0,
    "disaggregation_bootstrap_port": 8998,
    "disaggregation_transfer_backend": "mooncake",
    "host": "0.0.0.0",
}

ROUTER_RECORDER = """#!/usr/bin/env bash
exec {python} -c 'import json, os, sys
with open(os.environ["RECORD"], "a") as out:
    out.write(json.dumps(["python3", *sys.argv[1:]]) + "\\n")' "$@"
"""
RECORDER = """#!/usr/bin/env bash
exec {python} -c 'import json, os, sys
with open(os.environ["RECORD"], "a") as out:
    out.write(json.dumps(["python", *sys.argv[1:]]) + "\\n")' "$@"
"""


def test_sglang_pd_on_one_node_is_the_documented_llama_command(tmp_path: Path) -> None:
    import sys

    for backend, (prefill_doc, decode_doc) in SGLANG_PD_ONE_NODE.items():
        data: dict[str, Any] = {
            "job": {"name": "pd-one-node", "command": "python3"},
            "distributed": {"launcher": "sglang_disagg", "backend": "local", "nproc_per_node": 2},
            "sglang_disagg": {
                "model_path": "meta-llama/Llama-3.1-8B-Instruct",
                "transfer_backend": backend,
                "server_args": ["--disaggregation-ib-device", "mlx5_roce0"]
                if backend == "mooncake"
                else [],
            },
        }
        compiled = compile_data(tmp_path, data)
        out = tmp_path / backend
        write_tree(out, compiled.tree)
        recorder = out / "record"
        recorder.write_text(RECORDER.format(python=sys.executable), encoding="utf-8")
        recorder.chmod(0o755)
        record = out / "runs.jsonl"
        subprocess.run(
            ["bash", str(out / "launch" / "sglang_disagg.sh"), str(recorder)],
            # the recorders serve no /health: the router does not wait for them
            env={**os.environ, "RECORD": str(record), "MDC_READY_SECONDS": "0"},
            check=True,
            timeout=60,
        )
        runs = [json.loads(line) for line in record.read_text(encoding="utf-8").splitlines()]
        (router,) = [r for r in runs if r[2] == "sglang_router.launch_router"]
        # the router's words, with the prefill server's bootstrap port written out (8998,
        # the server's default, which the documented router leaves implicit)
        documented = SGLANG_PD_ONE_NODE_ROUTER.split()
        at = documented.index("--decode")
        assert sorted(router) == sorted([*documented[:at], "8998", *documented[at:]])
        assert router[router.index("--prefill") + 1 : router.index("--prefill") + 3] == [
            "http://127.0.0.1:30000",
            "8998",
        ]
        servers = {r[r.index("--disaggregation-mode") + 1]: r for r in runs if r is not router}
        for mode, doc in (("prefill", prefill_doc), ("decode", decode_doc)):
            mine, theirs = sglang_namespace(servers[mode]), sglang_namespace(doc.split())
            for key, value in theirs.items():
                if value is not None:
                    assert mine[key] == value, f"{backend} {mode} {key}: {mine[key]!r}, {value!r}"
            extra = {k: v for k, v in mine.items() if theirs[k] is None and v is not None}
            assert extra == {k: SGLANG_SERVER_DEFAULTS[k] for k in extra}, f"mdc adds {extra}"
