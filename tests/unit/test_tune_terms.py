"""The throughput model is its terms: predict adds up short, documented term functions."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest
from tests.tools import REPO

TUNE = REPO / "compiler" / "mdc" / "tune"


def _functions(path: Path) -> dict[str, ast.FunctionDef]:
    """The module's functions and its classes' methods (a method under a module-level
    function's name does not shadow it)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    found.update({n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)})
    return found


def test_predict_reads_in_one_screen_and_calls_the_terms() -> None:
    predict = _functions(TUNE / "perf.py")["predict"]
    assert predict.end_lineno is not None
    assert predict.end_lineno - predict.lineno < 100
    called = {
        n.func.attr
        for n in ast.walk(predict)
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and isinstance(n.func.value, ast.Name)
        and n.func.value.id == "terms"
    }
    expected = {
        "dense_gemms", "expert_gemms", "attention", "output_layer", "elementwise", "tp_comm",
        "cp_comm", "ep_comm", "pp_p2p", "moe_permute", "expert_overhead", "mamba",
        "expert_weights",
        "bubble_slots", "dp_comm", "optimizer",
    }  # fmt: skip
    assert expected <= called


def test_every_term_is_short_and_names_its_formula() -> None:
    for name, node in _functions(TUNE / "terms.py").items():
        assert node.end_lineno is not None
        assert node.end_lineno - node.lineno < 60, name
        if not name.startswith("_") and name not in ("span", "hbm", "moe_layers"):
            doc = ast.get_docstring(node)
            assert doc and len(doc) > 60, f"{name}: its formula and data in a docstring"


def test_the_gemm_levels_are_the_measured_table() -> None:
    from mdc.hardware import builtin
    from mdc.tune import kernels, terms

    measured = kernels.gemm_levels()
    assert set(measured) == set(terms.GEMM_LEVEL)
    for key, level in measured.items():
        assert terms.GEMM_LEVEL[key] == pytest.approx(level, abs=1e-4), key
    table = tomllib.loads((TUNE / "kernels.toml").read_text(encoding="utf-8"))["gemm"]
    assert table["url"].startswith("https://")
    catalogue = builtin()
    assert {acc for acc, *_ in table["points"]} | set(table["stand_in"]) <= set(catalogue)


def test_the_hbm_levels_are_the_measured_table() -> None:
    """The serving model's HBM level: each accelerator's BabelStream Triad over its
    catalogue bandwidth, relative to the H100 SXM's (H100 2.97 of 3.35 TB/s, MI300X 4.09 of
    5.3: 0.870 of the H100's share)."""
    from mdc.tune import kernels, terms

    measured = kernels.hbm_levels()
    assert set(measured) == set(terms.HBM_LEVEL)
    for key, level in measured.items():
        assert terms.HBM_LEVEL[key] == pytest.approx(level, abs=1e-4), key
    assert measured["mi300x"] == pytest.approx((4.09 / 5.3) / (2.97 / 3.35), rel=1e-9)


def test_the_attention_levels_are_the_measured_table() -> None:
    """The attention level: cuDNN's forward attention TFLOP/s over the catalogue's bf16 peak,
    relative to the H200's (H200 679.887 of 989.4, B200 1,488.046 of 2,250, GB200 1,562.874
    and GB300 1,986.33 of 2,500); the H100 SXM takes the H200's."""
    from mdc.hardware import builtin
    from mdc.tune import kernels, terms

    measured = kernels.attention_levels()
    assert set(measured) == set(terms.ATTENTION_LEVEL)
    for key, level in measured.items():
        assert terms.ATTENTION_LEVEL[key] == pytest.approx(level, abs=1e-4), key
    h200 = 679.887 / 989.4
    assert measured["b200"] == pytest.approx((1488.046 / 2250) / h200, rel=1e-9)
    assert measured["gb300"] / measured["gb200"] == pytest.approx(1986.33 / 1562.874, rel=1e-9)
    assert measured["h100-sxm"] == measured["h200"] == 1.0
    table = tomllib.loads((TUNE / "kernels.toml").read_text(encoding="utf-8"))["attention_level"]
    assert table["url"].startswith("https://")
    assert {acc for acc, *_ in table["points"]} | set(table["stand_in"]) <= set(builtin())


def test_attention_runs_at_each_accelerators_measured_level() -> None:
    """The same layer's attention on a GB300 takes GB200's time over the measured ratio of
    their kernels (the same catalogue peak: Blackwell Ultra's doubled softmax exponentials),
    on a B200 the H100's time scaled by the peaks and the B200's level; an accelerator with
    no measurement (B300) runs at the bf16 peak's share alone."""
    from mdc.hardware import builtin
    from mdc.plan.memory import resolve_shape
    from mdc.spec import ModelTable
    from mdc.tune import terms
    from mdc.tune.perf import DEFAULT, Layout

    shape = resolve_shape(
        ModelTable(num_layers=4, hidden_size=4096, num_attention_heads=32, num_query_groups=8,
                   vocab_size=1024, seq_length=8192)
    )  # fmt: skip
    assert shape is not None
    layout = Layout(tp=1, pp=1, cp=1, ep=1, etp=1, dp=8, vpp=1, micro_batch_size=1,
                    microbatches=1, sequence_parallel=False, recompute="none")  # fmt: skip
    executed = terms.flops_of(shape, True, False, None, None)
    hw = builtin()

    def seconds(acc: str) -> float:
        return terms.attention(terms.Step(shape, layout, hw[acc], DEFAULT, 8), executed)

    assert seconds("gb200") / seconds("gb300") == pytest.approx(1986.33 / 1562.874, rel=1e-3)
    peaks = hw["b200"].peak_tflops("bf16") / hw["h100-sxm"].peak_tflops("bf16")
    assert seconds("h100-sxm") / seconds("b200") == pytest.approx(peaks * 0.9624, rel=1e-3)
    assert seconds("h100-sxm") / seconds("b300") == pytest.approx(
        hw["b300"].peak_tflops("bf16") / hw["h100-sxm"].peak_tflops("bf16"), rel=1e-9
    )


def test_gemms_run_at_each_accelerators_measured_share_of_its_peak() -> None:
    from mdc.hardware import builtin
    from mdc.tune import terms
    from mdc.tune.perf import DEFAULT

    hw = builtin()

    def share(acc: str, precision: str) -> float:
        rate = terms.gemm_rate(hw[acc], precision, DEFAULT, 0.0)
        return rate / (hw[acc].peak_tflops(precision) * 1e12)

    # the table's TFLOP/s over the datasheet peaks: A100 271.2 of 312, H100 794.5 of 989.4
    # in bf16 and 1402.6 of 1978.9 in fp8, GB200 1822 of 2500
    assert share("a100-80gb", "bf16") / share("h100-sxm", "bf16") == pytest.approx(
        (271.2 / 312) / (794.5 / 989.4), rel=1e-3
    )
    assert share("h100-sxm", "fp8") / share("h100-sxm", "bf16") == pytest.approx(
        (1402.6 / 1978.9) / (794.5 / 989.4), rel=1e-3
    )
    assert share("gb300", "bf16") == share("gb200", "bf16")  # its stand-in
    assert share("gb200", "bf16") / share("h100-sxm", "bf16") == pytest.approx(
        (1822 / 2500) / (794.5 / 989.4), rel=1e-3
    )
    # NVFP4 at its measured level (5,500 of 9,000 TFLOP/s on a B200) times fp4_peak; GB200
    # without a point of its own at the B200's NVFP4-over-fp8 ratio times its own fp8 level;
    # fp16 at bf16's
    assert share("b200", "fp4") / share("h100-sxm", "bf16") == pytest.approx(
        DEFAULT.fp4_peak * (5500 / 9000) / (794.5 / 989.4), rel=1e-3
    )
    assert share("gb200", "fp4") / share("gb200", "fp8") == pytest.approx(
        share("b200", "fp4") / share("b200", "fp8"), rel=1e-3
    )
    assert share("b200", "fp16") == share("b200", "bf16")


def test_the_fp4_levels_are_the_measured_nvfp4_gemms() -> None:
    from mdc.tune import kernels, terms

    measured = kernels.fp4_levels()
    assert set(measured) == set(terms.FP4_LEVEL)  # NVIDIA's Blackwell chips: NVFP4 is theirs
    for acc, level in measured.items():
        assert terms.FP4_LEVEL[acc] == pytest.approx(level, abs=1e-4), acc
    table = tomllib.loads((TUNE / "kernels.toml").read_text(encoding="utf-8"))["fp4"]
    assert table["url"].startswith("https://")
    # measured beside bf16 on the same machine: NVFP4 3.2-3.8x bf16 at every shape
    assert all(3.1 < fp4 / bf16 < 3.9 for _, bf16, fp4 in table["points"])


def test_the_b300s_nvfp4_level_is_transformer_engines_layer_benchmark() -> None:
    """The B300's NVFP4 GEMMs run at the rate Transformer Engine's GEMM profiling guide
    measured for a layer's twelve pre-quantized GEMMs: the ~19.17 TFLOP per layer the guide
    states in 3.764 ms, over the B300's 13,500 TFLOP/s fp4 peak, relative to the H100's
    794.5 of 989.4 in bf16; its bf16 time in the same run 13.102 ms, the 3.48x the guide
    prints."""
    from mdc.tune import kernels, terms

    (row,) = [r for r in kernels.curves("fp4_layer") if r["accelerator"] == "b300"]
    assert row["source"].startswith("https://github.com/NVIDIA/TransformerEngine/blob/")
    assert kernels.fp4_layer_tflops(row) == pytest.approx(19.17e12 / 3.764e-3 / 1e12, rel=1e-3)
    assert row["bf16_ms"] / row["nvfp4_ms"] == pytest.approx(3.48, abs=0.005)
    level = (19.17e12 / 3.764e-3) / 13500e12 / (794.5 / 989.4)
    assert kernels.fp4_levels()["b300"] == pytest.approx(level, rel=1e-3)
    assert terms.FP4_LEVEL["b300"] == pytest.approx(level, rel=1e-3)
    # the GB300 has no NVFP4 measurement: it keeps the B200's NVFP4-over-fp8 ratio
    assert terms.FP4_LEVEL["gb300"] / terms.GEMM_LEVEL["gb300", "fp8"] == pytest.approx(
        terms.FP4_LEVEL["b200"] / terms.GEMM_LEVEL["b200", "fp8"], rel=1e-3
    )


def test_the_link_shares_are_nccls_measured_bus_bandwidths() -> None:
    from mdc.tune import kernels
    from mdc.tune.perf import DEFAULT

    shares = kernels.link_shares()
    # NVLink 4: 370 of 450 GB/s; NDR InfiniBand: 47 of 50 GB/s per NIC
    assert shares == {"scale-up": pytest.approx(370 / 450), "scale-out": pytest.approx(47 / 50)}
    assert DEFAULT.link_share == pytest.approx(shares["scale-up"], rel=1e-4)
    assert DEFAULT.nic_share == pytest.approx(shares["scale-out"], rel=1e-4)
    assert all(c["source"].startswith("https://") for c in kernels.curves("collective"))


def test_a_group_across_nodes_reaches_its_nics_measured_share() -> None:
    from mdc.hardware import builtin
    from mdc.tune import terms
    from mdc.tune.perf import DEFAULT

    hw = builtin()["h100-sxm"]
    # inside the node: NVLink at its share; 16 ranks 8 apart over 2 nodes: one NIC each
    assert terms.bandwidth(8, 1, 8, hw, DEFAULT) == pytest.approx(370e9, rel=1e-4)
    assert terms.bandwidth(16, 8, 8, hw, DEFAULT) == pytest.approx(47e9, rel=1e-4)
    # tp-like neighbours spanning two nodes: each node's 8 members send over 8 NICs,
    # up to the NVLink share
    assert terms.bandwidth(16, 1, 8, hw, DEFAULT) == pytest.approx(370e9, rel=1e-4)
    assert terms.bandwidth(32, 4, 8, hw, DEFAULT) == pytest.approx(2 * 47e9, rel=1e-4)
