"""The vllm launcher: the server's command and env per mode, its findings, and the Ray script.

Specs are compiled in-process through mdc's own pipeline with only the plugins these
tests need (vllm and the local backend). The Ray node script is run for real with stub
``ray``, ``python3`` and ``vllm`` programs on PATH (no GPU or Ray here): they record
what they were called with, and the stub ``python3`` answers the GPU count Ray would.
Flag names against vLLM's own CLI are checked in tests/conformance/test_serving_flags.py.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from tests.tools import shellcheck

from mdc.api import Concat, Ref
from mdc.emit import write_tree
from mdc.errors import Diagnostic, Severity, SpecError
from mdc.pipeline import Compiled, Compiler
from mdc.plugin_manager import load_plugins

OTHERS = (
    "torchrun",
    "basic",
    "deepspeed",
    "megatron",
    "torchtitan",
    "primus",
    "sglang",
    "sglang_disagg",
    "slurm",
    "ssh",
    "kubernetes",
    "pytorchjob",
    "trainjob",
    "leaderworkerset",
)
COMPILER = Compiler(load_plugins(autoload=False, blocked=OTHERS))
MODEL = "org/some-model"


def spec(
    vllm: dict[str, Any] | None = None,
    *,
    nnodes: int = 1,
    nproc: int = 4,
    command: Any = ("vllm", "serve"),
    **extra: Any,
) -> dict[str, Any]:
    data: dict[str, Any] = {
        "job": {"name": "vllm-unit", "command": list(command)},
        "distributed": {
            "launcher": "vllm",
            "backend": "local",
            "nnodes": nnodes,
            "nproc_per_node": nproc,
            "master_port": 29650,
        },
        "vllm": {"model": MODEL, **(vllm or {})},
    }
    for table, value in extra.items():
        data.setdefault(table, {}).update(value)
    return data


def compile_(tmp_path: Path, data: dict[str, Any]) -> Compiled:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return COMPILER.compile(path)


def diagnostics(tmp_path: Path, data: dict[str, Any]) -> list[Diagnostic]:
    with pytest.raises(SpecError) as caught:
        compile_(tmp_path, data)
    return list(caught.value.diagnostics)


def warnings_of(tmp_path: Path, data: dict[str, Any]) -> list[str]:
    return [d.code for d in compile_(tmp_path, data).diagnostics]


def file_of(compiled: Compiled, path: str) -> str:
    return next(a for a in compiled.tree if a.path == path).data.decode("utf-8")


# ------------------------------------------------------------ command lines


def test_one_node_serves_the_model_over_all_its_gpus(tmp_path: Path) -> None:
    compiled = compile_(tmp_path, spec({"args": ["--max-model-len", "4096"]}))
    (role,) = compiled.launch.roles
    assert role.argv == (
        "vllm",
        "serve",
        MODEL,
        "--tensor-parallel-size",
        "4",
        "--pipeline-parallel-size",
        "1",
        "--host",
        "0.0.0.0",
        "--port",
        "8000",
        "--max-model-len",
        "4096",
    )
    env = dict(role.env)
    assert env["VLLM_TENSOR_PARALLEL_SIZE"] == "4"
    assert env["VLLM_PIPELINE_PARALLEL_SIZE"] == "1"
    assert env["VLLM_DISTRIBUTED_BACKEND"] == "auto"
    assert env["NNODES"] == "1" and env["NPROC_PER_NODE"] == "4"
    assert env["NODE_RANK"] == Ref("NODE_RANK") and env["MASTER_PORT"] == Ref("MASTER_PORT")
    assert [a.path for a in compiled.launch.files] == []


def test_a_command_other_than_vllm_serve_gets_the_model_as_an_option(tmp_path: Path) -> None:
    command = ("python", "-m", "vllm.entrypoints.openai.api_server", "--seed", "1")
    compiled = compile_(tmp_path, spec({"port": 9001, "host": "127.0.0.1"}, command=command))
    (role,) = compiled.launch.roles
    assert role.argv[:7] == (*command, "--model", MODEL)
    assert role.argv[7:] == (
        "--tensor-parallel-size",
        "4",
        "--pipeline-parallel-size",
        "1",
        "--host",
        "127.0.0.1",
        "--port",
        "9001",
    )
    assert "MDC365" not in warnings_of(tmp_path, spec(command=command))


def test_several_nodes_default_to_one_server_over_ray(tmp_path: Path) -> None:
    compiled = compile_(tmp_path, spec(nnodes=2, nproc=8, parallelism={"tp": 8, "pp": 2}))
    (role,) = compiled.launch.roles
    assert role.argv[:2] == ("bash", Concat((Ref("MDC_OUT"), "/launch/vllm-node.sh")))
    assert role.argv[2:] == (
        "vllm",
        "serve",
        MODEL,
        "--tensor-parallel-size",
        "8",
        "--pipeline-parallel-size",
        "2",
        "--host",
        "0.0.0.0",
        "--port",
        "8000",
        "--distributed-executor-backend",
        "ray",
    )
    assert dict(role.env)["VLLM_DISTRIBUTED_BACKEND"] == "ray"
    (script,) = compiled.launch.files
    assert script.path == "launch/vllm-node.sh" and script.executable
    text = script.data.decode("utf-8")
    assert '--port="$MASTER_PORT" --num-gpus=8' in text
    assert "((gpus >= 16))" in text
    assert compiled.launch.worker_env["MASTER_PORT"].startswith("29650 ")


def test_replicas_run_an_independent_server_on_every_node(tmp_path: Path) -> None:
    compiled = compile_(
        tmp_path, spec({"mode": "replicas"}, nnodes=3, nproc=4, parallelism={"tp": 2, "pp": 2})
    )
    (role,) = compiled.launch.roles
    assert role.argv == (
        "vllm",
        "serve",
        MODEL,
        "--tensor-parallel-size",
        "2",
        "--pipeline-parallel-size",
        "2",
        "--host",
        "0.0.0.0",
        "--port",
        "8000",
    )
    assert compiled.launch.files == ()
    assert compiled.plan.sizes.dp == 3


def test_the_same_spec_gives_the_same_bytes(tmp_path: Path) -> None:
    data = spec(nnodes=2, nproc=8)
    first = [(a.path, a.data) for a in compile_(tmp_path, data).tree]
    assert [(a.path, a.data) for a in compile_(tmp_path, data).tree] == first


# ------------------------------------------------------------ findings


def test_a_missing_model_is_an_error(tmp_path: Path) -> None:
    data = spec()
    del data["vllm"]
    found = diagnostics(tmp_path, data)
    assert [(d.code, d.location.pointer) for d in found] == [("MDC360", "/vllm")]


def test_replicas_need_tp_times_pp_to_fill_one_node(tmp_path: Path) -> None:
    # pp defaults to nnodes (4) for a model-parallel launcher: 8 x 4 = 32 GPUs per server
    (found,) = [
        d
        for d in diagnostics(tmp_path, spec({"mode": "replicas"}, nnodes=4, nproc=8))
        if d.is_error
    ]
    assert found.code == "MDC362" and "8 GPUs" in found.message and "= 32" in found.message
    assert "tp = 8 and pp = 1" in (found.hint or "")


def test_in_ray_mode_one_server_must_use_every_gpu(tmp_path: Path) -> None:
    data = spec({"mode": "ray"}, nnodes=2, nproc=8, parallelism={"tp": 8, "pp": 1})
    found = [d for d in diagnostics(tmp_path, data) if d.is_error]
    assert [d.code for d in found] == ["MDC362"]
    assert "= 8 GPUs" in found[0].message and "2 x 8 = 16" in found[0].message
    assert '("dp")' in (found[0].hint or "")


def test_tp_below_the_job_is_data_parallel_by_default(tmp_path: Path) -> None:
    compiled = compile_(tmp_path, spec(nnodes=2, nproc=8, parallelism={"tp": 8, "pp": 1}))
    (role,) = compiled.launch.roles
    words = [w for w in role.argv if isinstance(w, str)]
    assert words[words.index("--data-parallel-size") + 1] == "2"
    assert words[words.index("--data-parallel-size-local") + 1] == "1"
    assert "--enable-expert-parallel" not in words


def test_data_parallel_ranks_wider_than_a_node_run_over_ray(tmp_path: Path) -> None:
    """tp 16 on 8-GPU nodes, dp 2: vLLM places such ranks through Ray with
    VLLM_RAY_DP_PACK_STRATEGY=span, which ignores --data-parallel-size-local
    (docs/serving/data_parallel_deployment.md, "Internal Load Balancing", vllm-project/vllm
    at 01e4fce07423dafcc832600ba05159fb28dc1126)."""
    data = spec(nnodes=4, nproc=8, parallelism={"tp": 16, "pp": 1})
    compiled = compile_(tmp_path, data)
    (role,) = compiled.launch.roles
    words = [w for w in role.argv if isinstance(w, str)]
    assert words[words.index("--data-parallel-size") + 1] == "2"
    assert words[words.index("--data-parallel-backend") + 1] == "ray"
    assert "--data-parallel-size-local" not in words and "--headless" not in words
    assert role.env["VLLM_RAY_DP_PACK_STRATEGY"] == "span"
    # the Ray cluster of every node first; node 0 serves once Ray has the 32 GPUs
    script = file_of(compiled, "launch/vllm-node.sh")
    assert "ray start --head" in script and "((gpus >= 32))" in script
    (server,) = compiled.launch.servers
    assert (server.nodes, server.gpus, server.tp, server.dp) == ((0, 1, 2, 3), 32, 16, 2)
    # an engine of 12 GPUs is neither a divisor of a node nor whole nodes
    data = spec(nnodes=3, nproc=8, parallelism={"tp": 12, "pp": 1})
    (found,) = [d for d in diagnostics(tmp_path, data) if d.is_error]
    assert found.code == "MDC362" and "whole nodes" in found.message


def test_vllm_expert_parallel_is_tp_times_dp(tmp_path: Path) -> None:
    data = spec(nnodes=2, nproc=8, parallelism={"tp": 2, "pp": 1, "ep": 4})
    data["model"] = {"num_experts": 64}
    found = [d for d in diagnostics(tmp_path, data) if d.is_error]
    assert [d.code for d in found] == ["MDC368"]
    assert "2 x 8 = 16" in found[0].message and "set ep = 16" in (found[0].hint or "")


def test_api_server_count_must_not_reach_headless_nodes(tmp_path: Path) -> None:
    data = spec({"args": ["--api-server-count", "4"]}, nnodes=2, nproc=4, parallelism={"tp": 1})
    data["parallelism"]["pp"] = 1
    found = [d for d in diagnostics(tmp_path, data) if d.is_error]
    assert [(d.code, d.location.pointer) for d in found] == [("MDC369", "/vllm/args")]
    assert "head_args" in (found[0].hint or "")


def test_a_finding_on_a_key_read_from_a_flag_points_at_the_flag(tmp_path: Path) -> None:
    """-dp 2 is [parallelism] dp = 2; with tp the node's 4 GPUs it does not add up (MDC202),
    and the error names the word the user wrote."""
    found = diagnostics(tmp_path, spec({"args": ["--seed", "1", "-dp", "2"]}))
    assert [(d.code, d.location.pointer) for d in found if d.is_error] == [
        ("MDC202", "/vllm/args/2")
    ]


def test_context_parallel_is_refused(tmp_path: Path) -> None:
    found = diagnostics(tmp_path, spec(nproc=4, parallelism={"tp": 2, "pp": 1, "cp": 2}))
    assert "MDC363" in {d.code for d in found if d.is_error}


@pytest.mark.parametrize(
    ("where", "words", "expected"),
    [
        (
            "command",
            ["vllm", "serve", "--port", "1"],
            [("/job/command/2", "'--port 1'", "[vllm] port = 8001")],
        ),
        (
            "args",
            ["-tp", "2", "--model=x"],
            [
                ("/vllm/args/0", "'-tp 2'", "[parallelism] tp = 4"),
                ("/vllm/args/2", "'--model=x'", '[vllm] model = "org/some-model"'),
            ],
        ),
        (
            "args",
            ["--pipeline-parallel-size=2"],
            [("/vllm/args/0", "'--pipeline-parallel-size=2'", "[parallelism] pp = 1")],
        ),
    ],
)
def test_a_flag_that_disagrees_with_its_key_is_refused(
    tmp_path: Path, where: str, words: list[str], expected: list[tuple[str, str, str]]
) -> None:
    """One finding per flag, at the word itself, naming the key it disagrees with."""
    data = spec({"args": words}) if where == "args" else spec(command=words)
    data["vllm"]["port"] = 8001
    data["parallelism"] = {"tp": 4, "pp": 1}
    found = [d for d in diagnostics(tmp_path, data) if d.is_error]
    assert [d.code for d in found] == ["MDC364"] * len(expected)
    for d, (pointer, said, key) in zip(found, expected, strict=True):
        assert d.location.pointer == pointer
        assert f"passes {said}, but {key}" in d.message, d.message


def test_flags_mdc_writes_per_node_are_refused_where_it_writes_them(tmp_path: Path) -> None:
    """In dp mode over two nodes mdc writes --headless and the data-parallel addresses per
    node: the same flags in args (every node) would override them."""
    data = spec(
        {"args": ["--headless", "--data-parallel-rpc-port", "5555"]},
        nnodes=2,
        parallelism={"tp": 1, "pp": 1},
    )
    found = [d for d in diagnostics(tmp_path, data) if d.is_error]
    assert [(d.code, d.location.pointer) for d in found] == [
        ("MDC364", "/vllm/args/0"),
        ("MDC364", "/vllm/args/1"),
    ]
    assert all("per node" in d.message for d in found)


def test_warnings_for_a_foreign_command_and_a_mode_on_one_node(tmp_path: Path) -> None:
    found = warnings_of(tmp_path, spec({"mode": "ray"}, command=["python", "serve.py"]))
    assert sorted(found) == ["MDC361", "MDC365"]


def test_an_elastic_job_is_refused(tmp_path: Path) -> None:
    found = diagnostics(tmp_path, spec(nnodes=4, nproc=2, distributed={"min_nnodes": 2}))
    assert "MDC366" in {d.code for d in found if d.is_error}


def test_ray_over_cpu_is_refused_but_cpu_replicas_are_fine(tmp_path: Path) -> None:
    cpu = {"accelerator": "cpu"}
    found = diagnostics(tmp_path, spec(nnodes=2, nproc=2, distributed=cpu))
    assert [d.code for d in found if d.severity is Severity.ERROR] == ["MDC367"]
    compile_(
        tmp_path,
        spec(
            {"mode": "replicas"}, nnodes=2, nproc=2, distributed=cpu, parallelism={"tp": 2, "pp": 1}
        ),
    )


def test_unknown_keys_and_bad_modes_are_schema_errors(tmp_path: Path) -> None:
    found = diagnostics(tmp_path, spec({"mode": "mesh", "prot": 1}))
    assert {d.location.pointer for d in found} >= {"/vllm/mode", "/vllm/prot"}


# ------------------------------------------------------------ the Ray node script, run


STUB_RAY = """#!/usr/bin/env bash
echo "ray $*" >> "$STUB_LOG"
"""
#: answers each GPU-count question with the next line of $STUB_COUNTS (the last repeats)
STUB_PYTHON = """#!/usr/bin/env bash
echo "python3 VLLM_HOST_IP=$VLLM_HOST_IP" >> "$STUB_LOG"
n=$(cat "$STUB_COUNTS.n" 2>/dev/null || echo 1)
line=$(sed -n "${n}p" "$STUB_COUNTS")
[[ -n "$line" ]] || line=$(tail -n 1 "$STUB_COUNTS")
echo $((n + 1)) > "$STUB_COUNTS.n"
echo "noise on stdout"
echo "$line"
"""
STUB_VLLM = """#!/usr/bin/env bash
echo "vllm VLLM_HOST_IP=$VLLM_HOST_IP VLLM_DISTRIBUTED_BACKEND=$VLLM_DISTRIBUTED_BACKEND $*" \
  >> "$STUB_LOG"
"""


def run_node(
    tmp_path: Path,
    data: dict[str, Any],
    rank: int,
    counts: list[str],
    hosts: str = "127.0.0.1 127.0.0.2",
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    out = tmp_path / "out"
    write_tree(out, compile_(tmp_path, data).tree)
    stubs = tmp_path / "bin"
    stubs.mkdir(exist_ok=True)
    for name, text in (("ray", STUB_RAY), ("python3", STUB_PYTHON), ("vllm", STUB_VLLM)):
        (stubs / name).write_text(text, encoding="utf-8")
        (stubs / name).chmod(0o755)
    log = tmp_path / "calls.log"
    (tmp_path / "counts").write_text("\n".join(counts) + "\n", encoding="utf-8")
    env = {
        "PATH": f"{stubs}:{os.environ['PATH']}",
        "NODE_RANK": str(rank),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29650",
        "NODE_HOSTS": hosts,
        "STUB_LOG": str(log),
        "STUB_COUNTS": str(tmp_path / "counts"),
        "MDC_RESOLVE_SECONDS": "0",
    }
    done = subprocess.run(
        ["bash", str(out / "launch" / "worker.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    calls = log.read_text(encoding="utf-8").splitlines() if log.exists() else []
    return done, calls


RAY_2X2 = spec({"ray_wait_seconds": 30}, nnodes=2, nproc=2)


@pytest.mark.slow
def test_the_node_script_passes_bash_n_and_shellcheck(tmp_path: Path) -> None:
    script = tmp_path / "vllm-node.sh"
    script.write_text(file_of(compile_(tmp_path, RAY_2X2), "launch/vllm-node.sh"), encoding="utf-8")
    parsed = subprocess.run(
        ["bash", "-n", str(script)], capture_output=True, text=True, check=False
    )
    assert parsed.returncode == 0, parsed.stderr
    linted = subprocess.run(
        [shellcheck(), "--norc", "-S", "style", str(script)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert linted.returncode == 0, linted.stdout + linted.stderr


@pytest.mark.slow
def test_node_0_starts_the_head_waits_for_every_gpu_then_serves(tmp_path: Path) -> None:
    # Ray first reports 2 of the 4 GPUs (node 1 not there yet), then all 4
    done, calls = run_node(tmp_path, RAY_2X2, 0, ["2", "4"])
    assert done.returncode == 0, done.stderr
    assert calls[0] == ("ray start --head --node-ip-address=127.0.0.1 --port=29650 --num-gpus=2")
    assert calls[1:3] == ["python3 VLLM_HOST_IP=127.0.0.1"] * 2
    assert calls[3] == (
        "vllm VLLM_HOST_IP=127.0.0.1 VLLM_DISTRIBUTED_BACKEND=ray serve "
        f"{MODEL} --tensor-parallel-size 2 --pipeline-parallel-size 2 "
        "--host 0.0.0.0 --port 8000 --distributed-executor-backend ray"
    )
    assert calls[4:] == ["ray stop"]  # the EXIT trap stops Ray once the server is done


@pytest.mark.slow
def test_other_nodes_join_the_head_and_block(tmp_path: Path) -> None:
    done, calls = run_node(tmp_path, RAY_2X2, 1, ["0"])
    assert done.returncode == 0, done.stderr
    assert calls == [
        ("ray start --address=127.0.0.1:29650 --node-ip-address=127.0.0.2 --num-gpus=2 --block")
    ]


@pytest.mark.slow
def test_the_head_gives_up_after_ray_wait_seconds_with_a_clear_error(tmp_path: Path) -> None:
    data = spec({"ray_wait_seconds": 1}, nnodes=2, nproc=2)
    done, calls = run_node(tmp_path, data, 0, ["2"])
    assert done.returncode == 1
    assert "Ray reports 2 of 4 GPUs after 1 s" in done.stderr
    assert not any(c.startswith("vllm ") for c in calls)
    assert calls[-1] == "ray stop"


@pytest.mark.slow
def test_an_unresolvable_host_name_is_a_clear_error(tmp_path: Path) -> None:
    done, calls = run_node(tmp_path, RAY_2X2, 1, ["0"], hosts="127.0.0.1 no-such-host.invalid")
    assert done.returncode == 1
    assert "'no-such-host.invalid' (in NODE_HOSTS) has no IPv4 address after 0 s" in done.stderr
    assert calls == []


@pytest.mark.parametrize(("given", "refused"), [("2", False), ("3", True)])
def test_data_parallel_size_in_replicas_mode_is_each_nodes(
    tmp_path: Path, given: str, refused: bool
) -> None:
    """In replicas mode --data-parallel-size is each node's server's (4 GPUs / tp 2 = 2
    engines here), not [parallelism] dp: the same value is written once, another refused."""
    data = spec(
        {"mode": "replicas", "args": ["--data-parallel-size", given]},
        nnodes=2,
        nproc=4,
        parallelism={"tp": 2, "pp": 1},
    )
    if refused:
        found = [d for d in diagnostics(tmp_path, data) if d.is_error]
        assert [(d.code, d.location.pointer) for d in found] == [("MDC364", "/vllm/args/0")]
        assert "mdc writes '--data-parallel-size 2'" in found[0].message
        return
    (role,) = compile_(tmp_path, data).launch.roles
    assert [w for w in role.argv if w == "--data-parallel-size"] == ["--data-parallel-size"]
