"""trtllm's commands and files against TensorRT-LLM's own option definitions and recipes.

TensorRT-LLM does not install without a GPU, so the facts these tests need are read from
its source at a pinned commit into ``data/trtllm.json`` (the click options of
``trtllm-serve`` and ``trtllm-serve disaggregated``, the disaggregated config's keys, the
LLM API option fields, each with the file it comes from). From them the tests build real
click commands and parse every command the generated scripts run, found by running the
scripts with stub programs that record their arguments; the LLM API options files and the
disaggregated config are checked key by key and type by type. The examples taken from
TensorRT-LLM's documented recipes are compared with the documented commands and files,
option for option, as tests/conformance/test_serving_recipes.py does for vLLM and SGLang.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from pathlib import Path
from typing import Any

import click
import pytest
import yaml
from tests.tools import REPO

from mdc.emit import write_tree
from mdc.pipeline import Compiled, Compiler
from mdc.plugin_manager import load_plugins

FACTS = json.loads((Path(__file__).parent / "data" / "trtllm.json").read_text("utf-8"))
COMPILER = Compiler(load_plugins(autoload=False))
TYPES = {"str": click.STRING, "int": click.INT, "float": click.FLOAT}


def command(name: str) -> click.Command:
    """``trtllm-serve NAME`` rebuilt from the facts: the same option names, types, flags."""
    params: list[click.Parameter] = []
    if name == "serve":
        params.append(click.Argument([FACTS["serve"]["argument"]], type=click.STRING))
    for option in FACTS[name]["options"]:
        names = list(option["names"])
        if "dest" in option:
            names.append(option["dest"])
        kind = option["type"]
        if kind == "flag":
            params.append(click.Option(names, is_flag=True, default=False))
            continue
        value_type = click.Choice(option["choices"]) if kind == "choice" else TYPES[kind]
        params.append(
            click.Option(
                names,
                type=value_type,
                default=option.get("default"),
                multiple=option.get("multiple", False),
            )
        )
    return click.Command(name, params=params)


SERVE, DISAGGREGATED = command("serve"), command("disaggregated")


def parse(cmd: click.Command, args: list[str]) -> dict[str, Any]:
    """The values click gives the command's function (raises on what trtllm-serve refuses)."""
    with cmd.make_context(f"trtllm-serve {cmd.name}", list(args)) as ctx:
        return dict(ctx.params)


STUB = """#!/usr/bin/env bash
record="$RECORDS/$(date +%s%N)-$$"
if [[ "$(basename "$0")" == trtllm-serve && "${1:-}" == disaggregated ]]; then
  cp "$3" "$record.config"
fi
printf '%s\\0' "$(basename "$0")" "$@" > "$record"
"""


def run_nodes(tmp_path: Path, compiled: Compiled, hosts: list[str]) -> list[list[str]]:
    """Every program run by every node's scripts, as argv lists (stubs record them)."""
    out = tmp_path / "out"
    write_tree(out, compiled.tree)
    bin_dir, records = tmp_path / "bin", tmp_path / "records"
    bin_dir.mkdir()
    records.mkdir()
    for program in ("trtllm-serve", "srun"):
        (bin_dir / program).write_text(STUB, encoding="utf-8")
        (bin_dir / program).chmod(0o755)
    for node in range(compiled.plan.nnodes):
        env = {
            **{k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"},
            "PATH": f"{bin_dir}:{os.environ['PATH']}",
            "RECORDS": str(records),
            "NODE_RANK": str(node),
            "MASTER_ADDR": hosts[0],
            "MASTER_PORT": "29650",
            "NODE_HOSTS": " ".join(hosts),
        }
        subprocess.run(["bash", str(out / "launch" / "worker.sh")], env=env, check=True)
    runs = []
    for record in sorted(records.iterdir()):
        if record.suffix != ".config":
            runs.append(record.read_bytes().decode().split("\0")[:-1])
    return runs


def server_args(argv: list[str]) -> list[str]:
    """What trtllm-serve itself receives (after srun ... trtllm-llmapi-launch)."""
    if argv[0] == "srun":
        argv = argv[argv.index("trtllm-llmapi-launch") + 1 :]
    assert argv[0] == "trtllm-serve", argv
    return argv[1:]


def check_llm_options(data: dict[str, Any]) -> None:
    """Every key of an LLM API options file is a field, with the field's type."""
    fields = FACTS["llm_api_fields"]
    for key, value in data.items():
        assert key in fields, f"{key} is not an LLM API option mdc knows from llm_args.py"
        check_type(fields[key], value, key)


def check_type(kind: Any, value: Any, where: str) -> None:
    if isinstance(kind, dict):
        assert isinstance(value, dict), where
        for key, inner in value.items():
            assert key in kind, f"{where}.{key} is not a field"
            check_type(kind[key], inner, f"{where}.{key}")
    elif isinstance(kind, list):
        assert value in kind, f"{where} = {value!r} is not one of {kind}"
    else:
        python: dict[str, type | tuple[type, ...]] = {
            "int": int,
            "float": (int, float),
            "bool": bool,
            "str": str,
            "list": list,
            "dict": dict,
        }
        assert isinstance(value, python[kind]), f"{where} = {value!r} is not {kind}"
        assert kind != "int" or not isinstance(value, bool), where


def check_disagg_config(data: dict[str, Any]) -> None:
    """The keys extract_disagg_cfg and extract_ctx_gen_cfgs read, and their URL rule."""
    rules = FACTS["disagg_config"]
    for key, value in data.items():
        assert key in rules["top_level"], key
        check_type(rules["top_level"][key], value, key)
    for section in ("context_servers", "generation_servers"):
        servers = data[section]
        for key in servers:
            assert key in rules["server_section"] or key in FACTS["llm_api_fields"], key
        assert len(servers["urls"]) == servers["num_instances"]
        for url in servers["urls"]:
            host, port = url.split(":")  # as extract_ctx_gen_cfgs unpacks it
            assert host and int(port) > 0


def option_file(args: dict[str, Any]) -> dict[str, Any]:
    path = args["extra_llm_api_options"]
    if path is None:
        return {}
    data: dict[str, Any] = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    return data


EXAMPLES = sorted(p for p in (REPO / "examples").glob("trtllm-*.toml"))


def test_there_are_trtllm_examples() -> None:
    names = [p.name for p in EXAMPLES]
    assert any("disagg" in n for n in names) and any("disagg" not in n for n in names)


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_every_command_and_file_of_an_example_is_one_trtllm_serve_takes(
    tmp_path: Path, path: Path
) -> None:
    compiled = COMPILER.compile(path)
    hosts = [f"node{i}" for i in range(compiled.plan.nnodes)]
    runs = run_nodes(tmp_path, compiled, hosts)
    assert runs
    for argv in runs:
        args = server_args(argv)
        if args[0] == "disaggregated":
            parsed = parse(DISAGGREGATED, args[1:])
            configs = sorted((tmp_path / "records").glob("*.config"))
            assert parsed["config_file"] and configs
            check_disagg_config(yaml.safe_load(configs[0].read_text(encoding="utf-8")))
            continue
        parsed = parse(SERVE, args)
        check_llm_options(option_file(parsed))


def test_the_rebuilt_parsers_refuse_what_trtllm_serve_refuses() -> None:
    with pytest.raises(click.NoSuchOption):
        parse(SERVE, ["m", "--tensor-parallel-size", "2"])  # vLLM's spelling
    with pytest.raises(click.BadParameter):
        parse(SERVE, ["m", "--tp_size", "two"])
    with pytest.raises(click.BadParameter):
        parse(SERVE, ["m", "--backend", "vllm"])
    with pytest.raises(AssertionError):
        check_llm_options({"enable_attention_dp": "yes"})
    with pytest.raises(AssertionError):
        check_disagg_config(
            {"context_servers": {"num_instances": 2, "urls": ["a:1"]}, "generation_servers": {}}
        )


def effective(args: dict[str, Any]) -> dict[str, Any]:
    """The LLM API arguments trtllm-serve builds: its options (get_llm_args), then the
    options file's keys over them (update_llm_args_with_extra_dict: llm_args | file)."""
    llm: dict[str, Any] = {}
    for option in FACTS["serve"]["options"]:
        target = option.get("llm_arg")
        if target is None:
            continue
        value = args[option["names"][0].lstrip("-")]
        if target == "kv_cache_config.free_gpu_memory_fraction":
            llm["kv_cache_config"] = {"free_gpu_memory_fraction": value}
        else:
            llm[target] = value
    for flag, target in FACTS["serve"]["llm_args_also"].items():
        llm[target] = args[flag.lstrip("-")]
    if llm.get("moe_expert_parallel_size") is None:
        llm["moe_expert_parallel_size"] = 1  # mapping.py: unset ep is 1 (moe_tp = tp)
    return llm | option_file(args)


def documented(text: str, **files: str) -> dict[str, Any]:
    """A documented ``trtllm-serve`` command (its ``${VAR}`` files given), parsed."""
    words = shlex.split(text.replace("\\\n", " "))
    for name, path in files.items():
        words = [path if w == f"${{{name}}}" else w for w in words]
    assert words[0] == "trtllm-serve"
    return parse(SERVE, words[1:])


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


# docs/source/deployment-guide/quick-start-recipe-for-llama3.3-70b-on-trtllm.md
LLAMA_COMMAND = """trtllm-serve nvidia/Llama-3.3-70B-Instruct-FP8 \\
    --host 0.0.0.0 \\
    --port 8000 \\
    --max_batch_size 1024 \\
    --max_num_tokens 2048 \\
    --max_seq_len 2048 \\
    --kv_cache_free_gpu_memory_fraction 0.9 \\
    --tp_size 1 \\
    --ep_size 1 \\
    --trust_remote_code \\
    --extra_llm_api_options ${EXTRA_LLM_API_FILE}"""
LLAMA_FILE = """enable_attention_dp: false
cuda_graph_config:
  enable_padding: true
  max_batch_size: 1024
kv_cache_config:
  dtype: fp8
"""
# docs/source/deployment-guide/quick-start-recipe-for-deepseek-r1-on-trtllm.md (FP8 model)
DEEPSEEK_COMMAND = """trtllm-serve deepseek-ai/DeepSeek-R1-0528 \\
    --host 0.0.0.0 \\
    --port 8000 \\
    --backend pytorch \\
    --max_batch_size 1024 \\
    --max_num_tokens 3200 \\
    --max_seq_len 2048 \\
    --kv_cache_free_gpu_memory_fraction 0.8 \\
    --tp_size 8 \\
    --ep_size 8 \\
    --trust_remote_code \\
    --extra_llm_api_options ${EXTRA_LLM_API_FILE}"""
DEEPSEEK_FILE = """enable_attention_dp: true
cuda_graph_config:
  enable_padding: true
  max_batch_size: 128
kv_cache_config:
  dtype: fp8
stream_interval: 10
speculative_config:
  decoding_type: MTP
  num_nextn_predict_layers: 1
moe_config:
  backend: DEEPGEMM
  max_num_tokens: 3200
"""


@pytest.mark.parametrize(
    ("example", "text", "file"),
    [
        ("trtllm-llama33-70b-1x8.toml", LLAMA_COMMAND, LLAMA_FILE),
        ("trtllm-deepseek-r1-1x8.toml", DEEPSEEK_COMMAND, DEEPSEEK_FILE),
    ],
)
def test_the_aggregated_examples_are_the_documented_recipes(
    tmp_path: Path, example: str, text: str, file: str
) -> None:
    compiled = COMPILER.compile(REPO / "examples" / example)
    runs = run_nodes(tmp_path, compiled, ["node0"])
    ours = [parse(SERVE, server_args(argv)) for argv in runs]
    theirs = documented(text, EXTRA_LLM_API_FILE=write(tmp_path, "config.yml", file))
    # the options file, key for key; the command, option for option (the port aside:
    # replicas side by side take 8000, 8001, ...; the recipe runs one server)
    first = min(ours, key=lambda args: args["port"])
    assert option_file(first) == option_file(theirs)
    for args in ours:
        mine = {k: v for k, v in args.items() if k not in ("port", "extra_llm_api_options")}
        doc = {k: v for k, v in theirs.items() if k not in ("port", "extra_llm_api_options")}
        if mine["moe_expert_parallel_size"] is None:  # mapping.py: unset ep is 1
            mine["moe_expert_parallel_size"] = 1
        assert mine == doc
        assert effective(args) == effective(theirs)
    assert first["port"] == theirs["port"]


# examples/models/core/exaone/README.md, "Running Disaggregated TensorRT LLM Server"
EXAONE_CONTEXT = """backend: pytorch
trust_remote_code: true
disable_overlap_scheduler: true
enable_chunked_prefill: true

tensor_parallel_size: 4
moe_expert_parallel_size: 4
pipeline_parallel_size: 1
enable_attention_dp: true

cache_transceiver_config:
  backend: UCX
  max_tokens_in_buffer: 8192
"""
EXAONE_GENERATION = EXAONE_CONTEXT.replace(
    "disable_overlap_scheduler: true", "disable_overlap_scheduler: false"
)
EXAONE_SERVERS = {
    "context": "trtllm-serve $HF_MODEL_DIR --host localhost --port 8001 --enable_chunked_prefill "
    "--extra_llm_api_options ${CTX}",
    "generation": "trtllm-serve $HF_MODEL_DIR --host localhost --port 8002 "
    "--enable_chunked_prefill --extra_llm_api_options ${GEN}",
}
EXAONE_CONFIG = {
    "hostname": "localhost",
    "port": 8000,
    "backend": "pytorch",
    "context_servers": {"num_instances": 1, "urls": ["localhost:8001"]},
    "generation_servers": {"num_instances": 1, "urls": ["localhost:8002"]},
}


def test_the_disaggregated_example_is_the_documented_one(tmp_path: Path) -> None:
    compiled = COMPILER.compile(REPO / "examples" / "trtllm-disagg-1x8.toml")
    runs = run_nodes(tmp_path, compiled, ["localhost"])
    files = {
        "CTX": write(tmp_path, "ctx.yaml", EXAONE_CONTEXT),
        "GEN": write(tmp_path, "gen.yaml", EXAONE_GENERATION),
    }
    servers = [server_args(argv) for argv in runs if server_args(argv)[0] != "disaggregated"]
    assert len(servers) == 2
    ours = sorted((parse(SERVE, args) for args in servers), key=lambda a: a["port"])
    for args, role in zip(ours, ("context", "generation"), strict=True):
        theirs = documented(
            EXAONE_SERVERS[role].replace("$HF_MODEL_DIR", compiled.plan.job.name), **files
        )
        mine, doc = effective(args), effective(theirs)
        # the LLM API arguments each server is built with are the documented ones; the
        # model (the recipe's $HF_MODEL_DIR) and the host (the recipe's localhost; mdc
        # listens on every interface so that other nodes reach the server) aside
        assert mine == doc, role
        assert args["port"] == theirs["port"]
    (config_file,) = sorted((tmp_path / "records").glob("*.config"))
    config = yaml.safe_load(config_file.read_text(encoding="utf-8"))
    # the documented config with the host mdc listens on, and without the top-level
    # "backend: pytorch", which extract_disagg_cfg only copies into both server sections
    # (read when the servers are started by disaggregated_mpi_worker, which mdc does not use)
    expected = {k: v for k, v in EXAONE_CONFIG.items() if k != "backend"}
    assert config == expected | {"hostname": "0.0.0.0"}
    check_disagg_config(config)
    gpus = {s.role: s.first_gpu for s in compiled.launch.servers}
    assert gpus == {"proxy": 0, "context": 0, "generation": 4}
    assert sum(s.gpus for s in compiled.launch.servers) == 8
