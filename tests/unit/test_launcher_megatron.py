"""The megatron launcher's output, read back the way a user reads launch/worker.sh.

No torch here: tests/conformance/test_megatron_args.py holds the same output against
megatron-core and torch's torchrun parser.
"""

from __future__ import annotations

import io
import json
import shlex
from pathlib import Path
from typing import Any

import pytest

from mdc.cli import main
from mdc_builtin.launchers.megatron import MegatronOptions, training


def _compile(tmp_path: Path, data: dict[str, Any], out: str = "out") -> tuple[int, str]:
    """Compile ``data`` into ``tmp_path / out``: (exit code, stderr)."""
    spec = tmp_path / f"{out}.json"
    spec.write_text(json.dumps(data), encoding="utf-8")
    err = io.StringIO()
    code = main(
        ["compile", str(spec), "-o", str(tmp_path / out), "--no-plugin-autoload"],
        stdout=io.StringIO(),
        stderr=err,
    )
    return code, err.getvalue()


def compiled(tmp_path: Path, **tables: Any) -> tuple[list[str], dict[str, str], dict[str, Any]]:
    """Compile a megatron spec; (the exec line's words, the exports, plan.json)."""
    data: dict[str, Any] = {
        "job": {"name": "unit", "command": ["python", "pretrain_gpt.py", "--mock-data"]},
        "distributed": {
            "launcher": "megatron",
            "nnodes": 2,
            "nproc_per_node": 4,
            "accelerator": "nvidia",
        },
        **tables,
    }
    code, err = _compile(tmp_path, data)
    assert code == 0, err
    script = (tmp_path / "out" / "launch" / "worker.sh").read_text(encoding="utf-8")
    exports = dict(
        line[len("export ") :].split("=", 1)
        for line in script.splitlines()
        if line.startswith("export ")
    )
    words = shlex.split(script.rpartition("\nexec ")[2])
    plan = json.loads((tmp_path / "out" / "plan.json").read_text(encoding="utf-8"))
    return words, exports, plan


def after(words: list[str], marker: str) -> list[str]:
    return words[words.index(marker) + 1 :]


def test_defaults_take_tp_from_the_node_and_pp_from_the_nodes(tmp_path: Path) -> None:
    words, exports, _ = compiled(tmp_path)
    args = after(words, "pretrain_gpt.py")
    assert args == [
        "--mock-data",
        "--tensor-model-parallel-size",
        "4",
        "--pipeline-model-parallel-size",
        "2",
        "--context-parallel-size",
        "1",
        "--expert-model-parallel-size",
        "1",
        "--expert-tensor-parallel-size",
        "4",
        "--sequence-parallel",
        "--use-distributed-optimizer",
    ]
    # madengine's runner (§4.1/§5 megatron): the torchrun command up to the script
    runner = shlex.split(exports.pop("MAD_MULTI_NODE_RUNNER"))[0].split(" ")
    assert runner == words[: words.index("pretrain_gpt.py")]
    assert exports == {
        "TENSOR_MODEL_PARALLEL_SIZE": "4",
        "PIPELINE_MODEL_PARALLEL_SIZE": "2",
        "CONTEXT_PARALLEL_SIZE": "1",
        "CUDA_DEVICE_MAX_CONNECTIONS": "1",
        "NNODES": "2",
        "NPROC_PER_NODE": "4",
    }


def test_everything_in_order_user_args_first_extra_args_last(tmp_path: Path) -> None:
    words, _, plan = compiled(
        tmp_path,
        parallelism={"tp": 2, "pp": 2, "cp": 2, "vpp": 2},
        batch={"global_batch_size": 32, "micro_batch_size": 2},
        model={
            "num_layers": 8,
            "hidden_size": 128,
            "num_attention_heads": 4,
            "num_query_groups": 2,
            "ffn_hidden_size": 512,
            "seq_length": 256,
            "vocab_size": 1000,
            "dtype": "bf16",
        },
        megatron={
            "overlap_grad_reduce": True,
            "overlap_param_gather": True,
            "recompute_granularity": "full",
            "recompute_method": "block",
            "recompute_num_layers": 1,
            "max_position_embeddings": 1024,
            "extra_args": ["--lr", "1e-4"],
        },
    )
    assert after(words, "pretrain_gpt.py") == [
        "--mock-data",
        "--tensor-model-parallel-size",
        "2",
        "--pipeline-model-parallel-size",
        "2",
        "--context-parallel-size",
        "2",
        "--expert-model-parallel-size",
        "1",
        "--expert-tensor-parallel-size",
        "2",
        "--num-virtual-stages-per-pipeline-rank",
        "2",
        "--sequence-parallel",
        "--use-distributed-optimizer",
        "--overlap-grad-reduce",
        "--overlap-param-gather",
        "--micro-batch-size",
        "2",
        "--global-batch-size",
        "32",
        "--num-layers",
        "8",
        "--hidden-size",
        "128",
        "--ffn-hidden-size",
        "512",
        "--num-attention-heads",
        "4",
        "--group-query-attention",
        "--num-query-groups",
        "2",
        "--seq-length",
        "256",
        "--max-position-embeddings",
        "1024",
        "--bf16",
        "--recompute-granularity",
        "full",
        "--recompute-method",
        "block",
        "--recompute-num-layers",
        "1",
        "--lr",
        "1e-4",
    ]
    # 8 ranks / (tp 2 * pp 2 * cp 2) = dp 1: 32 = 2 micro * dp 1 * 16 steps
    assert plan["batch"]["grad_accum_steps"] == 16


@pytest.mark.parametrize(
    ("order", "pp", "mapping"),
    [
        ("tp-cp-ep-pp-dp", 2, True),
        ("tp-pp-dp", 2, True),
        ("tp-cp-ep-pp-dp", 1, False),
        ("tp-dp-pp", 2, False),
        ("tp-cp-ep-dp-pp", 2, False),
    ],
)
def test_tp_pp_dp_mapping_only_when_the_layout_needs_it(
    order: str, pp: int, mapping: bool, tmp_path: Path
) -> None:
    """pp = 1 lays ranks out the same in both orders: no flag is needed."""
    words, _, _ = compiled(tmp_path, parallelism={"tp": 2, "pp": pp, "order": order})
    assert ("--use-tp-pp-dp-mapping" in words) == mapping


@pytest.mark.parametrize(
    ("dtype", "flags"),
    [
        ("bf16", ["--bf16"]),
        ("fp16", ["--fp16"]),
        ("fp32", []),
        ("fp8", ["--bf16", "--fp8-format", "hybrid"]),
    ],
)
def test_dtype_flags(dtype: str, flags: list[str], tmp_path: Path) -> None:
    words, _, _ = compiled(tmp_path, model={"dtype": dtype})
    assert [w for w in words if w in ("--bf16", "--fp16", "--fp8-format", "hybrid")] == flags


def test_gqa_flag_only_when_groups_differ_from_heads(tmp_path: Path) -> None:
    words, _, _ = compiled(tmp_path, model={"num_attention_heads": 8, "num_query_groups": 8})
    assert "--group-query-attention" not in words and "--num-query-groups" not in words


@pytest.mark.parametrize(
    ("accelerator", "tp", "cp", "wanted"),
    [("nvidia", 1, 1, False), ("nvidia", 1, 2, True), ("amd", 2, 1, True), ("cpu", 4, 1, False)],
)
def test_cuda_device_max_connections(
    accelerator: str, tp: int, cp: int, wanted: bool, tmp_path: Path
) -> None:
    data = {
        "parallelism": {"tp": tp, "pp": 1, "cp": cp},
        "distributed": {
            "launcher": "megatron",
            "nnodes": 2,
            "nproc_per_node": 4,
            "accelerator": accelerator,
        },
    }
    _, exports, plan = compiled(tmp_path, **data)
    assert ("CUDA_DEVICE_MAX_CONNECTIONS" in exports) == wanted
    assert ("CUDA_DEVICE_MAX_CONNECTIONS" in plan["worker_env"]) == wanted


def test_no_single_connection_with_the_ep_overlap(tmp_path: Path) -> None:
    """--overlap-moe-expert-parallel-comm runs the all-to-alls on their own streams: mdc
    leaves CUDA_DEVICE_MAX_CONNECTIONS to the user (Megatron-LM does not assert it then)."""
    data: dict[str, Any] = {
        "parallelism": {"tp": 2, "pp": 1, "ep": 2, "etp": 1},
        "model": {"num_layers": 4, "hidden_size": 256, "num_attention_heads": 8,
                  "seq_length": 512, "num_experts": 4, "dtype": "bf16"},
        "megatron": {"overlap_moe_expert_parallel_comm": True,
                     "moe_token_dispatcher_type": "alltoall"},
    }  # fmt: skip
    words, exports, plan = compiled(tmp_path, **data)
    assert "--overlap-moe-expert-parallel-comm" in words
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in exports
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in plan["worker_env"]


def _connections(gpu: str | None, value: str | None, **megatron: Any) -> dict[str, Any]:
    job: dict[str, Any] = {"name": "unit", "command": ["python", "pretrain_gpt.py"]}
    if value is not None:
        job["env"] = {"CUDA_DEVICE_MAX_CONNECTIONS": value}
    distributed: dict[str, Any] = {"launcher": "megatron", "nnodes": 2, "nproc_per_node": 4,
                                   "accelerator": "nvidia"}  # fmt: skip
    if gpu is not None:
        distributed["accelerator_model"] = gpu
    return {"job": job, "distributed": distributed, "parallelism": {"tp": 2, "pp": 1},
            "megatron": megatron}  # fmt: skip


@pytest.mark.parametrize(
    ("gpu", "value", "exported"),
    [
        # Megatron-LM asserts 1 for tp > 1 only before Blackwell (get_device_arch_version
        # < 10): on Blackwell mdc exports nothing, and the user's value (NVIDIA's recipes
        # set 32 there) is the job's
        ("b200", None, None),
        ("gb300", "32", "32"),
        ("h100-sxm", None, "1"),
        ("h100-sxm", "1", "1"),
        # no accelerator_model: 1, so that a Hopper job runs, unless the user sets it
        (None, None, "1"),
        (None, "8", "8"),
    ],
)
def test_cuda_device_max_connections_by_gpu(
    gpu: str | None, value: str | None, exported: str | None, tmp_path: Path
) -> None:
    code, err = _compile(tmp_path, _connections(gpu, value), "refused")
    assert code == 0, err
    assert ("MDC328" in err) == (gpu is None and value == "8")  # the warning, where unknown
    script = (tmp_path / "refused" / "launch" / "worker.sh").read_text(encoding="utf-8")
    assert (f"export CUDA_DEVICE_MAX_CONNECTIONS={exported}" in script) == (exported is not None)
    assert ("CUDA_DEVICE_MAX_CONNECTIONS=" in script) == (exported is not None)


@pytest.mark.parametrize(
    ("gpu", "value", "megatron", "text"),
    [
        ("h100-sxm", "8", {}, "require setting the environment variable "
         "CUDA_DEVICE_MAX_CONNECTIONS to 1"),
        ("a100-80gb", "32", {}, "require setting the environment variable "
         "CUDA_DEVICE_MAX_CONNECTIONS to 1"),
        ("b200", "1", {"use_megatron_fsdp": True, "data_parallel_sharding_strategy":
                       "optim_grads_params"},
         "FSDP always requires CUDA_DEVICE_MAX_CONNECTIONS value large than one"),
    ],
)  # fmt: skip
def test_cuda_device_max_connections_megatron_asserts_against_is_refused(
    gpu: str, value: str, megatron: dict[str, Any], text: str, tmp_path: Path
) -> None:
    """Megatron-LM core_v0.16.1's validate_args: 1 for tp or cp > 1 before Blackwell, not 1
    with FSDP; the user's [job] env value is refused exactly there, with its text."""
    code, err = _compile(tmp_path, _connections(gpu, value, **megatron), "refused")
    assert code != 0
    assert "error[MDC328]" in err and text in err and "/job/env/CUDA_DEVICE_MAX_CONNECTIONS" in err
    assert not (tmp_path / "refused").exists()


def test_torchrun_table_applies(tmp_path: Path) -> None:
    words, _, _ = compiled(tmp_path, torchrun={"rdzv_backend": "static", "max_restarts": 2})
    assert words[words.index("--rdzv-backend") + 1] == "static"
    assert words[words.index("--max-restarts") + 1] == "2"


def test_training_setup() -> None:
    assert training(None).zero_stage == 1 and training(None).grad_bytes == 4
    assert training(None).sequence_parallel and training(None).recompute == "none"
    off = training(
        MegatronOptions(
            use_distributed_optimizer=False, sequence_parallel=False, recompute_granularity="full"
        )
    )
    assert (off.zero_stage, off.sequence_parallel, off.recompute) == (0, False, "full")
