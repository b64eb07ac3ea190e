"""The serving launchers' command lines, parsed as vLLM's and SGLang's own CLIs would.

vLLM and SGLang cannot be installed here (both pull a CUDA build of torch), so their
parsers are rebuilt below from a table of the real flags, each entry taken from the
projects' source (cited per table). Every emitted command of every vllm/sglang example
(and of a few more specs) is parsed with ``allow_abbrev=False`` and no unknown flag
allowed, and the parsed values are compared with the plan. The generated scripts also
pass ``bash -n`` and shellcheck.
"""

from __future__ import annotations

import argparse
import importlib
import json
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from tests.tools import REPO, shellcheck

from mdc.api import Concat, Ref, Word
from mdc.emit import write_tree
from mdc.pipeline import Compiled, Compiler
from mdc.plugin_manager import load_plugins

OTHERS = (
    "torchrun",
    "basic",
    "deepspeed",
    "megatron",
    "torchtitan",
    "primus",
    "sglang_disagg",
    "ssh",
    "kubernetes",
    "pytorchjob",
    "trainjob",
    "leaderworkerset",
)
COMPILER = Compiler(load_plugins(autoload=False, blocked=OTHERS))

#: (flags, kind, extra): kind "value" takes one value (converted by extra, a type, or
#: checked against extra, a list of choices), "switch" takes none, "list" one or more.
Flag = tuple[tuple[str, ...], str, Any]

#: vLLM's server CLI, as `vllm serve` builds it:
#: - vllm/entrypoints/cli/serve.py (ServeSubcommand.subparser_init): the optional
#:   positional `model_tag`, then make_arg_parser;
#: - vllm/entrypoints/openai/cli_args.py (make_arg_parser / FrontendArgs): --host (str,
#:   default None = every interface), --port (int, default 8000);
#: - vllm/engine/arg_utils.py (EngineArgs.add_cli_args, the ParallelConfig group):
#:   "--distributed-executor-backend" (choices of DistributedExecutorBackend),
#:   "--pipeline-parallel-size", "-pp"; "--tensor-parallel-size", "-tp";
#:   "--data-parallel-size", "-dp"; the ModelConfig group: --model, --max-model-len,
#:   --served-model-name (nargs "+"), --seed; the CacheConfig group:
#:   --gpu-memory-utilization (float), --kv-cache-dtype; the data-parallel flags of the
#:   ParallelConfig group: "--data-parallel-rank" "-dpn", "--data-parallel-start-rank"
#:   "-dpr", "--data-parallel-size-local" "-dpl", "--data-parallel-address" "-dpa" (str),
#:   "--data-parallel-rpc-port" "-dpp" (int), "--enable-expert-parallel" "-ep" (a switch),
#:   "--data-parallel-backend" "-dpb" (choices mp, ray);
#: - vllm/entrypoints/openai/cli_args.py (make_arg_parser): "--headless" (a switch),
#:   "--api-server-count" "-asc" (int), which ServeSubcommand.cmd refuses with --headless
#:   (vllm/entrypoints/cli/serve.py);
#: - vllm/config/scheduler.py (SchedulerConfig, the flags' SchedulerConfig group):
#:   --max-num-batched-tokens and --max-num-seqs (int, >= 1), which mdc tune writes.
VLLM_FLAGS: list[Flag] = [
    (("--model",), "value", str),
    (("--host",), "value", str),
    (("--port",), "value", int),
    (("--tensor-parallel-size", "-tp"), "value", int),
    (("--pipeline-parallel-size", "-pp"), "value", int),
    (("--data-parallel-size", "-dp"), "value", int),
    (("--distributed-executor-backend",), "value", ["ray", "mp", "uni", "external_launcher"]),
    (("--max-model-len",), "value", str),
    (("--served-model-name",), "list", str),
    (("--seed",), "value", int),
    (("--gpu-memory-utilization",), "value", float),
    (("--kv-cache-dtype",), "value", str),
    (("--trust-remote-code",), "switch", None),
    (("--data-parallel-rank", "-dpn"), "value", int),
    (("--data-parallel-start-rank", "-dpr"), "value", int),
    (("--data-parallel-size-local", "-dpl"), "value", int),
    (("--data-parallel-address", "-dpa"), "value", str),
    (("--data-parallel-rpc-port", "-dpp"), "value", int),
    (("--enable-expert-parallel", "-ep"), "switch", None),
    (("--data-parallel-backend", "-dpb"), "value", ["mp", "ray"]),
    (("--headless",), "switch", None),
    (("--api-server-count", "-asc"), "value", int),
    (("--max-num-batched-tokens",), "value", int),
    (("--max-num-seqs",), "value", int),
]

#: SGLang's server CLI, python/sglang/srt/server_args.py (ServerArgs; add_cli_args makes
#: one flag per annotated field, "--" + the field name with "-" for "_", plus the
#: Arg(aliases=...)), at sgl-project/sglang 001067fffe33427bee0ed2f007fb7551a1d76b44:
#: model_path (aliases --model), tp_size (--tensor-parallel-size), pp_size
#: (--pipeline-parallel-size), dp_size (--data-parallel-size), nnodes, node_rank,
#: dist_init_addr (--nccl-init-addr), host (default 127.0.0.1), port (default 30000),
#: trust_remote_code (bool: a switch), mem_fraction_static (float); enable_dp_attention
#: (a switch), ep_size (--expert-parallel-size), moe_a2a_backend, disaggregation_mode
#: (choices null/prefill/decode), disaggregation_transfer_backend,
#: disaggregation_bootstrap_port, disaggregation_ib_device, max_running_requests,
#: chunked_prefill_size, base_gpu_id.
SGLANG_FLAGS: list[Flag] = [
    (("--model-path", "--model"), "value", str),
    (("--tp-size", "--tensor-parallel-size"), "value", int),
    (("--pp-size", "--pipeline-parallel-size"), "value", int),
    (("--dp-size", "--data-parallel-size"), "value", int),
    (("--nnodes",), "value", int),
    (("--node-rank",), "value", int),
    (("--dist-init-addr", "--nccl-init-addr"), "value", str),
    (("--host",), "value", str),
    (("--port",), "value", int),
    (("--trust-remote-code",), "switch", None),
    (("--mem-fraction-static",), "value", float),
    # PD disaggregation and the sizes of docs/advanced_features/pd_disaggregation.md
    (("--enable-dp-attention",), "switch", None),
    (("--ep-size", "--expert-parallel-size"), "value", int),
    (("--moe-a2a-backend",), "value", str),
    (("--disaggregation-mode",), "value", ["null", "prefill", "decode"]),
    (("--disaggregation-transfer-backend",), "value", str),
    (("--disaggregation-bootstrap-port",), "value", int),
    (("--disaggregation-ib-device",), "value", str),
    (("--max-running-requests",), "value", int),
    (("--chunked-prefill-size",), "value", int),
    (("--base-gpu-id",), "value", int),
]

#: the programs in front of the flags, and whether the model may come positionally
VLLM_PROGRAMS: dict[tuple[str, ...], bool] = {
    ("vllm", "serve"): True,
    ("python", "-m", "vllm.entrypoints.openai.api_server"): False,
}
SGLANG_PROGRAMS: dict[tuple[str, ...], bool] = {
    ("python", "-m", "sglang.launch_server"): False,
    ("python3", "-m", "sglang.launch_server"): False,
}


def parser_of(flags: list[Flag], positional_model: bool) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(allow_abbrev=False, exit_on_error=False, add_help=False)
    if positional_model:
        parser.add_argument("model_tag", nargs="?")
    for names, kind, extra in flags:
        dest = names[0].lstrip("-").replace("-", "_")
        if kind == "switch":
            parser.add_argument(*names, dest=dest, action="store_true")
        elif kind == "list":
            parser.add_argument(*names, dest=dest, nargs="+", type=extra)
        elif isinstance(extra, list):
            parser.add_argument(*names, dest=dest, choices=extra)
        else:
            parser.add_argument(*names, dest=dest, type=extra)
    return parser


def parse(
    flags: list[Flag], programs: dict[tuple[str, ...], bool], argv: Sequence[str]
) -> argparse.Namespace:
    for program, positional in programs.items():
        if tuple(argv[: len(program)]) == program:
            rest = list(argv[len(program) :])
            try:
                return parser_of(flags, positional).parse_args(rest)
            except (argparse.ArgumentError, SystemExit) as error:
                raise AssertionError(f"the CLI would reject {rest}: {error}") from error
    raise AssertionError(f"{list(argv)} does not start with a known server program")


NODE_RANK = "1"
MASTER_ADDR = "10.0.0.1"


def resolve(word: Word, master_port: int) -> str:
    """A word as bash gives it to the program on node 1."""
    values = {
        "NODE_RANK": NODE_RANK,
        "MASTER_ADDR": MASTER_ADDR,
        "MASTER_PORT": str(master_port),
        "MDC_OUT": "/out",
    }
    if isinstance(word, str):
        return word
    if isinstance(word, Ref):
        return values[word.name]
    assert isinstance(word, Concat)
    return "".join(p if isinstance(p, str) else values[p.name] for p in word.parts)


def server_argv(compiled: Compiled) -> list[str]:
    (role,) = compiled.launch.roles
    words = [resolve(w, compiled.plan.rendezvous.master_port) for w in role.argv]
    if words[:2] in (["bash", "/out/launch/vllm-node.sh"], ["bash", "/out/launch/sglang-node.sh"]):
        return words[2:]
    return words


def compile_file(path: Path) -> Compiled:
    return COMPILER.compile(path)


def compile_data(tmp_path: Path, data: dict[str, Any]) -> Compiled:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return COMPILER.compile(path)


EXAMPLES = sorted(
    p
    for p in (REPO / "examples").iterdir()
    if p.name.startswith(("vllm-", "sglang-"))
    and "disagg" not in p.name
    and p.suffix in {".toml", ".yaml", ".json"}
)


def test_there_are_vllm_and_sglang_examples() -> None:
    names = {p.stem for p in EXAMPLES}
    assert {"vllm-1x8", "vllm-ray-2x8", "vllm-replicas-4x8", "sglang-1x8", "sglang-2x8"} <= names


def check_vllm(compiled: Compiled) -> None:
    plan = compiled.plan
    options = plan.options["vllm"]
    parsed = parse(VLLM_FLAGS, VLLM_PROGRAMS, server_argv(compiled))
    assert (getattr(parsed, "model_tag", None) or parsed.model) == options.model  # type: ignore[attr-defined]
    assert parsed.tensor_parallel_size == plan.sizes.tp
    assert parsed.pipeline_parallel_size == plan.sizes.pp
    assert parsed.port == (options.port or 8000)  # type: ignore[attr-defined]
    assert parsed.host == (options.host or "0.0.0.0")  # type: ignore[attr-defined]
    mode = "single" if plan.nnodes == 1 else options.mode or ("dp" if plan.sizes.dp > 1 else "ray")  # type: ignore[attr-defined]
    assert parsed.distributed_executor_backend == ("ray" if mode == "ray" else None)
    # one server fills the job, or (replicas) one node; dp engines of tp x pp GPUs each
    gpus = plan.nproc_per_node if mode == "replicas" else plan.world_size
    engines = parsed.data_parallel_size or 1
    assert parsed.tensor_parallel_size * parsed.pipeline_parallel_size * engines == gpus
    assert parsed.enable_expert_parallel == (plan.sizes.ep > 1)


def check_sglang(compiled: Compiled) -> None:
    plan = compiled.plan
    options = plan.options["sglang"]
    parsed = parse(SGLANG_FLAGS, SGLANG_PROGRAMS, server_argv(compiled))
    assert parsed.model_path == options.model  # type: ignore[attr-defined]
    assert parsed.tp_size == plan.sizes.tp
    assert (parsed.pp_size or 1) == plan.sizes.pp
    assert parsed.tp_size * (parsed.pp_size or 1) == plan.world_size
    if plan.nnodes > 1:
        assert parsed.nnodes == plan.nnodes
        assert parsed.node_rank == int(NODE_RANK)
        assert parsed.dist_init_addr == f"{MASTER_ADDR}:{plan.rendezvous.master_port}"
    else:
        assert (parsed.nnodes, parsed.node_rank, parsed.dist_init_addr) == (None, None, None)
    assert parsed.port == (options.port or 30000)  # type: ignore[attr-defined]
    assert parsed.host == (options.host or "0.0.0.0")  # type: ignore[attr-defined]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_flag_of_an_example_is_one_the_real_cli_takes(path: Path) -> None:
    compiled = compile_file(path)
    (check_vllm if compiled.plan.launcher == "vllm" else check_sglang)(compiled)


def vllm_spec(nnodes: int, nproc: int, **tables: Any) -> dict[str, Any]:
    return {
        "job": {"name": "vllm-flags", "command": tables.pop("command", ["vllm", "serve"])},
        "distributed": {
            "launcher": "vllm",
            "backend": "local",
            "nnodes": nnodes,
            "nproc_per_node": nproc,
            "master_port": 29777,
        },
        **tables,
    }


def sglang_spec(nnodes: int, nproc: int, **tables: Any) -> dict[str, Any]:
    return {
        "job": {"name": "sglang-flags", "command": ["python", "-m", "sglang.launch_server"]},
        "distributed": {
            "launcher": "sglang",
            "backend": "local",
            "nnodes": nnodes,
            "nproc_per_node": nproc,
            "master_port": 29777,
        },
        **tables,
    }


MORE = [
    vllm_spec(1, 2, vllm={"model": "m", "port": 9000, "host": "127.0.0.1"}),
    vllm_spec(4, 4, vllm={"model": "m"}),
    vllm_spec(
        2,
        4,
        vllm={"model": "m", "mode": "replicas", "args": ["--seed", "1"]},
        parallelism={"tp": 2, "pp": 2},
    ),
    vllm_spec(
        2, 4, vllm={"model": "m"}, command=["python", "-m", "vllm.entrypoints.openai.api_server"]
    ),
    sglang_spec(1, 4, sglang={"model": "m", "args": ["--trust-remote-code"]}),
    sglang_spec(4, 8, sglang={"model": "m", "port": 31000}, parallelism={"tp": 16, "pp": 2}),
    # the sizes as the servers' own flags, read as their keys: each flag emitted once
    vllm_spec(
        2,
        8,
        vllm={
            "model": "m",
            "args": [
                "-tp",
                "1",
                "--enable-expert-parallel",
                "--data-parallel-size",
                "16",
                "--data-parallel-size-local=8",
            ],
        },
    ),
    sglang_spec(
        2,
        8,
        sglang={"model": "m", "args": ["--tp-size", "8", "--pipeline-parallel-size=2"]},
    ),
]


@pytest.mark.parametrize(
    "data",
    MORE,
    ids=lambda d: (
        f"{d['distributed']['launcher']}-"
        f"{d['distributed']['nnodes']}x{d['distributed']['nproc_per_node']}"
    ),
)
def test_every_flag_of_more_specs_is_one_the_real_cli_takes(
    tmp_path: Path, data: dict[str, Any]
) -> None:
    compiled = compile_data(tmp_path, data)
    (check_vllm if compiled.plan.launcher == "vllm" else check_sglang)(compiled)


def test_a_size_given_as_the_servers_flag_is_passed_once(tmp_path: Path) -> None:
    """The sizes in args (MORE's last two specs) are read as their keys: the command line
    carries each flag once, as mdc writes it, and the plan has those sizes."""
    vllm_words = server_argv(compile_data(tmp_path, MORE[-2]))
    for flag in ("--enable-expert-parallel", "--data-parallel-size", "--tensor-parallel-size"):
        assert vllm_words.count(flag) == 1, flag
    assert "-tp" not in vllm_words and "--data-parallel-size-local=8" not in vllm_words
    sglang = compile_data(tmp_path, MORE[-1])
    sglang_words = server_argv(sglang)
    assert sglang_words.count("--tp-size") == 1 and sglang_words.count("--pp-size") == 1
    assert "--pipeline-parallel-size=2" not in sglang_words
    assert (sglang.plan.sizes.tp, sglang.plan.sizes.pp) == (8, 2)


def test_the_parsers_reject_what_the_real_clis_reject() -> None:
    """The rebuilt parsers are strict, so a passing parse means something."""
    with pytest.raises(AssertionError, match="would reject"):
        parse(VLLM_FLAGS, VLLM_PROGRAMS, ["vllm", "serve", "m", "--tp-size", "2"])
    with pytest.raises(AssertionError, match="would reject"):
        parse(
            VLLM_FLAGS,
            VLLM_PROGRAMS,
            ["vllm", "serve", "m", "--distributed-executor-backend", "mpi"],
        )
    with pytest.raises(AssertionError, match="would reject"):
        parse(
            SGLANG_FLAGS,
            SGLANG_PROGRAMS,
            ["python", "-m", "sglang.launch_server", "--model-path", "m", "--tensor-parallel", "2"],
        )


@pytest.mark.slow
@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_the_generated_scripts_pass_bash_n_and_shellcheck(tmp_path: Path, path: Path) -> None:
    write_tree(tmp_path / "out", compile_file(path).tree)
    scripts = sorted((tmp_path / "out").rglob("*.sh"))
    assert scripts
    for script in scripts:
        parsed = subprocess.run(
            ["bash", "-n", str(script)], capture_output=True, text=True, check=False
        )
        assert parsed.returncode == 0, f"{script.name}: {parsed.stderr}"
    linted = subprocess.run(
        [shellcheck(), "--norc", "-S", "warning", *map(str, scripts)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert linted.returncode == 0, linted.stdout + linted.stderr


@pytest.mark.parametrize("launcher", ["vllm", "sglang", "sglang_disagg"])
def test_the_flags_mdc_reads_have_the_servers_spellings_and_shapes(launcher: str) -> None:
    """Every flag a serving launcher reads (as a key, or compared with what mdc writes) is
    one the server's own parser declares (the tables above), under the same spellings, and
    takes its values as that parser does: a switch, one typed value, or several."""
    table = importlib.import_module(f"mdc_builtin.launchers.{launcher}").READING.table
    known = VLLM_FLAGS if launcher == "vllm" else SGLANG_FLAGS
    for flag in table.flags:
        (names, kind, extra), *_ = [e for e in known if flag.name in e[0]]
        assert set(flag.aliases) <= set(names) - {flag.name}, flag.name
        assert flag.nargs == {"switch": 0, "value": 1, "list": "+"}[kind], flag.name
        if kind == "value" and extra in (int, float):
            assert type(flag.convert("3")) is extra, flag.name
