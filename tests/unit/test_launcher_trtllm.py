"""The trtllm launcher: trtllm-serve's command, its servers on the nodes, its findings.

Specs are compiled in-process through mdc's own pipeline. The generated node scripts are
run for real with stub programs on PATH (trtllm-serve, srun) that record their arguments
and environment. The flag names against trtllm-serve's own click options are checked in
tests/conformance/test_serving_trtllm.py.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from tests.tools import shellcheck

from mdc.emit import write_tree
from mdc.errors import Diagnostic, SpecError
from mdc.pipeline import Compiled, Compiler
from mdc.plan.memory import GIB
from mdc.plugin_manager import load_plugins

COMPILER = Compiler(load_plugins(autoload=False))
MODEL = "org/some-model"
#: meta-llama/Llama-3.1-8B's config.json (huggingface.co/meta-llama/Llama-3.1-8B)
LLAMA_8B = {
    "num_layers": 32,
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_query_groups": 8,
    "ffn_hidden_size": 14336,
    "vocab_size": 128256,
    "seq_length": 8192,
    "gated_mlp": True,
    "tied_embeddings": False,
    "position_embedding": "rope",
}


def spec(
    trtllm: dict[str, Any] | None = None,
    *,
    nnodes: int = 1,
    nproc: int = 8,
    backend: str = "local",
    **extra: Any,
) -> dict[str, Any]:
    data: dict[str, Any] = {
        "job": {"name": "trtllm-unit", "command": ["trtllm-serve"], "image": "img:1"},
        "distributed": {
            "launcher": "trtllm",
            "backend": backend,
            "nnodes": nnodes,
            "nproc_per_node": nproc,
            "master_port": 29650,
        },
        "trtllm": {"model": MODEL, **(trtllm or {})},
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


def codes(found: list[Diagnostic]) -> list[str]:
    return sorted(d.code for d in found if d.is_error)


STUB = """#!/usr/bin/env bash
printf '%s\\n' "$(basename "$0") CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-} $*" >> "$RECORD"
"""


def run_node(tmp_path: Path, compiled: Compiled, node: int, hosts: list[str]) -> list[str]:
    """Run node ``node``'s launch/worker.sh with stub programs; the lines they recorded."""
    out = tmp_path / "out"
    write_tree(out, compiled.tree)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name in ("trtllm-serve", "srun"):
        (bin_dir / name).write_text(STUB, encoding="utf-8")
        (bin_dir / name).chmod(0o755)
    record = tmp_path / f"record-{node}"
    env = {
        **{k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"},
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "RECORD": str(record),
        "NODE_RANK": str(node),
        "MASTER_ADDR": hosts[0],
        "MASTER_PORT": "29650",
        "NODE_HOSTS": " ".join(hosts),
    }
    subprocess.run(["bash", str(out / "launch" / "worker.sh")], env=env, check=True)
    return sorted(record.read_text(encoding="utf-8").splitlines()) if record.exists() else []


def test_one_server_on_one_node_is_trtllm_serve_with_the_plan_sizes(tmp_path: Path) -> None:
    compiled = compile_(
        tmp_path,
        spec({"max_batch_size": 64, "max_num_tokens": 4096, "args": ["--trust_remote_code"]}),
    )
    (role,) = compiled.launch.roles
    assert role.argv == (
        "trtllm-serve",
        MODEL,
        "--host",
        "0.0.0.0",
        "--tp_size",
        "8",
        "--pp_size",
        "1",
        "--max_batch_size",
        "64",
        "--max_num_tokens",
        "4096",
        "--trust_remote_code",
        "--port",
        "8000",
    )
    assert compiled.launch.files == ()  # nothing to write: no LLM API option set
    (server,) = compiled.launch.servers
    assert (server.role, server.gpus, server.nodes, server.port) == ("server", 8, (0,), 8000)


def test_servers_side_by_side_each_get_their_gpus_and_port(tmp_path: Path) -> None:
    compiled = compile_(
        tmp_path, spec({"port": 9000}, nnodes=2, parallelism={"tp": 2, "pp": 1}, nproc=4)
    )
    # 2 nodes x 2 servers of 2 GPUs: every GPU of the plan is some server's, none twice
    placed = [(s.nodes, s.first_gpu, s.gpus, s.port) for s in compiled.launch.servers]
    assert placed == [
        ((0,), 0, 2, 9000),
        ((0,), 2, 2, 9001),
        ((1,), 0, 2, 9000),
        ((1,), 2, 2, 9001),
    ]
    assert sum(s.gpus for s in compiled.launch.servers) == compiled.plan.world_size
    lines = run_node(tmp_path, compiled, 1, ["n0", "n1"])
    words = f"{MODEL} --host 0.0.0.0 --tp_size 2 --pp_size 1"
    assert lines == [
        f"trtllm-serve CUDA_VISIBLE_DEVICES=0,1 {words} --port 9000",
        f"trtllm-serve CUDA_VISIBLE_DEVICES=2,3 {words} --port 9001",
    ]
    script = tmp_path / "out" / "launch" / "trtllm-node.sh"
    subprocess.run([shellcheck(), str(script)], check=True)


def test_a_server_over_two_nodes_is_one_srun_mpi_step_on_slurm(tmp_path: Path) -> None:
    compiled = compile_(
        tmp_path,
        spec(nnodes=4, backend="slurm", parallelism={"tp": 16, "pp": 1, "ep": 16}),
    )
    assert [s.nodes for s in compiled.launch.servers] == [(0, 1), (2, 3)]
    hosts = ["a", "b", "c", "d"]
    assert run_node(tmp_path, compiled, 3, hosts) == []  # its ranks run in node 2's step
    (line,) = run_node(tmp_path, compiled, 2, hosts)
    assert line == (
        "srun CUDA_VISIBLE_DEVICES= --overlap --mpi=pmix --kill-on-bad-exit=1 --nodes=2 "
        "--ntasks=16 --ntasks-per-node=8 --nodelist=c,d trtllm-llmapi-launch trtllm-serve "
        f"{MODEL} --host 0.0.0.0 --tp_size 16 --pp_size 1 --ep_size 16 --port 8000"
    )


@pytest.mark.parametrize("backend", ["local", "ssh", "kubernetes", "leaderworkerset"])
def test_a_server_over_nodes_is_refused_without_an_mpi_launcher(
    tmp_path: Path, backend: str
) -> None:
    data = spec(nnodes=2, backend=backend, parallelism={"tp": 16, "pp": 1})
    if backend == "ssh":
        data["ssh"] = {"hosts": ["h0", "h1"]}
    found = diagnostics(tmp_path, data)
    (mpi,) = [d for d in found if d.code == "MDC705"]
    assert backend in mpi.message and "MPI" in mpi.message


def test_attention_dp_and_llm_api_options_go_to_one_yaml_file(tmp_path: Path) -> None:
    compiled = compile_(
        tmp_path,
        spec(
            {
                "enable_attention_dp": True,
                "extra_llm_api_options": {"kv_cache_config": {"dtype": "fp8"}},
            },
            parallelism={"tp": 8, "ep": 8},
        ),
    )
    (role,) = compiled.launch.roles
    at = role.argv.index("--extra_llm_api_options")
    assert "--ep_size" in role.argv
    (extra,) = [a for a in compiled.launch.files if a.path.endswith(".yaml")]
    import yaml

    assert yaml.safe_load(extra.data) == {
        "kv_cache_config": {"dtype": "fp8"},
        "enable_attention_dp": True,
    }
    assert at > 0


def test_owned_flags_in_args_are_read_as_their_keys(tmp_path: Path) -> None:
    compiled = compile_(
        tmp_path,
        spec(
            {
                "max_batch_size": 32,
                "args": [
                    "--max_batch_size=32",
                    "--free_gpu_memory_fraction",
                    "0.5",
                    "--tp_size",
                    "8",
                ],
            }
        ),
    )
    (role,) = compiled.launch.roles
    argv = list(role.argv)
    # each once, in mdc's spelling; the alias read as the key it stands for
    assert argv.count("--max_batch_size") == 1 and "--max_batch_size=32" not in argv
    assert argv.count("--tp_size") == 1
    assert argv[argv.index("--kv_cache_free_gpu_memory_fraction") + 1] == "0.5"
    assert "--free_gpu_memory_fraction" not in argv


def test_a_flag_that_contradicts_its_key_is_refused_naming_both(tmp_path: Path) -> None:
    found = diagnostics(
        tmp_path,
        spec({"max_batch_size": 32, "args": ["--max_batch_size", "64", "--pp_size", "2"]}),
    )
    clash = [d for d in found if d.code == "MDC703"]
    assert len(clash) == 2
    assert any("64" in d.message and "max_batch_size = 32" in d.message for d in clash)
    assert any("--pp_size 2" in d.message and "pp 1" in d.message for d in clash)


def test_a_second_llm_api_options_file_is_refused(tmp_path: Path) -> None:
    found = diagnostics(
        tmp_path, spec({"enable_attention_dp": True, "args": ["--config", "mine.yaml"]})
    )
    assert codes(found) == ["MDC708"]
    # without a file of mdc's, the user's own passes through
    compiled = compile_(tmp_path, spec({"args": ["--config", "mine.yaml"]}))
    assert compiled.launch.roles[0].argv[-4:] == ("--config", "mine.yaml", "--port", "8000")


@pytest.mark.parametrize(
    ("sizes", "nproc", "code"),
    [
        ({"tp": 8, "pp": 1, "ep": 16}, 8, "MDC702"),  # Mapping: moe_tp x moe_ep = tp
        ({"tp": 4, "pp": 1}, 6, "MDC701"),  # 4 GPUs neither divide 6 nor are whole nodes
        ({"tp": 4, "pp": 1, "cp": 2}, 8, "MDC704"),
    ],
)
def test_sizes_trtllm_refuses_are_refused_first(
    tmp_path: Path, sizes: dict[str, int], nproc: int, code: str
) -> None:
    found = diagnostics(tmp_path, spec(nnodes=2, nproc=nproc, parallelism=sizes))
    assert code in codes(found)
    (finding,) = [d for d in found if d.code == code][:1]
    assert finding.hint


def test_a_missing_model_and_an_elastic_job_are_refused(tmp_path: Path) -> None:
    data = spec(nnodes=2)
    del data["trtllm"]["model"]
    data["distributed"]["min_nnodes"] = 1
    assert {"MDC700", "MDC707"} <= set(codes(diagnostics(tmp_path, data)))


def test_the_memory_estimate_takes_the_fraction_of_what_the_weights_leave(
    tmp_path: Path,
) -> None:
    data = spec(
        {"kv_cache_free_gpu_memory_fraction": 0.5, "max_seq_len": 8192},
        nproc=1,
        distributed={"accelerator_memory_gib": 80},
        model=LLAMA_8B,
    )
    memory = compile_(tmp_path, data).plan.serving_memory
    assert memory is not None and memory.engine == "TensorRT-LLM"
    # Llama-3.1-8B in bf16: 8.03e9 parameters x 2 bytes; half of what they leave of 80 GiB
    assert memory.weights == pytest.approx(8.03e9 * 2, rel=0.01)
    # and of the activations of the step it profiles first: 8192 tokens (max_num_tokens'
    # default) x (2 x 4096 + 3 x 14336) bf16 elements
    assert memory.workspace == 8192 * (2 * 4096 + 3 * 14336) * 2
    left = 80 * GIB - memory.weights - memory.workspace
    assert memory.cache == pytest.approx(0.5 * left, abs=1)
    # 32 layers x 8 KV heads x 128 x 2 (K and V) x 2 bytes per token
    assert memory.kv_per_token == 32 * 8 * 128 * 2 * 2
    assert memory.max_len == 8192


def disagg(context: dict[str, Any], generation: dict[str, Any], **more: Any) -> dict[str, Any]:
    return {"context": context, "generation": generation, **more}


CONFIG_STUB = """#!/usr/bin/env bash
if [[ "$1" == disaggregated ]]; then cp "$3" "$RECORD.config"; fi
printf '%s\\n' "$(basename "$0") CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-} $*" >> "$RECORD"
"""


def test_disaggregated_servers_and_the_proxy_config_on_one_node(tmp_path: Path) -> None:
    import yaml

    compiled = compile_(
        tmp_path,
        spec(
            disagg(
                {"servers": 2, "tp_size": 2, "max_num_tokens": 8192},
                {"servers": 1, "tp_size": 4, "args": ["--ep_size", "4"]},
                cache_transceiver_backend="UCX",
            )
        ),
    )
    roles = [(s.role, s.nodes, s.first_gpu, s.gpus, s.port) for s in compiled.launch.servers]
    assert roles == [
        ("proxy", (0,), 0, 0, 8000),  # trtllm-serve disaggregated needs no GPU
        ("context", (0,), 0, 2, 8001),
        ("context", (0,), 2, 2, 8002),
        ("generation", (0,), 4, 4, 8003),
    ]
    assert sum(s.gpus for s in compiled.launch.servers) == compiled.plan.world_size
    (bin_dir := tmp_path / "bin").mkdir()
    (bin_dir / "trtllm-serve").write_text(CONFIG_STUB, encoding="utf-8")
    (bin_dir / "trtllm-serve").chmod(0o755)
    out = tmp_path / "out"
    write_tree(out, compiled.tree)
    record = tmp_path / "record"
    env = {
        **{k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"},
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "RECORD": str(record),
        "NODE_RANK": "0",
        "MASTER_ADDR": "box",
        "MASTER_PORT": "29650",
        "NODE_HOSTS": "box",
    }
    subprocess.run(["bash", str(out / "launch" / "worker.sh")], env=env, check=True)
    lines = sorted(record.read_text(encoding="utf-8").splitlines())
    ctx_file = f"{out}/launch/trtllm-context.yaml"
    assert lines[0] == "trtllm-serve CUDA_VISIBLE_DEVICES= disaggregated -c " + lines[0].split()[-1]
    assert lines[1:] == [
        f"trtllm-serve CUDA_VISIBLE_DEVICES=0,1 {MODEL} --host 0.0.0.0 --tp_size 2 --pp_size 1 "
        f"--max_num_tokens 8192 --extra_llm_api_options {ctx_file} --port 8001",
        f"trtllm-serve CUDA_VISIBLE_DEVICES=2,3 {MODEL} --host 0.0.0.0 --tp_size 2 --pp_size 1 "
        f"--max_num_tokens 8192 --extra_llm_api_options {ctx_file} --port 8002",
        f"trtllm-serve CUDA_VISIBLE_DEVICES=4,5,6,7 {MODEL} --host 0.0.0.0 --tp_size 4 "
        f"--pp_size 1 --ep_size 4 --extra_llm_api_options {out}/launch/trtllm-generation.yaml "
        "--port 8003",
    ]
    config = yaml.safe_load((tmp_path / "record.config").read_text(encoding="utf-8"))
    assert config == {
        "hostname": "0.0.0.0",
        "port": 8000,
        "context_servers": {"num_instances": 2, "urls": ["box:8001", "box:8002"]},
        "generation_servers": {"num_instances": 1, "urls": ["box:8003"]},
    }
    context = yaml.safe_load((out / "launch" / "trtllm-context.yaml").read_text("utf-8"))
    assert context == {
        "disable_overlap_scheduler": True,
        "cache_transceiver_config": {"backend": "UCX"},
    }
    subprocess.run([shellcheck(), str(out / "launch" / "trtllm-disagg.sh")], check=True)


def test_disaggregated_servers_over_nodes_run_as_srun_steps(tmp_path: Path) -> None:
    compiled = compile_(
        tmp_path,
        spec(
            disagg({"servers": 1, "tp_size": 8}, {"servers": 1, "tp_size": 16}),
            nnodes=3,
            backend="slurm",
        ),
    )
    placed = [(s.role, s.nodes, s.gpus) for s in compiled.launch.servers]
    assert placed == [("proxy", (0,), 0), ("context", (0,), 8), ("generation", (1, 2), 16)]
    hosts = ["a", "b", "c"]
    assert run_node(tmp_path, compiled, 2, hosts) == []
    (line,) = run_node(tmp_path, compiled, 1, hosts)
    assert line.startswith(
        "srun CUDA_VISIBLE_DEVICES= --overlap --mpi=pmix --kill-on-bad-exit=1 --nodes=2 "
        "--ntasks=16 --ntasks-per-node=8 --nodelist=b,c trtllm-llmapi-launch trtllm-serve "
        f"{MODEL} --host 0.0.0.0 --tp_size 16 --pp_size 1"
    )
    assert line.endswith("--port 8002")


@pytest.mark.parametrize(
    ("context", "generation", "code"),
    [
        ({"servers": 1, "tp_size": 2}, {"servers": 1, "tp_size": 2}, "MDC712"),  # 4 of 8 GPUs
        ({"servers": 1, "tp_size": 6}, {"servers": 1, "tp_size": 2, "pp_size": 5}, "MDC711"),
        # inside a node: GPUs 6..9 would cross node 0's edge
        ({"servers": 1, "tp_size": 6}, {"servers": 1, "tp_size": 4}, "MDC711"),
        ({"servers": 1, "tp_size": 4, "ep_size": 3}, {"servers": 1, "tp_size": 4}, "MDC713"),
        ({"servers": 1, "tp_size": 4, "args": ["--tp_size", "2"]}, {"tp_size": 4}, "MDC703"),
    ],
)
def test_disaggregated_layouts_trtllm_or_mdc_cannot_place_are_refused(
    tmp_path: Path, context: dict[str, Any], generation: dict[str, Any], code: str
) -> None:
    found = diagnostics(tmp_path, spec(disagg(context, generation)))
    assert code in codes(found), found


def test_one_role_table_alone_is_refused(tmp_path: Path) -> None:
    found = diagnostics(tmp_path, spec({"context": {"servers": 1, "tp_size": 8}}))
    assert codes(found) == ["MDC710"]


def test_a_kv_cache_config_in_the_options_file_replaces_the_command_lines_fraction(
    tmp_path: Path,
) -> None:
    # trtllm-serve merges the file over its own arguments key by key (llm_args | file):
    # kv_cache_config replaces the KvCacheConfig built from the command line's fraction
    options = {
        "kv_cache_free_gpu_memory_fraction": 0.5,
        "extra_llm_api_options": {"kv_cache_config": {"dtype": "fp8"}},
    }
    data = spec(options, nproc=1, distributed={"accelerator_memory_gib": 80}, model=LLAMA_8B)
    compiled = compile_(tmp_path, data)
    (warning,) = [d for d in compiled.diagnostics if d.code == "MDC709"]
    assert "0.5 has no effect" in warning.message and "keeps 0.9" in warning.message
    memory = compiled.plan.serving_memory
    assert memory is not None and memory.share == 0.9 and memory.kv_dtype == "fp8"
    options["extra_llm_api_options"] = {"kv_cache_config": {"free_gpu_memory_fraction": 0.5}}
    compiled = compile_(tmp_path, spec(options, nproc=1))
    assert not [d for d in compiled.diagnostics if d.code == "MDC709"]


def test_the_server_map_draws_each_role(tmp_path: Path) -> None:
    from mdc.rankmap import rank_map_svg

    compiled = compile_(
        tmp_path,
        spec(disagg({"servers": 2, "tp_size": 2}, {"servers": 1, "tp_size": 4})),
    )
    svg = rank_map_svg(compiled.plan, compiled.launch.servers)
    # three GPU servers drawn, the proxy named beside them (it has no GPU)
    assert "3 server(s), proxy on node 0" in svg
    for label in ("context 0", "context 1", "generation 0"):
        assert label in svg


def test_a_disaggregated_job_is_estimated_by_its_tighter_role(tmp_path: Path) -> None:
    data = spec(
        disagg(
            {"servers": 1, "tp_size": 4, "kv_cache_free_gpu_memory_fraction": 0.8},
            {"servers": 2, "tp_size": 2, "kv_cache_free_gpu_memory_fraction": 0.6},
        ),
        distributed={"accelerator_memory_gib": 80},
        model=LLAMA_8B,
    )
    memory = compile_(tmp_path, data).plan.serving_memory
    assert memory is not None and memory.engine == "TensorRT-LLM (generation)"
    # a generation server of tp 2: half of each layer, 4 of the 8 KV heads per GPU
    assert memory.kv_per_token == 32 * 4 * 128 * 2 * 2
    # the step's activations hold half the MLP intermediate per GPU
    assert memory.workspace == 8192 * (2 * 4096 + 3 * 14336 // 2) * 2
    left = 80 * GIB - memory.weights - memory.workspace
    assert memory.cache == pytest.approx(0.6 * left, abs=1)


def test_a_disaggregated_job_reads_the_generation_servers_cuda_graphs(tmp_path: Path) -> None:
    """The tokens wait for the generation servers' steps: their cuda_graph_config sets the
    largest batch replayed in a graph, even where the context servers (two of tp 2) are the
    tighter ones; the context servers' config (prefill steps, never replayed) does not."""
    padded = {"cuda_graph_config": {"enable_padding": True, "max_batch_size": 256}}
    data = spec(
        disagg(
            {"servers": 2, "tp_size": 2, "extra_llm_api_options": {"cuda_graph_config": None}},
            {"servers": 1, "tp_size": 4, "extra_llm_api_options": padded},
        ),
        distributed={"accelerator_memory_gib": 80},
        model=LLAMA_8B,
    )
    memory = compile_(tmp_path, data).plan.serving_memory
    assert memory is not None and memory.engine == "TensorRT-LLM (context)"
    assert memory.cuda_graphs is True and memory.graph_batch == 256


def test_a_size_flag_in_the_shared_args_of_a_disaggregated_job_is_refused(
    tmp_path: Path,
) -> None:
    data = spec(
        disagg({"tp_size": 4}, {"tp_size": 4}, args=["--tp_size", "4", "--max_batch_size", "8"])
    )
    found = diagnostics(tmp_path, data)
    (size,) = [d for d in found if d.code == "MDC703"]
    assert "--tp_size" in size.message and size.location.pointer == "/trtllm/args/0"
