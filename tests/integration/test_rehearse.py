"""``mdc rehearse``: compiled jobs really play on this CPU, and the probe catches wiring bugs.

Each world (2x2, 2x4, 4x2) runs with the torchrun, megatron and deepspeed launchers on
the local, slurm, ssh, kubernetes, pytorchjob, trainjob and jobset backends; every rank's
probe checks its ranks, env and the launcher's arguments against plan.json and all-reduces
inside every group. The broken cases inject a backend mapping bug (two nodes swap
NODE_RANK) and tamper with the plan the probe reads, and must be reported rank by rank.
The serving launchers play against stand-ins (vLLM's Ray cluster also as kuberay's head
and worker pods).
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from tests.tools import free_base

import mdc.rehearse
import mdc.rehearse.serving
from mdc.cli import main
from mdc.pipeline import Compiler
from mdc.rehearse import RehearseError, rehearse
from mdc.rehearse.process import processes_with

pytestmark = [pytest.mark.slow, pytest.mark.torch, pytest.mark.xdist_group("loopback")]

#: (launcher, nnodes, nproc, backend, extra spec tables)
WORLDS: list[tuple[str, int, int, str, dict[str, Any]]] = [
    ("torchrun", 2, 2, "local", {}),  # c10d rendezvous: node ranks in join order
    ("torchrun", 2, 4, "kubernetes", {"torchrun": {"rdzv_backend": "static"}}),
    ("torchrun", 4, 2, "slurm", {"parallelism": {"tp": 2, "pp": 2}}),
    ("megatron", 2, 2, "pytorchjob", {"batch": {"global_batch_size": 8, "micro_batch_size": 2}}),
    (
        "megatron",
        2,
        4,
        "local",
        {
            "parallelism": {"tp": 2, "pp": 2, "cp": 1, "vpp": 2},
            "batch": {"global_batch_size": 16, "micro_batch_size": 1},
        },
    ),
    (
        "megatron",
        4,
        2,
        "slurm",
        {
            "parallelism": {"tp": 2, "pp": 2, "order": "tp-cp-ep-pp-dp"},
            "batch": {"global_batch_size": 8, "micro_batch_size": 1},
        },
    ),
    (
        "deepspeed",
        2,
        2,
        "trainjob",
        {"batch": {"global_batch_size": 16, "micro_batch_size": 2}, "deepspeed": {"zero_stage": 2}},
    ),
    (
        "deepspeed",
        2,
        4,
        "ssh",
        {
            "batch": {"global_batch_size": 32, "micro_batch_size": 2},
            "ssh": {"hosts": ["gpu-a", "gpu-b"]},
        },
    ),  # deepspeed's runner
    ("deepspeed", 4, 2, "slurm", {"deepspeed": {"runner": "deepspeed", "zero_stage": 1}}),
    ("torchrun", 1, 2, "local", {}),  # --standalone: the workers' MASTER_ADDR is localhost
    ("torchrun", 2, 2, "jobset", {"parallelism": {"tp": 2}}),
]


def _spec(
    tmp_path: Path, launcher: str, nnodes: int, nproc: int, backend: str, extra: dict[str, Any]
) -> Path:
    data: dict[str, Any] = {
        "job": {
            "name": f"rh-{launcher}-{nnodes}x{nproc}",
            "command": ["python", "train.py", "--data", "/data/corpus"],
            "image": "nvcr.io/nvidia/pytorch:25.01-py3",
        },
        "distributed": {
            "launcher": launcher,
            "backend": backend,
            "nnodes": nnodes,
            "nproc_per_node": nproc,
            "accelerator": "nvidia",
        },
        **extra,
    }
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def _token_free(results: Path) -> bool:
    """No process of this rehearsal is left (they all carry MDC_REHEARSE_RESULTS=results)."""
    return not processes_with("MDC_REHEARSE_RESULTS", str(results))


@pytest.mark.parametrize(
    ("launcher", "nnodes", "nproc", "backend", "extra"),
    WORLDS,
    ids=[f"{w[0]}-{w[1]}x{w[2]}-{w[3]}" for w in WORLDS],
)
def test_world_plays(
    tmp_path: Path, launcher: str, nnodes: int, nproc: int, backend: str, extra: dict[str, Any]
) -> None:
    spec = _spec(tmp_path, launcher, nnodes, nproc, backend, extra)
    stdout, stderr = io.StringIO(), io.StringIO()
    keep = tmp_path / "out"
    code = main(
        ["rehearse", str(spec), "--no-plugin-autoload", "--keep", str(keep), "--timeout", "150"],
        stdout=stdout,
        stderr=stderr,
    )
    text = stdout.getvalue()
    assert code == 0, text + stderr.getvalue()
    world = nnodes * nproc
    nodes = f"{nnodes} node" + ("s" if nnodes > 1 else "")
    assert f"rehearse: OK: {launcher} on {backend}, {world} ranks on {nodes}:" in text
    assert f"rehearse: {world}/{world} ranks up" in stderr.getvalue()
    # every rank reported from the node its rank belongs to, on that node's loopback address
    plan = json.loads((keep / "plan.json").read_text(encoding="utf-8"))
    tp_groups = plan["groups"]["tp"]["ranks"]
    for rank in range(world):
        report = json.loads((keep / "rehearse" / f"rank-{rank}.json").read_text("utf-8"))
        assert report["problems"] == []
        node = report["node"]
        if "join order" in plan["worker_env"].get("GROUP_RANK", ""):  # c10d rendezvous
            assert rank // nproc == int(report["env"]["GROUP_RANK"])
        else:
            assert rank // nproc == node
        assert report["host"] == f"127.0.0.{node + 1}"
        assert report["env"]["NODE_HOSTS"].split() == [f"127.0.0.{i + 1}" for i in range(nnodes)]
        assert report["groups"]["mine"]["tp"] == next(g for g in tp_groups if rank in g)
        assert report["groups"]["built"] == sum(g["count"] for g in plan["groups"].values())
    args = json.loads((keep / "rehearse" / "rank-0.json").read_text("utf-8"))["argv"]
    if launcher == "megatron":
        sizes = plan["parallelism"]
        assert args[args.index("--tensor-model-parallel-size") + 1] == str(sizes["tp"])
        assert ("--use-tp-pp-dp-mapping" in args) == (sizes["order"] == "tp-cp-ep-pp-dp")
    if launcher == "deepspeed":
        config = json.loads(Path(args[args.index("--deepspeed_config") + 1]).read_text("utf-8"))
        dp = world  # no tp/pp/cp in these specs
        assert config["train_batch_size"] == (
            config["train_micro_batch_size_per_gpu"] * config["gradient_accumulation_steps"] * dp
        )
    seen = json.loads((keep / "rehearse" / "rank-0.json").read_text("utf-8"))["env"]
    if backend == "slurm":  # slurm/node.sh ran, with srun's variables
        assert seen["SLURM_NODEID"] == seen["NODE_RANK"]
    if backend in ("kubernetes", "pytorchjob", "trainjob", "jobset"):  # the pod's node.sh ran
        assert (keep / "rehearse" / "pod" / "k8s" / "node.sh").is_file()
        index = {
            "kubernetes": "JOB_COMPLETION_INDEX",
            "pytorchjob": "RANK",
            "trainjob": "PET_NODE_RANK",
            "jobset": "JOB_COMPLETION_INDEX",
        }[backend]
        assert f'export NODE_RANK="${index}"' in (
            keep / "rehearse" / "pod" / "k8s" / "node.sh"
        ).read_text("utf-8").replace("${" + index + ":-}", "$" + index)
    assert _token_free(keep / "rehearse")


def test_a_spec_naming_its_accelerator_model_plays(tmp_path: Path) -> None:
    """The rehearsal runs on the CPU: the spec's accelerator model (NVIDIA hardware) does not
    contradict it, and no finding is made on a key the spec does not write."""
    spec = _spec(tmp_path, "torchrun", 1, 2, "local", {})
    data = json.loads(spec.read_text(encoding="utf-8"))
    del data["distributed"]["accelerator"]
    data["distributed"]["accelerator_model"] = "h100-sxm"
    spec.write_text(json.dumps(data), encoding="utf-8")
    stdout, stderr = io.StringIO(), io.StringIO()
    code = main(["rehearse", str(spec), "--no-plugin-autoload"], stdout=stdout, stderr=stderr)
    assert code == 0, stdout.getvalue() + stderr.getvalue()
    assert "rehearse: OK: torchrun on local, 2 ranks on 1 node:" in stdout.getvalue()
    assert "MDC601" not in stderr.getvalue()


def test_swapped_node_ranks_are_reported_by_rank(tmp_path: Path, compiler: Compiler) -> None:
    """A backend that hands nodes 0 and 1 each other's NODE_RANK: every rank says so."""
    spec = _spec(tmp_path, "torchrun", 2, 2, "local", {"torchrun": {"rdzv_backend": "static"}})

    def swap(index: int, env: dict[str, str]) -> dict[str, str]:
        return {**env, "NODE_RANK": str(1 - index)}

    outcome = rehearse(
        spec, compiler, keep=tmp_path / "out", stderr=io.StringIO(), node_env_hook=swap, timeout=120
    )
    assert not outcome.ok
    assert sorted(outcome.problems) == ["0", "1", "2", "3"]
    for rank, found in outcome.problems.items():
        node = 1 - int(rank) // 2  # where the swapped NODE_RANK put it
        wanted = node * 2 + int(rank) % 2
        assert (
            f"RANK of local rank {int(rank) % 2} on node {node} (node x 2 + local rank) "
            f"is {int(rank)}, plan.json says {wanted}"
        ) in found
        assert f"NODE_RANK on node {node} is {1 - node}, plan.json says {node}" in found
    text = mdc.rehearse.render(outcome, kept=True)
    assert "rank 2: RANK of local rank 0 on node 0" in text
    assert "rehearse: FAILED: torchrun on local, 4 ranks on 2 nodes: 4 rank(s)" in text


def test_tampered_plan_is_reported_by_rank(tmp_path: Path, compiler: Compiler) -> None:
    """The probe compares what megatron's launcher passes with the plan it reads."""
    spec = _spec(tmp_path, "megatron", 2, 2, "local", {})

    def tamper(tree: Path) -> None:
        path = tree / "rehearse" / "plan.json"
        plan = json.loads(path.read_text(encoding="utf-8"))
        plan["parallelism"]["tp"] = 1
        plan["groups"]["tp"]["ranks"] = [[0, 1], [1, 2], [3]]
        path.write_text(json.dumps(plan), encoding="utf-8")

    outcome = rehearse(
        spec, compiler, keep=tmp_path / "out", stderr=io.StringIO(), tree_hook=tamper, timeout=120
    )
    assert not outcome.ok
    for rank in "0123":
        assert "--tensor-model-parallel-size is 2, plan.json says 1" in outcome.problems[rank]
    assert (
        "rank 1 is in 2 tp groups ([[0, 1], [1, 2]]), expected exactly 1" in outcome.problems["1"]
    )
    assert any(
        p.startswith("tp group [3] has 1 ranks, plan.json says size 2")
        for p in outcome.problems["3"]
    )


def test_timeout_stops_everything_and_names_the_missing_ranks(
    tmp_path: Path, compiler: Compiler
) -> None:
    spec = _spec(tmp_path, "torchrun", 2, 2, "local", {"torchrun": {"rdzv_backend": "static"}})

    def lost(index: int, env: dict[str, str]) -> dict[str, str]:  # node 1 never reaches node 0
        return {**env, "MASTER_PORT": "1"} if index == 1 else env

    started = time.monotonic()
    outcome = rehearse(
        spec, compiler, keep=tmp_path / "out", stderr=io.StringIO(), node_env_hook=lost, timeout=8
    )
    assert time.monotonic() - started < 40
    assert outcome.timed_out and not outcome.ok
    assert outcome.missing == [0, 1, 2, 3]
    assert "rehearse: timed out after" in mdc.rehearse.render(outcome, kept=True)
    assert _token_free(tmp_path / "out" / "rehearse")


def test_world_above_the_bound_is_refused_without_forking(tmp_path: Path) -> None:
    spec = _spec(tmp_path, "torchrun", 16, 8, "local", {})
    stdout, stderr = io.StringIO(), io.StringIO()
    keep = tmp_path / "out"
    code = main(
        ["rehearse", str(spec), "--no-plugin-autoload", "--keep", str(keep)],
        stdout=stdout,
        stderr=stderr,
    )
    assert code == 2
    assert (
        "the job has 128 ranks (16 nodes x 8); this rehearsal is bounded to 64 processes"
        in stderr.getvalue()
    )
    assert "--max-ranks 128" in stderr.getvalue()
    assert not keep.exists()
    small = _spec(tmp_path, "torchrun", 2, 4, "local", {})
    code = main(
        ["rehearse", str(small), "--no-plugin-autoload", "--max-ranks", "4"],
        stdout=stdout,
        stderr=stderr,
    )
    assert code == 2 and "the job has 8 ranks (2 nodes x 4)" in stderr.getvalue()


def test_spec_error_is_a_compile_diagnostic(tmp_path: Path) -> None:
    spec = tmp_path / "bad.toml"
    spec.write_text(
        '[job]\nname = "bad"\ncommand = ["python", "t.py"]\n\n[distributed]\n'
        'launcher = "megatron"\nnnodes = 2\nnproc_per_node = 2\n\n'
        "[parallelism]\ntp = 3\n",
        encoding="utf-8",
    )
    stdout, stderr = io.StringIO(), io.StringIO()
    code = main(["rehearse", str(spec), "--no-plugin-autoload"], stdout=stdout, stderr=stderr)
    assert code == 1
    assert f"{spec}:11:6: error[MDC201]: world size (4)" in stderr.getvalue()
    assert "tp" in stderr.getvalue()
    # an error in what rehearse replaces (the command) is still the spec's error
    spec.write_text(
        '[job]\nname = "bad"\ncommand = 3\n\n[distributed]\nlauncher = "torchrun"\n'
        "nnodes = 1\nnproc_per_node = 2\n",
        encoding="utf-8",
    )
    stderr = io.StringIO()
    code = main(["rehearse", str(spec), "--no-plugin-autoload"], stdout=stdout, stderr=stderr)
    assert code == 1
    assert f"{spec}:3:11: error[MDC100]: expected a string or a list" in stderr.getvalue()
    assert "ranks up" not in stderr.getvalue()


def test_missing_torch_is_a_clear_message(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a)
    )
    spec = _spec(tmp_path, "torchrun", 1, 2, "local", {})
    stdout, stderr = io.StringIO(), io.StringIO()
    code = main(["rehearse", str(spec), "--no-plugin-autoload"], stdout=stdout, stderr=stderr)
    assert code == 2
    assert "pip install 'mdc-compiler[torch]'" in stderr.getvalue()


def test_rehearse_module_does_not_import_torch() -> None:
    import subprocess
    import sys

    code = (
        "import sys, mdc.rehearse, mdc.rehearse.probe, mdc.cli; "
        "sys.exit(1 if 'torch' in sys.modules else 0)"
    )
    assert (
        subprocess.run([sys.executable, "-c", code], env={**os.environ}, check=False).returncode
        == 0
    )


def test_primus_is_refused(tmp_path: Path, compiler: Compiler) -> None:
    spec = _spec(tmp_path, "primus", 1, 2, "local", {"primus": {"config_path": "x.yaml"}})
    with pytest.raises(RehearseError, match="primus runs its own launch script"):
        rehearse(spec, compiler, stderr=io.StringIO())


SERVING: list[tuple[str, int, str, dict[str, Any]]] = [
    ("sglang_disagg", 5, "slurm", {"sglang_disagg": {"model_path": "Qwen/Qwen3-8B"}}),
    (
        "sglang_disagg",
        4,
        "local",
        {
            "sglang_disagg": {"model_path": "deepseek-ai/DeepSeek-V3-0324", "tp_size": 16},
            "distributed": {"prefill_nodes": 2, "decode_nodes": 2},
        },
    ),
    # one node: 2 prefill + 6 decode GPUs in servers of tp 2 (the automatic split)
    ("sglang_disagg", 1, "local", {"sglang_disagg": {"model_path": "Qwen/Qwen3-8B", "tp_size": 2}}),
    # two nodes: 6 prefill GPUs on node 0, 10 decode GPUs after them, the router on node 0
    ("sglang_disagg", 2, "local", {"sglang_disagg": {"model_path": "Qwen/Qwen3-8B", "tp_size": 2}}),
    (
        "vllm",
        2,
        "local",
        {"vllm": {"model": "meta-llama/Llama-3.1-70B-Instruct"}, "parallelism": {"tp": 8, "pp": 2}},
    ),
    (
        "vllm",
        2,
        "slurm",
        {
            "vllm": {"model": "deepseek-ai/DeepSeek-V3-0324"},
            "parallelism": {"tp": 1, "pp": 1, "ep": 16},
        },
    ),
    # data-parallel ranks of 16 GPUs over 8-GPU nodes: a Ray cluster, node 0 serves
    (
        "vllm",
        4,
        "local",
        {"vllm": {"model": "deepseek-ai/DeepSeek-V3-0324"}, "parallelism": {"tp": 16, "pp": 1}},
    ),
    # a RayCluster: the head pod is node 0, each worker pod node 1 to its node.sh
    (
        "vllm",
        3,
        "kuberay",
        {"vllm": {"model": "meta-llama/Llama-3.1-70B-Instruct"}, "parallelism": {"tp": 8, "pp": 3}},
    ),
    (
        "sglang",
        2,
        "kubernetes",
        {"sglang": {"model": "deepseek-ai/DeepSeek-V3"}, "parallelism": {"tp": 16, "pp": 1}},
    ),
    # vllm_disagg: one node (servers side by side), two nodes, and 4 nodes whose decode
    # server spans two nodes (data parallel, the later node headless)
    (
        "vllm_disagg",
        1,
        "local",
        {"vllm_disagg": {"model": "Qwen/Qwen3-8B", "tensor_parallel_size": 2}},
    ),
    (
        "vllm_disagg",
        2,
        "local",
        {"vllm_disagg": {"model": "Qwen/Qwen3-8B", "tensor_parallel_size": 4}},
    ),
    (
        "vllm_disagg",
        4,
        "slurm",
        {
            "vllm_disagg": {
                "model": "Qwen/Qwen3-8B",
                "tensor_parallel_size": 8,
                "decode": {"tensor_parallel_size": 4, "data_parallel_size": 4},
            },
            "distributed": {"prefill_nodes": 2, "decode_nodes": 2},
        },
    ),
]
#: launchers whose servers' stand-ins listen on their HTTP ports
DISAGG = ("sglang_disagg", "vllm_disagg")
ROUTER_MODULES = ("sglang_router.launch_router", "sglang.srt.disaggregation.mini_lb")
COMMANDS = {
    "vllm_disagg": ["vllm", "serve"],
    "sglang_disagg": "python3",
    "vllm": ["vllm", "serve"],
    "sglang": ["python3", "-m", "sglang.launch_server"],
}


def _serving_spec(
    tmp_path: Path,
    launcher: str,
    nnodes: int,
    backend: str,
    extra: dict[str, Any],
    port: int | None = None,
) -> Path:
    """The spec; a disaggregated job's servers count their HTTP ports up from ``port`` (their
    stand-ins listen there for the router's /health probe: a fixed port may be taken)."""
    if launcher in DISAGG:
        assert port is not None, "a disaggregated job's stand-ins need free ports (free_base)"
        extra = {**extra, launcher: {**extra[launcher], "port": port}}
    data: dict[str, Any] = {
        "job": {
            "name": f"rh-{launcher.replace('_', '-')}",
            "command": COMMANDS[launcher],
            "image": "lmsysorg/sglang:v0.5.5",
        },
        "distributed": {
            "launcher": launcher,
            "backend": backend,
            "nnodes": nnodes,
            "nproc_per_node": 8,
            "accelerator": "nvidia",
            **extra.get("distributed", {}),
        },
        **{k: v for k, v in extra.items() if k != "distributed"},
    }
    path = tmp_path / "serve.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("launcher", "nnodes", "backend", "extra"),
    SERVING,
    ids=[f"{s[0]}-{s[1]}-{s[2]}-{'-'.join(s[3].get('parallelism', s[3][s[0]]))}" for s in SERVING],
)
def test_serving_roles_and_addresses(
    tmp_path: Path, launcher: str, nnodes: int, backend: str, extra: dict[str, Any]
) -> None:
    base = free_base(16) if launcher in DISAGG else 0
    spec = _serving_spec(tmp_path, launcher, nnodes, backend, extra, base or None)
    stdout, stderr = io.StringIO(), io.StringIO()
    keep = tmp_path / "out"
    code = main(
        ["rehearse", str(spec), "--no-plugin-autoload", "--keep", str(keep)],
        stdout=stdout,
        stderr=stderr,
    )
    assert code == 0, stdout.getvalue() + stderr.getvalue()
    nodes = "1 node:" if nnodes == 1 else f"{nnodes} nodes"
    assert f"rehearse: OK: {launcher} on {backend}, {nodes}" in stdout.getvalue()
    records = mdc.rehearse.serving.read_records(keep / "rehearse")
    assert sorted(records) == list(range(nnodes))
    if launcher == "sglang_disagg" and nnodes == 1:  # every server and the router on node 0
        runs = {e["env"]["SGLANG_DISAGG_ROLE"] + ":" + e["argv"][1]: e["argv"] for e in records[0]}
        router = runs["proxy:sglang_router.launch_router"]
        assert router[router.index("--prefill") :] == [
            "--prefill",
            f"http://127.0.0.1:{base}",
            "8998",
            *[
                w
                for port in (base + 1, base + 2, base + 3)
                for w in ("--decode", f"http://127.0.0.1:{port}")
            ],
        ]
        placed = sorted(
            (
                e["argv"][e["argv"].index("--port") + 1],
                e["argv"][e["argv"].index("--base-gpu-id") + 1],
            )
            for e in records[0]
            if e["argv"][1] == "sglang.launch_server"
        )
        assert placed == [(str(base + i), str(2 * i)) for i in range(4)]
    elif launcher == "sglang_disagg" and nnodes == 2:  # servers on both, router on node 0
        (router,) = [e["argv"] for e in records[0] if e["argv"][1] == "sglang_router.launch_router"]
        decode = [router[i + 1] for i, w in enumerate(router) if w == "--decode"]
        assert decode == [f"http://127.0.0.1:{base + 3}"] + [
            f"http://127.0.0.2:{base + i}" for i in (4, 5, 6, 7)
        ]
        assert {e["argv"][1] for e in records[1]} == {"sglang.launch_server"}
    elif launcher == "sglang_disagg" and "tp_size" in extra[launcher]:  # servers of 2 nodes
        (router,) = [e["argv"] for e in records[0] if e["argv"][1] in ROUTER_MODULES]
        assert router[router.index("--prefill") :] == [
            "--prefill",
            f"http://127.0.0.1:{base}",
            "8998",
            "--decode",
            f"http://127.0.0.3:{base + 2}",
        ]
        port = json.loads((keep / "plan.json").read_text("utf-8"))["rendezvous"]["master_port"]
        for node, first in ((0, 0), (1, 0), (2, 2), (3, 2)):
            (argv,) = [e["argv"] for e in records[node] if e["argv"][1] == "sglang.launch_server"]
            assert argv[argv.index("--nnodes") + 1] == "2"
            assert argv[argv.index("--node-rank") + 1] == str(node - first)
            assert argv[argv.index("--dist-init-addr") + 1] == f"127.0.0.{first + 1}:{port + first}"
    elif launcher == "sglang_disagg":  # 5 nodes: prefill 0-1 (the router on 0), decode 2-4
        (router,) = [e["argv"] for e in records[0] if e["argv"][1] in ROUTER_MODULES]
        assert router[:2] == ["-m", "sglang_router.launch_router"]
        assert [router[i + 1] for i, w in enumerate(router) if w == "--prefill"] == [
            f"http://127.0.0.1:{base}",
            f"http://127.0.0.2:{base + 1}",
        ]
        assert [router[i + 1] for i, w in enumerate(router) if w == "--decode"] == [
            f"http://127.0.0.3:{base + 2}",
            f"http://127.0.0.4:{base + 3}",
            f"http://127.0.0.5:{base + 4}",
        ]
    if launcher == "vllm_disagg" and nnodes == 4:  # the proxy lists each server's first node
        (proxy,) = [e["argv"] for e in records[0] if e["argv"][0].endswith("toy_proxy_server.py")]
        assert proxy[proxy.index("--prefiller-hosts") :] == [
            "--prefiller-hosts",
            "127.0.0.1",
            "127.0.0.2",
            "--prefiller-ports",
            str(base),
            str(base + 1),
            "--decoder-hosts",
            "127.0.0.3",
            "--decoder-ports",
            str(base + 2),
        ]
        (later,) = [e for e in records[3] if e["program"] == "vllm"]
        assert (
            "--headless" in later["argv"] and later["env"]["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "5616"
        )
    if backend == "kuberay":  # each pod's node.sh ran, with its group's env and its own IP
        assert (keep / "rehearse" / "pod" / "k8s" / "node.sh").is_file()
        for node in range(nnodes):
            seen = next(e["env"] for e in records[node] if e["program"] == "ray")
            assert (seen["NODE_RANK"], seen["NODE_HOSTS"]) == (
                ("0", "127.0.0.1") if node == 0 else ("1", f"127.0.0.1 127.0.0.{node + 1}")
            ), (node, seen)
    if launcher == "sglang":  # every node is told node 0's address and the plan's port
        port = json.loads((keep / "plan.json").read_text("utf-8"))["rendezvous"]["master_port"]
        for node, entries in records.items():
            argv = entries[0]["argv"]
            assert argv[argv.index("--dist-init-addr") + 1] == f"127.0.0.1:{port}"
            assert argv[argv.index("--node-rank") + 1] == str(node)
    if launcher == "vllm" and "ep" in extra["parallelism"]:  # data parallel, one endpoint
        port = json.loads((keep / "plan.json").read_text("utf-8"))["rendezvous"]["master_port"]
        head, engines = records[0][0]["argv"], records[1][0]["argv"]
        assert "--headless" not in head and "--headless" in engines
        assert engines[engines.index("--data-parallel-start-rank") + 1] == "8"
        for argv in (head, engines):
            assert argv[argv.index("--data-parallel-address") + 1] == "127.0.0.1"
            assert argv[argv.index("--data-parallel-rpc-port") + 1] == str(port)
            assert "--enable-expert-parallel" in argv
    elif launcher == "vllm" and extra["parallelism"]["tp"] == 16:  # Ray data parallel
        (head,) = [e["argv"] for e in records[0] if e["program"] == "vllm"]
        assert head[head.index("--data-parallel-size") + 1] == "2"
        assert head[head.index("--data-parallel-backend") + 1] == "ray"
        for node in (1, 2, 3):  # every other node joins the Ray head and serves nothing
            assert [e["program"] for e in records[node]] == ["ray"]
    elif launcher == "vllm":  # Ray head on node 0, node 1 joins it from its own address
        joined = records[1][0]["argv"]
        assert joined[:2] == ["start", f"--address=127.0.0.1:{records[0][0]['argv'][3][7:]}"]
        assert records[1][0]["env"]["VLLM_HOST_IP"] == "127.0.0.2"


def test_serving_url_to_a_wrong_role_is_caught(tmp_path: Path, compiler: Compiler) -> None:
    """The router's node sees NODE_HOSTS in another order: its URLs reach the wrong roles."""
    base = free_base(5)
    spec = _serving_spec(
        tmp_path,
        "sglang_disagg",
        5,
        "local",
        {"sglang_disagg": {"model_path": "Qwen/Qwen3-8B"}},
        base,
    )

    def reorder(index: int, env: dict[str, str]) -> dict[str, str]:
        if index != 0:
            return env
        hosts = env["NODE_HOSTS"].split()
        hosts[1], hosts[2] = hosts[2], hosts[1]
        return {**env, "NODE_HOSTS": " ".join(hosts)}

    outcome = rehearse(
        spec, compiler, keep=tmp_path / "out", stderr=io.StringIO(), node_env_hook=reorder
    )
    assert not outcome.ok
    assert (
        f"router --prefill http://127.0.0.3:{base + 1} points at node 2, whose role is decode"
        in outcome.findings
    )
    assert (
        f"router --decode http://127.0.0.2:{base + 2} points at node 1, whose role is prefill"
        in outcome.findings
    )


def test_vllm_disagg_proxy_list_to_a_wrong_node_is_caught(
    tmp_path: Path, compiler: Compiler
) -> None:
    """Node 0 sees NODE_HOSTS with nodes 1 and 2 swapped: the proxy lists the prefill
    server's port at the decode node's address."""
    base = free_base(5)
    spec = _serving_spec(
        tmp_path, "vllm_disagg", 5, "local", {"vllm_disagg": {"model": "Qwen/Qwen3-8B"}}, base
    )

    def reorder(index: int, env: dict[str, str]) -> dict[str, str]:
        if index != 0:
            return env
        hosts = env["NODE_HOSTS"].split()
        hosts[1], hosts[2] = hosts[2], hosts[1]
        return {**env, "NODE_HOSTS": " ".join(hosts)}

    outcome = rehearse(
        spec, compiler, keep=tmp_path / "out", stderr=io.StringIO(), node_env_hook=reorder
    )
    assert not outcome.ok
    assert (
        "the proxy's --prefiller-hosts ['127.0.0.1', '127.0.0.3'] and --prefiller-ports "
        f"['{base}', '{base + 1}'] reach (node, port) [(0, '{base}'), (2, '{base + 1}')]; the "
        f"prefill servers run at [(0, '{base}'), (1, '{base + 1}')]" in outcome.findings
    ), outcome.findings


def test_shims_pass_shellcheck(tmp_path: Path) -> None:
    import subprocess
    import sys

    mdc.rehearse.serving.install_shims(tmp_path, sys.executable)
    scripts = sorted(str(p) for p in tmp_path.iterdir())
    shellcheck = Path(sys.executable).parent / "shellcheck"
    for script in scripts:
        assert subprocess.run(["bash", "-n", script], check=False).returncode == 0
    result = subprocess.run(
        [str(shellcheck), *scripts], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout


def test_vllm_engines_pointed_at_a_wrong_head_are_caught(
    tmp_path: Path, compiler: Compiler
) -> None:
    """Node 1 is told the wrong MASTER_ADDR: its headless engines would wait for node 1."""
    spec = _serving_spec(
        tmp_path,
        "vllm",
        2,
        "local",
        {"vllm": {"model": "m"}, "parallelism": {"tp": 2, "pp": 1}},
    )

    def wrong_head(index: int, env: dict[str, str]) -> dict[str, str]:
        return {**env, "MASTER_ADDR": "127.0.0.2"} if index == 1 else env

    outcome = rehearse(
        spec, compiler, keep=tmp_path / "out", stderr=io.StringIO(), node_env_hook=wrong_head
    )
    assert not outcome.ok
    assert "node 1: --data-parallel-address 127.0.0.2 is not node 0" in outcome.findings


def test_a_server_node_pointed_at_another_servers_head_is_caught(
    tmp_path: Path, compiler: Compiler
) -> None:
    """Node 1 (second node of the prefill server) sees NODE_HOSTS in another order."""
    spec = _serving_spec(
        tmp_path,
        "sglang_disagg",
        4,
        "local",
        {
            "sglang_disagg": {"model_path": "deepseek-ai/DeepSeek-V3-0324", "tp_size": 16},
            "distributed": {"prefill_nodes": 2, "decode_nodes": 2},
        },
        free_base(4),
    )

    def reorder(index: int, env: dict[str, str]) -> dict[str, str]:
        if index != 1:
            return env
        hosts = env["NODE_HOSTS"].split()
        hosts[0], hosts[2] = hosts[2], hosts[0]
        return {**env, "NODE_HOSTS": " ".join(hosts)}

    outcome = rehearse(
        spec, compiler, keep=tmp_path / "out", stderr=io.StringIO(), node_env_hook=reorder
    )
    assert not outcome.ok
    assert any(
        f.startswith("node 1 (prefill): --dist-init-addr 127.0.0.3:") and "is node 2" in f
        for f in outcome.findings
    ), outcome.findings


def test_one_node_router_pointed_at_the_wrong_role_is_caught() -> None:
    """The one-node check reads the records: a router that sends prefill to a decode server."""
    plan = {
        "nproc_per_node": 2,
        "servers": [
            {"role": "router", "gpus": 0, "port": 8000, "nodes": [0]},
            {"role": "prefill", "gpus": 1, "port": 30000, "nodes": [0]},
            {"role": "decode", "gpus": 1, "port": 30001, "nodes": [0]},
        ],
    }

    def server(mode: str, port: int, gpu: int) -> dict[str, Any]:
        argv = ["-m", "sglang.launch_server", "--disaggregation-mode", mode, "--tp-size", "1"]
        argv += ["--port", str(port), "--base-gpu-id", str(gpu)]
        return {"program": "python", "argv": argv, "env": {"SGLANG_DISAGG_ROLE": mode}}

    router = {
        "program": "python",
        "argv": ["-m", "sglang_router.launch_router", "--pd-disaggregation"]
        + ["--prefill", "http://127.0.0.1:30001", "8998", "--decode", "http://127.0.0.1:30000"],
        "env": {"SGLANG_DISAGG_ROLE": "proxy"},
    }
    found = mdc.rehearse.serving._check_disagg_shared(
        plan, {0: [server("prefill", 30000, 0), server("decode", 30001, 0), router]}, ["127.0.0.1"]
    )
    assert found == [
        "decode server on port 30001 takes GPU 0, also the server on port 30000's",
        "router --prefill http://127.0.0.1:30001 reaches a decode server",
        "router --decode http://127.0.0.1:30000 reaches a prefill server",
    ]


def _trtllm_spec(tmp_path: Path, example: str, base: int, nnodes: int | None = None) -> Path:
    """An example under examples/ as JSON, its servers' ports counted up from ``base`` (the
    aggregated one's from ``base + 1``)."""
    import tomllib

    root = Path(__file__).resolve().parents[2]
    data = tomllib.loads((root / "examples" / example).read_text("utf-8"))
    data["trtllm"] |= {"port": base + 1, "router_port": base}
    if nnodes is not None and "context" not in data["trtllm"]:  # one server over the nodes
        data["distributed"]["nnodes"] = nnodes
        data["parallelism"]["tp"] = nnodes * 8
        nnodes = None
    if nnodes is not None:  # every role's servers twice, one more node
        data["distributed"] |= {"nnodes": nnodes, "backend": "slurm"}
        for role in ("context", "generation"):
            data["trtllm"][role]["servers"] *= nnodes
    path = tmp_path / "trtllm.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def _trtllm_runs(keep: Path) -> dict[int, list[dict[str, Any]]]:
    records = mdc.rehearse.serving.read_records(keep / "rehearse")
    return {n: [e for e in es if e["program"] == "trtllm-serve"] for n, es in records.items()}


def test_trtllm_aggregated_replicas_play(tmp_path: Path) -> None:
    """Eight tp-1 replicas on one node: each on its own GPU and port (the example's layout)."""
    base = free_base(9)
    spec = _trtllm_spec(tmp_path, "trtllm-llama33-70b-1x8.toml", base)
    stdout, stderr = io.StringIO(), io.StringIO()
    keep = tmp_path / "out"
    code = main(["rehearse", str(spec), "--keep", str(keep)], stdout=stdout, stderr=stderr)
    assert code == 0, stdout.getvalue() + stderr.getvalue()
    assert "rehearse: OK: trtllm on slurm, 1 node:" in stdout.getvalue()
    runs = _trtllm_runs(keep)[0]
    placed = sorted((e["argv"][-1], e["env"]["CUDA_VISIBLE_DEVICES"]) for e in runs)
    assert placed == [(str(base + 1 + i), str(i)) for i in range(8)]
    assert all("TRTLLM_DISAGG_ROLE" not in e["env"] for e in runs)


@pytest.mark.parametrize("nnodes", [None, 2], ids=["1x8-example", "2x8"])
def test_trtllm_disaggregated_plays(tmp_path: Path, nnodes: int | None) -> None:
    """The disaggregated example on one node, and over two nodes (two servers of tp 4 a role):
    the proxy's config lists every server where it really ran, and its temporary folder is
    gone after the run."""
    base = free_base(6)
    spec = _trtllm_spec(tmp_path, "trtllm-disagg-1x8.toml", base, nnodes)
    stdout, stderr = io.StringIO(), io.StringIO()
    keep = tmp_path / "out"
    code = main(["rehearse", str(spec), "--keep", str(keep)], stdout=stdout, stderr=stderr)
    assert code == 0, stdout.getvalue() + stderr.getvalue()
    runs = _trtllm_runs(keep)
    (proxy,) = [e for e in runs[0] if e["argv"][0] == "disaggregated"]
    assert proxy["env"]["TRTLLM_DISAGG_ROLE"] == "proxy"
    servers = sorted(
        (node, e["argv"][-1], e["env"]["TRTLLM_DISAGG_ROLE"], e["env"]["CUDA_VISIBLE_DEVICES"])
        for node, entries in runs.items()
        for e in entries
        if e is not proxy
    )
    if nnodes is None:
        assert servers == [
            (0, str(base + 1), "context", "0,1,2,3"),
            (0, str(base + 2), "generation", "4,5,6,7"),
        ]
        urls = [f"127.0.0.1:{base + 1}", f"127.0.0.1:{base + 2}"]
    else:  # two servers a role: the context servers fill node 0, generation node 1
        assert [s[:3] for s in servers] == [
            (0, str(base + 1), "context"),
            (0, str(base + 2), "context"),
            (1, str(base + 3), "generation"),
            (1, str(base + 4), "generation"),
        ]
        urls = [f"127.0.0.{1 + i // 2}:{base + 1 + i}" for i in range(4)]
    from ruamel.yaml import YAML

    config = YAML(typ="safe").load(proxy["config"])
    assert config["port"] == base
    # the config's temporary folder went with the script (its EXIT trap)
    written = Path(proxy["argv"][proxy["argv"].index("-c") + 1])
    assert written.name == "disagg_config.yaml" and not written.parent.exists(), written
    half = len(urls) // 2
    assert config["context_servers"] == {"num_instances": half, "urls": urls[:half]}
    assert config["generation_servers"] == {"num_instances": half, "urls": urls[half:]}


def test_trtllm_proxy_config_to_a_wrong_node_is_caught(tmp_path: Path, compiler: Compiler) -> None:
    """Node 0 sees NODE_HOSTS in reverse: its config puts its own servers on node 1."""
    base = free_base(6)
    spec = _trtllm_spec(tmp_path, "trtllm-disagg-1x8.toml", base, 2)

    def reorder(index: int, env: dict[str, str]) -> dict[str, str]:
        if index != 0:
            return env
        return {**env, "NODE_HOSTS": " ".join(reversed(env["NODE_HOSTS"].split()))}

    outcome = rehearse(
        spec, compiler, keep=tmp_path / "out", stderr=io.StringIO(), node_env_hook=reorder
    )
    assert not outcome.ok
    assert (
        f"the proxy's context_servers ['127.0.0.2:{base + 1}', '127.0.0.2:{base + 2}'] reach "
        f"(node, port) [(1, '{base + 1}'), (1, '{base + 2}')]; the context servers run at "
        f"[(0, '{base + 1}'), (0, '{base + 2}')]" in outcome.findings
    ), outcome.findings


def test_trtllm_server_on_a_wrong_gpu_is_caught() -> None:
    """The check reads the records: two servers on one GPU, one beside its planned GPUs."""
    plan = {
        "servers": [
            {"role": "replica", "gpus": 1, "first_gpu": g, "port": 8000 + g, "nodes": [0]}
            for g in (0, 1)
        ]
    }

    def server(port: int, gpu: str) -> dict[str, Any]:
        argv = ["m", "--tp_size", "1", "--pp_size", "1", "--port", str(port)]
        return {"program": "trtllm-serve", "argv": argv, "env": {"CUDA_VISIBLE_DEVICES": gpu}}

    from mdc.rehearse.trtllm import check_trtllm

    found = check_trtllm(plan, {0: [server(8000, "0"), server(8001, "0")]}, ["127.0.0.1"])
    assert found == [
        "servers started (nodes, port, role, GPUs a node) [((0,), '8000', 'aggregated', [0]), "
        "((0,), '8001', 'aggregated', [0])], the plan has [((0,), '8000', 'aggregated', [0]), "
        "((0,), '8001', 'aggregated', [1])]"
    ]


def test_trtllm_servers_over_nodes_play_as_srun_steps(tmp_path: Path) -> None:
    """The 3-node disaggregated example (a generation server of tp 16 over nodes 1-2) and the
    aggregated one as one tp-16 server over 2 nodes: each runs as its first node's srun step
    over its nodes, a task a GPU, and the step's other node starts nothing itself."""
    base = free_base(5)
    for example, nnodes, step in (
        ("trtllm-disagg-slurm-3x8.toml", None, (1, ["127.0.0.2", "127.0.0.3"], base + 3)),
        ("trtllm-llama33-70b-1x8.toml", 2, (0, ["127.0.0.1", "127.0.0.2"], base + 1)),
    ):
        spec = _trtllm_spec(tmp_path, example, base, nnodes)
        stdout, stderr = io.StringIO(), io.StringIO()
        keep = tmp_path / example
        code = main(["rehearse", str(spec), "--keep", str(keep)], stdout=stdout, stderr=stderr)
        assert code == 0, stdout.getvalue() + stderr.getvalue()
        records = mdc.rehearse.serving.read_records(keep / "rehearse")
        node, hosts, port = step
        (srun,) = [e["argv"] for e in records[node] if e["program"] == "srun"]
        assert f"--nodelist={','.join(hosts)}" in srun
        assert "--ntasks-per-node=8" in srun and "--ntasks=16" in srun
        assert srun[srun.index("trtllm-llmapi-launch") + 1] == "trtllm-serve"
        assert srun[-2:] == ["--port", str(port)]
        assert node + 1 not in records  # the step's second node runs only its tasks


def test_trtllm_srun_step_over_the_wrong_nodes_is_caught(
    tmp_path: Path, compiler: Compiler
) -> None:
    """Node 1 of the 3-node example sees NODE_HOSTS in reverse: its step reaches nodes 1 and
    0, and node 2 starts nothing."""
    base = free_base(5)
    spec = _trtllm_spec(tmp_path, "trtllm-disagg-slurm-3x8.toml", base)

    def reorder(index: int, env: dict[str, str]) -> dict[str, str]:
        if index != 1:
            return env
        return {**env, "NODE_HOSTS": " ".join(reversed(env["NODE_HOSTS"].split()))}

    outcome = rehearse(
        spec, compiler, keep=tmp_path / "out", stderr=io.StringIO(), node_env_hook=reorder
    )
    assert not outcome.ok
    assert any(
        f"((1, 0), '{base + 3}', 'generation'" in f and "the plan has" in f
        for f in outcome.findings
    ), outcome.findings
    assert "node 2 (127.0.0.3, role worker) started no server" in outcome.findings
