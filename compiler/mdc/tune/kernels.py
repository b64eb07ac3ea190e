"""The measured kernel curves of ``kernels.toml`` and the knees the model takes from them.

The performance model reads its measured knees as constants (:class:`mdc.tune.perf.Constants`);
this module fits them to the published points, and a test holds the two equal, so that the
model's start-up reads no data file and the data stays the source.
"""

from __future__ import annotations

import math
import tomllib
from typing import Any

from mdc.package_data import package_text


def curves(kind: str) -> list[dict[str, Any]]:
    """The curves of one kind ("attention") as ``kernels.toml`` lists them."""
    found: list[dict[str, Any]] = tomllib.loads(package_text("mdc.tune", "kernels.toml"))[kind]
    return found


def saturation(points: list[tuple[float, float]]) -> tuple[float, float]:
    """(plateau, knee) of ``rate = plateau * x / (x + knee)`` fitted to ``points`` by least
    squares in log space (the knee on a 1-token grid up to 4,096; the plateau in closed
    form for each knee)."""
    best: tuple[float, float, float] | None = None
    for knee in range(0, 4097):
        logs = [math.log(rate) - math.log(x / (x + knee)) for x, rate in points]
        level = sum(logs) / len(logs)
        error = sum((value - level) ** 2 for value in logs)
        if best is None or error < best[0]:
            best = (error, math.exp(level), float(knee))
    assert best is not None
    return best[1], best[2]


def attention_seq_knee() -> float:
    """The query tokens per FlashAttention kernel at which its throughput halves: the knee
    of the attention curves, averaged over them."""
    knees = [saturation([(x, y) for x, y in c["points"]])[1] for c in curves("attention")]
    return sum(knees) / len(knees)


def gemm_levels() -> dict[tuple[str, str], float]:
    """{(accelerator, precision): its GEMM level}: the measured maximum achievable matmul
    TFLOP/s over the catalogue's dense peak, relative to the reference accelerator's
    (``kernels.toml``'s ``[gemm]``); an accelerator the table does not list takes its
    stand-in's level, fp8 where it has none of its own takes bf16's."""
    from mdc.hardware import builtin

    table = tomllib.loads(package_text("mdc.tune", "kernels.toml"))["gemm"]
    catalogue = builtin()
    share = {
        (acc, precision): tflops / catalogue[acc].peak_tflops(precision)
        for acc, precision, tflops, *_ in table["points"]
    }
    reference = share[tuple(table["reference"])]
    levels = {key: value / reference for key, value in share.items()}
    for acc, stand_in in table["stand_in"].items():
        for precision in ("bf16", "fp8"):
            if (stand_in, precision) in levels and (acc, precision) not in levels:
                levels[acc, precision] = levels[stand_in, precision]
    for acc, _ in list(levels):
        if (acc, "fp8") not in levels and "fp8" in catalogue[acc].dense_tflops:
            levels[acc, "fp8"] = levels[acc, "bf16"]
    return dict(sorted(levels.items()))


def attention_levels() -> dict[str, float]:
    """{accelerator: its attention level}: the measured forward attention TFLOP/s
    (``kernels.toml``'s ``[attention_level]``, cuDNN's fused attention) over the catalogue's
    dense bf16 peak, relative to the reference accelerator's; a stand-in's level for an
    accelerator the table times as another."""
    from mdc.hardware import builtin

    table = tomllib.loads(package_text("mdc.tune", "kernels.toml"))["attention_level"]
    catalogue = builtin()
    share = {acc: tflops / catalogue[acc].peak_tflops("bf16") for acc, tflops, _ in table["points"]}
    reference = share[table["reference"]]
    levels = {acc: value / reference for acc, value in share.items()}
    for acc, stand_in in table["stand_in"].items():
        levels.setdefault(acc, levels[stand_in])
    return dict(sorted(levels.items()))


def link_shares() -> dict[str, float]:
    """{"scale-up" | "scale-out": NCCL's bus bandwidth over the line rate} (``kernels.toml``'s
    ``[[collective]]``): the model's ``link_share`` and ``nic_share``."""
    return {c["link"]: c["bus_gb_s"] / c["line_rate_gb_s"] for c in curves("collective")}


def hbm_levels() -> dict[str, float]:
    """{accelerator: its HBM level}: the measured BabelStream Triad bandwidth over the
    catalogue's HBM bandwidth, relative to the reference accelerator's (``kernels.toml``'s
    ``[hbm]``)."""
    from mdc.hardware import builtin

    table = tomllib.loads(package_text("mdc.tune", "kernels.toml"))["hbm"]
    catalogue = builtin()
    share = {
        acc: tb_s * 1e3 / catalogue[acc].memory_bandwidth_gb_s for acc, tb_s, _ in table["points"]
    }
    reference = share[table["reference"]]
    return {acc: value / reference for acc, value in sorted(share.items())}


def ssd_level() -> tuple[float, float]:
    """(level, knee) of Mamba-2's SSD kernels: the plateau of ``kernels.toml``'s ``[[ssd]]``
    curve over its accelerator's dense bf16 peak, and the sequence length (tokens) at which
    its throughput halves."""
    from mdc.hardware import builtin

    curve = curves("ssd")[0]
    plateau, knee = saturation([(x, y) for x, y in curve["points"]])
    return plateau / builtin()[curve["accelerator"]].peak_tflops("bf16"), knee


def fp4_layer_tflops(row: dict[str, Any]) -> float:
    """TFLOP/s of one ``[[fp4_layer]]`` row's NVFP4 GEMMs: the layer's FLOPs (each forward
    GEMM 2 x M x K x N, its dgrad and wgrad the same again) over the NVFP4 milliseconds."""
    flops = 3 * sum(2 * m * k * n for m, k, n in row["shapes"])
    return float(flops / (row["nvfp4_ms"] * 1e-3) / 1e12)


def fp4_levels() -> dict[str, float]:
    """{accelerator: its NVFP4 GEMM level}: a measured NVFP4 rate over the catalogue's fp4
    peak, relative to the reference's bf16 share (as :func:`gemm_levels`): ``[fp4]``'s best
    point for its accelerator, a ``[[fp4_layer]]`` row's layer rate for its own; every other
    accelerator with an fp4 peak keeps ``[fp4]``'s accelerator's NVFP4 level over its fp8
    level, times its own fp8 level (that vendor's chips: NVFP4 is NVIDIA's format)."""
    from mdc.hardware import builtin

    table = tomllib.loads(package_text("mdc.tune", "kernels.toml"))["fp4"]
    catalogue = builtin()
    gemm = gemm_levels()
    reference = _reference_share()
    measured = table["accelerator"]
    rates = {measured: max(fp4 for _, _, fp4 in table["points"])}
    rates.update({row["accelerator"]: fp4_layer_tflops(row) for row in curves("fp4_layer")})
    own = {
        acc: tflops / catalogue[acc].peak_tflops("fp4") / reference for acc, tflops in rates.items()
    }
    ratio = own[measured] / gemm[measured, "fp8"]
    return {
        acc: own.get(acc, gemm[acc, "fp8"] * ratio)
        for acc, hw in sorted(catalogue.items())
        if "fp4" in hw.dense_tflops
        and (acc, "fp8") in gemm
        and hw.vendor == catalogue[measured].vendor
    }


def _reference_share() -> float:
    """The reference accelerator's measured share of its peak (``[gemm]``'s reference)."""
    from mdc.hardware import builtin

    table = tomllib.loads(package_text("mdc.tune", "kernels.toml"))["gemm"]
    acc, precision = table["reference"]
    tflops = next(t for a, p, t, *_ in table["points"] if (a, p) == (acc, precision))
    return float(tflops) / builtin()[acc].peak_tflops(precision)


#: the GEMMs a local expert runs per MoE layer and pass (fc1 and fc2: forward, or each of
#: the two backward passes)
EXPERT_GEMMS = 2


def expert_overhead_us() -> float:
    """A local expert's fixed time per MoE layer and pass, in microseconds: what Transformer
    Engine's per-expert grouped GEMM takes beyond one kernel over the same experts, per
    expert and GEMM (``kernels.toml``'s ``[[grouped_gemm]]``, averaged over its rows), times
    the expert's two GEMMs per pass."""
    rows = curves("grouped_gemm")
    per_gemm = [
        (row["multi_stream_ms"] - row["single_launch_ms"]) * 1e3 / row["experts"] for row in rows
    ]
    return float(EXPERT_GEMMS * sum(per_gemm) / len(per_gemm))


def fused_moe_shares() -> dict[str, float]:
    """{precision: the Triton fused-MoE kernel's marginal FLOP rate at many tokens per expert
    as a share of the chip's peak at its measured GEMM level}, averaged over the curves of
    ``kernels.toml``'s ``[[fused_moe]]`` (the serving model's ``FUSED_MOE_SHARE``)."""
    from mdc.hardware import builtin
    from mdc.tune.terms import gemm_level

    shares: dict[str, list[float]] = {}
    for c in curves("fused_moe"):
        (b0, t0), (b1, t1) = c["points"][-2:]
        per_token = 2 * 3 * c["hidden"] * c["intermediate"] * c["topk"]
        rate = (b1 - b0) * per_token / ((t1 - t0) * 1e-6)
        hw = builtin()[c["accelerator"]]
        peak = hw.peak_tflops(c["precision"]) * 1e12 * gemm_level(hw, c["precision"])
        shares.setdefault(c["precision"], []).append(rate / peak)
    return {p: sum(v) / len(v) for p, v in sorted(shares.items())}


def fused_moe_fixed_s() -> float:
    """Seconds of a Triton fused-MoE launch beyond its weight reads: each
    ``[[fused_moe_launch]]`` entry's one-token time less its top-k experts' bytes at the
    chip's measured HBM bandwidth (``[hbm]``'s Triad), averaged (the serving model's
    ``FUSED_MOE_FIXED_S``)."""
    table = tomllib.loads(package_text("mdc.tune", "kernels.toml"))
    triad = {acc: tb_s * 1e12 for acc, tb_s, _ in table["hbm"]["points"]}
    fixed: list[float] = []
    for c in table["fused_moe_launch"]:
        read = c["topk"] * 3 * c["hidden"] * c["intermediate"] * c["weight_bytes"]
        fixed.append(float(c["one_token_us"]) * 1e-6 - read / triad[c["accelerator"]])
    return sum(fixed) / len(fixed)


def block_fp8_tile_rate() -> float:
    """Bytes/s one 128-column tile of a block-scaled FP8 GEMM streams at a few rows
    (``[block_fp8]``: 128 x K bytes of weights over the measured kernel's time; the serving
    model's ``BLOCK_FP8_TILE_BYTES_S``)."""
    c = tomllib.loads(package_text("mdc.tune", "kernels.toml"))["block_fp8"]
    seconds = 2 * c["n"] * c["k"] / (c["tflops"] * 1e12)
    return float(c["tile"] * c["k"] / seconds)


def block_fp8_measured_us() -> dict[str, dict[tuple[int, int], tuple[tuple[int, float], ...]]]:
    """``[[block_fp8_gemm]]``'s timings by accelerator: {(N, K): ((rows, microseconds), ...)}
    in rising rows, as published (the serving model's ``BLOCK_FP8_MEASURED_US``)."""
    out: dict[str, dict[tuple[int, int], tuple[tuple[int, float], ...]]] = {}
    for c in curves("block_fp8_gemm"):
        points = tuple(sorted((int(m), float(us)) for m, us in c["points"]))
        out.setdefault(c["accelerator"], {})[(int(c["n"]), int(c["k"]))] = points
    return out
