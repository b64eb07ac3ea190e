"""mdc tune: every printed layout compiles, --write is the first row, output is stable."""

from __future__ import annotations

import io
import json
import math
import re
import tomllib
from pathlib import Path
from typing import Any

import attrs
import pytest
from tests.tools import REPO

from mdc.cli import main
from mdc.hardware import builtin
from mdc.plan import per_op
from mdc.plan.memory import resolve_shape
from mdc.plan.named_models import CATALOGUE_FILE
from mdc.spec import ModelTable
from mdc.tune import terms
from mdc.tune.flops import token_flops
from mdc.tune.perf import DEFAULT, Layout, predict, stage_params

EXAMPLE = REPO / "examples" / "tune-llama70b-64xh100.toml"


def _run(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(args), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def tuned() -> dict[str, Any]:
    code, out, err = _run("tune", str(EXAMPLE), "--format", "json", "--top", "6")
    assert code == 0, err
    result: dict[str, Any] = json.loads(out)
    return result


def _spec_with(tmp_path: Path, candidate: dict[str, Any], name: str) -> Path:
    """The example with a candidate's printed tables merged in, as a JSON spec."""
    data = tomllib.loads(EXAMPLE.read_text(encoding="utf-8"))
    for table, values in candidate["spec"].items():
        data.setdefault(table, {}).update(values)
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def _tuned_with(megatron: str, tmp_path: Path, top: int) -> dict[str, Any]:
    """tune's JSON for the example with ``megatron`` as its [megatron] table; every row
    shown compiled (none refused on the way)."""
    spec = tmp_path / "with-table.toml"
    spec.write_text(EXAMPLE.read_text(encoding="utf-8") + f"\n[megatron]\n{megatron}\n",
                    encoding="utf-8")  # fmt: skip
    code, out, err = _run("tune", str(spec), "--format", "json", "--top", str(top))
    assert code == 0, err
    result: dict[str, Any] = json.loads(out)
    assert result["candidates"] and result["searched"]["refused_by_compile"] == {}
    return result


@pytest.mark.slow
def test_every_printed_candidate_compiles(tuned: dict[str, Any], tmp_path: Path) -> None:
    candidates = tuned["candidates"]
    assert isinstance(candidates, list) and len(candidates) == 6
    for i, candidate in enumerate(candidates):
        spec = _spec_with(tmp_path, candidate, f"c{i}")
        code, _, err = _run("compile", str(spec), "-o", str(tmp_path / f"out{i}"))
        assert code == 0, (candidate["layout"], err)
        plan = json.loads((tmp_path / f"out{i}" / "plan.json").read_text(encoding="utf-8"))
        assert plan["parallelism"]["dp"] == candidate["parallelism"]["dp"]
        assert candidate["memory_gib"] <= 81559 / 1024


@pytest.mark.slow
def test_write_output_compiles_and_is_the_first_row(tuned: dict[str, Any], tmp_path: Path) -> None:
    out_spec = tmp_path / "best.toml"
    code, _, err = _run("tune", str(EXAMPLE), "--write", str(out_spec))
    assert code == 0, err
    written = tomllib.loads(out_spec.read_text(encoding="utf-8"))
    first = tuned["candidates"][0]
    for axis in ("tp", "pp", "cp"):
        assert written["parallelism"][axis] == first["parallelism"][axis]
    assert written["parallelism"].get("vpp", 1) == first["parallelism"]["vpp"]
    assert written["batch"]["micro_batch_size"] == first["micro_batch_size"]
    assert written["job"] == tomllib.loads(EXAMPLE.read_text(encoding="utf-8"))["job"]
    code, _, err = _run("compile", str(out_spec), "-o", str(tmp_path / "out"))
    assert code == 0, err


@pytest.mark.slow
def test_ranking_is_deterministic_and_sorted(tuned: dict[str, Any]) -> None:
    again = _run("tune", str(EXAMPLE), "--format", "json", "--top", "6")[1]
    assert json.loads(again) == tuned
    rates = [c["predicted"]["tokens_per_s_per_gpu"] for c in tuned["candidates"]]
    assert rates == sorted(rates, reverse=True)
    names = {"step_time_s", "tokens_per_s_per_gpu", "model_tflops_per_gpu", "mfu"}
    for c in tuned["candidates"]:
        assert names <= set(c["predicted"])
        assert set(c["parallelism"]) == {"tp", "pp", "cp", "ep", "etp", "vpp", "dp"}


@pytest.mark.slow
def test_text_output_explains_the_runners_up() -> None:
    code, out, _ = _run("tune", str(EXAMPLE), "--top", "3")
    assert code == 0
    assert "why the runners-up lost:" in out
    why = out.split("why the runners-up lost:\n", 1)[1].splitlines()
    assert [line.split()[0] for line in why] == ["2", "3"]
    assert all(("slower" in line) or ("as fast" in line) for line in why)


def test_held_fixed_parallelism_is_kept(tmp_path: Path) -> None:
    spec = tmp_path / "fixed.toml"
    spec.write_text(
        EXAMPLE.read_text(encoding="utf-8") + "\n[parallelism]\ntp = 8\n", encoding="utf-8"
    )
    code, out, err = _run("tune", str(spec), "--format", "json")
    assert code == 0, err
    assert {c["parallelism"]["tp"] for c in json.loads(out)["candidates"]} == {8}


@pytest.mark.slow
def test_svg_marks_the_limit_and_the_choice(tmp_path: Path) -> None:
    picture = tmp_path / "tune.svg"
    code, _, _ = _run("tune", str(EXAMPLE), "--svg", str(picture))
    assert code == 0
    text = picture.read_text(encoding="utf-8")
    assert text.startswith("<svg") and "memory limit 79.6475 GiB" in text and "best: " in text
    import xml.etree.ElementTree as ET

    ET.fromstring(text)  # well-formed


def test_a_spec_without_accelerator_model_is_refused_with_its_location(tmp_path: Path) -> None:
    spec = tmp_path / "bare.toml"
    spec.write_text(
        EXAMPLE.read_text(encoding="utf-8").replace('accelerator_model = "h100-sxm"\n', ""),
        encoding="utf-8",
    )
    code, _, err = _run("tune", str(spec))
    assert code == 1 and "bare.toml:11:" in err and "error[MDC611]" in err


def test_gemms_in_a_precision_the_chip_lacks_are_refused_before_the_search(
    tmp_path: Path,
) -> None:
    # fp8 on an A100: compile refuses every layout (MDC602), so tune says so with compile's
    # own finding, where it once compiled 400 layouts to find it out
    spec = tmp_path / "a100.toml"
    text = EXAMPLE.read_text(encoding="utf-8").replace('"h100-sxm"', '"a100-80gb"')
    spec.write_text(text.replace('dtype = "bf16"', 'dtype = "fp8"'), encoding="utf-8")
    assert 'dtype = "fp8"' in spec.read_text(encoding="utf-8")
    code, _, err = _run("tune", str(spec))
    compiled, _, said = _run("compile", str(spec), "-o", str(tmp_path / "out"))
    assert code == compiled == 1
    assert "error[MDC602]" in err and "searched" not in err
    assert [line for line in err.splitlines() if "MDC602" in line] == [
        line for line in said.splitlines() if "MDC602" in line
    ]


# ------------------------------------------------------------------ the model's arithmetic


def test_full_attention_count_is_narayanans_formula() -> None:
    """Narayanan et al. 2021, appendix: 72*B*s*l*h^2*(1 + s/(6h) + V/(12*h*l)) for GPT-3."""
    layers, h, s, V = 96, 12288, 2048, 51200
    shape = resolve_shape(
        ModelTable(
            num_layers=layers, hidden_size=h, num_attention_heads=96, vocab_size=V, seq_length=s
        )
    )
    assert shape is not None
    paper = 72 * s * layers * h**2 * (1 + s / (6 * h) + V / (12 * h * layers))
    assert token_flops(shape, causal=False).total * s == pytest.approx(paper, rel=1e-12)


def test_causal_count_halves_only_the_attention_scores() -> None:
    shape = resolve_shape(
        ModelTable(
            num_layers=2, hidden_size=64, num_attention_heads=4, vocab_size=256, seq_length=32
        )
    )
    assert shape is not None
    full, causal = token_flops(shape, causal=False), token_flops(shape, causal=True)
    assert full.attention == 2 * causal.attention
    assert full.dense_gemm == causal.dense_gemm and full.logits == causal.logits


def _layout(**kw: object) -> Layout:
    base: dict[str, Any] = {"tp": 8, "pp": 4, "cp": 1, "ep": 1, "etp": 8, "dp": 2, "vpp": 1}
    base.update(micro_batch_size=1, microbatches=64, sequence_parallel=True, recompute="none")
    base.update(kw)
    return Layout(**base)


def _dense_70b() -> Any:
    """An 80-layer, 8192-wide dense model with a 128k vocabulary."""
    shape = resolve_shape(
        ModelTable(num_layers=80, hidden_size=8192, num_attention_heads=64, vocab_size=128256,
                   seq_length=4096)
    )  # fmt: skip
    assert shape is not None
    return shape


def test_bubble_is_p_minus_1_over_v_m() -> None:
    shape = _dense_70b()
    hw = builtin()["h100-sxm"]
    for vpp, m in ((1, 8), (5, 8), (1, 64)):
        p = predict(shape, _layout(vpp=vpp, microbatches=m), hw, nproc_per_node=8)
        assert p.bubble == pytest.approx(3 / vpp / (m + 3 / vpp))
        assert p.breakdown["pp-bubble"] / (
            p.step_time_s - p.breakdown["dp"] - p.breakdown["optimizer"]
        ) == pytest.approx(p.bubble)


def test_the_breakdown_adds_up_to_the_step() -> None:
    """The stage works its m micro batches and idles the fill: each term counts m micro
    batches, the bubble the fill, so ``mdc explain``'s terms sum to the step."""
    shape = _dense_70b()
    hw = builtin()["h100-sxm"]
    for vpp, m in ((1, 8), (5, 8), (1, 64)):
        p = predict(shape, _layout(vpp=vpp, microbatches=m), hw, nproc_per_node=8)
        assert sum(p.breakdown.values()) == pytest.approx(p.step_time_s)


def test_interleaved_chunks_sync_their_data_parallel_buffers_in_warm_up_and_cool_down() -> None:
    """Megatron-Core syncs each model chunk's gradient and parameter buffer on its own
    (Megatron Bridge: the DP communication's granularity is a virtual stage's layers). With
    v chunks, all but the 1/v of the traffic of the chunk that ends the step hide in the first
    stage's warm-up and cool-down, 2(p-1) + (v-1)p chunk steps each (at most m*v), t_micro/v
    per forward-and-backward chunk step; that last chunk's share hides behind one micro batch,
    as the whole stage's does without interleaving. Hidden time still pays the overlap tax."""
    shape, hw = _dense_70b(), builtin()["h100-sxm"]
    for m in (8, 1):  # micro batches: 8 fill the warm-up, 1 leaves it short
        layout = _layout(dp=8, vpp=5, microbatches=m)  # dp members on 8 nodes: over the NIC
        traffic = predict(shape, attrs.evolve(layout, overlap_grad_reduce=False), hw,
                          nproc_per_node=8).breakdown["dp"]  # fmt: skip
        b = predict(shape, layout, hw, nproc_per_node=8).breakdown
        micro = sum(b[k] for k in ("compute", "elementwise", "tp", "cp", "ep", "pp-p2p")) / m
        steps = min(2 * 3 + 4 * 4, m * 5)
        exposed = max(0.0, traffic / 5 - micro) + max(0.0, traffic * 4 / 5 - steps * micro / 5)
        assert b["dp"] == pytest.approx(exposed + DEFAULT.overlap_tax * (traffic - exposed))
        flat = predict(shape, attrs.evolve(layout, vpp=1), hw, nproc_per_node=8).breakdown["dp"]
        assert b["dp"] < flat
    assert exposed > 0  # one micro batch's warm-up does not cover four chunks' traffic


def test_recompute_costs_time_and_tp_across_nodes_costs_more() -> None:
    shape = _dense_70b()
    hw = builtin()["h100-sxm"]
    none = predict(shape, _layout(), hw, nproc_per_node=8)
    full = predict(shape, _layout(recompute="full"), hw, nproc_per_node=8)
    assert full.step_time_s > none.step_time_s * 1.2
    inside = predict(shape, _layout(tp=8, dp=2), hw, nproc_per_node=8)
    across = predict(shape, _layout(tp=8, dp=2), hw, nproc_per_node=4)
    # H100: 450 GB/s NVLink inside a node at NCCL's 370/450; across nodes of 4, a tp group of
    # 8 has 4 members per node, so its traffic leaves over 4 NICs of 50 GB/s at 47/50: 188
    # GB/s (and the slower backward collectives may outlast the weight-gradient GEMM they
    # hide behind)
    assert across.breakdown["tp"] >= inside.breakdown["tp"] * 370 / 188 * (1 - 1e-9)


def test_backward_tp_collectives_hide_behind_the_weight_gradient_gemm() -> None:
    """Of a layer's 4 tp collectives (no recompute), the 2 forward ones wait (x tp_exposed),
    the 2 backward ones run beside the weight-gradient GEMM: on NVLink a 70B layer's GEMM
    outlasts them, so only overlap_tax of their time is lost."""
    shape = _dense_70b()
    hw = builtin()["h100-sxm"]
    layout = _layout(tp=8, dp=2)
    hidden = predict(shape, layout, hw, nproc_per_node=8).breakdown["tp"]
    charged = predict(
        shape, layout, hw, nproc_per_node=8, constants=attrs.evolve(DEFAULT, overlap_tax=1.0)
    ).breakdown["tp"]
    e, tax = DEFAULT.tp_exposed, DEFAULT.overlap_tax
    assert hidden / charged == pytest.approx((2 * e + 2 * tax) / (2 * e + 2))


def test_the_last_stage_runs_its_layers_and_the_output_layer() -> None:
    """The pipeline runs at the pace of the slower of the heaviest stage and the last one,
    which adds the output layer to its layers. The 70B's 128k-vocabulary output layer
    (2*h*V FLOPs per token) costs a little more than one of its layers (2*12*h^2 and the
    attention scores): one layer fewer on the last stage (the loss counted as a layer)
    leaves it the slowest by a little; with two fewer a middle stage sets the pace, and
    more fewer change nothing."""
    shape = _dense_70b()
    hw = builtin()["h100-sxm"]

    def step(**kw: object) -> float:
        return predict(shape, _layout(stage_layers=20, **kw), hw, nproc_per_node=8).step_time_s

    even = step()
    assert step(last_stage_layers=20) == even
    assert step(last_stage_layers=18) < step(last_stage_layers=19) < even
    assert step(last_stage_layers=17) == step(last_stage_layers=18)


@pytest.mark.parametrize("name", ["llama3-70b", "qwen3-235b-a22b"])
def test_one_gpu_holds_the_published_parameter_count(name: str) -> None:
    """The weights the data-parallel and optimizer terms move: on one GPU (tp, pp, ep 1),
    with the untied output layer's vocabulary matrix beside the embedding, the model's
    published parameter count (the norms are under 0.1 % of it)."""
    models = tomllib.loads(Path(CATALOGUE_FILE).read_text("utf-8"))
    model = ModelTable(**models[name]["model"])
    shape = resolve_shape(model)
    assert shape is not None
    one = _layout(tp=1, pp=1, etp=1, dp=1)
    dense, expert = stage_params(shape, one, shape.layers)
    output = shape.vocab * shape.hidden
    assert dense + expert + output == pytest.approx(models[name]["published_params"], rel=0.01)


def test_the_multi_token_prediction_layer_runs_on_the_last_stage() -> None:
    """Megatron-Core runs the MTP layers on the last stage, beside its decoder layers: with
    one MTP layer, a last stage of 20 decoder layers runs 21 layers' kernels, and one of 19
    runs as many as a middle stage of 20 (then the last stage adds only its output layers)."""
    shape = attrs.evolve(_dense_70b(), mtp_layers=1)
    hw = builtin()["h100-sxm"]

    def elementwise(last: int) -> float:
        layout = _layout(stage_layers=20, last_stage_layers=last)
        return predict(shape, layout, hw, nproc_per_node=8).breakdown["elementwise"]

    assert elementwise(20) == pytest.approx(elementwise(19) * 21 / 20)


def test_interleaved_sends_are_hidden_only_with_megatrons_overlap() -> None:
    """Megatron-LM overlaps the interleaved schedule's sends with the next chunk's compute
    (overlap_p2p_comm): only overlap_tax of their time stays; --no-overlap-p2p-communication
    exposes all of it, as the plain 1F1B schedule does."""
    shape = _dense_70b()
    hw = builtin()["h100-sxm"]

    def p2p(**kw: object) -> float:
        layout = _layout(tp=8, dp=2, stage_layers=20, **kw)
        return predict(shape, layout, hw, nproc_per_node=8).breakdown["pp-p2p"]

    assert p2p(vpp=5) == pytest.approx(p2p(vpp=5, overlap_p2p=False) * DEFAULT.overlap_tax)
    assert p2p(vpp=1) == p2p(vpp=1, overlap_p2p=False)


@pytest.mark.parametrize(
    "written", ["overlap_p2p_comm = false", 'extra_args = ["--no-overlap-p2p-communication"]']
)
def test_without_send_overlap_the_interleaved_layouts_keep_pp_above_2(
    written: str, tmp_path: Path
) -> None:
    """Without the send overlap (the key, or Megatron-LM's flag in extra_args), no layout
    Megatron-LM refuses (virtual stages with pp 2) is generated."""
    spec = tmp_path / "no-overlap.toml"
    spec.write_text(
        EXAMPLE.read_text(encoding="utf-8") + f"\n[parallelism]\npp = 2\n\n[megatron]\n{written}\n",
        encoding="utf-8",
    )
    code, out, err = _run("tune", str(spec), "--format", "json", "--top", "3")
    assert code == 0, err
    result = json.loads(out)
    assert result["candidates"]
    assert all(c["parallelism"]["vpp"] in (None, 1) for c in result["candidates"])
    assert result["searched"]["refused_by_compile"] == {}


def test_torch_fsdp2_layouts_are_not_given_megatrons_param_gather_overlap(
    tmp_path: Path,
) -> None:
    """With PyTorch FSDP2 the search leaves overlap_param_gather unset: Megatron-LM refuses
    it without the distributed optimizer or Megatron-FSDP (MDC321)."""
    spec = tmp_path / "fsdp2.toml"
    spec.write_text(
        EXAMPLE.read_text(encoding="utf-8")
        + "\n[parallelism]\npp = 1\n\n[megatron]\nuse_torch_fsdp2 = true\n"
        'use_distributed_optimizer = false\nextra_args = ["--no-gradient-accumulation-fusion"]\n',
        encoding="utf-8",
    )
    code, out, err = _run("tune", str(spec), "--format", "json", "--top", "3")
    assert code == 0, err
    result = json.loads(out)
    assert result["candidates"]
    assert result["searched"]["refused_by_compile"] == {}
    assert all("overlap_param_gather" not in c["spec"]["megatron"] for c in result["candidates"])


def _tp_term(shape: Any, layout: Layout, hw_id: str, **constants: float) -> float:
    hw = builtin()[hw_id]
    c = attrs.evolve(DEFAULT, **constants)
    return predict(shape, layout, hw, nproc_per_node=8, constants=c).breakdown["tp"]


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_tp_comm_overlap_hides_the_forward_collectives_but_for_the_tax(recompute: str) -> None:
    """Without --tp-comm-overlap tp_exposed of the forward collectives stays; with it they
    hide behind the forward GEMMs (and the recomputed ones) but for overlap_tax, where those
    GEMMs are the longer (a dense 70B layer on tp 8: its GEMMs outlast the collectives)."""
    shape = _dense_70b()
    plain = _layout(recompute=recompute)
    backward = _tp_term(shape, plain, "h100-sxm", tp_exposed=0.0)
    forward = (_tp_term(shape, plain, "h100-sxm") - backward) / DEFAULT.tp_exposed
    assert forward > 0
    overlapped = _tp_term(shape, attrs.evolve(plain, tp_comm_overlap=True), "h100-sxm")
    assert overlapped == pytest.approx(backward + DEFAULT.overlap_tax * forward, rel=1e-9)


def test_tp_comm_overlap_leaves_the_expert_layers_collectives() -> None:
    """Megatron-Core runs the experts' linear layers without userbuffers: in an MoE layer
    only the attention's forward collective (one of the two) is overlapped."""
    shape = _moe_shape()
    plain = _layout(tp=2, pp=1, etp=1, ep=4, dp=4, microbatches=8)
    backward = _tp_term(shape, plain, "h100-sxm", tp_exposed=0.0)
    forward = (_tp_term(shape, plain, "h100-sxm") - backward) / DEFAULT.tp_exposed
    overlapped = _tp_term(shape, attrs.evolve(plain, tp_comm_overlap=True), "h100-sxm")
    half = forward / 2
    expected = backward + DEFAULT.overlap_tax * half + DEFAULT.tp_exposed * half
    assert overlapped == pytest.approx(expected, rel=1e-9)


@pytest.mark.slow
@pytest.mark.parametrize(
    "written", ["tp_comm_overlap = true", 'extra_args = ["--tp-comm-overlap"]']
)
def test_tune_holds_the_tp_overlap_where_megatron_takes_it(written: str, tmp_path: Path) -> None:
    """--tp-comm-overlap, written as the key or passed in extra_args, is held: every
    candidate runs it, none with tp 1 (which Megatron-LM refuses, MDC321), and each is
    predicted with it (faster than the same layout without)."""
    code, out, err = _run("tune", str(EXAMPLE), "--format", "json", "--top", "40")
    assert code == 0, err
    plain = {c["layout"]: c for c in json.loads(out)["candidates"]}
    result = _tuned_with(written, tmp_path, top=40)
    assert all(c["parallelism"]["tp"] > 1 for c in result["candidates"])
    assert all(" tp-overlap " in c["layout"] for c in result["candidates"])
    faster = 0
    for c in result["candidates"]:
        same = plain.get(c["layout"].replace(" tp-overlap", ""))
        if same is not None:
            speed = c["predicted"]["tokens_per_s_per_gpu"]
            assert speed > same["predicted"]["tokens_per_s_per_gpu"]
            faster += 1
    assert faster


SWITCH_FLAGS = (
    '"--recompute-granularity", "full", "--recompute-method", "uniform", '
    '"--recompute-num-layers", "1", "--sequence-parallel", "--overlap-grad-reduce"'
)
SWITCH_KEYS = (
    'recompute_granularity = "full"\nrecompute_method = "uniform"\nrecompute_num_layers = 1\n'
    "sequence_parallel = true\noverlap_grad_reduce = true"
)


def test_switches_in_extra_args_are_held_as_the_keys_are(tmp_path: Path) -> None:
    """Megatron flags in extra_args that the launcher reads into its keys are held as
    those keys written in the table: the same layouts, predicted alike, none refused for
    repeating a flag (MDC323), and none written again into the spec."""
    as_flags = _tuned_with(f"extra_args = [{SWITCH_FLAGS}]", tmp_path, top=4)["candidates"]
    as_keys = _tuned_with(SWITCH_KEYS, tmp_path, top=4)["candidates"]
    assert [(c["layout"], c["predicted"]) for c in as_flags] == [
        (c["layout"], c["predicted"]) for c in as_keys
    ]
    for c in as_flags:
        assert c["recompute"] == "full"
        assert c["sequence_parallel"] is (c["parallelism"]["tp"] > 1)  # off at tp 1, as in Megatron
        assert c["spec"]["megatron"].keys().isdisjoint(
            {"recompute_granularity", "recompute_method", "recompute_num_layers",
             "sequence_parallel", "overlap_grad_reduce"}
        )  # fmt: skip


def test_a_size_flag_in_extra_args_is_held_as_its_key(tmp_path: Path) -> None:
    """The tp that extra_args passes is [parallelism] tp: every layout tune shows has it,
    compiles (none refused for the flag), and keeps the flag where the user wrote it."""
    text = EXAMPLE.read_text(encoding="utf-8")
    result = _tuned_with('extra_args = ["--tensor-model-parallel-size", "4"]', tmp_path, top=3)
    assert "[parallelism]\ntp =" not in text  # the example leaves tp open
    for c in result["candidates"]:
        assert c["parallelism"]["tp"] == 4
        assert "tp" not in c["spec"].get("parallelism", {})
        assert c["spec"]["megatron"]["extra_args"] == ["--tensor-model-parallel-size", "4"]


def test_explain_predicts_what_tune_printed(tuned: dict[str, Any], tmp_path: Path) -> None:
    """`mdc explain` of the written best spec shows the same predicted block as its row."""
    out_spec = tmp_path / "best.toml"
    assert _run("tune", str(EXAMPLE), "--write", str(out_spec))[0] == 0
    code, out, err = _run("explain", str(out_spec), "--format", "json")
    assert code == 0, err
    predicted = json.loads(out)["predicted"]
    assert predicted.pop("accelerator_model") == "h100-sxm"
    assert predicted == tuned["candidates"][0]["predicted"]
    code, text, _ = _run("explain", str(out_spec))
    assert "predicted on NVIDIA H100 SXM5 80GB" in text


@pytest.mark.slow
@pytest.mark.parametrize(
    ("flag", "key", "term", "without"),
    [
        ("--tp-comm-overlap", "tp_comm_overlap", "tp", {}),
        # Megatron-LM refuses the parameter-gather overlap without the gradient one
        ("--overlap-grad-reduce", "overlap_grad_reduce", "dp",
         {"overlap_param_gather = true": "overlap_param_gather = false"}),
    ],
)  # fmt: skip
def test_explain_predicts_an_overlap_in_extra_args_as_tune_does(
    flag: str, key: str, term: str, without: dict[str, str], tmp_path: Path
) -> None:
    """With an overlap flag in extra_args (held by tune, not written again as its key),
    the written best spec's `mdc explain` predicts what its tune row did (the plan's
    training setup carries the flag), and explain of the spec without it predicts a
    longer term for the communication it hides."""
    spec = tmp_path / "overlap.toml"
    spec.write_text(EXAMPLE.read_text(encoding="utf-8") + f'\n[megatron]\nextra_args = ["{flag}"]\n',
                    encoding="utf-8")  # fmt: skip
    out_spec = tmp_path / "best.toml"
    code, out, err = _run("tune", str(spec), "--format", "json", "--top", "1")
    assert code == 0, err
    row = json.loads(out)["candidates"][0]
    assert key not in row["spec"]["megatron"]
    assert _run("tune", str(spec), "--write", str(out_spec))[0] == 0
    code, out, err = _run("explain", str(out_spec), "--format", "json")
    assert code == 0, err
    predicted = json.loads(out)["predicted"]
    predicted.pop("accelerator_model")
    assert predicted == row["predicted"]
    text = out_spec.read_text(encoding="utf-8").replace(f'"{flag}"', "")
    for old, new in without.items():
        assert old in text
        text = text.replace(old, new)
    plain = tmp_path / "plain.toml"
    plain.write_text(text, encoding="utf-8")
    code, out, err = _run("explain", str(plain), "--format", "json")
    assert code == 0, err
    assert json.loads(out)["predicted"]["breakdown_s"][term] > predicted["breakdown_s"][term] > 0


def test_held_fixed_sizes_no_layout_can_use_get_the_compilers_own_finding(
    tmp_path: Path,
) -> None:
    spec = tmp_path / "tp3.toml"
    spec.write_text(
        EXAMPLE.read_text(encoding="utf-8").replace(
            "[batch]", "[parallelism]\ntp = 3\n\n[batch]", 1
        ),
        encoding="utf-8",
    )
    code, _, err = _run("tune", str(spec))
    assert code == 1 and "tp3.toml:19:6: error[MDC201]" in err


@pytest.mark.slow
@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_write_in_other_formats_compiles(suffix: str, tmp_path: Path) -> None:
    out_spec = tmp_path / f"best{suffix}"
    assert _run("tune", str(EXAMPLE), "--top", "1", "--write", str(out_spec))[0] == 0
    code, _, err = _run("compile", str(out_spec), "-o", str(tmp_path / "out"))
    assert code == 0, err


@pytest.mark.parametrize(
    ("layers", "split"),
    [
        # 78 + the embedding + the loss = 80 layers: 10 per stage, Megatron's accounting
        (78, {"account_for_embedding_in_pipeline_split": True,
              "account_for_loss_in_pipeline_split": True}),
        # 77 (+1, +2) divides by no pp 8: the middle stages take ceil(77 / 8) = 10 each and
        # the first and last the remaining 17
        (77, {"decoder_first_pipeline_num_layers": 8, "decoder_last_pipeline_num_layers": 9}),
    ],
)  # fmt: skip
def test_layers_that_do_not_divide_by_pp_get_megatrons_uneven_splits(
    layers: int, split: dict[str, Any], tmp_path: Path
) -> None:
    spec = tmp_path / "uneven.toml"
    spec.write_text(
        EXAMPLE.read_text(encoding="utf-8")
        .replace("num_layers = 80", f"num_layers = {layers}")
        .replace("[batch]", "[parallelism]\npp = 8\n\n[batch]", 1),
        encoding="utf-8",
    )
    # no headroom: the three fastest, with no roomier row sought past them
    code, out, err = _run("tune", str(spec), "--format", "json", "--top", "3", "--headroom", "0")
    assert code == 0, err
    candidates = json.loads(out)["candidates"]
    assert len(candidates) == 3
    for i, candidate in enumerate(candidates):
        megatron = candidate["spec"]["megatron"]
        assert {k: megatron.get(k) for k in split} == split
        path = tmp_path / f"c{i}.json"
        data = tomllib.loads(spec.read_text(encoding="utf-8"))
        for table, values in candidate["spec"].items():
            data.setdefault(table, {}).update(values)
        path.write_text(json.dumps(data), encoding="utf-8")
        code, _, err = _run("compile", str(path), "-o", str(tmp_path / f"out{i}"))
        assert code == 0, (candidate["layout"], err)
        plan = json.loads((tmp_path / f"out{i}" / "plan.json").read_text(encoding="utf-8"))
        stages = plan["pipeline_stages"]
        counts = [
            run["layers"] for run in stages for _ in range(run["ranks"][1] - run["ranks"][0] + 1)
        ]
        assert len(counts) == 8 and sum(counts) == layers
        # the heaviest stage, the one the throughput model charges
        assert max(counts) == 10
        # explain charges the same stage, whichever one the memory estimate is of
        code, out, err = _run("explain", str(path), "--format", "json")
        assert code == 0, err
        predicted = json.loads(out)["predicted"]
        predicted.pop("accelerator_model")
        assert predicted == candidate["predicted"], candidate["layout"]


@pytest.mark.slow
def test_megatron_fp4_on_a_bf16_model_is_predicted_at_the_fp4_peak(tmp_path: Path) -> None:
    """NVFP4 is written as [megatron] fp4_format on a bf16 model (Megatron's --bf16
    --fp4-format e2m1): tune and explain take the fp4 peak for it, not bf16's."""
    data = tomllib.loads(EXAMPLE.read_text(encoding="utf-8"))
    data["distributed"]["accelerator_model"] = "b200"
    data["distributed"].pop("accelerator_memory_gib", None)
    predicted: dict[str, float] = {}
    for name, megatron in (("bf16", {}), ("fp4", {"fp4_format": "e2m1", "fp4_recipe": "nvfp4"})):
        data["megatron"] = {**data.get("megatron", {}), **megatron}
        spec = tmp_path / f"{name}.json"
        spec.write_text(json.dumps(data), encoding="utf-8")
        code, out, err = _run("tune", str(spec), "--format", "json", "--top", "1")
        assert code == 0, err
        assert json.loads(out)["precision"] == name
        code, out, err = _run("explain", str(spec), "--format", "json")
        assert code == 0, err
        predicted[name] = json.loads(out)["predicted"]["model_tflops_per_gpu"]
    assert predicted["fp4"] > predicted["bf16"]


def test_explain_runs_torchtitans_pipeline_micro_batches(tmp_path: Path) -> None:
    """TorchTitan splits each local batch into pipeline micro batches
    (pipeline_microbatch_size): a local batch of 32 in micro batches of 4 is 8 micro batches
    a step, so 1F1B over 8 stages idles (8 - 1) / (8 + 8 - 1) of it, as the memory estimate
    counts them too; read as one micro batch of 32 it would idle 7/8."""
    spec = {
        "job": {"name": "titan", "command": ["python", "-m", "torchtitan.train"]},
        "distributed": {"launcher": "torchtitan", "nnodes": 8, "nproc_per_node": 8,
                        "accelerator_model": "h100-sxm"},
        "parallelism": {"tp": 8, "pp": 8},
        "batch": {"global_batch_size": 32, "micro_batch_size": 32},
        "model": {"num_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
                  "num_query_groups": 8, "ffn_hidden_size": 14336, "vocab_size": 128256,
                  "seq_length": 8192, "gated_mlp": True, "tied_embeddings": False,
                  "position_embedding": "rope", "bias": False, "normalization": "rmsnorm",
                  "dtype": "bf16"},
        "torchtitan": {"model": "llama3", "flavor": "8B", "pipeline_microbatch_size": 4,
                       "pipeline_schedule": "1F1B"},
    }  # fmt: skip
    path = tmp_path / "titan.json"
    path.write_text(json.dumps(spec), encoding="utf-8")
    code, out, err = _run("explain", str(path), "--format", "json")
    assert code == 0, err
    assert json.loads(out)["predicted"]["bubble"] == pytest.approx(7 / 15, rel=1e-3)


def _moe_shape() -> Any:
    """A small MoE stack: 8 layers, 64 experts of width 1024, top 4, on h = 2048."""
    shape = resolve_shape(
        ModelTable(num_layers=8, hidden_size=2048, num_attention_heads=16, vocab_size=32000,
                   seq_length=4096, num_experts=64, moe_ffn_hidden_size=1024, moe_router_topk=4,
                   gated_mlp=True)
    )  # fmt: skip
    assert shape is not None
    return shape


def test_expert_gradients_cross_the_nic_once_ep_fills_the_node() -> None:
    """ep 8 on 8-GPU nodes: each expert-data-parallel group has one member per node, so the
    expert gradients go over each GPU's own NIC; on one 64-GPU NVLink domain the same group
    stays on the scale-up link. The dense gradients cross the same bandwidth either way."""
    shape, hw = _moe_shape(), builtin()["b300"]
    layout = _layout(tp=1, pp=1, ep=8, etp=1, dp=64, microbatches=1, sequence_parallel=False,
                     overlap_grad_reduce=False)  # fmt: skip
    nodes = predict(shape, layout, hw, nproc_per_node=8).breakdown["dp"]
    rack = predict(shape, attrs.evolve(layout, ep=64), hw, nproc_per_node=8).breakdown["dp"]
    # expert parameters per GPU with ep 8: 8 local experts x 8 layers x 3 x 1024 x 2048
    local = 8 * 8 * 3 * 1024 * 2048
    share = DEFAULT.nic_share
    # fp32 gradients reduce-scattered and bf16 parameters gathered over 8 members, 1 NIC each
    expert_nic = local * 7 / 8 * (4 + 2) / (hw.scale_out_gb_s * 1e9 * share)
    # ep 64 leaves no expert gradient to reduce: what remains is the dense traffic
    assert nodes - rack == pytest.approx(expert_nic, rel=1e-9)


def test_few_tokens_per_expert_stream_the_expert_weights() -> None:
    """ep 1 keeps every expert on every GPU: 12 bytes per expert parameter per micro batch
    (bf16 reads forward and backward, fp32 main-gradient read and write)."""
    shape, hw = _moe_shape(), builtin()["b300"]
    one = _layout(tp=1, pp=1, ep=1, etp=1, dp=8, microbatches=1, sequence_parallel=False)
    eight = attrs.evolve(one, ep=8)
    # without the local experts' fixed time (the next test), which ep changes too
    constants = attrs.evolve(DEFAULT, expert_overhead_us=0.0)
    a = predict(shape, one, hw, nproc_per_node=8, constants=constants).breakdown["elementwise"]
    b = predict(shape, eight, hw, nproc_per_node=8, constants=constants).breakdown["elementwise"]
    experts = 64 * 8 * 3 * 1024 * 2048
    expected = 12 * experts * (1 - 1 / 8) / (hw.memory_bandwidth_gb_s * 1e9)
    # one micro batch: the step holds one slot of elementwise time
    assert a - b == pytest.approx(expected, rel=1e-9)


def test_fp4_gemms_reach_fp4_peak_of_the_share_the_others_reach() -> None:
    """B200's fp4 peak is 4x its bf16 one, and fp4 GEMMs run at NVFP4's measured level
    (B200: 5500 of 9000 TFLOP/s in NVFP4, 1745 of 2250 in bf16, kernels.toml): the
    GEMM time G4 at fp4 is r = (1745/2250) / (4 * 5500/9000) of bf16's Gb, and fp4_peak 0.5
    doubles it. The attention stays at the bf16 peak, so compute(bf16) - compute(fp4) =
    Gb - G4 = G4 (1 - r)/r and compute(fp4, 0.5) - compute(fp4, 1) = G4."""
    shape, hw = _moe_shape(), builtin()["b200"]
    layout = _layout(tp=1, pp=1, ep=8, etp=1, dp=8, microbatches=1, sequence_parallel=False)

    def compute(precision: str, share: float) -> float:
        constants = attrs.evolve(DEFAULT, fp4_peak=share)
        return predict(
            shape, layout, hw, nproc_per_node=8, precision=precision, constants=constants
        ).breakdown["compute"]

    assert compute("bf16", 0.5) == compute("bf16", 1.0)  # only fp4 GEMMs take it
    r = (1745 / 2250) / (4 * 5500 / 9000)
    g4 = (compute("bf16", 1.0) - compute("fp4", 1.0)) * r / (1 - r)
    assert compute("fp4", 0.5) - compute("fp4", 1.0) == pytest.approx(g4, rel=1e-3)


def test_every_local_expert_costs_a_fixed_time_per_layer_and_pass() -> None:
    """ep 1 runs all 64 experts of each MoE layer on every GPU, ep 8 eight of them: each
    local expert costs expert_overhead_us in the forward and the two backward GEMMs, and
    once more in a recomputed forward."""
    shape, hw = _moe_shape(), builtin()["b300"]
    one = _layout(tp=1, pp=1, ep=1, etp=1, dp=8, microbatches=1, sequence_parallel=False)
    with_it = attrs.evolve(DEFAULT, expert_overhead_us=10.0)
    without = attrs.evolve(DEFAULT, expert_overhead_us=0.0)
    for layout, local, passes in ((one, 64, 3), (attrs.evolve(one, ep=8), 8, 3),
                                  (attrs.evolve(one, recompute="full"), 64, 4)):  # fmt: skip
        a = predict(shape, layout, hw, nproc_per_node=8, constants=with_it).breakdown
        b = predict(shape, layout, hw, nproc_per_node=8, constants=without).breakdown
        # memory-bound work beside the kernels, timed with the elementwise ones: one micro
        # batch of 8 MoE layers
        assert a["compute"] == b["compute"]
        assert a["elementwise"] - b["elementwise"] == pytest.approx(
            10e-6 * local * 8 * passes, rel=1e-9
        )


def test_the_permutation_moves_the_bytes_of_the_kernels_megatron_core_runs() -> None:
    """Per MoE layer, in units of one routed copy of a token's hidden vector (h x 2 bytes;
    top 4, so a token is a quarter of its copies): the permute reads the token and writes
    its copies (1/4 + 1), the unpermute reads the copies and writes the token (1 + 1/4);
    the alltoall dispatcher sorts the received copies by local expert and back, where a
    rank holds more than one (read and write, twice: 4); fp8 quantizes the experts' input
    (read 1, write 1/2 row-wise and 1/2 column-wise: 2). The backward moves as much again,
    a recomputed forward once more. No fitted constant scales it."""
    shape, hw = _moe_shape(), builtin()["b300"]
    alltoall = _layout(tp=1, pp=1, ep=8, etp=1, dp=8, microbatches=1, sequence_parallel=False)
    copy = 4096 * 4 * 2048 * 2 * 8 / (hw.memory_bandwidth_gb_s * 1e9)  # 8 MoE layers
    cases = (
        (alltoall, "bf16", (1 / 4 + 1) + 4 + (1 + 1 / 4), 2),
        (alltoall, "fp8", (1 / 4 + 1) + 4 + 2 + (1 + 1 / 4), 2),
        (attrs.evolve(alltoall, ep=64), "bf16", (1 / 4 + 1) + (1 + 1 / 4), 2),  # 1 expert each
        (attrs.evolve(alltoall, dispatcher="flex"), "bf16", (1 / 4 + 1) + (1 + 1 / 4), 2),
        (attrs.evolve(alltoall, recompute="full"), "bf16", (1 / 4 + 1) + 4 + (1 + 1 / 4), 3),
    )
    for layout, precision, forward, passes in cases:
        st = terms.Step(shape, layout, hw, DEFAULT, 8)
        assert terms.moe_permute(st, precision) == pytest.approx(
            forward * passes * copy, rel=1e-9
        ), (layout.ep, layout.dispatcher, precision, layout.recompute)
    assert "moe_passes" not in DEFAULT.to_json()


def test_hybrid_mtp_layers_are_attention_and_the_last_layers_mlp() -> None:
    """Megatron-Bridge counts a hybrid stack's MTP depths as its MTP pattern ("*E" for
    Nemotron 3: attention and MoE) plus one more output layer each."""
    table: dict[str, Any] = {
        "num_layers": 4, "hidden_size": 1024, "num_attention_heads": 8, "vocab_size": 1024,
        "seq_length": 2048, "num_experts": 8, "moe_ffn_hidden_size": 512, "moe_router_topk": 2,
        "hybrid_override_pattern": "M*ME", "mamba_num_heads": 32, "mamba_head_dim": 64,
    }  # fmt: skip
    base = resolve_shape(ModelTable(**table))
    mtp = resolve_shape(ModelTable(**table, mtp_num_layers=2))
    assert base is not None and mtp is not None
    without, with_mtp = token_flops(base), token_flops(mtp)
    one_moe = without.expert_gemm
    core = 3 * 2 * 2 * (8 * 128) * 2048 / 2  # one causal attention layer's scores and values
    # the pattern's one attention and one MoE layer, twice
    assert with_mtp.attention - without.attention == pytest.approx(2 * core)
    assert with_mtp.expert_gemm == pytest.approx(3 * one_moe)
    assert with_mtp.logits == pytest.approx(3 * without.logits)


def test_ep_comm_overlap_hides_the_all_to_alls_but_for_the_tax() -> None:
    """Without --overlap-moe-expert-parallel-comm ep_exposed of the all-to-alls' time stays;
    with it they run beside another micro batch's compute, which outlasts them here (ep 8
    over NVLink), and cost only overlap_tax of their time; where they outlast the compute,
    ep_exposed of the rest stays."""
    shape, hw = _moe_shape(), builtin()["h100-sxm"]
    plain = _layout(tp=1, pp=1, ep=8, etp=1, dp=8, microbatches=8, sequence_parallel=False)
    whole = predict(shape, plain, hw, nproc_per_node=8,
                    constants=attrs.evolve(DEFAULT, ep_exposed=1.0)).breakdown  # fmt: skip
    assert 0 < whole["ep"] < whole["compute"]
    exposed = predict(shape, plain, hw, nproc_per_node=8).breakdown["ep"]
    assert exposed == pytest.approx(DEFAULT.ep_exposed * whole["ep"], rel=1e-9)
    overlap = attrs.evolve(plain, ep_comm_overlap=True)
    overlapped = predict(shape, overlap, hw, nproc_per_node=8).breakdown
    assert overlapped["ep"] == pytest.approx(DEFAULT.overlap_tax * whole["ep"], rel=1e-9)
    # over the NIC (ep 64 across 8 nodes) the all-to-alls outlast the compute
    wide = attrs.evolve(overlap, ep=64, dp=64)
    raw = predict(shape, attrs.evolve(wide, ep_comm_overlap=False), hw, nproc_per_node=8,
                  constants=attrs.evolve(DEFAULT, ep_exposed=1.0)).breakdown  # fmt: skip
    assert raw["ep"] > raw["compute"]
    got = predict(shape, wide, hw, nproc_per_node=8).breakdown["ep"]
    hidden = raw["ep"] - (got - DEFAULT.overlap_tax * raw["ep"]) / (
        DEFAULT.ep_exposed - DEFAULT.overlap_tax
    )  # what the compute covered, solved from the formula: the layers' compute
    assert 0 < hidden < raw["compute"]
    assert DEFAULT.overlap_tax * raw["ep"] < got < DEFAULT.ep_exposed * raw["ep"]


def test_the_flex_dispatcher_sends_a_token_once_to_each_other_node() -> None:
    """ep 32 over 4 nodes of 8 H100s, 64 experts, top 4: the all-to-all sends every routed
    copy, 3/4 of them over the NIC; DeepEP and HybridEP (moe_token_dispatcher_type = "flex")
    send a token once to each other node that holds one of its experts (a node holds 16 of
    the 64: it misses a token with probability C(48, 4) / C(64, 4)) and fan it out over
    NVLink there, so every routed copy crosses NVLink and only those the NIC."""
    shape, hw = _moe_shape(), builtin()["h100-sxm"]
    wide = _layout(tp=1, pp=1, ep=32, etp=1, dp=32, microbatches=4, sequence_parallel=False)
    once = attrs.evolve(DEFAULT, ep_exposed=1.0)
    plain = predict(shape, wide, hw, nproc_per_node=8, constants=once).breakdown["ep"]
    flex = attrs.evolve(wide, dispatcher="flex")
    dedup = predict(shape, flex, hw, nproc_per_node=8, constants=once).breakdown["ep"]
    # each link at NCCL's measured share of it
    up, out = hw.scale_up_gb_s * DEFAULT.link_share, hw.scale_out_gb_s * DEFAULT.nic_share
    copies = 4 * 31 / 32  # routed copies of a token that leave its GPU
    hit = 1 - math.comb(48, 4) / math.comb(64, 4)
    expected = (copies / up + 3 * hit / out) / (copies * (1 / 4 / up + 3 / 4 / out))
    assert dedup / plain == pytest.approx(expected, rel=1e-9)
    assert dedup < plain
    # inside one node there is nothing to deduplicate
    node = attrs.evolve(wide, ep=8, dp=8)
    assert predict(shape, attrs.evolve(node, dispatcher="flex"), hw, nproc_per_node=8).breakdown[
        "ep"
    ] == pytest.approx(predict(shape, node, hw, nproc_per_node=8).breakdown["ep"], rel=1e-12)


def test_node_limited_routing_caps_the_nodes_a_flex_token_reaches() -> None:
    """The same ep 32 over 4 nodes with group-limited routing (moe_router_num_groups 4,
    one per node, moe_router_group_topk 2): a token's experts lie in 2 of the 4 nodes, so
    a node holds one of them when its group is chosen (2/4) and one of the 4 experts drawn
    from the chosen groups' 32 falls in its 16, where uniform routing gave
    1 - C(48, 4)/C(64, 4); 8 groups (2 per node), 4 chosen: a node is reached when j
    of its 2 groups are chosen (C(2, j) C(6, 4 - j)/C(8, 4)) and one of the 4 experts drawn
    from the chosen groups' 32 falls in its 8 j; only the NIC's share changes, and the
    plain all-to-all, which sends every routed copy, not at all."""
    shape, hw = _moe_shape(), builtin()["h100-sxm"]
    wide = _layout(tp=1, pp=1, ep=32, etp=1, dp=32, microbatches=4, sequence_parallel=False)
    once = attrs.evolve(DEFAULT, ep_exposed=1.0)
    up, out = hw.scale_up_gb_s * DEFAULT.link_share, hw.scale_out_gb_s * DEFAULT.nic_share
    copies = 4 * 31 / 32

    def ep_time(layout: Layout) -> float:
        return predict(shape, layout, hw, nproc_per_node=8, constants=once).breakdown["ep"]

    flex = attrs.evolve(wide, dispatcher="flex")
    uniform = ep_time(flex)
    per_node = ep_time(attrs.evolve(flex, router_groups=(4, 2)))
    base = copies / up + 3 * (1 - math.comb(48, 4) / math.comb(64, 4)) / out
    assert per_node / uniform == pytest.approx(
        (copies / up + 3 * (2 / 4) * (1 - math.comb(16, 4) / math.comb(32, 4)) / out) / base,
        rel=1e-9,
    )
    hit = sum(
        math.comb(2, j) * math.comb(6, 4 - j) / math.comb(8, 4)
        * (1 - math.comb(32 - 8 * j, 4) / math.comb(32, 4))
        for j in (1, 2)
    )  # fmt: skip
    two_per_node = ep_time(attrs.evolve(flex, router_groups=(8, 4)))
    assert two_per_node / uniform == pytest.approx((copies / up + 3 * hit / out) / base, rel=1e-9)
    assert per_node < two_per_node < uniform
    # every group open, or the plain all-to-all: as without groups
    assert ep_time(attrs.evolve(flex, router_groups=(4, 4))) == uniform
    assert ep_time(attrs.evolve(wide, router_groups=(4, 2))) == ep_time(wide)


def _moe_plan(megatron: dict[str, Any]) -> Any:
    """The plan of a 16-GPU Megatron-LM job of a small MoE model at ep 16, with ``megatron``."""
    from mdc.loaders import LoadedDocument
    from mdc.pipeline import Compiler
    from mdc.plugin_manager import load_plugins

    spec = {
        "job": {"name": "moe", "command": ["python", "pretrain_gpt.py"]},
        "distributed": {"launcher": "megatron", "backend": "slurm", "nnodes": 2,
                        "nproc_per_node": 8, "accelerator_model": "h100-sxm"},
        "parallelism": {"tp": 1, "pp": 1, "ep": 16},
        "batch": {"global_batch_size": 64, "micro_batch_size": 1},
        "model": {"num_layers": 4, "hidden_size": 1024, "num_attention_heads": 8,
                  "seq_length": 2048, "vocab_size": 32000, "num_experts": 64,
                  "moe_ffn_hidden_size": 512, "moe_router_topk": 4, "dtype": "bf16"},
        "megatron": megatron,
        "slurm": {"partition": "gpu"},
    }  # fmt: skip
    document = LoadedDocument(path="moe.json", data=spec, values={}, keys={})
    return Compiler(load_plugins(autoload=False)).compile_document(document, tree=False).plan


def test_router_groups_are_read_from_keys_and_extra_args() -> None:
    """moe_router_num_groups and moe_router_group_topk, as keys or as Megatron-LM's flags in
    extra_args, reach the throughput model as the layout's router groups; a group top-k
    alone (Megatron-Core refuses it) or none leaves the routing open."""
    from mdc.tune.perf import plan_inputs

    seen = []
    for megatron in (
        {"moe_router_num_groups": 4, "moe_router_group_topk": 2},
        {"extra_args": ["--moe-router-num-groups", "4", "--moe-router-group-topk=2"]},
        {"moe_router_num_groups": 4},
    ):
        plan = _moe_plan({"moe_token_dispatcher_type": "flex", **megatron})
        inputs = plan_inputs(plan)
        assert inputs is not None
        seen.append(inputs.layout.router_groups)
    assert seen == [(4, 2), (4, 2), None]


def test_the_allgather_dispatcher_gathers_every_token_of_the_group() -> None:
    """Megatron-LM's default dispatcher gathers all the tokens of the etp x ep group on
    each rank (and reduce-scatters the outputs): 7 other ranks' tokens with ep 8, where the
    all-to-all sends a token's routed copies, top 4 of 64 experts, 7/8 of them away."""
    shape, hw = _moe_shape(), builtin()["h100-sxm"]
    node = _layout(tp=1, pp=1, ep=8, etp=1, dp=8, microbatches=4, sequence_parallel=False)
    alltoall = predict(shape, node, hw, nproc_per_node=8).breakdown["ep"]
    gathered = predict(shape, attrs.evolve(node, dispatcher="allgather"), hw, nproc_per_node=8)
    assert gathered.breakdown["ep"] / alltoall == pytest.approx(7 / (4 * 7 / 8), rel=1e-9)
    # past the top k the gather grows with the group: ep 64 gathers 63 ranks' tokens
    wide = attrs.evolve(node, ep=64, dp=64)
    ratio = (
        predict(shape, attrs.evolve(wide, dispatcher="allgather"), hw, nproc_per_node=8).breakdown[
            "ep"
        ]
        / predict(shape, wide, hw, nproc_per_node=8).breakdown["ep"]
    )
    assert ratio == pytest.approx(63 / (4 * 63 / 64), rel=1e-9)


MOE_TUNE = """
[parallelism]
ep = 8

[megatron]
moe_token_dispatcher_type = "alltoall"
{overlap}
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    ("written", "mtp"), [("overlap_moe_expert_parallel_comm = true", 0),
                         ('extra_args = ["--overlap-moe-expert-parallel-comm"]', 0),
                         ("overlap_moe_expert_parallel_comm = true", 1)],
)  # fmt: skip
def test_tune_holds_the_ep_overlap_where_megatron_core_takes_it(
    written: str, mtp: int, tmp_path: Path
) -> None:
    """--overlap-moe-expert-parallel-comm is held: no candidate runs pp > 1 without virtual
    stages, nor (with an MTP layer) pp 1 (Megatron-Core refuses both, MDC321), none is
    refused by compile, and each is predicted with the all-to-alls hidden."""
    spec = tmp_path / "moe.toml"
    moe = "[model]\nnum_experts = 16\nmoe_router_topk = 2\nmoe_ffn_hidden_size = 2048\n"
    moe += f"mtp_num_layers = {mtp}\n" if mtp else ""
    text = EXAMPLE.read_text(encoding="utf-8").replace("[model]\n", moe)
    spec.write_text(text + MOE_TUNE.format(overlap=written), encoding="utf-8")
    code, out, err = _run("tune", str(spec), "--format", "json", "--top", "10")
    assert code == 0, err
    result = json.loads(out)
    assert result["candidates"] and result["searched"]["refused_by_compile"] == {}
    for c in result["candidates"]:
        p = c["parallelism"]
        assert p["ep"] == 8 and (p["pp"] == 1 or (p["vpp"] or 1) > 1), c["layout"]
        assert p["pp"] > 1 or not mtp, c["layout"]
        assert " ep-overlap" in c["layout"]


def test_recompute_modules_rerun_their_share_of_the_dense_gemms() -> None:
    """Megatron-Core's recompute_modules rerun what they name: "mlp" the MLP's GEMMs, 2/3
    of a square layer's dense GEMM FLOPs (MLP 2 x h x 4h, projections 4 x h x h); "moe"
    the whole MoE layer, its two forward all-to-alls too (6 of them per layer, not 4)."""
    dense = _dense_70b()
    parts = dense.pattern.parts(0, dense.layers)
    assert per_op.gemm_share(dense, parts, ("feed_forward.",)) == pytest.approx(2 / 3)
    hw = builtin()["h100-sxm"]
    times = [
        predict(dense, _layout(recompute="selective", recompute_modules=modules), hw,
                nproc_per_node=8).breakdown["compute"]
        for modules in (("layernorm",), ("core_attn",), ("core_attn", "mlp"))
    ]  # fmt: skip
    assert times[0] < times[1] < times[2]
    moe = _moe_shape()
    plain = _layout(tp=1, pp=1, ep=8, etp=1, dp=8, microbatches=8, sequence_parallel=False)
    ep = [
        predict(moe, attrs.evolve(plain, recompute=rc, recompute_modules=modules), hw,
                nproc_per_node=8).breakdown["ep"]
        for rc, modules in (("none", None), ("selective", ("moe",)))
    ]  # fmt: skip
    assert ep[1] == pytest.approx(ep[0] * 6 / 4, rel=1e-9)


def _tuned_json(*extra: str) -> dict[str, Any]:
    code, out, err = _run("tune", str(EXAMPLE), "--format", "json", *extra)
    assert code == 0, err
    result: dict[str, Any] = json.loads(out)
    return result


#: the example's H100 SXM5 80GB: 81,559 MiB per GPU
_H100_GIB = 81559 / 1024


@pytest.mark.slow
def test_rows_above_the_headroom_are_marked_and_not_chosen(tmp_path: Path) -> None:
    # a margin of 21 %: the fastest layout (63.6 GiB) eats into it
    tuned = _tuned_json("--headroom", "21")
    limit = _H100_GIB * 0.79
    rows = tuned["candidates"]
    assert [r["above_headroom"] for r in rows] == [r["memory_gib"] > limit for r in rows]
    assert rows[0]["above_headroom"], "the example's fastest layout sits above 80 %"
    roomy = next(r for r in rows if not r["above_headroom"])
    assert tuned["chosen"] == roomy["rank"] > 1
    out_spec = tmp_path / "chosen.toml"
    code, _, err = _run("tune", str(EXAMPLE), "--headroom", "21", "--write", str(out_spec))
    assert code == 0, err
    written = tomllib.loads(out_spec.read_text(encoding="utf-8"))
    for axis in ("tp", "pp", "cp"):
        assert written["parallelism"][axis] == roomy["parallelism"][axis]
    assert written["batch"]["micro_batch_size"] == roomy["micro_batch_size"]
    code, text, _ = _run("tune", str(EXAMPLE), "--headroom", "21")
    marked = [int(line.split()[0]) for line in text.splitlines() if re.match(r" ?\d+ .*\d! ", line)]
    assert marked == [r["rank"] for r in rows if r["above_headroom"]]  # the text marks them too
    assert f"the fastest that leaves it is #{roomy['rank']}, which --write writes" in text


@pytest.mark.slow
def test_the_default_headroom_is_where_compile_warns_and_zero_marks_nothing() -> None:
    tuned = _tuned_json()
    assert tuned["headroom"] == pytest.approx(0.10)
    for row in tuned["candidates"]:
        assert row["above_headroom"] == (row["memory_gib"] > _H100_GIB * 0.9)
    assert any(r["above_headroom"] for r in tuned["candidates"])
    plain = _tuned_json("--headroom", "0")
    assert not any(r["above_headroom"] for r in plain["candidates"])
    assert plain["chosen"] == 1
    # the ranking itself is by predicted speed whatever the headroom: no row is dropped
    assert [r["layout"] for r in plain["candidates"]] == [r["layout"] for r in tuned["candidates"]]


@pytest.mark.slow
def test_when_no_top_row_leaves_the_headroom_the_walk_finds_one() -> None:
    tuned = _tuned_json("--headroom", "35")
    limit = _H100_GIB * 0.65
    rows = tuned["candidates"]
    assert all(r["memory_gib"] > limit for r in rows[:5])
    assert len(rows) == 6 and rows[5]["memory_gib"] <= limit and tuned["chosen"] == 6


@pytest.mark.parametrize("value", ["100", "-1", "x"])
def test_headroom_out_of_range_is_a_usage_error(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = _run("tune", str(EXAMPLE), "--headroom", value)
    assert code == 2 and "argument --headroom" in err + capsys.readouterr().err


def test_the_local_experts_fixed_time_is_the_measured_grouped_gemm() -> None:
    """Transformer Engine's per-expert grouped GEMM against one kernel over the same 8
    experts of 128 tokens (0.267 ms against 0.069 ms): 24.75 us per expert and GEMM, two
    GEMMs (fc1, fc2) per pass; the constant the model reads is that, not a fit."""
    from mdc.tune import kernels

    assert kernels.expert_overhead_us() == pytest.approx(2 * (0.267 - 0.069) * 1e3 / 8)
    assert DEFAULT.expert_overhead_us == pytest.approx(kernels.expert_overhead_us(), rel=1e-6)
    for row in kernels.curves("grouped_gemm"):
        assert row["source"].startswith("https://")
        assert row["multi_stream_ms"] > row["single_launch_ms"] > 0


def test_the_attention_knee_is_the_measured_curves() -> None:
    from mdc.tune import kernels

    # the constant the model reads is the knee fitted to the published points
    assert DEFAULT.attention_seq_knee == pytest.approx(kernels.attention_seq_knee(), abs=0.5)
    for curve in kernels.curves("attention"):
        assert curve["source"].startswith("https://")
        points = [(float(x), float(y)) for x, y in curve["points"]]
        plateau, knee = kernels.saturation(points)
        # the fitted curve passes within 3 % of every published point
        for x, rate in points:
            assert plateau * x / (x + knee) == pytest.approx(rate, rel=0.03)


@pytest.mark.parametrize("cp", [1, 4])
def test_attention_slows_with_the_query_tokens_each_kernel_runs(cp: int) -> None:
    shape = resolve_shape(
        ModelTable(num_layers=80, hidden_size=8192, num_attention_heads=64, vocab_size=128256,
                   seq_length=32768)
    )  # fmt: skip
    assert shape is not None
    hw = builtin()["h100-sxm"]
    layout = _layout(cp=cp, dp=8 // cp)

    def compute(**constants: float) -> float:
        c = attrs.evolve(DEFAULT, **constants)
        p = predict(shape, layout, hw, nproc_per_node=8, constants=c)
        return p.breakdown["compute"]

    plain = compute(attention_seq_knee=0.0)
    # the attention's time at the knee-less efficiency: what doubling its peak halves
    attention = 2 * (
        plain - compute(attention_seq_knee=0.0, attention_peak=DEFAULT.attention_peak * 2)
    )
    knee = DEFAULT.attention_seq_knee
    # efficiency s'/(s' + knee) over s' = seq / cp query tokens: time grows by knee / s'
    grown = compute() - plain
    assert grown / attention == pytest.approx(knee / (32768 / cp), rel=1e-6)


def test_a_layout_trading_cp_for_the_micro_batch_is_shown_once(tuned: dict[str, Any]) -> None:
    # cp 2 at one sequence per micro batch and cp 4 at two run the same tokens per rank in
    # about the same memory: one choice, the faster (attention's kernels are longer) shown
    seen = set()
    for row in tuned["candidates"]:
        p = row["parallelism"]
        key = (p["tp"], p["pp"], p["ep"], p["etp"], row["micro_batch_size"] / p["cp"])
        assert key not in seen, row["layout"]
        seen.add(key)


def test_experts_padded_to_capacity_run_and_send_the_padding() -> None:
    """moe_pad_expert_input_to_capacity: each expert computes, and the all-to-all carries,
    capacity-factor times the even share of routed tokens; at factor 1 nothing changes."""
    shape, hw = _moe_shape(), builtin()["h100-sxm"]
    base = _layout(tp=1, pp=1, ep=8, etp=1, dp=16, microbatches=8, sequence_parallel=False)
    even = predict(shape, base, hw, nproc_per_node=8).breakdown
    same = predict(shape, attrs.evolve(base, moe_capacity=1.0), hw, nproc_per_node=8).breakdown
    assert same == even
    padded = predict(shape, attrs.evolve(base, moe_capacity=1.5), hw, nproc_per_node=8).breakdown
    # the routed all-to-all volume is linear in the tokens sent
    assert padded["ep"] == pytest.approx(1.5 * even["ep"], rel=1e-9)
    assert padded["compute"] > even["compute"]
    assert padded["elementwise"] > even["elementwise"]


def _chart(tmp_path: Path, *extra: str) -> Any:
    import xml.etree.ElementTree as ET

    picture = tmp_path / "tune.svg"
    code, _, err = _run("tune", str(EXAMPLE), "--svg", str(picture), *extra)
    assert code == 0, err
    text = picture.read_text(encoding="utf-8")
    return text, ET.fromstring(text)


@pytest.mark.slow
def test_chart_labels_never_overlap_on_a_real_search(tmp_path: Path) -> None:
    """Llama 70B on 64 H100, twelve rows: every drawn label's box (monospace, so
    characters x CHAR_W wide) lies in the picture and clear of every other."""
    from mdc.tune.report import CHAR_W, HEIGHT, LABEL_H, WIDTH

    text, root = _chart(tmp_path, "--top", "12")
    ns = "{http://www.w3.org/2000/svg}"
    labels = [t for t in root.iter(f"{ns}text") if "label" in t.get("class", "").split()]
    boxes = []
    for label in labels:
        x, baseline = float(label.get("x", "")), float(label.get("y", ""))
        boxes.append((x, baseline - 10, CHAR_W * len(label.text or ""), LABEL_H))
    assert any((t.text or "").startswith("best: ") for t in labels)
    assert len(boxes) >= 4
    for i, a in enumerate(boxes):
        assert a[0] >= 0 and a[0] + a[2] <= WIDTH and a[1] >= 0 and a[1] + a[3] <= HEIGHT
        for b in boxes[i + 1 :]:
            apart = a[0] + a[2] <= b[0] or b[0] + b[2] <= a[0]
            assert apart or a[1] + a[3] <= b[1] or b[1] + b[3] <= a[1], (a, b)
    again = tmp_path / "again"
    again.mkdir()
    assert _chart(again, "--top", "12")[0] == text  # same search, same bytes


@pytest.mark.slow
def test_chart_axis_hugs_the_limit_and_counts_what_it_clips(tmp_path: Path) -> None:
    """The memory axis ends at 1.3 x the 79.65 GiB limit (ticks 0..104); the layouts
    beyond sit on the right edge, and the marker counts exactly those dots."""
    from mdc.tune.report import LEFT, RIGHT, WIDTH

    _, root = _chart(tmp_path)
    ns = "{http://www.w3.org/2000/svg}"
    ticks = [t.text for t in root.iter(f"{ns}text") if t.get("text-anchor") == "middle"]
    assert "104" in ticks and "0" in ticks
    edge = float(WIDTH - RIGHT)
    dots = [c for c in root.iter(f"{ns}circle") if c.get("class") == "point" and c.get("r") == "2"]
    assert all(LEFT <= float(c.get("cx", "")) <= edge for c in dots)
    clipped = sum(1 for c in dots if float(c.get("cx", "")) == edge)
    marker = next(t for t in root.iter(f"{ns}text") if "beyond" in t.get("class", ""))
    assert clipped > 0 and (marker.text or "").startswith(f"{clipped} more above 104 GiB")
    # throughput runs around the layouts drawn, not from 0 (their spread is a few %)
    levels = [float(t.text or "") for t in root.iter(f"{ns}text") if t.get("text-anchor") == "end"]
    assert 0 < min(levels) < max(levels) < 2 * min(levels)


@pytest.mark.slow
def test_chart_pareto_front_tops_every_fitting_layout(tmp_path: Path) -> None:
    """No dot left of the limit line lies above the drawn front, and the front steps
    only right and up; the legend names each mark."""
    _, root = _chart(tmp_path)
    ns = "{http://www.w3.org/2000/svg}"
    line = next(p for p in root.iter(f"{ns}polyline") if p.get("class") == "pareto")
    steps = [tuple(map(float, p.split(","))) for p in line.get("points", "").split()]
    assert all(b[0] >= a[0] and b[1] <= a[1] for a, b in zip(steps, steps[1:], strict=False))
    limit = next(ln for ln in root.iter(f"{ns}line") if ln.get("stroke-dasharray") == "6 4")
    limit_x = float(limit.get("x1", ""))
    assert steps[-1][0] == limit_x
    for dot in (c for c in root.iter(f"{ns}circle") if c.get("class") == "point"):
        cx, cy = float(dot.get("cx", "")), float(dot.get("cy", ""))
        if cx > limit_x or dot.get("fill") == "none":
            continue
        reached = [y for x, y in steps if x <= cx]
        assert reached and min(reached) <= cy + 0.1, (cx, cy)
    legend = next(g for g in root.iter(f"{ns}g") if g.get("class") == "legend")
    words = {t.text for t in legend.iter(f"{ns}text")}
    assert {"chosen", "Pareto front", "memory limit", "other layout searched"} <= words


def test_pareto_front_by_hand() -> None:
    from mdc.tune.report import pareto_front

    points = [(10.0, 5.0), (20.0, 4.0), (30.0, 9.0), (25.0, 9.5), (90.0, 20.0), (5.0, 1.0)]
    assert pareto_front(points, 80.0) == [(5.0, 1.0), (10.0, 5.0), (25.0, 9.5)]


def test_a_label_with_no_room_is_dropped() -> None:
    from mdc.tune.report import place_label

    area = (0.0, 0.0, 200.0, 100.0)
    first = place_label((100.0, 50.0), "#1 tp8", [], area)
    assert first is not None
    everything = [area]
    assert place_label((100.0, 50.0), "#2 tp4", everything, area) is None


def test_the_ssd_level_is_the_measured_curve() -> None:
    from mdc.tune import kernels, terms

    # the level and knee the Mamba term reads are the fit to the published SSD points
    level, knee = kernels.ssd_level()
    assert pytest.approx(level, abs=5e-5) == terms.SSD_LEVEL
    assert knee == terms.SSD_SEQ_KNEE
    for curve in kernels.curves("ssd"):
        assert curve["source"].startswith("https://")
        points = [(float(x), float(y)) for x, y in curve["points"]]
        plateau, fitted = kernels.saturation(points)
        # the Triton forward peaks at 16k and falls 9 % by 32k (its state passing walks the
        # chunks one after another): the curve passes within 6 % of each point
        for x, rate in points:
            assert plateau * x / (x + fitted) == pytest.approx(rate, rel=0.06)
    # vLLM's measured tokens/s at 8k (12,623,270) times the forward count at the measured
    # shape (chunk 256, 1 group, 128 heads of 64, state 128): 80.2 TFLOP/s
    per_token = 1 * 2 * 256 * 128 + 128 * (4 * 64 * 128 + 256 * 64)
    assert [p for p in kernels.curves("ssd")[0]["points"] if p[0] == 8192] == [
        [8192, pytest.approx(1.262327e7 * per_token / 1e12, abs=5e-4)]
    ]


def _mamba_step(state: int) -> Any:
    from mdc.tune import terms

    shape = resolve_shape(
        ModelTable(num_layers=4, hidden_size=1024, num_attention_heads=8, vocab_size=1024,
                   seq_length=8192, hybrid_override_pattern="MMMM", mamba_num_heads=32,
                   mamba_head_dim=64, mamba_state_dim=state, mamba_num_groups=8)
    )  # fmt: skip
    assert shape is not None
    layout = _layout(tp=1, pp=1, etp=1, dp=8, microbatches=1, sequence_parallel=False)
    return terms.Step(shape, layout, builtin()["h100-sxm"], DEFAULT, 8)


def test_mamba_layers_run_the_ssd_work_at_the_measured_kernel_level() -> None:
    """32 heads of 64 (inner width 2,048), 8 groups, state 128, chunk 128, per token: the
    SSD's training products (mamba_ssm's Triton kernels): the forward's C B^T (8 x 2 x 128 x
    128 = 262,144), chunk states and C times the passed states (32 x 2 x 64 x 128 = 524,288
    each), the causal intra-chunk product (32 x 128 x 64 = 262,144); the backward's C B^T
    and chunk states again (262,144 + 524,288); the states' gradient, dx through the states,
    dB and dC (524,288 each), dx through the chunk, d(CB) and the decay's gradient
    (262,144 each), d(CB) back to B and to C over the whole chunk (262,144 each): 5,767,168
    FLOPs. The kernels'
    bytes (test_mamba_bytes_are_the_kernels_inputs_and_outputs): 333,824."""
    from mdc.tune import terms

    st = _mamba_step(128)
    hw = st.hw
    products = [262_144, 524_288, 524_288, 262_144]  # forward
    products += [262_144, 524_288]  # recomputed in the backward
    products += [524_288] * 4 + [262_144] * 3 + [262_144] * 2  # the backward's own
    assert sum(products) == 5_767_168
    rate = 989.4e12 * terms.SSD_LEVEL * 8192 / (8192 + terms.SSD_SEQ_KNEE)
    per_token = 5_767_168 / rate + 333_824 / 3350e9
    assert hw.peak_tflops("bf16") == 989.4 and hw.memory_bandwidth_gb_s == 3350
    expected = DEFAULT.mamba_overhead * per_token * 8192 * 4
    assert terms.mamba(st) == pytest.approx(expected, rel=1e-9)
    # the state size sets the SSD's work (the cost was once a count of passes over the
    # inner width alone)
    assert terms.mamba(_mamba_step(256)) > 1.5 * terms.mamba(st)


def test_mamba_bytes_are_the_kernels_inputs_and_outputs() -> None:
    """Per token, inner width d = 2,048 (x, z and the output), B and C s = 8 x 128 = 1,024
    wide each, the fp32 chunk states S = 2,048 x 128 / 128 = 2,048 values, the fp32 C B^T
    c = 8 x 128 = 1,024 values; bf16 tensors 2 bytes a value. Each kernel of Megatron-Core's
    memory-efficient path (mamba_split_conv1d_scan_combined, the gate z in the chunk scan,
    then Megatron's RMSNorm) reads its inputs once and writes its outputs once."""
    from mdc.plan.architecture import Mamba
    from mdc.tune import terms

    d, s, S, c = 2048, 1024, 2048, 1024
    xbc = d + 2 * s
    forward = [
        2 * xbc + 2 * xbc,  # causal conv1d: x, B, C in and out
        2 * d + 2 * s + 4 * S,  # chunk states: x, B in; fp32 states out
        4 * S + 2 * S,  # state passing: fp32 in, bf16 out
        2 * s + 2 * s + 4 * c,  # C B^T: C, B in; fp32 out
        4 * c + 2 * d + 2 * s + 2 * S + 2 * d + 2 * d + 2 * d,  # chunk scan: CB, x, C, states,
        # z in; gated and ungated outputs out
        2 * d + 2 * d,  # RMSNorm
    ]
    backward = [
        2 * d + 2 * d + 2 * d,  # RMSNorm's gradient: x, dy in; dx out
        2 * xbc + 2 * xbc,  # conv1d again
        2 * s + 2 * s + 4 * c,  # C B^T again
        2 * d + 2 * s + 4 * S,  # chunk states again
        4 * S + 4 * S,  # state passing again, fp32 out
        4 * 2 * d + 2 * 2 * d,  # the gate's gradient: x, z, out, dy in; dz, dy out
        2 * s + 2 * d + 4 * S,  # the states' gradient: C, dy in; fp32 out
        4 * S + 4 * S + 2 * S + 2 * S,  # state passing back: states, dstates in; both bf16 out
        2 * d + 2 * s + 4 * c + 2 * d + 2 * S + 2 * d,  # dx: x, B, CB, dy, dstates in; dx out
        2 * d + 2 * S + 2 * s + 2 * s,  # dB: x, dstates, B in; dB out
        2 * S + 2 * d + 2 * s + 2 * s,  # dC: states, dy, C in; dC out
        2 * d + 2 * d + 4 * c,  # d(CB): x, dy in; fp32 out
        2 * (2 * s + 4 * c + 2 * s + 2 * s),  # d(CB) back to B and to C
        2 * d + 2 * d + 4 * c,  # the decay's gradient: x, dy, CB in
        3 * 2 * xbc,  # conv1d's gradient: x, B, C and their gradient in; dx out
    ]
    assert sum(forward) + sum(backward) == 333_824
    assert terms.mamba_bytes(Mamba(state=128, head_dim=64, heads=32, groups=8), 1) == 333_824
    # tp 4 splits every width; tp 16 leaves a rank one group, B and C still 128 wide
    tp4 = terms.mamba_bytes(Mamba(state=128, head_dim=64, heads=32, groups=8), 4)
    assert tp4 == pytest.approx(333_824 / 4)
    tp16 = terms.mamba_bytes(Mamba(state=128, head_dim=64, heads=32, groups=8), 16)
    assert tp16 == 68 * 128 + 66 * 128 + 46 * 128 + 32 * 128


def test_mambas_scan_is_not_timed_at_attentions_rate() -> None:
    # Bridge counts the scan with attention's FLOPs; the model times it in the Mamba term
    st = _mamba_step(128)
    from mdc.tune import terms

    executed = token_flops(st.shape)
    assert executed.scan == executed.attention > 0
    assert terms.attention(st, executed) == 0.0


def test_each_ring_step_hides_only_its_own_send() -> None:
    """cp 4 across nodes (tp 8 fills each H100 node): each rank sends 8,192 / 4 = 2,048
    tokens' K and V, 2 x 8 groups x 128 / 8 (tp) x 2 bytes each = 1 MiB per layer and ring
    step, over one NDR NIC at 47 GB/s (s = 22.3 us). With each step's forward attention
    half of that, every one of the 3 steps with a send exposes s/2 forward and s backward
    (K, V and their gradients beside twice the forward's attention): 4.5 s per layer,
    where hiding the whole ring (9 s) behind the whole attention (6 s) leaves 3 s."""
    from mdc.tune import terms

    shape = resolve_shape(
        ModelTable(num_layers=80, hidden_size=8192, num_attention_heads=64,
                   num_query_groups=8, vocab_size=128256, seq_length=8192)
    )  # fmt: skip
    assert shape is not None
    layout = _layout(tp=8, pp=1, cp=4, dp=1, microbatches=1, order="tp-cp-ep-dp-pp")
    st = terms.Step(shape, layout, builtin()["h100-sxm"], DEFAULT, 8)
    send = 2048 * 2 * 8 * 128 / 8 * 2 / (50e9 * 47 / 50)
    assert st.stage_layers == 80
    attention = 80 * 3 * 4 * send / 2  # each step's forward attention: half a send
    assert terms.cp_comm(st, attention) == pytest.approx(80 * 4.5 * send, rel=1e-9)
    # a step whose attention outlasts its send hides it
    assert terms.cp_comm(st, 80 * 3 * 4 * send * 1.5) == 0.0


def test_nvfp4_casts_stream_each_linear_layers_input_and_output_gradient() -> None:
    """A Llama-3-70B-shaped layer at tp 2 with sequence parallelism, per token: QKV's
    8,192 / 2 input and (64 + 2 x 8) x 128 / 2 = 5,120 output, the output projection's
    64 x 128 / 2 = 4,096 and 8,192 / 2, the MLP's 4,096 in, 2 x 28,672 / 2 out, 28,672 / 2
    in and 4,096 out: 68,608 elements, each 7.125 bytes (two amax reads, one read and two
    4-bit writes with their scales), over 80 layers of 8,192 tokens at the B200's 7,700
    GB/s; a quarter of the layers kept in bf16 cast nothing."""
    from mdc.tune import terms

    shape = resolve_shape(
        ModelTable(num_layers=80, hidden_size=8192, num_attention_heads=64,
                   num_query_groups=8, ffn_hidden_size=28672, gated_mlp=True,
                   vocab_size=128256, seq_length=8192)
    )  # fmt: skip
    assert shape is not None and shape.gated
    layout = _layout(tp=2, pp=1, dp=4, microbatches=1)
    st = terms.Step(shape, layout, builtin()["b200"], DEFAULT, 8)
    per_token = 4096 + 5120 + 4096 + 4096 + 4096 + 28672 + 14336 + 4096
    assert per_token == 68608
    expected = 7.125 * per_token * 8192 * 80 / 7700e9
    assert terms.fp4_casts(st, 0.0) == pytest.approx(expected, rel=1e-9)
    assert terms.fp4_casts(st, 0.25) == pytest.approx(0.75 * expected, rel=1e-9)
    # only NVFP4 pays them
    hw = builtin()["b200"]
    fp8 = predict(shape, layout, hw, nproc_per_node=8, precision="fp8").breakdown
    fp4 = predict(shape, layout, hw, nproc_per_node=8, precision="fp4").breakdown
    assert fp4["elementwise"] - fp8["elementwise"] == pytest.approx(expected, rel=1e-9)


def test_where_no_layout_fits_json_says_what_was_searched_and_why(tmp_path: Path) -> None:
    # Llama 3.2 1B on one H100 with 1,048,576-token sequences: its model state fits, and
    # the spec as written compiles (the estimate only warns), but no layout's activations fit
    text = (REPO / "examples" / "memory-llama32-1b.toml").read_text(encoding="utf-8")
    data = tomllib.loads(text)
    data["distributed"].update(launcher="megatron", nproc_per_node=1, accelerator_model="h100-sxm")
    data["batch"] = {"global_batch_size": 8}
    data["model"]["seq_length"] = 1 << 20
    spec = tmp_path / "long.json"
    spec.write_text(json.dumps(data), encoding="utf-8")
    code, out, err = _run("tune", str(spec), "--format", "json")
    found = json.loads(out)
    assert code == 1 and found["candidates"] == [] and found["chosen"] is None
    assert found["searched"]["fit_memory"] == 0 and found["searched"]["memory_estimated"] > 0
    assert found["why"] == err.strip() and found["why"].startswith("mdc tune: no layout fits")
