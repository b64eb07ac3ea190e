"""mdc tune on TorchTitan: its search space (activation checkpointing, the local batch) is
searched and written into [torchtitan.config], held keys are kept, and each gradient-
accumulation step runs its own pipeline schedule, in tune's prediction as in explain's."""

from __future__ import annotations

import io
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from tests.tools import REPO

from mdc.cli import main
from mdc.hardware import builtin
from mdc.plan.memory import resolve_shape
from mdc.plan.model import BatchPlan, Sizes, TrainingSetup
from mdc.spec import ModelTable
from mdc.tune.perf import Layout, layout_of, predict
from mdc_builtin.launchers.torchtitan import TorchtitanOptions
from mdc_builtin.launchers.torchtitan import training as titan_training

EXAMPLE = REPO / "examples" / "torchtitan-llama3-8b-4x8.toml"


def _run(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(args), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def _open_spec(tmp_path: Path, torchtitan: str = "") -> Path:
    """The TorchTitan example on H100s with its sizes, local batch and checkpointing left
    open (``torchtitan``: lines added to its [torchtitan] table)."""
    text = EXAMPLE.read_text(encoding="utf-8")
    text = re.sub(r"\[parallelism\]\ntp = 2\npp = 2\n\n", "", text)
    text = re.sub(r"micro_batch_size = 8 .*\n", "", text)
    text = text.replace('activation_checkpoint = { mode = "full" }\n', "")
    text = text.replace('accelerator = "nvidia"', 'accelerator_model = "h100-sxm"')
    text = text.replace("steps = 1000\n", f"steps = 1000\n{torchtitan}")
    path = tmp_path / "titan.toml"
    path.write_text(text, encoding="utf-8")
    return path


def _tuned(spec: Path, top: int = 12) -> dict[str, Any]:
    code, out, err = _run("tune", str(spec), "--format", "json", "--top", str(top))
    assert code == 0, err
    result: dict[str, Any] = json.loads(out)
    assert result["candidates"]
    return result


@pytest.mark.slow
def test_checkpointing_is_searched_and_the_best_compiles_as_predicted(tmp_path: Path) -> None:
    spec = _open_spec(tmp_path)
    result = _tuned(spec)
    modes = set()
    for row in result["candidates"]:
        checkpoint = row["spec"]["torchtitan"]["config"]["activation_checkpoint"]
        mode = checkpoint["mode"]
        modes.add(mode)
        # TorchTitan's selective checkpointing per op, named as the estimate counts it
        if mode == "selective":
            assert checkpoint["selective_ac_option"] == "op"
            assert "rc:selective-op" in row["layout"]
        # the user's other config tables are kept beside the one tune writes
        assert row["spec"]["torchtitan"]["config"]["metrics"]["log_freq"] == 10
    assert modes <= {"none", "selective", "full"} and "selective" in modes
    best = tmp_path / "best.toml"
    assert _run("tune", str(spec), "--write", str(best))[0] == 0
    code, out, err = _run("explain", str(best), "--format", "json")
    assert code == 0, err
    predicted = json.loads(out)["predicted"]
    assert predicted.pop("accelerator_model") == "h100-sxm"
    assert predicted == result["candidates"][0]["predicted"]


def test_a_held_schedule_and_checkpointing_mode_are_kept(tmp_path: Path) -> None:
    held = 'pipeline_schedule = "1F1B"\n'
    spec = _open_spec(tmp_path, held)
    text = spec.read_text(encoding="utf-8")
    text = text.replace(
        "[torchtitan.config]\n", '[torchtitan.config]\nactivation_checkpoint = { mode = "full" }\n'
    )
    # two pipeline stages held (the 8B model's fastest layouts have none), so that every row
    # is one the schedule constrains
    spec.write_text(
        text.replace("[batch]", "[parallelism]\npp = 2\n\n[batch]", 1), encoding="utf-8"
    )
    result = _tuned(spec, top=20)
    # 1F1B runs one stage per rank: no interleaved layout is tried, so none is refused
    assert "MDC336" not in result["searched"]["refused_by_compile"]
    assert all(row["parallelism"]["pp"] == 2 for row in result["candidates"])
    for row in result["candidates"]:
        assert row["parallelism"]["vpp"] == 1 and row["recompute"] == "full"
        assert "activation_checkpoint" not in row["spec"]["torchtitan"]["config"] or (
            row["spec"]["torchtitan"]["config"]["activation_checkpoint"] == {"mode": "full"}
        )


def test_checkpointing_overridden_in_the_command_is_held(tmp_path: Path) -> None:
    """``--activation_checkpoint.mode full`` in the job's command wins over the config file
    in TorchTitan: every candidate runs it, is estimated with it, and the written spec
    leaves the command's override alone (no activation_checkpoint written beside it)."""
    spec = _open_spec(tmp_path)
    text = spec.read_text(encoding="utf-8").replace(
        '"torchtitan.train"]', '"torchtitan.train", "--activation_checkpoint.mode", "full"]'
    )
    spec.write_text(text, encoding="utf-8")
    result = _tuned(spec)
    for row in result["candidates"]:
        assert row["recompute"] == "full"
        assert "activation_checkpoint" not in row["spec"]["torchtitan"]["config"]
    best = tmp_path / "best.toml"
    assert _run("tune", str(spec), "--write", str(best))[0] == 0
    assert '"--activation_checkpoint.mode", "full"]' in best.read_text(encoding="utf-8")
    code, out, err = _run("explain", str(best), "--format", "json")
    assert code == 0, err
    predicted = json.loads(out)["predicted"]
    predicted.pop("accelerator_model")
    assert predicted == result["candidates"][0]["predicted"]


@pytest.mark.parametrize(("schedules", "microbatches"), [(1, 8), (8, 8), (4, 16)])
def test_each_schedule_run_fills_and_drains_the_pipeline(schedules: int, microbatches: int) -> None:
    """The bubble of ``schedules`` runs of ``microbatches / schedules`` micro batches on pp
    stages: each run idles (pp - 1) micro-batch slots, so the share is
    schedules * (pp - 1) / (microbatches + schedules * (pp - 1))."""
    model = ModelTable(num_layers=32, hidden_size=4096, num_attention_heads=32,
                       num_query_groups=8, ffn_hidden_size=14336, vocab_size=128256,
                       seq_length=8192, gated_mlp=True, dtype="bf16")  # fmt: skip
    shape = resolve_shape(model)
    assert shape is not None
    pp = 4
    layout = Layout(tp=1, pp=pp, cp=1, ep=1, etp=1, dp=8, vpp=1, micro_batch_size=1,
                    microbatches=microbatches, schedules=schedules, sequence_parallel=False,
                    recompute="none", zero_stage=3)  # fmt: skip
    found = predict(shape, layout, builtin()["h100-sxm"], nproc_per_node=8)
    idle = schedules * (pp - 1)
    assert found.bubble == pytest.approx(idle / (microbatches + idle))


def _llama3_8b_compute(**recompute: Any) -> float:
    """The predicted compute time of Llama 3 8B under FSDP on 8 H100s, local batch 2, with
    the given recompute settings."""
    model = ModelTable(num_layers=32, hidden_size=4096, num_attention_heads=32,
                       num_query_groups=8, ffn_hidden_size=14336, vocab_size=128256,
                       seq_length=8192, gated_mlp=True, dtype="bf16")  # fmt: skip
    shape = resolve_shape(model)
    assert shape is not None
    sizes = Sizes(tp=1, pp=1, cp=1, ep=1, etp=1, dp=8, edp=8)
    batch = BatchPlan(global_batch_size=16, micro_batch_size=2, grad_accum_steps=1)
    training = TrainingSetup(zero_stage=3, sequence_parallel=True, **recompute)
    layout = layout_of(sizes, batch, training, "bf16", "tp-cp-ep-dp-pp", 32, None)
    return predict(shape, layout, builtin()["h100-sxm"], nproc_per_node=8).breakdown["compute"]


def test_every_nth_layer_checkpointing_recomputes_that_share() -> None:
    """TorchTitan's selective_ac_option = "2" checkpoints every second layer whole: the
    model recomputes half the layers, so the extra compute is half of full recompute's."""
    compute = _llama3_8b_compute
    every_other = compute(recompute="full", recompute_every=2)
    none, full = compute(recompute="none"), compute(recompute="full")
    assert every_other - none == pytest.approx((full - none) / 2)


def test_per_op_checkpointing_recomputes_the_matmuls_it_does_not_keep() -> None:
    """TorchTitan's selective_ac_option = "op" keeps wq's, wv's, w1's and w2's outputs of a
    Llama layer and runs wk, wo and w3 again, but not the attention kernel: the extra compute
    is their share of the dense GEMMs' extra under full recompute (which also recomputes
    attention, as Megatron's selective recompute does alone)."""
    h, q, g, f = 4096, 4096, 1024, 14336  # Llama 3 8B: 32 heads of 128, 8 groups
    compute = _llama3_8b_compute
    none, full = compute(recompute="none"), compute(recompute="full")
    attention_core = compute(recompute="selective")
    per_op = compute(recompute="selective", recompute_per_op=True)
    again = (h * g + q * h + h * f) / (h * q + 2 * h * g + q * h + 3 * h * f)
    assert per_op - none == pytest.approx(again * (full - attention_core))


def test_explain_names_per_op_checkpointing(tmp_path: Path) -> None:
    spec = _open_spec(tmp_path)
    text = spec.read_text(encoding="utf-8").replace(
        "[torchtitan.config]\n",
        "[torchtitan.config]\n"
        'activation_checkpoint = { mode = "selective", selective_ac_option = "op" }\n',
    )
    spec.write_text(text, encoding="utf-8")
    code, out, err = _run("explain", str(spec), "--format", "json")
    assert code == 0, err
    assert json.loads(out)["memory"]["activations"]["recompute"] == "selective per op"


def _seq_len_spec(tmp_path: Path) -> Path:
    """The example with its sequence length in [torchtitan] seq_len instead of [model]."""
    text = EXAMPLE.read_text(encoding="utf-8").replace("seq_length = 8192\n", "")
    text = text.replace('accelerator = "nvidia"', 'accelerator_model = "h100-sxm"')
    text = text.replace("steps = 1000\n", "steps = 1000\nseq_len = 8192\n")
    path = tmp_path / "titan.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_torchtitan_seq_len_is_the_sequence_the_estimate_reads(tmp_path: Path) -> None:
    """[torchtitan] seq_len is the sequence TorchTitan trains on: with a flavor and an
    accelerator_model, explain shows the same memory estimate and prediction as with
    [model] seq_length (it was silently lost)."""
    code, from_table, err = _run("explain", str(_seq_len_spec(tmp_path)), "--format", "json")
    assert code == 0, err
    code, from_model, err = _run("explain", str(EXAMPLE), "--format", "json")
    assert code == 0, err
    table, model = json.loads(from_table), json.loads(from_model)
    assert table["memory"] is not None and table["memory"]["bytes"]["total"] > 0
    # the example names accelerator = "nvidia" (no capacity); its estimate is the same
    assert table["memory"]["bytes"] == model["memory"]["bytes"]
    assert table["model"]["seq_length"] == 8192
    assert "predicted" in table


def test_tune_names_only_the_missing_model_keys(tmp_path: Path) -> None:
    text = EXAMPLE.read_text(encoding="utf-8").replace("seq_length = 8192\n", "")
    text = text.replace('accelerator = "nvidia"', 'accelerator_model = "h100-sxm"')
    spec = tmp_path / "titan.toml"
    spec.write_text(text, encoding="utf-8")
    code, _, err = _run("tune", str(spec))
    assert code == 1
    assert "error[MDC612]: mdc tune needs [model] seq_length (at /model)" in err
    assert "num_layers" not in err.split("MDC612", 1)[1].splitlines()[0]


def _llama3_8b_breakdown(precision: str = "bf16", **training: Any) -> Mapping[str, float]:
    """The predicted step of Llama 3 8B under FSDP on 8 H100s, local batch 2 (one micro
    batch of 2 x 8,192 tokens), without recompute, by term."""
    model = ModelTable(num_layers=32, hidden_size=4096, num_attention_heads=32,
                       num_query_groups=8, ffn_hidden_size=14336, vocab_size=128256,
                       seq_length=8192, gated_mlp=True, dtype=precision)  # fmt: skip
    shape = resolve_shape(model)
    assert shape is not None
    sizes = Sizes(tp=1, pp=1, cp=1, ep=1, etp=1, dp=8, edp=8)
    batch = BatchPlan(global_batch_size=16, micro_batch_size=2, grad_accum_steps=1)
    setup = TrainingSetup(zero_stage=3, sequence_parallel=True, **training)
    layout = layout_of(sizes, batch, setup, precision, "tp-cp-ep-dp-pp", 32, None)
    found = predict(shape, layout, builtin()["h100-sxm"], nproc_per_node=8, precision=precision)
    return found.breakdown


def _llama3_8b_elementwise(precision: str = "bf16", **training: Any) -> float:
    return _llama3_8b_breakdown(precision, **training)["elementwise"]


_TOKEN_LAYERS = 2 * 8192 * 32  # tokens of the micro batch x layers of the stage


def test_an_uncompiled_model_pays_its_eager_kernels_bytes() -> None:
    """Eager PyTorch runs TorchTitan's RMSNorm (x.float(), pow, mean, mul, type_as, weight:
    36 bytes per element where one fused kernel moves 4), rotary embedding on q and k
    (float, complex multiply, type_as: 20 against 4) and SwiGLU (silu, mul: 10 against 6)
    one kernel per operator: per token and layer, forward, 2 norms x 4,096 x 32 + (4,096 +
    1,024) x 16 + 14,336 x 4 bytes more, and the backward twice that."""
    forward = 2 * 4096 * 32 + (4096 + 1024) * 16 + 14336 * 4
    hbm = builtin()["h100-sxm"].memory_bandwidth_gb_s * 1e9
    extra = _llama3_8b_elementwise(eager_kernels=True) - _llama3_8b_elementwise()
    assert extra == pytest.approx(3 * forward * _TOKEN_LAYERS / hbm)


def test_torchao_float8_casts_each_linears_operands() -> None:
    """torchao's Float8Linear casts each linear's input forward and its output gradient
    backward (amax read 2 bytes, cast read 2 write 1, the column-major copy 1: 6 bytes per
    element): inputs wq, wk, wv, w1, w3 the hidden vector each, wo 4,096, w2 14,336; output
    gradients wq 4,096, wk and wv 1,024, wo 4,096, w1 and w3 14,336, w2 4,096. Charged only
    where the GEMMs run in fp8."""
    inputs = 5 * 4096 + 4096 + 14336
    grads = 4096 + 1024 + 1024 + 4096 + 14336 + 14336 + 4096
    hbm = builtin()["h100-sxm"].memory_bandwidth_gb_s * 1e9
    extra = _llama3_8b_elementwise("fp8", float8_casts=True) - _llama3_8b_elementwise("fp8")
    assert extra == pytest.approx(6 * (inputs + grads) * _TOKEN_LAYERS / hbm)
    assert _llama3_8b_elementwise(float8_casts=True) == _llama3_8b_elementwise()


def _predicted_tokens(spec: Path) -> float:
    code, out, err = _run("explain", str(spec), "--format", "json")
    assert code == 0, err
    return float(json.loads(out)["predicted"]["tokens_per_s_per_gpu"])


def test_torch_compile_is_predicted_faster_than_eager(tmp_path: Path) -> None:
    """[torchtitan.config] compile.enable fuses each block's elementwise operators: the same
    layout is predicted faster compiled than eager."""
    eager = _predicted_tokens(_open_spec(tmp_path))
    compiled = _open_spec(tmp_path)
    text = compiled.read_text(encoding="utf-8")
    compiled.write_text(
        text.replace("[torchtitan.config]\n", "[torchtitan.config]\ncompile = { enable = true }\n"),
        encoding="utf-8",
    )
    assert _predicted_tokens(compiled) > eager * 1.05


def test_async_tensor_parallel_overlaps_the_tp_collectives(tmp_path: Path) -> None:
    """[torchtitan.config.parallelism] enable_async_tensor_parallel, compiled, pipelines
    tensor parallelism's all-gathers and reduce-scatters with the matmuls beside them: the
    same tp 2 layout is predicted faster with it; uncompiled (TorchTitan refuses async TP
    without torch.compile) it changes nothing."""
    held = "[parallelism]\ntp = 2\npp = 1\n\n"

    def spec(config: str) -> Path:
        path = _open_spec(tmp_path)
        text = held + path.read_text(encoding="utf-8")
        path.write_text(text.replace("[torchtitan.config]\n", f"[torchtitan.config]\n{config}"))
        return path

    compiled = "compile = { enable = true }\n"
    async_tp = "parallelism = { enable_async_tensor_parallel = true }\n"
    assert _predicted_tokens(spec(compiled + async_tp)) > _predicted_tokens(spec(compiled))
    assert _predicted_tokens(spec(async_tp)) == _predicted_tokens(spec(""))


def test_fsdp_float8_all_gather_gathers_the_layers_in_one_byte() -> None:
    """torchao's float8 all-gather (enable_fsdp_float8_all_gather) gathers the layers'
    linear weights in fp8 and the embedding in bf16, twice per micro batch; the
    reduce-scatter still moves fp32 gradients (TorchTitan's mixed_precision_reduce). The
    data-parallel term, hidden but for one layer's share and the overlap tax, scales with
    those bytes: Llama 3 8B's 32 layers of 218.1M weights (wq, wo 4,096^2; wk, wv 4,096 x
    1,024; w1, w2, w3 4,096 x 14,336) and its 525.3M embedding."""
    layers = 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336)
    embedding = 128256 * 4096
    weights = layers + embedding
    bf16 = 4 * weights + 2 * 2 * weights
    fp8 = 4 * weights + 2 * (2 * embedding + 1 * layers)
    gathered = _llama3_8b_breakdown("fp8", fp8_gather_bytes=1)["dp"]
    assert gathered / _llama3_8b_breakdown("fp8")["dp"] == pytest.approx(fp8 / bf16)
    # bf16 GEMMs gather bf16 weights whatever the float8 option says
    assert _llama3_8b_breakdown(fp8_gather_bytes=1)["dp"] == _llama3_8b_breakdown()["dp"]


def test_fsdp_reduce_dtype_sets_the_reduce_scatter_bytes() -> None:
    """TorchTitan's training.mixed_precision_reduce = "bfloat16" reduce-scatters 2-byte
    gradients where float32 (its default) moves 4: per micro batch 2 of the 8 bytes per
    weight (two 2-byte gathers and the reduce-scatter) fewer."""
    fp32 = _llama3_8b_breakdown(grad_bytes=4)["dp"]
    assert _llama3_8b_breakdown(grad_bytes=4, reduce_bytes=2)["dp"] / fp32 == pytest.approx(6 / 8)


def test_torchtitan_reads_its_fsdp_dtypes_and_switches() -> None:
    """The launcher's training: the float8 all-gather (today's quantize.linear.float8 or
    the older float8 section; tensorwise only), the reduce dtype, async TP only with the
    model compiled, eager kernels unless it is."""

    def setup(**config: Any) -> TrainingSetup:
        return titan_training(TorchtitanOptions(config=config))

    gather = {"enable_fsdp_float8_all_gather": True}
    assert setup(quantize={"linear": {"float8": gather}}).fp8_gather_bytes == 1
    assert setup(float8=gather).fp8_gather_bytes == 1
    rowwise = {**gather, "recipe_name": "rowwise"}
    assert setup(quantize={"linear": {"float8": rowwise}}).fp8_gather_bytes is None
    assert setup().fp8_gather_bytes is None
    assert setup(training={"mixed_precision_reduce": "bfloat16"}).reduce_bytes == 2
    assert setup().reduce_bytes is None
    compiled = {"enable": True}
    async_tp = {"enable_async_tensor_parallel": True}
    assert setup(compile=compiled, parallelism=async_tp).async_tp
    assert not setup(parallelism=async_tp).async_tp
    assert setup().eager_kernels and not setup(compile=compiled).eager_kernels
