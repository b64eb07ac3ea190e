"""The engines' per-step limits as each framework names them: the serving prediction reads
the per-step token budget and the running-request cap from the launcher's keys and flags."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from bench import serving_fit

from mdc.describe import plan_json
from mdc.errors import SpecError
from mdc.hardware import builtin
from mdc.pipeline import Compiled, Compiler
from mdc.plugin_manager import load_plugins
from mdc.spec import WorkloadTable
from mdc.tune.serving_records import DEFAULT, Deployment, Role
from mdc.tune.serving_server import server_of

COMPILER = Compiler(load_plugins(autoload=False))
R1 = {"name": "deepseek-ai/DeepSeek-R1", "dtype": "fp8", "seq_length": 9216}
#: the key that names the model to serve, where it is not "model"
MODEL_KEY = {"sglang_disagg": "model_path"}
WORKLOAD = {"input_tokens": 8192, "output_tokens": 1024, "concurrency": 64}


def spec(launcher: str, table: dict[str, Any], **extra: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "job": {"name": "r1", "command": ["trtllm-serve"] if launcher == "trtllm" else ["x"]},
        "distributed": {
            "launcher": launcher,
            "backend": "local",
            "nnodes": 1,
            "nproc_per_node": 8,
            "accelerator_model": "h200",
        },
        "parallelism": {"tp": 8},
        "model": R1,
        launcher: {MODEL_KEY.get(launcher, "model"): "deepseek-ai/DeepSeek-R1", **table},
        "workload": WORKLOAD,
    }
    data.update(extra)
    return data


def compile_(tmp_path: Path, data: dict[str, Any]) -> Compiled:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return COMPILER.compile(path, tree=False)


def predicted(tmp_path: Path, data: dict[str, Any]) -> dict[str, Any]:
    compiled = compile_(tmp_path, data)
    block = plan_json(compiled.plan, compiled.launch)["predicted"]
    assert isinstance(block, dict)
    return block


def vllm(*args: str) -> dict[str, Any]:
    return spec("vllm", {"args": list(args)})


def sglang(*args: str) -> dict[str, Any]:
    data = spec("sglang", {"args": list(args)})
    data["job"]["command"] = ["python3", "-m", "sglang.launch_server"]
    return data


def _r1_server(step_tokens: int | None) -> Any:
    shape = serving_fit._shape("deepseek-v3", "fp8", 9216)
    role = Role(name="server", servers=1, gpus=8, tp=8, step_tokens=step_tokens)
    dep = Deployment(launcher="sglang", roles=(role,), capacity_gib=141.0)
    work = WorkloadTable(input_tokens=8192, output_tokens=1024, concurrency=64)
    return server_of(role, shape, builtin()["h200"], dep, work, DEFAULT)


@pytest.mark.parametrize(
    ("data", "flag"),
    [
        (vllm("--max-num-seqs", "16"), "--max-num-seqs"),
        (sglang("--max-running-requests", "16"), "--max-running-requests"),
        (spec("trtllm", {"max_batch_size": 16}), "max_batch_size"),
    ],
)
def test_the_running_request_cap_bounds_the_batch(
    tmp_path: Path, data: dict[str, Any], flag: str
) -> None:
    """64 requests in flight against a cap of 16: the engine runs 16, the rest queue."""
    assert predicted(tmp_path, data)["batch"] == {"server": 16}, flag


@pytest.mark.parametrize(
    ("small", "default"),
    [
        (vllm("--max-num-batched-tokens", "2048"), vllm()),
        (sglang("--chunked-prefill-size", "2048"), sglang()),
        (spec("trtllm", {"max_num_tokens": 2048}), spec("trtllm", {})),
    ],
)
def test_the_step_token_budget_chunks_the_prompt(
    tmp_path: Path, small: dict[str, Any], default: dict[str, Any]
) -> None:
    """An 8,192-token prompt in steps of 2,048 tokens takes four steps before its first
    token instead of one; the decode of the running batch is the same where the engine
    mixes the chunks into its decode steps (vLLM, TensorRT-LLM). SGLang runs them alone,
    each step with its overhead: over a request's 1,024 tokens the other 63 requests'
    prompts pause its decode for 3 more steps each."""
    chunked, whole = predicted(tmp_path, small), predicted(tmp_path, default)
    launcher = small["distributed"]["launcher"]
    extra = 63 / 1024 * 3 * DEFAULT.overhead(launcher) * 1e3 if launcher == "sglang" else 0.0
    assert chunked["tpot_ms"] == pytest.approx(whole["tpot_ms"] + extra, abs=0.011)
    assert chunked["ttft_ms"] > whole["ttft_ms"]
    memory = plan_json(*_compiled(tmp_path, small))["serving_memory"]
    assert isinstance(memory, dict) and memory["step_tokens"] == 2048


def _compiled(tmp_path: Path, data: dict[str, Any]) -> tuple[Any, Any]:
    compiled = compile_(tmp_path, data)
    return compiled.plan, compiled.launch


def test_a_server_prefills_a_prompt_in_steps_of_its_budget() -> None:
    """The prefill of one prompt alone: ceil(8192 / 2048) = 4 steps, each paying the
    step's overhead and (at least) one read of the weights."""
    four, one = _r1_server(2048), _r1_server(None)
    assert four.step_tokens == 2048 and one.step_tokens == DEFAULT.chunk_tokens
    weights = (four.dense_bytes + four.expert_bytes) / four.hbm_rate()
    steps = math.ceil(8192 / 2048)
    overhead = DEFAULT.overhead("sglang")
    expected = max(four.prefill_compute(8192, 8192), steps * weights) + steps * overhead
    assert four.prefill(8192, 8192) == pytest.approx(expected)
    assert four.prefill(8192, 8192) - one.prefill(8192, 8192) >= 3 * overhead * 0.999


def test_disaggregated_roles_take_their_own_limits(tmp_path: Path) -> None:
    """SGLang's decode servers with DP attention over 8 ranks cap 128 running requests per
    server: 16 per rank (server_args.py divides --max-running-requests and
    --chunked-prefill-size by --dp-size); the prefill servers' budget is their own."""
    data = spec(
        "sglang_disagg",
        {
            "tp_size": 8,
            "ep_size": 8,
            "prefill": {"args": ["--chunked-prefill-size", "2048"]},
            "decode": {
                "dp_size": 8,
                "enable_dp_attention": True,
                "args": ["--max-running-requests", "128"],
            },
        },
        parallelism={},
    )
    data["distributed"].update(nnodes=2, prefill_gpus=8, decode_gpus=8)
    data["job"]["command"] = ["python3"]
    data["workload"] = {**WORKLOAD, "concurrency": 512}
    compiled = compile_(tmp_path, data)
    memory = plan_json(compiled.plan, compiled.launch)["serving_memory"]
    assert isinstance(memory, dict)
    # no --mem-fraction-static: each role at the share SGLang picks for it on an H200
    # (143,771 MiB). Prefill: 512 + 2,048 x 1.5 + 8 / 8 x 1,024 + 1,536 (MLA prefill graphs)
    # = 6,144, up to the 10 GiB floor: 0.929. Decode, the estimate's own: 512 + 2,048 x 1.5
    # + 1,024 + 2 x 512 + 512 x 8 x 4.5 (DP attention) = 24,064: 0.833
    assert memory["roles"] == {
        "prefill": {"step_tokens": 2048, "share": round(1 - 10240 / 143771, 3)},
        "decode": {"max_batch": 16},
    }
    assert memory["share"] == round(1 - 24064 / 143771, 3) == 0.833
    block = plan_json(compiled.plan, compiled.launch)["predicted"]
    assert isinstance(block, dict)
    assert block["batch"]["decode"] <= 128


def test_trtllm_roles_take_their_tables_limits(tmp_path: Path) -> None:
    """[trtllm.context] max_num_tokens and [trtllm.generation] max_batch_size, by role."""
    data = spec(
        "trtllm",
        {
            "max_batch_size": 256,
            "context": {"servers": 1, "tp_size": 4, "ep_size": 4, "max_num_tokens": 4096},
            "generation": {"servers": 1, "tp_size": 4, "ep_size": 4, "max_batch_size": 8},
        },
        parallelism={},
    )
    data["model"] = {**R1, "dtype": "fp4"}
    compiled = compile_(tmp_path, data)
    memory = plan_json(compiled.plan, compiled.launch)["serving_memory"]
    assert isinstance(memory, dict)
    assert memory["roles"] == {
        "prefill": {"max_batch": 256, "step_tokens": 4096},
        "decode": {"max_batch": 8},
    }
    block = plan_json(compiled.plan, compiled.launch)["predicted"]
    assert isinstance(block, dict)
    assert block["batch"]["decode"] <= 8


def test_vllm_disaggregated_roles_read_their_own_args(tmp_path: Path) -> None:
    """vLLM's prefill and decode engines each read their role's --max-num-batched-tokens
    and --max-num-seqs (each engine's own scheduler)."""
    data = spec(
        "vllm_disagg",
        {
            "tensor_parallel_size": 8,
            "prefill": {"args": ["--max-num-batched-tokens", "16384"]},
            "decode": {"args": ["--max-num-seqs", "32"]},
        },
        parallelism={},
    )
    data["distributed"].update(nnodes=2, prefill_gpus=8, decode_gpus=8)
    data["job"]["command"] = ["vllm", "serve"]
    compiled = compile_(tmp_path, data)
    memory = plan_json(compiled.plan, compiled.launch)["serving_memory"]
    assert isinstance(memory, dict)
    assert memory["roles"] == {"prefill": {"step_tokens": 16384}, "decode": {"max_batch": 32}}
    block = plan_json(compiled.plan, compiled.launch)["predicted"]
    assert isinstance(block, dict)
    assert block["batch"]["decode"] <= 32


def _errors(tmp_path: Path, data: dict[str, Any]) -> list[Any]:
    with pytest.raises(SpecError) as caught:
        compile_(tmp_path, data)
    return [d for d in caught.value.diagnostics if d.is_error]


def test_vllm_refuses_a_step_budget_below_its_request_cap(tmp_path: Path) -> None:
    """vLLM's SchedulerConfig raises when max_num_batched_tokens < max_num_seqs; mdc says so
    at the budget's word, and passes the budget equal to the cap."""
    (error,) = _errors(tmp_path, vllm("--max-num-seqs", "1024", "--max-num-batched-tokens", "512"))
    assert error.code == "MDC625"
    assert error.location.pointer == "/vllm/args/2"
    assert "512 below --max-num-seqs 1024" in error.message
    compile_(tmp_path, vllm("--max-num-seqs", "1024", "--max-num-batched-tokens=1024"))


def test_vllm_disagg_checks_each_roles_engines_once(tmp_path: Path) -> None:
    data = spec(
        "vllm_disagg",
        {
            "tensor_parallel_size": 8,
            "args": ["--max-num-seqs", "256"],
            "decode": {"args": ["--max-num-batched-tokens", "128"]},
        },
        parallelism={},
    )
    data["distributed"].update(nnodes=2, prefill_gpus=8, decode_gpus=8)
    data["job"]["command"] = ["vllm", "serve"]
    (error,) = _errors(tmp_path, data)
    assert error.code == "MDC625"
    assert error.location.pointer == "/vllm_disagg/decode/args/0"


def test_the_search_gives_vllm_no_budget_below_its_cap(tmp_path: Path) -> None:
    """With --max-num-seqs 4096 the search tries only the budgets vLLM accepts (8k, 16k),
    and every row it prints compiles."""
    from mdc.loaders import load_file
    from mdc.tune.serving_search import ServingTuner

    data = vllm("--max-num-seqs", "4096")
    data["workload"] = {**WORKLOAD, "concurrency": 4096}
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    result = ServingTuner(COMPILER, load_file(path)).run(top=4)
    assert result.rows and not result.refused
    for row in [*result.rows, *result.predicted]:
        (role,) = row.deployment.roles
        assert role.step_tokens in (8192, 16384)
