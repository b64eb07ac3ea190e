"""The torchtitan launcher's output: the job config TOML and the overrides, read back.

No torch here: tests/conformance/test_torchtitan.py loads the same output with
TorchTitan's own config manager and builds its device mesh.
"""

from __future__ import annotations

import io
import json
import shlex
import tomllib
from pathlib import Path
from typing import Any

import pytest

from mdc.cli import main
from mdc_builtin.launchers.torchtitan import TorchtitanOptions, training


def compiled(tmp_path: Path, **tables: Any) -> tuple[list[str], dict[str, str], str]:
    """Compile a torchtitan spec; (the exec line's words, the exports, the TOML text)."""
    data: dict[str, Any] = {
        "job": {"name": "unit", "command": ["python", "-m", "torchtitan.train"]},
        "distributed": {
            "launcher": "torchtitan",
            "nnodes": 2,
            "nproc_per_node": 8,
            "accelerator": "nvidia",
        },
        **tables,
    }
    tmp_path.mkdir(parents=True, exist_ok=True)
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(data), encoding="utf-8")
    err = io.StringIO()
    code = main(
        ["compile", str(spec), "-o", str(tmp_path / "out"), "--no-plugin-autoload"],
        stdout=io.StringIO(),
        stderr=err,
    )
    assert code == 0, err.getvalue()
    script = (tmp_path / "out" / "launch" / "worker.sh").read_text(encoding="utf-8")
    exports = dict(
        line[len("export ") :].split("=", 1)
        for line in script.splitlines()
        if line.startswith("export ") and not line.startswith("export MDC_OUT")
    )
    words = shlex.split(script.rpartition("\nexec ")[2])
    toml = (tmp_path / "out" / "launch" / "torchtitan.toml").read_text(encoding="utf-8")
    return words, exports, toml


def overrides(words: list[str]) -> dict[str, str]:
    rest = words[words.index("torchtitan.train") + 1 :]
    assert rest[:2] == ["--job.config_file", "${MDC_OUT}/launch/torchtitan.toml"]
    pairs = rest[2:]
    return dict(zip(pairs[::2], pairs[1::2], strict=False))


def test_defaults(tmp_path: Path) -> None:
    """tp = 8 (the node), pp = 2 (the nodes): dp 1, nothing to shard."""
    words, exports, toml = compiled(tmp_path)
    assert tomllib.loads(toml) == {
        "job": {"description": "unit", "dump_folder": "./outputs"},
        "model": {"name": "llama3", "flavor": "debugmodel"},
        "parallelism": {
            "data_parallel_replicate_degree": 1,
            "data_parallel_shard_degree": 1,
            "tensor_parallel_degree": 8,
            "pipeline_parallel_degree": 2,
            "context_parallel_degree": 1,
            "expert_parallel_degree": 1,
            "expert_tensor_parallel_degree": 8,
            "pipeline_parallel_schedule": "1F1B",
        },
    }
    assert overrides(words) == {
        "--parallelism.data_parallel_replicate_degree": "1",
        "--parallelism.data_parallel_shard_degree": "1",
        "--parallelism.tensor_parallel_degree": "8",
        "--parallelism.pipeline_parallel_degree": "2",
        "--parallelism.context_parallel_degree": "1",
        "--parallelism.expert_parallel_degree": "1",
    }
    # madengine's runner (§4.1/§5 torchtitan): the torchrun command up to the program
    runner = shlex.split(exports.pop("MAD_MULTI_NODE_RUNNER"))[0].split(" ")
    assert runner == words[: words.index("--module")]
    assert exports == {
        "TORCHTITAN_TENSOR_PARALLEL_SIZE": "8",
        "TORCHTITAN_PIPELINE_PARALLEL_SIZE": "2",
        "TORCHTITAN_FSDP_ENABLED": "0",
        "TORCHTITAN_CONTEXT_PARALLEL_SIZE": "1",
        "NNODES": "2",
        "NPROC_PER_NODE": "8",
    }


def test_hsdp_batch_sequence_and_pass_through(tmp_path: Path) -> None:
    words, exports, toml = compiled(
        tmp_path,
        parallelism={"tp": 2, "pp": 1},
        batch={"global_batch_size": 64, "micro_batch_size": 4},
        model={"seq_length": 1024, "dtype": "fp8"},
        torchtitan={
            "dp_replicate": 2,
            "steps": 7,
            "flavor": "8B",
            "config": {
                "training": {"dataset": "c4", "dataloader": {"num_workers": 2}},
                "optimizer": {"lr": 0.001, "name": "AdamW"},
            },
        },
    )
    loaded = tomllib.loads(toml)
    # world 16 / tp 2 = dp 8 = 2 replicas x 4 shards; 64 = 4 * 8 * 2 steps
    assert loaded["parallelism"]["data_parallel_replicate_degree"] == 2
    assert loaded["parallelism"]["data_parallel_shard_degree"] == 4
    assert "pipeline_parallel_schedule" not in loaded["parallelism"]
    assert loaded["training"] == {
        "local_batch_size": 4,
        "global_batch_size": 64,
        "seq_len": 1024,
        "steps": 7,
        "mixed_precision_param": "bfloat16",
        "dataset": "c4",
        "dataloader": {"num_workers": 2},
    }
    assert loaded["model"]["converters"] == ["quantize.linear.float8"]
    assert list(loaded["optimizer"]) == ["lr", "name"]  # pass-through keys sorted
    assert overrides(words)["--training.global_batch_size"] == "64"
    assert exports["TORCHTITAN_FSDP_ENABLED"] == "1"


def test_expert_tensor_parallel_override_only_with_experts(tmp_path: Path) -> None:
    words, _, _ = compiled(
        tmp_path, parallelism={"tp": 2, "pp": 1, "ep": 2}, model={"num_experts": 4}
    )
    assert overrides(words)["--parallelism.expert_tensor_parallel_degree"] == "2"


def test_context_parallel_alone_turns_fsdp_on(tmp_path: Path) -> None:
    """TorchTitan shards over dp_shard * cp: cp > 1 with dp_shard 1 is still FSDP."""
    _, exports, _ = compiled(tmp_path, parallelism={"tp": 8, "pp": 1, "cp": 2})
    assert exports["TORCHTITAN_FSDP_ENABLED"] == "1"


@pytest.mark.parametrize(
    ("layers", "pp", "vpp", "per_stage"),
    [
        # ceil((layers + 1 + 1) / n) == pp * vpp, the largest such n
        (48, 2, 4, 7),  # 50 / 7 -> 8 stages
        (32, 2, 3, 6),  # 34 / 6 -> 6 stages (TorchTitan splits them unevenly: 6, 6, 6, 6, 5, 5)
        (30, 2, 3, 6),  # 32 / 6 -> 6 stages
        (16, 2, 2, None),  # vpp 2: TorchTitan's own default of 2 stages per rank
    ],
)
def test_layers_per_stage(
    layers: int, pp: int, vpp: int, per_stage: int | None, tmp_path: Path
) -> None:
    # a model registered by the user (not in TorchTitan's registry): [model] gives its shape
    _, _, toml = compiled(
        tmp_path,
        parallelism={"tp": 2, "pp": pp, "vpp": vpp},
        model={"num_layers": layers},
        torchtitan={"model": "my_llm", "flavor": "custom"},
    )
    parallelism = tomllib.loads(toml)["parallelism"]
    assert parallelism["pipeline_parallel_schedule"] == "Interleaved1F1B"
    assert parallelism.get("pipeline_parallel_layers_per_stage") == per_stage


def test_output_is_byte_identical(tmp_path: Path) -> None:
    tables = {"torchtitan": {"config": {"b": {"z": 1, "a": [1, 2]}, "a": {"k": "v"}}}}
    first = compiled(tmp_path / "one", **tables)
    second = compiled(tmp_path / "two", **tables)
    assert first == second


def test_training_setup() -> None:
    # TorchTitan's default: selective with selective_ac_option "2", every 2nd layer whole
    default = training(None)
    assert (default.zero_stage, default.recompute, default.recompute_every) == (3, "full", 2)
    op = training(
        TorchtitanOptions(config={"activation_checkpoint": {"selective_ac_option": "op"}})
    )
    assert (op.recompute, op.recompute_every, op.recompute_per_op) == ("selective", None, True)
    full = training(TorchtitanOptions(config={"activation_checkpoint": {"mode": "full"}}))
    none = training(TorchtitanOptions(config={"activation_checkpoint": {"mode": "none"}}))
    assert (full.recompute, none.recompute) == ("full", "none")
    assert not (default.recompute_per_op or full.recompute_per_op or none.recompute_per_op)
    # the matmuls per-op recompute always recomputes: TorchTitan's default, or the config's
    assert op.recompute_per_op_forced == ("moe.router.gate",)
    checkpoint = {"selective_ac_option": "op",
                  "per_op_sac_force_recompute_mm_shapes_by_fqns": ["feed_forward.w1"]}  # fmt: skip
    forced = training(TorchtitanOptions(config={"activation_checkpoint": checkpoint}))
    assert forced.recompute_per_op_forced == ("feed_forward.w1",)
    # no dropout; the MLP runs eagerly unless [compile] compiles the model
    assert not default.dropout_masks and default.eager_gated_mlp

    def eager(compile_table: dict[str, Any]) -> bool:
        return training(TorchtitanOptions(config={"compile": compile_table})).eager_gated_mlp

    assert not eager({"enable": True})
    assert eager({"enable": True, "components": ["loss"]}) and eager({"enable": False})

    # the loss's working set per logit: run eagerly, cross_entropy(pred.float()) keeps the
    # bf16 logits, the fp32 log-softmax and the fp32 gradients of its backward (12 bytes);
    # compiled ("loss" among the components), the bf16 logits and their bf16 gradient
    def logit_bytes(compile_table: dict[str, Any]) -> int | None:
        return training(TorchtitanOptions(config={"compile": compile_table})).logit_bytes

    assert default.logit_bytes == 12 and logit_bytes({"enable": False}) == 12
    assert logit_bytes({"enable": True}) == 2 + 2
    assert logit_bytes({"enable": True, "components": ["model"]}) == 12


def validate(tmp_path: Path, data: dict[str, Any]) -> tuple[int, str]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(data), encoding="utf-8")
    err = io.StringIO()
    code = main(["validate", str(spec), "--no-plugin-autoload"], stdout=io.StringIO(), stderr=err)
    return code, err.getvalue()


@pytest.mark.parametrize(
    "word",
    [
        "--parallelism.tensor_parallel_degree",
        "--parallelism.tensor-parallel-degree=2",
        "--job.config-file",
        "--training.local_batch_size",
    ],
)
def test_a_derived_key_in_the_command_is_an_error(word: str, tmp_path: Path) -> None:
    code, err = validate(
        tmp_path,
        {
            "job": {"name": "unit", "command": ["python", "-m", "torchtitan.train", word, "2"]},
            "distributed": {"launcher": "torchtitan", "nnodes": 1, "nproc_per_node": 8},
        },
    )
    assert code == 1 and "MDC338" in err and "/job/command/3" in err


def test_dtype_keys_are_free_without_a_dtype(tmp_path: Path) -> None:
    config = {
        "model": {"converters": ["quantize.linear.mx"]},
        "training": {"mixed_precision_param": "float32", "dataset": "c4"},
    }
    base = {
        "job": {"name": "unit", "command": ["python", "-m", "torchtitan.train"]},
        "distributed": {
            "launcher": "torchtitan",
            "nnodes": 1,
            "nproc_per_node": 8,
            "accelerator": "cpu",
        },
        "torchtitan": {"config": config},
    }
    assert validate(tmp_path / "free", base)[0] == 0
    code, err = validate(tmp_path / "owned", {**base, "model": {"dtype": "fp8"}})
    assert code == 1 and err.count("MDC338") == 2
