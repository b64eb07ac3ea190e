"""Uneven pipeline splits: the [megatron] keys, their flags, Megatron's refusals (each with
its location), the per-stage layers in plan.json and ``mdc explain``, and the memory
estimate of the heaviest stage. tests/conformance/test_pipeline_split.py checks the same
rules against megatron-core and TorchTitan themselves."""

from __future__ import annotations

import io
import json
import shlex
from pathlib import Path
from typing import Any

import pytest

from mdc.cli import main
from mdc.plan.stages import Model, PipelineSplit, parse_layout, split_layers

LLAMA_405B = {
    "num_layers": 126,
    "hidden_size": 16384,
    "num_attention_heads": 128,
    "num_query_groups": 8,
    "ffn_hidden_size": 53248,
    "vocab_size": 128256,
    "seq_length": 8192,
    "gated_mlp": True,
    "tied_embeddings": False,
    "position_embedding": "rope",
    "bias": False,
    "normalization": "rmsnorm",
}
QWEN3_235B = {
    "num_layers": 94,
    "hidden_size": 4096,
    "num_attention_heads": 64,
    "num_query_groups": 4,
    "ffn_hidden_size": 12288,
    "vocab_size": 151936,
    "seq_length": 4096,
    "num_experts": 128,
    "moe_ffn_hidden_size": 1536,
    "moe_router_topk": 8,
    "gated_mlp": True,
    "tied_embeddings": False,
    "position_embedding": "rope",
    "bias": False,
    "normalization": "rmsnorm",
}
BLOOM = {
    "num_layers": 70,
    "hidden_size": 14336,
    "num_attention_heads": 112,
    "vocab_size": 250880,
    "seq_length": 2048,
}
BOTH_ENDS = {
    "account_for_embedding_in_pipeline_split": True,
    "account_for_loss_in_pipeline_split": True,
}


def run(
    tmp_path: Path, command: str, nodes: int, nproc: int, **tables: Any
) -> tuple[int, str, Path]:
    data: dict[str, Any] = {
        "job": {"name": "unit", "command": ["python", "pretrain_gpt.py"]},
        "distributed": {
            "launcher": tables.pop("launcher", "megatron"),
            "nnodes": nodes,
            "nproc_per_node": nproc,
            "backend": "slurm",
        },
        **tables,
    }
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(data), encoding="utf-8")
    out, err = io.StringIO(), io.StringIO()
    args = [command, str(spec), "--no-plugin-autoload"]
    if command == "compile":
        args += ["-o", str(tmp_path / "out")]
    code = main(args, stdout=out, stderr=err)
    return code, out.getvalue() + err.getvalue(), tmp_path / "out"


def worker_args(out: Path) -> list[str]:
    script = (out / "launch" / "worker.sh").read_text(encoding="utf-8")
    words = shlex.split(script.rpartition("\nexec ")[2])
    return words[words.index("pretrain_gpt.py") + 1 :]


def plan_of(out: Path) -> dict[str, Any]:
    return json.loads((out / "plan.json").read_text(encoding="utf-8"))  # type: ignore[no-any-return]


# ----------------------------------------------------------------------------- published


@pytest.mark.slow
@pytest.mark.parametrize(
    ("model", "nodes", "sizes", "megatron"),
    [
        # Megatron-Bridge: llama31_405b H100 perf recipe (TP 8, PP 8, CP 2, VPP 8)
        (LLAMA_405B, 128, {"tp": 8, "pp": 8, "cp": 2, "vpp": 8}, BOTH_ENDS),
        (LLAMA_405B, 64, {"tp": 8, "pp": 8, "cp": 1, "vpp": 2}, BOTH_ENDS),
        (LLAMA_405B, 64, {"tp": 8, "pp": 16}, BOTH_ENDS),
        # Qwen3-235B-A22B: PP 4 VPP 2, PP 8 VPP 4 / 3, PP 16 (EP 8)
        (QWEN3_235B, 16, {"tp": 2, "pp": 4, "vpp": 2, "ep": 8, "etp": 1}, BOTH_ENDS),
        (QWEN3_235B, 32, {"tp": 1, "pp": 8, "vpp": 4, "ep": 8, "etp": 1}, BOTH_ENDS),
        (QWEN3_235B, 32, {"tp": 1, "pp": 8, "vpp": 3, "ep": 8, "etp": 1}, BOTH_ENDS),
        # BLOOM-176B: TP 4, PP 12 (its 70 layers with the embedding and loss counted)
        (BLOOM, 48, {"tp": 4, "pp": 12}, BOTH_ENDS),
        # first/last stage counts: 126 = 9 + 6 * 18 + 9
        (
            LLAMA_405B,
            64,
            {"tp": 8, "pp": 8},
            {
                "decoder_first_pipeline_num_layers": 9,
                "decoder_last_pipeline_num_layers": 9,
            },
        ),
    ],
)
def test_published_uneven_layouts_compile(
    tmp_path: Path,
    model: dict[str, Any],
    nodes: int,
    sizes: dict[str, int],
    megatron: dict[str, Any],
) -> None:
    code, text, out = run(
        tmp_path,
        "compile",
        nodes,
        8,
        model=model,
        parallelism=sizes,
        megatron=megatron,
        batch={"micro_batch_size": 1, "global_batch_size": 1024},
    )
    assert code == 0, text
    args = worker_args(out)
    for key, value in megatron.items():
        flag = "--" + key.replace("_", "-")
        assert flag in args
        if value is not True:
            assert args[args.index(flag) + 1] == str(value)
    stages = plan_of(out)["pipeline_stages"]
    layers = sum(run["layers"] * (run["ranks"][1] - run["ranks"][0] + 1) for run in stages)
    assert layers == model["num_layers"]
    assert all(len(run["virtual_stages"]) == sizes.get("vpp", 1) for run in stages)


def test_even_split_refusal_suggests_the_accounting_keys(tmp_path: Path) -> None:
    code, text, _ = run(
        tmp_path, "validate", 64, 8, model=LLAMA_405B, parallelism={"tp": 8, "pp": 8}
    )
    assert code != 0
    assert "MDC222" in text and "num_layers (126) is not divisible by pp (8)" in text
    assert "account_for_embedding_in_pipeline_split = true and " in text


def test_the_heaviest_stage_decides_the_estimate(tmp_path: Path) -> None:
    """126 layers, pp 8, both ends counted: ranks 1..6 hold 16 layers, 0 and 7 hold 15."""
    code, text, out = run(
        tmp_path,
        "compile",
        64,
        8,
        model=LLAMA_405B,
        parallelism={"tp": 8, "pp": 8},
        megatron=BOTH_ENDS,
        batch={"micro_batch_size": 1, "global_batch_size": 64},
    )
    assert code == 0, text
    plan = plan_of(out)
    assert plan["pipeline_stages"] == [
        {"ranks": [0, 0], "layers": 15, "virtual_stages": [15]},
        {"ranks": [1, 6], "layers": 16, "virtual_stages": [16]},
        {"ranks": [7, 7], "layers": 15, "virtual_stages": [15]},
    ]
    # 1F1B: rank 0 holds 8 micro batches of 15 layers (+ embedding), rank 1 7 of 16: the
    # first stays the heaviest
    assert plan["memory"]["stage"] == {"name": "first", "rank": 0, "layers": 15}


def test_layout_string_sets_vpp_and_is_emitted_alone(tmp_path: Path) -> None:
    model = {**BLOOM, "num_layers": 8}
    layout = "Et|(t|)*6,tL"  # 8 stages over pp 4: 2 virtual stages per rank
    code, text, out = run(
        tmp_path,
        "compile",
        4,
        8,
        model=model,
        parallelism={"tp": 8, "pp": 4},
        megatron={"pipeline_model_parallel_layout": layout},
    )
    assert code == 0, text
    args = worker_args(out)
    assert args[args.index("--pipeline-model-parallel-layout") + 1] == layout
    assert "--num-virtual-stages-per-pipeline-rank" not in args
    plan = plan_of(out)
    assert plan["parallelism"]["vpp"] == 2
    assert plan["pipeline_stages"] == [{"ranks": [0, 3], "layers": 2, "virtual_stages": [1, 1]}]


@pytest.mark.parametrize(
    ("megatron", "sizes", "code", "pointer", "words"),
    [
        (
            {"decoder_first_pipeline_num_layers": 3, "account_for_loss_in_pipeline_split": True},
            {"pp": 4},
            "MDC227",
            "/megatron/account_for_loss_in_pipeline_split",
            "cannot be combined",
        ),
        (
            {"decoder_first_pipeline_num_layers": 3},
            {"pp": 4, "vpp": 2},
            "MDC227",
            "/megatron/decoder_first_pipeline_num_layers",
            "must be divisible by vpp (2)",
        ),
        (
            {"decoder_first_pipeline_num_layers": 2, "decoder_last_pipeline_num_layers": 3},
            {"pp": 4},
            "MDC227",
            "/megatron/decoder_first_pipeline_num_layers",
            "do not divide over the 2 middle pipeline stages",
        ),
        (
            {"decoder_first_pipeline_num_layers": 4, "decoder_last_pipeline_num_layers": 4},
            {"pp": 2},
            "MDC227",
            "/megatron/decoder_first_pipeline_num_layers",
            "Mismatch",
        ),
        (
            {"decoder_first_pipeline_num_layers": 2, "decoder_last_pipeline_num_layers": 2},
            {"pp": 4, "vpp": 2},
            "MDC227",
            "/parallelism/vpp",
            "each middle pipeline stage holds 3 layers",
        ),
        (
            {"account_for_embedding_in_pipeline_split": True},
            {"pp": 4},
            "MDC222",
            "/model/num_layers",
            "num_layers + 1 (the embedding, counted as layers) = 11",
        ),
        (
            {
                "account_for_embedding_in_pipeline_split": True,
                "account_for_loss_in_pipeline_split": True,
            },
            {"pp": 4, "vpp": 2},
            "MDC223",
            "/parallelism/vpp",
            "(12 / 4 = 3) is not divisible by vpp (2)",
        ),
        (
            {"pipeline_model_parallel_layout": "Et*5|t*5L", "decoder_first_pipeline_num_layers": 5},
            {"pp": 2},
            "MDC228",
            "/megatron/pipeline_model_parallel_layout",
            "cannot be set with decoder_first_pipeline_num_layers",
        ),
        (
            {"pipeline_model_parallel_layout": "Et*5|t*4|tL"},
            {"pp": 2},
            "MDC228",
            "/megatron/pipeline_model_parallel_layout",
            "not a multiple of pp (2)",
        ),
        (
            {"pipeline_model_parallel_layout": "Et*5|t*4L"},
            {"pp": 2},
            "MDC228",
            "/megatron/pipeline_model_parallel_layout",
            "it holds 9 decoder layers (t), but num_layers = 10",
        ),
        (
            {"pipeline_model_parallel_layout": "Et*5|t*5xL"},
            {"pp": 2},
            "MDC228",
            "/megatron/pipeline_model_parallel_layout",
            "invalid layer character 'x'",
        ),
        (
            {"pipeline_model_parallel_layout": "Et|ttt|ttt|tttL"},
            {"pp": 2, "vpp": 3},
            "MDC228",
            "/parallelism/vpp",
            "vpp = 3 but pipeline_model_parallel_layout has",
        ),
    ],
)
def test_megatron_refusals_are_located(
    tmp_path: Path,
    megatron: dict[str, Any],
    sizes: dict[str, int],
    code: str,
    pointer: str,
    words: str,
) -> None:
    model = {**BLOOM, "num_layers": 10}
    status, text, _ = run(
        tmp_path,
        "validate",
        sizes["pp"],
        4,
        model=model,
        parallelism={"tp": 4, **sizes},
        megatron=megatron,
    )
    assert status != 0
    assert code in text and words in text, text
    assert pointer in text, text


def test_extra_args_flags_are_read_as_their_keys(tmp_path: Path) -> None:
    """The flags given in extra_args are read into the plan as if given by their keys."""
    code, text, out = run(
        tmp_path,
        "compile",
        64,
        8,
        model=LLAMA_405B,
        parallelism={"tp": 8, "pp": 8},
        megatron={
            "extra_args": [
                "--account-for-embedding-in-pipeline-split",
                "--account-for-loss-in-pipeline-split",
            ]
        },
    )
    assert code == 0, text
    args = worker_args(out)
    assert args.count("--account-for-embedding-in-pipeline-split") == 1
    assert plan_of(out)["pipeline_stages"][1] == {
        "ranks": [1, 6],
        "layers": 16,
        "virtual_stages": [16],
    }


def test_extra_args_refusals_point_at_the_flag(tmp_path: Path) -> None:
    code, text, _ = run(
        tmp_path,
        "validate",
        2,
        4,
        model={**BLOOM, "num_layers": 10},
        parallelism={"tp": 4, "pp": 2},
        megatron={
            "decoder_first_pipeline_num_layers": 3,
            "extra_args": ["--tokenizer-type", "X", "--account-for-loss-in-pipeline-split"],
        },
    )
    assert code != 0 and "MDC227" in text
    assert "/megatron/extra_args/2" in text


@pytest.mark.parametrize(("flag", "refused"), [("4", False), ("2", True)])
def test_a_flag_and_its_key_are_refused_only_when_they_disagree(
    tmp_path: Path, flag: str, refused: bool
) -> None:
    """Megatron-LM keeps the last of the two: the same value is one setting, another is
    a contradiction, named with both places."""
    code, text, _ = run(
        tmp_path,
        "validate",
        2,
        4,
        model={**BLOOM, "num_layers": 8},
        parallelism={"tp": 4, "pp": 2},
        megatron={
            "decoder_first_pipeline_num_layers": 4,
            "extra_args": ["--decoder-first-pipeline-num-layers", flag],
        },
    )
    assert (code != 0) == refused and ("MDC323" in text) == refused, text
    if refused:
        assert "[megatron] decoder_first_pipeline_num_layers = 4" in text
        assert "/megatron/extra_args/0" in text


def test_explain_lists_the_layers_of_each_stage(tmp_path: Path) -> None:
    code, text, _ = run(
        tmp_path,
        "explain",
        4,
        8,
        model={**BLOOM, "num_layers": 10},
        parallelism={"tp": 8, "pp": 4},
        megatron={"decoder_first_pipeline_num_layers": 1, "decoder_last_pipeline_num_layers": 3},
    )
    assert code == 0, text
    assert "  stage 0: 1 layers + input embedding\n" in text
    assert "  stage 1..2: 3 layers\n" in text
    assert "  stage 3: 3 layers + output layer\n" in text


# ----------------------------------------------------------------------------- the module


def test_runs_stay_few_for_a_huge_pipeline() -> None:
    stages, found = split_layers(
        PipelineSplit(rule="megatron", embedding=True, loss=True),
        Model(layers=(1 << 30) - 2),
        1 << 30,
        None,
    )
    assert not found and stages is not None
    assert [(r.first_rank, r.count, r.chunks) for r in stages.runs] == [
        (0, 1, (0,)),
        (1, (1 << 30) - 2, (1,)),
        ((1 << 30) - 1, 1, (0,)),
    ]


def test_layout_grammar() -> None:
    assert parse_layout("E(tt|)*2,tL") == [
        ["embedding", "decoder", "decoder"],
        ["decoder", "decoder"],
        ["decoder", "loss"],
    ]
    assert parse_layout("Et*3|m|L") == [
        ["embedding", "decoder", "decoder", "decoder"],
        ["mtp"],
        ["loss"],
    ]


# ----------------------------------------------------------------------------- torchtitan


def titan(tmp_path: Path, command: str, nodes: int, **tables: Any) -> tuple[int, str, Path]:
    return run(
        tmp_path,
        command,
        nodes,
        8,
        launcher="torchtitan",
        **tables,
    )


def test_torchtitan_uneven_virtual_stages_compile(tmp_path: Path) -> None:
    """32 layers, pp 4, vpp 3: TorchTitan builds 12 stages (layers_per_stage 3)."""
    code, text, out = titan(
        tmp_path,
        "compile",
        4,
        parallelism={"tp": 8, "pp": 4, "vpp": 3},
        batch={"micro_batch_size": 12, "global_batch_size": 12},
        torchtitan={"flavor": "8B"},
    )
    assert code == 0, text
    toml = (out / "launch" / "torchtitan.toml").read_text(encoding="utf-8")
    assert "pipeline_parallel_layers_per_stage = 3" in toml
    # TorchTitan: (32 + 1 + 1) effective layers over 12 stages, the first 10 one more
    assert plan_of(out)["pipeline_stages"] == [
        {"ranks": [0, 0], "layers": 8, "virtual_stages": [2, 3, 3]},
        {"ranks": [1, 1], "layers": 9, "virtual_stages": [3, 3, 3]},
        {"ranks": [2, 2], "layers": 8, "virtual_stages": [3, 3, 2]},
        {"ranks": [3, 3], "layers": 7, "virtual_stages": [3, 3, 1]},
    ]


def test_torchtitan_hint_offers_only_buildable_vpp(tmp_path: Path) -> None:
    code, text, _ = titan(
        tmp_path,
        "validate",
        2,
        parallelism={"tp": 8, "pp": 2, "vpp": 4},
        torchtitan={"flavor": "8B"},
    )
    assert code != 0 and "MDC336" in text
    hint = text.split("vpp can be 2 or one of ")[1].split("\n")[0]
    assert "4" not in hint.split(", ") and "3" in hint.split(", ")


def test_torchtitan_model_must_match_the_flavor(tmp_path: Path) -> None:
    code, text, _ = titan(
        tmp_path,
        "validate",
        4,
        parallelism={"tp": 8, "pp": 4},
        model={"num_layers": 80, "hidden_size": 4096},
        torchtitan={"flavor": "8B"},
    )
    assert code != 0
    assert "MDC393" in text and "/model/num_layers" in text and "has num_layers = 32" in text
    assert text.count("MDC393") == 1  # hidden_size 4096 agrees


def test_torchtitan_experts_come_from_the_flavor(tmp_path: Path) -> None:
    code, text, out = titan(
        tmp_path,
        "compile",
        2,
        parallelism={"tp": 1, "ep": 8},
        torchtitan={"model": "qwen3", "flavor": "30B-A3B"},
    )
    assert code == 0, text
    assert "MDC224" not in text
    assert plan_of(out)["model"]["num_experts"] == 128
