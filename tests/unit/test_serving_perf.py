"""The serving model: [workload], the predicted block of explain and plan.json, the model's
behaviour, and its error on the published measurements it is fitted on."""

from __future__ import annotations

import functools
import json
import math
import statistics
from pathlib import Path
from typing import Any

import attrs
import pytest
from bench import serving_fit

from mdc.describe import explain_text, plan_json
from mdc.errors import SpecError
from mdc.hardware import Accelerator, builtin
from mdc.pipeline import Compiled, Compiler
from mdc.plugin_manager import load_plugins
from mdc.spec import WorkloadTable
from mdc.tune.records import DEFAULT as MEASURED
from mdc.tune.serving_perf import predict
from mdc.tune.serving_records import DEFAULT, Deployment, Role
from mdc.tune.serving_server import link_rate, server_of
from mdc.tune.terms import GEMM_LEVEL, hbm_level

COMPILER = Compiler(load_plugins(autoload=False))
R1 = {"name": "deepseek-ai/DeepSeek-R1", "dtype": "fp8", "seq_length": 9216}
WORKLOAD = {"input_tokens": 8192, "output_tokens": 1024, "concurrency": 64}


def trtllm(**tables: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "job": {"name": "r1", "command": ["trtllm-serve"]},
        "distributed": {
            "launcher": "trtllm",
            "backend": "local",
            "nnodes": 1,
            "nproc_per_node": 8,
            "accelerator_model": "h200",
        },
        "parallelism": {"tp": 8, "ep": 8},
        "model": R1,
        "trtllm": {"model": "deepseek-ai/DeepSeek-R1"},
        "workload": WORKLOAD,
    }
    data.update(tables)
    return data


def compile_(tmp_path: Path, data: dict[str, Any]) -> Compiled:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return COMPILER.compile(path, tree=False)


def predicted(tmp_path: Path, data: dict[str, Any]) -> dict[str, Any] | None:
    compiled = compile_(tmp_path, data)
    block = plan_json(compiled.plan, compiled.launch).get("predicted")
    assert block is None or isinstance(block, dict)
    return block


def test_plan_json_predicts_a_serving_spec_with_a_workload(tmp_path: Path) -> None:
    p = predicted(tmp_path, trtllm())
    assert p is not None
    assert p["accelerator_model"] == "h200"
    for key in (
        "ttft_ms",
        "tpot_ms",
        "output_tokens_per_s_per_gpu",
        "output_tokens_per_s_per_user",
        "requests_per_s",
    ):
        assert p[key] > 0, key
    # one user's speed is one token per TPOT; the GPUs' output is requests x output tokens
    assert p["output_tokens_per_s_per_user"] == pytest.approx(1000 / p["tpot_ms"], rel=1e-3)
    assert p["output_tokens_per_s_per_gpu"] * 8 == pytest.approx(
        p["requests_per_s"] * 1024, rel=1e-3
    )
    # 64 in flight, all of which the cache holds: the server runs them all at once
    assert p["batch"] == {"server": 64}


def test_explain_says_the_prediction(tmp_path: Path) -> None:
    compiled = compile_(tmp_path, trtllm())
    text = explain_text(compiled.plan, compiled.launch)
    assert "for 8192 in / 1024 out tokens, 64 requests in flight" in text
    assert "TTFT" in text and "TPOT" in text


def test_no_prediction_without_a_workload(tmp_path: Path) -> None:
    data = trtllm()
    del data["workload"]
    assert predicted(tmp_path, data) is None


def test_disaggregated_spec_is_predicted_from_its_roles(tmp_path: Path) -> None:
    data = trtllm(
        distributed={
            "launcher": "sglang_disagg",
            "backend": "local",
            "nnodes": 4,
            "nproc_per_node": 8,
            "accelerator_model": "h200",
            "prefill_nodes": 2,
            "decode_nodes": 2,
        },
        parallelism={},
        sglang_disagg={
            "model_path": "deepseek-ai/DeepSeek-R1",
            "tp_size": 8,
            "dp_size": 8,
            "enable_dp_attention": True,
            "ep_size": 8,
        },
        job={"name": "r1-pd", "command": "python3"},
    )
    del data["trtllm"]
    p = predicted(tmp_path, data)
    assert p is not None
    assert set(p["batch"]) == {"prefill", "decode"}
    # 32 GPUs serve: 2 prefill and 2 decode servers of 8
    assert p["output_tokens_per_s_per_gpu"] * 32 == pytest.approx(
        p["requests_per_s"] * 1024, rel=1e-3
    )


def test_a_training_launcher_warns_that_it_does_not_read_the_workload(tmp_path: Path) -> None:
    data = {
        "job": {"name": "train", "command": ["python", "train.py"]},
        "distributed": {"launcher": "torchrun", "backend": "local", "nproc_per_node": 2},
        "workload": WORKLOAD,
    }
    compiled = compile_(tmp_path, data)
    assert [d.code for d in compiled.plan.warnings] == ["MDC620"]


@pytest.mark.parametrize(
    ("workload", "code", "pointer"),
    [
        ({"input_tokens": 10, "output_tokens": 10}, "MDC623", "/workload"),
        (
            {"input_tokens": 10, "output_tokens": 10, "concurrency": 1, "request_rate": 1.0},
            "MDC623",
            "/workload/request_rate",
        ),
        # the schema's bound, and no second finding on the value it dropped
        ({"input_tokens": 10, "output_tokens": 10, "concurrency": 0}, "MDC105", None),
    ],
)
def test_the_workload_takes_one_load(
    tmp_path: Path, workload: dict[str, Any], code: str, pointer: str | None
) -> None:
    with pytest.raises(SpecError) as caught:
        compile_(tmp_path, trtllm(workload=workload))
    found = [(d.code, d.location.pointer) for d in caught.value.diagnostics]
    assert any(c == code and (pointer is None or p == pointer) for c, p in found), found
    assert len(found) == 1, found


# -- the model's behaviour --------------------------------------------------------------


def _r1_shape() -> Any:
    return serving_fit._shape("deepseek-v3", "fp8", 9216)


def _deployment(*roles: Role, launcher: str = "sglang_disagg") -> Deployment:
    return Deployment(launcher=launcher, roles=roles, capacity_gib=140.4, nproc_per_node=8)


def test_tpot_grows_with_the_running_batch() -> None:
    hw, shape = builtin()["h200"], _r1_shape()
    dep = _deployment(Role(name="server", servers=1, gpus=8, tp=8, ep=8), launcher="sglang")
    tpots = [
        predict(
            shape, hw, dep, WorkloadTable(input_tokens=1024, output_tokens=1024, concurrency=c)
        ).tpot_ms
        for c in (1, 8, 64)
    ]
    assert tpots == sorted(tpots) and tpots[0] < tpots[-1]


def test_a_rate_past_the_capacity_is_overloaded() -> None:
    hw, shape = builtin()["h200"], _r1_shape()
    dep = _deployment(Role(name="server", servers=1, gpus=8, tp=8, ep=8), launcher="sglang")
    light = predict(
        shape, hw, dep, WorkloadTable(input_tokens=1024, output_tokens=256, request_rate=0.5)
    )
    heavy = predict(
        shape, hw, dep, WorkloadTable(input_tokens=1024, output_tokens=256, request_rate=500.0)
    )
    assert not light.overloaded and light.requests_per_s == pytest.approx(0.5)
    assert heavy.overloaded and heavy.binding == "queueing"
    assert heavy.requests_per_s < 500


def test_disaggregated_decode_runs_without_prefill_interference() -> None:
    hw, shape = builtin()["h200"], _r1_shape()
    work = WorkloadTable(input_tokens=8192, output_tokens=1024, concurrency=64)
    agg = _deployment(Role(name="server", servers=2, gpus=8, tp=8, ep=8))
    pd = _deployment(
        Role(name="prefill", servers=1, gpus=8, tp=8, ep=8),
        Role(name="decode", servers=1, gpus=8, tp=8, ep=8),
    )
    a, d = predict(shape, hw, agg, work), predict(shape, hw, pd, work)
    # the decode servers of the split run twice the batch of each aggregated server yet
    # no prompt's chunks: their step is not twice as long
    assert d.batch["decode"] == 2 * a.batch["server"]
    assert d.tpot_ms < 2 * a.tpot_ms


# -- the fit ----------------------------------------------------------------------------


def _median(errs: list[float]) -> float:
    return statistics.median(abs(e) for e in errs)


@functools.cache
def _rows() -> tuple[dict[str, Any], ...]:
    return tuple(serving_fit.measurements())


@functools.cache
def _held_out() -> dict[str, dict[str, list[float]]]:
    """Each source's errors per metric, with the constants fitted on the other sources."""
    folds = serving_fit.held_out(list(_rows()))
    return {
        source: {m: serving_fit.errors(test, c, m) for m in serving_fit.METRICS}
        for source, (c, test) in folds.items()
    }


@pytest.mark.slow
def test_the_shipped_constants_are_the_fit_on_the_fitted_sources() -> None:
    fitted = [r for r in _rows() if r.get("fit", True)]
    c, _ = serving_fit.fit(fitted)
    assert (
        c.hbm_efficiency,
        c.prefill_efficiency,
        c.overhead("trtllm"),
        c.request_overhead("vllm"),
        c.request_overhead("vllm_disagg"),
    ) == (
        DEFAULT.hbm_efficiency,
        DEFAULT.prefill_efficiency,
        DEFAULT.overhead("trtllm"),
        DEFAULT.request_overhead("vllm"),
        DEFAULT.request_overhead("vllm_disagg"),
    )


def test_the_fitted_sources_are_reproduced() -> None:
    """Throughput, TTFT and TPOT on the rows the constants are fitted on
    (docs/tune-serving-targets.md's table)."""
    fitted = [r for r in _rows() if r.get("fit", True)]
    throughput = serving_fit.errors(fitted, DEFAULT, "throughput")
    assert len(throughput) >= 66
    assert _median(throughput) <= 0.09
    assert sum(abs(e) <= 0.30 for e in throughput) / len(throughput) >= 0.85
    assert _median(serving_fit.errors(fitted, DEFAULT, "ttft")) <= 0.25
    assert _median(serving_fit.errors(fitted, DEFAULT, "tpot")) <= 0.09


#: the median |error| of each source's rows held out (fitted on the others): floors the
#: model must keep (docs/tune-serving-targets.md reports them, and why some are far off)
HELD_OUT_FLOORS = {
    ("trtllm-perf-overview", "throughput"): 0.11,
    ("nim-benchmarking", "throughput"): 0.07,
    ("nim-benchmarking", "ttft"): 0.12,
    ("nim-benchmarking", "tpot"): 0.11,
    # vLLM's steps past its 512 captured requests eager: 35.3 % -> 30.8 %
    ("amd-rocm-performance-results", "throughput"): 0.31,
    ("lmsys-sglang-96xh100", "throughput"): 0.15,
    ("lmsys-sglang-gb200-part2", "throughput"): 0.17,
    # its fixed lengths' waves run as bursts: TTFT 95.8 % -> 66.4 %, TPOT 60.1 % -> 64.8 %;
    # the 500 prompts' last wave, smaller, decodes faster: 65.1 % (the measured steps are
    # 2 to 6x the model's, so any smaller batch moves away from them); the block-FP8 GEMMs'
    # tiles and the fused-MoE launches: 65.1 % -> 61.8 %; SGLang's DP attention gathering
    # its groups' tokens: 53.9 %; the MI300X's block-FP8 GEMMs at aiter's measured times: 52.8 %;
    # TensorRT-LLM 0.17 decoding without CUDA graphs (its default then): 48.6 %
    ("dstack-deepseek-r1", "tpot"): 0.49,
}


@pytest.mark.slow
@pytest.mark.parametrize(("source", "metric"), sorted(HELD_OUT_FLOORS))
def test_held_out_by_source_the_error_keeps_its_floor(source: str, metric: str) -> None:
    errs = _held_out()[source][metric]
    assert errs, (source, metric)
    assert _median(errs) <= HELD_OUT_FLOORS[source, metric]


def test_vllm_host_work_per_request_brings_amds_rows_in() -> None:
    """AMD's vLLM rows on 8 MI300X run up to 3,200 requests at once; with 0 host work per
    request the model came 35 % fast (the 70B rows 1.5 to 1.7x), with the fitted 30 us a
    request a step every row is within 25 %."""
    rows = [r for r in _rows() if r["source"] == "amd-rocm-performance-results"]
    errs = serving_fit.errors(rows, DEFAULT, "throughput")
    assert len(errs) == 8
    assert _median(errs) <= 0.10
    assert all(abs(e) <= 0.25 for e in errs), errs


def test_a_decode_step_adds_the_host_work_of_each_request_of_an_engine_process() -> None:
    """vLLM's step at batch b carries b / dp x r more than with r = 0 (each data-parallel
    engine prepares and streams its own requests); TensorRT-LLM's none (r unset)."""
    shape = serving_fit._shape("llama3.1-70b", "fp8", 4096)
    hw = builtin()["h200"]
    work = WorkloadTable(input_tokens=2048, output_tokens=2048, concurrency=64)
    none = attrs.evolve(DEFAULT, request_overhead_s={})
    for launcher, dp, extra in (
        ("vllm", 1, 64 * 30e-6),
        ("vllm", 4, 16 * 30e-6),
        ("trtllm", 1, 0.0),
    ):
        role = Role(name="server", servers=1, gpus=8, tp=8 // dp, dp=dp)
        dep = Deployment(launcher=launcher, roles=(role,), capacity_gib=hw.memory_gib)
        with_host = server_of(role, shape, hw, dep, work, DEFAULT).decode_step(64, 3072)
        without = server_of(role, shape, hw, dep, work, none).decode_step(64, 3072)
        assert with_host - without == pytest.approx(extra), launcher


def test_ttft_below_the_knee_counts_the_wait_for_the_prefill() -> None:
    """NIM's Llama 3.3 70B on 2 H100 at 5 to 50 requests in flight: every request has a
    slot, yet prompts that arrive together wait for each other's prefill (a 5,000-token
    prompt fills a step's 8,192-token budget alone). Without that wait TTFT came 33 to
    55 % short."""
    rows = [r for r in _rows() if r["source"] == "nim-benchmarking" and 5 <= r["concurrency"] <= 50]
    errs = serving_fit.errors(rows, DEFAULT, "ttft")
    assert len(errs) == 3
    assert all(abs(e) <= 0.30 for e in errs), errs


def test_a_prompt_chunk_reads_the_experts_its_tokens_touch() -> None:
    """gpt-oss-120b (128 experts, top-4) on one H100 at 3 decoding requests: a step reads
    1 - (1 - 4/128)^3 = 9.1 % of the experts; with a 229-token prompt
    chunk beside them, 1 - (1 - 4/128)^232 = 99.9 %. The chunk adds the difference of the
    expert bytes at the step's HBM rate; a dense model's chunk adds no reads."""
    hw = builtin()["h100-sxm"]
    work = WorkloadTable(input_tokens=229, output_tokens=217, concurrency=4)
    role = Role(name="server", servers=1, gpus=1)
    dep = Deployment(launcher="vllm", roles=(role,), capacity_gib=hw.memory_gib)
    moe = server_of(role, serving_fit._shape("gpt-oss-120b", "fp4", 446), hw, dep, work, DEFAULT)
    share = (1 - (1 - 4 / 128) ** 232) - (1 - (1 - 4 / 128) ** 3)
    assert share == pytest.approx(0.9085, abs=1e-4)
    rate = hw.memory_bandwidth_gb_s * 1e9 * DEFAULT.hbm_efficiency  # the H100's level is 1
    assert moe.chunk_reads(3, 229) == pytest.approx(moe.expert_bytes * share / rate)
    assert moe.chunk_reads(3, 229) > 0.02  # over 20 ms of its ~60 GB of MXFP4 experts
    dense = server_of(role, serving_fit._shape("llama3.1-8b", "bf16", 446), hw, dep, work, DEFAULT)
    assert dense.chunk_reads(3, 229) == 0.0


def test_a_closed_loops_request_waits_for_the_step_in_flight() -> None:
    """A closed loop sends a request when another finishes, at a step's end; the engine has
    begun the next step of the others and takes the request after it. Alone it waits for
    nothing: the same deployment's TTFT at 1 and 4 in flight differs by the 3 others' decode
    step (and what the batch adds to its own step)."""
    shape = serving_fit._shape("llama3.1-70b", "fp8", 2500)
    hw = builtin()["h100-sxm"]
    role = Role(name="server", servers=1, gpus=2, tp=2)
    dep = Deployment(launcher="trtllm", roles=(role,), capacity_gib=hw.memory_gib)
    ctx = 500 + 2000 / 2
    one = WorkloadTable(input_tokens=500, output_tokens=2000, concurrency=1)
    four = attrs.evolve(one, concurrency=4)
    server = server_of(role, shape, hw, dep, four, DEFAULT)
    alone = predict(shape, hw, dep, one).ttft_ms
    among = predict(shape, hw, dep, four).ttft_ms
    # the prompt's own step at 4 running, less at 1 running, plus the others' step
    own = server.decode_step(4, ctx) - server.decode_step(1, ctx)
    assert among - alone == pytest.approx((own + server.decode_step(3, ctx)) * 1e3, rel=0.02)


def test_a_requests_tokens_wait_for_the_others_prompts_not_its_own() -> None:
    """An aggregated step prefills the prompts that replace finished requests; a request's
    own prompt is in its TTFT, so its tokens carry the other B - 1 requests' prompts over
    its output. Alone in flight its TPOT is the decode step (it carried its own prompt's
    prefill, 10 tokens a step here, with every layer's all-reduce latency, before)."""
    shape = serving_fit._shape("llama3.1-70b", "fp8", 5500)
    hw = builtin()["h100-sxm"]
    role = Role(name="server", servers=1, gpus=2, tp=2)
    dep = Deployment(launcher="trtllm", roles=(role,), capacity_gib=hw.memory_gib)
    ctx = 5000 + 500 / 2
    for load in (1, 5):
        work = WorkloadTable(input_tokens=5000, output_tokens=500, concurrency=load)
        server = server_of(role, shape, hw, dep, work, DEFAULT)
        others = server.prefill_compute((load - 1) * 5000 / 500, 5000) if load > 1 else 0.0
        expected = server.decode_step(load, ctx) + others
        assert predict(shape, hw, dep, work).tpot_ms == pytest.approx(expected * 1e3)


def test_gpustacks_ttft_at_4_in_flight() -> None:
    """GPUStack's runs at 4 requests in flight (ShareGPT prompts of ~229 tokens; never
    fitted): gpt-oss-120b on H100 and A100 and DeepSeek-R1 on 8 H200 under vLLM. Each
    prompt's step reads nearly every expert; counting only the 4 decoding tokens' experts
    the model came 68 to 90 % short (49 ms measured on one H100, 10 predicted)."""
    rows = [
        r
        for r in _rows()
        if r["source"] == "gpustack-performance-lab" and r.get("ttft_ms") is not None
    ]
    errs = serving_fit.errors(rows, DEFAULT, "ttft")
    assert len(errs) == 5
    assert _median(errs) <= 0.30
    assert sum(abs(e) <= 0.50 for e in errs) >= 4, errs


#: H200's measured GEMM levels (kernels.toml's [gemm]): bf16 as the H100's, fp8 its own
H200_FP8_OVER_BF16_LEVEL = GEMM_LEVEL["h200", "fp8"] / GEMM_LEVEL["h200", "bf16"]


@pytest.mark.parametrize(
    ("accelerator", "ratio"), [("b200", 0.5), ("h200", 2.0 * H200_FP8_OVER_BF16_LEVEL)]
)
def test_an_fp4_checkpoint_prefills_at_the_chips_fp4_peak(accelerator: str, ratio: float) -> None:
    """B200's dense FP4 peak is twice its FP8 one (FP4 at FP8's measured level); H200 has no
    FP4 tensor cores, so the 4-bit weights are widened and the GEMMs run at its bf16 peak,
    half its FP8 one, each at its own measured GEMM level."""
    hw = builtin()[accelerator]
    work = WorkloadTable(input_tokens=4096, output_tokens=512, concurrency=8)
    role = Role(name="server", servers=1, gpus=1, tp=1)
    dep = _deployment(role, launcher="vllm")

    def server(dtype: str) -> Any:
        shape = serving_fit._shape("llama3.1-8b", dtype, 4608)
        return server_of(role, shape, hw, dep, work, DEFAULT)

    fp4, fp8 = server("fp4"), server("fp8")
    assert fp4.prefill_compute(4096, 4096) / fp8.prefill_compute(4096, 4096) == pytest.approx(
        ratio, rel=1e-3
    )
    # and it reads fewer weight bytes each decode step
    assert fp4.decode_parts(1, 4352)[0] < fp8.decode_parts(1, 4352)[0]


def test_attention_data_parallel_without_expert_parallel_splits_the_experts() -> None:
    """SGLang's --enable-dp-attention (and TensorRT-LLM's enable_attention_dp) over tp 8
    without expert parallel keeps the experts tensor parallel over the server's 8 GPUs;
    vLLM's data-parallel engines without expert parallel are replicas of their tp."""
    hw, shape = builtin()["h200"], _r1_shape()
    work = WorkloadTable(input_tokens=3200, output_tokens=800, concurrency=16)

    def server(launcher: str, dp: int) -> Any:
        role = Role(name="server", servers=1, gpus=8, tp=8 // dp if launcher == "vllm" else 8)
        role = attrs.evolve(role, dp=dp)
        dep = _deployment(role, launcher=launcher)
        return server_of(role, shape, hw, dep, work, DEFAULT), predict(shape, hw, dep, work)

    (tp8, _), (adp, adp_prediction) = server("sglang", 1), server("sglang", 8)
    assert adp.expert_bytes == tp8.expert_bytes
    assert adp_prediction.output_tokens_per_s_per_gpu > 0
    replica, _ = server("vllm", 8)
    assert replica.expert_bytes == pytest.approx(8 * tp8.expert_bytes, rel=0.01)


def test_trtllm_attention_data_parallel_is_the_servers_dp(tmp_path: Path) -> None:
    """TensorRT-LLM's enable_attention_dp runs attention per tp rank, as SGLang's DP
    attention: the servers say so (dp = tp), and the model reads each rank's own cache."""
    plain = compile_(tmp_path, trtllm())
    data = trtllm()
    data["trtllm"]["enable_attention_dp"] = True
    adp = compile_(tmp_path, data)
    assert [s.dp for s in plain.launch.servers] == [1]
    assert [s.dp for s in adp.launch.servers] == [8]
    with_adp = plan_json(adp.plan, adp.launch)["predicted"]
    without = plan_json(plain.plan, plain.launch)["predicted"]
    assert isinstance(with_adp, dict) and isinstance(without, dict)
    # the latent KV cache is no longer read by all 8 ranks for every request
    assert with_adp["tpot_ms"] < without["tpot_ms"]


def test_pipeline_stages_add_up_in_a_decode_step() -> None:
    """A token passes every stage in turn: tp 4 x pp 2 reads as many weight bytes per GPU
    as tp 8, but one stage after the other, so a lone request waits for about one more
    read of tp 8's weight share (the per-step overhead and the all-reduces are alike)."""
    hw = builtin()["h100-sxm"]
    shape = serving_fit._shape("llama3.1-70b", "fp8", 4096)
    work = WorkloadTable(input_tokens=128, output_tokens=128, concurrency=1)

    def tpot(tp: int, pp: int) -> float:
        role = Role(name="server", servers=1, gpus=tp * pp, tp=tp, pp=pp)
        dep = Deployment(launcher="vllm", roles=(role,), capacity_gib=80, nproc_per_node=8)
        return predict(shape, hw, dep, work).tpot_ms

    # Llama 3.1 70B's 70.6e9 one-byte weights over 8 GPUs at 3,350 GB/s
    share_read_ms = 70.6e9 / 8 / 3350e9 * 1e3
    assert tpot(4, 2) - tpot(8, 1) > 0.7 * share_read_ms


def test_disaggregated_open_loop_carries_its_rate_or_is_overloaded() -> None:
    hw, shape = builtin()["h200"], _r1_shape()
    pd = _deployment(
        Role(name="prefill", servers=1, gpus=8, tp=8, ep=8, dp=8),
        Role(name="decode", servers=1, gpus=8, tp=8, ep=8, dp=8),
    )

    def at(rate: float) -> Any:
        return predict(
            shape, hw, pd, WorkloadTable(input_tokens=8192, output_tokens=1024, request_rate=rate)
        )

    light, heavy = at(0.5), at(200.0)
    assert not light.overloaded and light.requests_per_s == pytest.approx(0.5, rel=1e-3)
    # one prefill server takes a few hundred ms per 8k prompt: 200/s is far past it
    assert heavy.overloaded and heavy.requests_per_s < 20
    assert light.ttft_ms < heavy.ttft_ms


def test_a_closed_loop_past_the_decode_batch_waits_for_its_first_token() -> None:
    """256 requests in flight, a decode server that runs at most 16 of them: the others
    wait, and the loop holds all 256 (Little's law: running + rate x TTFT)."""
    hw, shape = builtin()["h200"], _r1_shape()
    pd = _deployment(
        Role(name="prefill", servers=1, gpus=8, tp=8, ep=8),
        Role(name="decode", servers=1, gpus=8, tp=8, ep=8, max_batch=16),
        launcher="trtllm",
    )
    work = WorkloadTable(input_tokens=8192, output_tokens=1024, concurrency=256)
    p = predict(shape, hw, pd, work)
    assert p.batch["decode"] == 16 and p.binding == "batch limit"
    held = p.batch["decode"] + p.requests_per_s * p.ttft_ms / 1e3
    assert held == pytest.approx(256, rel=1e-3)
    # 240 requests waiting take more than a few prefills' time
    assert p.ttft_ms > 10_000


def test_decode_reads_hbm_at_the_accelerators_measured_level() -> None:
    """MI300X's BabelStream Triad reaches 4.09 of its 5.3 TB/s, the H100's 2.97 of 3.35:
    a decode step reads at the catalogue bandwidth times that share relative to the
    H100's, times e_hbm (an accelerator not measured at its catalogue bandwidth)."""
    work = WorkloadTable(input_tokens=1024, output_tokens=1024, concurrency=8)
    role = Role(name="server", servers=1, gpus=8, tp=8)
    shape = serving_fit._shape("llama3.1-70b", "fp8", 2048)

    def rate(accelerator: str) -> float:
        dep = _deployment(role, launcher="vllm")
        return float(server_of(role, shape, builtin()[accelerator], dep, work, DEFAULT).hbm_rate())

    level = (4.09 / 5.3) / (2.97 / 3.35)
    assert rate("mi300x") == pytest.approx(5300e9 * level * DEFAULT.hbm_efficiency, rel=1e-4)
    assert rate("h100-sxm") == pytest.approx(3350e9 * DEFAULT.hbm_efficiency, rel=1e-9)
    unmeasured = builtin()["b200"].memory_bandwidth_gb_s * 1e9
    assert rate("b200") == pytest.approx(unmeasured * DEFAULT.hbm_efficiency, rel=1e-9)


@pytest.mark.parametrize(("gpus", "destinations", "link_gb_s"), [(8, 8, 450), (72, 9, 50)])
def test_an_expert_all_to_all_sends_a_token_once_per_destination(
    gpus: int, destinations: int, link_gb_s: float
) -> None:
    """DeepSeek's top-8 experts over ep ranks: inside a node a token goes once to each other
    rank holding one of its experts; past it once to each other node (DeepEP forwards inside
    the node), over the scale-out network. Dispatch in FP8 (1 byte), combine in bf16."""
    hw, shape = builtin()["h100-sxm"], _r1_shape()
    role = Role(name="decode", servers=1, gpus=gpus, tp=gpus, dp=gpus, ep=gpus)
    work = WorkloadTable(input_tokens=2000, output_tokens=1, concurrency=1)
    server = server_of(role, shape, hw, _deployment(role, launcher="sglang_disagg"), work, DEFAULT)
    n, k = destinations, shape.topk
    others = n * (1 - (1 - 1 / n) ** k) * (n - 1) / n
    share = MEASURED.link_share if link_gb_s == 450 else MEASURED.nic_share  # NCCL's measured
    wire = 256 * shape.hidden * (1 + 2) * others / (link_gb_s * 1e9 * share)
    assert hw.scale_up_gb_s == 450 and hw.scale_out_gb_s == 50
    assert server.alltoall(256) == pytest.approx(2 * DEFAULT.alltoall_latency_s + wire, rel=1e-9)


def test_the_96_h100_wide_expert_parallel_roles_are_predicted() -> None:
    """LMSYS's SGLang on 96 H100: a 72-GPU decode server at 256 requests per GPU makes 2,785
    output tokens/s per GPU, a 32-GPU prefill server 6,288 to 7,209 prompt tokens/s per GPU.
    When every token's activation went to each of its 8 experts' ranks at bf16 over
    InfiniBand the model came 33 % (decode) and 64 to 69 % (prefill) short."""
    rows = [r for r in _rows() if r["source"] == "lmsys-sglang-96xh100"]
    decode = [r for r in rows if r["role"] == "decode"]
    prefill = [r for r in rows if r["role"] == "prefill"]
    assert len(decode) == 1 and len(prefill) == 3
    assert abs(serving_fit.errors(decode, DEFAULT)[0]) <= 0.15
    assert all(abs(e) <= 0.20 for e in serving_fit.errors(prefill, DEFAULT))


def test_mla_decode_attention_runs_absorbed_at_the_caches_precision() -> None:
    """A DeepSeek decoding token's attention reads the latent cache: each of 128 heads
    scores kv_lora + rope dims and sums kv_lora per cached token, 2 x keys x heads x
    (2 x 512 + 64) FLOPs per layer, at the KV cache's precision (fp8 with an fp8 cache);
    the rest of the step's FLOPs at the checkpoint's. LMSYS's GB200 decode servers came 33
    to 57 % fast while the attention ran unabsorbed at the GEMMs' FP4 peak."""
    hw = builtin()["gb200"]
    role = Role(name="decode", servers=1, gpus=48, tp=48, dp=48, ep=48)
    work = WorkloadTable(input_tokens=2000, output_tokens=1, concurrency=1)
    shape = serving_fit._shape("deepseek-v3", "fp4", 2001)
    dep = attrs.evolve(_deployment(role), kv_dtype="fp8", capacity_gib=hw.memory_gib)
    server = server_of(role, shape, hw, dep, work, DEFAULT)
    # the mean context of a 2,000-token prompt and its one output token
    assert server.decode_attention_flops == pytest.approx(2.0 * 2000.5 * 128 * 1088 * 61)
    batch = 1408.0 * 48
    _, compute, _ = server.decode_parts(batch, 2000)
    gemm_rate = 10000e12 * GEMM_LEVEL["gb200", "fp8"] * DEFAULT.decode_efficiency
    attention_rate = 5000e12 * GEMM_LEVEL["gb200", "fp8"] * DEFAULT.decode_efficiency
    other = server.decode_flops - server.decode_attention_flops
    expected = 1408 * (other / gemm_rate + server.decode_attention_flops / attention_rate)
    assert compute == pytest.approx(expected, rel=1e-9)
    rows = [r for r in _rows() if r["source"] == "lmsys-sglang-gb200-part2"]
    assert all(abs(e) <= 0.30 for e in serving_fit.errors(rows, DEFAULT)), rows


def test_serving_collectives_reach_nccls_measured_shares_of_each_link() -> None:
    """The serving model's links at the training model's measured shares (one source:
    kernels.toml's [collective], NCCL's bus bandwidth over the line rate), not a share of
    its own: NVLink 4 at 370 of 450 GB/s, an NDR NIC at 47 of 50. A tp 8 all-reduce, a
    16-GPU server's all-reduce over the NICs and the prefill-to-decode KV transfer read
    them."""
    from mdc.tune import kernels

    hw = builtin()["h100-sxm"]
    shares = kernels.link_shares()
    assert link_rate(hw, scale_up=True) == pytest.approx(450e9 * shares["scale-up"])
    assert link_rate(hw, scale_up=False) == pytest.approx(50e9 * shares["scale-out"])
    shape = serving_fit._shape("llama3.1-70b", "fp8", 2048)
    work = WorkloadTable(input_tokens=1024, output_tokens=1, concurrency=1)
    for gpus, rate in ((8, 450e9 * 370 / 450), (16, 50e9 * 47 / 50)):
        role = Role(name="server", servers=1, gpus=gpus, tp=gpus)
        server = server_of(role, shape, hw, _deployment(role), work, DEFAULT)
        assert server.bandwidth() == pytest.approx(rate)


def test_the_fused_moe_shares_are_the_measured_kernels() -> None:
    """FUSED_MOE_SHARE is kernels.toml's [[fused_moe]]: vLLM's benchmark_moe on an H100,
    Qwen3-30B-A3B in fp8_w8a8, 1,647.57 us at 4,096 tokens and 911.64 at 2,048: 2,048
    tokens of 8 x 2 x 3 x 2048 x 768 FLOPs in 735.93 us, about 210 TFLOP/s, 0.12 of the
    H100's fp8 peak at its measured level."""
    from mdc.tune import kernels
    from mdc.tune.serving_server import FUSED_MOE_SHARE

    measured = kernels.fused_moe_shares()
    assert {p: round(v, 4) for p, v in measured.items()} == FUSED_MOE_SHARE
    rate = 2048 * 8 * 2 * 3 * 2048 * 768 / 735.93e-6
    assert measured["fp8"] == pytest.approx(rate / (1978.9e12 * GEMM_LEVEL["h100-sxm", "fp8"]))


def test_vllm_and_sglang_run_the_experts_at_the_fused_moe_rate() -> None:
    """The experts' GEMMs of a decode step and of a prefill run at the Triton fused-MoE
    kernel's measured rate under vLLM and SGLang (without DeepEP's expert parallel), the
    other GEMMs at e_dec / e_pre; TensorRT-LLM's and SGLang's with expert parallel (other
    kernels, not measured) stay with the other GEMMs."""
    from mdc.tune.serving_server import FUSED_MOE_SHARE

    hw = builtin()["h100-sxm"]
    work = WorkloadTable(input_tokens=1024, output_tokens=256, concurrency=1)
    shape = serving_fit._shape("qwen3-235b-a22b", "fp8", 1280)
    role = Role(name="server", servers=1, gpus=8, tp=8)
    server = server_of(
        role, shape, hw, attrs.evolve(_deployment(role), launcher="vllm"), work, DEFAULT
    )
    peak = 1978.9e12 * GEMM_LEVEL["h100-sxm", "fp8"]
    assert server.moe_rate == pytest.approx(peak * FUSED_MOE_SHARE["fp8"])
    assert 0 < server.expert_flops < server.decode_flops
    _, compute, _ = server.decode_parts(512.0, 1152)
    attention = server.decode_attention_flops / (989.4e12 * GEMM_LEVEL["h100-sxm", "bf16"])
    dense = (server.decode_flops - server.decode_attention_flops - server.expert_flops) / peak
    expected = 64 * ((dense + attention) / DEFAULT.decode_efficiency)
    expected += 64 * server.expert_flops / server.moe_rate
    assert compute == pytest.approx(expected, rel=1e-9)
    prefill = server.prefill_compute(8192, 1024) - server.comm(8192)
    rest = (server.prefill_flops - server.expert_flops) / (peak * DEFAULT.prefill_efficiency)
    assert prefill == pytest.approx(1024 * (rest + server.expert_flops / server.moe_rate))
    others = [
        ("trtllm", role, "fp8"),
        ("sglang", attrs.evolve(role, ep=8, dp=8), "fp8"),
    ]
    for launcher, other, dtype in others:
        moe = serving_fit._shape("qwen3-235b-a22b", dtype, 1280)
        dep = attrs.evolve(_deployment(other), launcher=launcher)
        assert server_of(other, moe, hw, dep, work, DEFAULT).moe_rate == 0.0


@pytest.mark.parametrize(
    ("accelerator", "bf16_tflops", "weight_only"),
    [("h100-sxm", 989.4, True), ("a100-80gb", 312.0, True), ("b200", 0.0, False)],
)
def test_mxfp4_experts_run_weight_only_in_bf16_below_blackwell(
    accelerator: str, bf16_tflops: float, weight_only: bool
) -> None:
    """gpt-oss's MXFP4 experts under vLLM: on a chip without FP4 tensor cores (Hopper:
    Triton matmul_ogs, Ampere: Marlin) the kernel widens the weights to bf16, so its GEMMs
    run at the bf16 fused-MoE kernel's measured share of the bf16 peak, not at the dense
    GEMMs' e_pre / e_dec; on Blackwell's FP4 tensor cores they stay with the other GEMMs."""
    from mdc.tune.serving_server import FUSED_MOE_SHARE

    hw = builtin()[accelerator]
    assert ("fp4" in hw.dense_tflops) is not weight_only
    work = WorkloadTable(input_tokens=1024, output_tokens=256, concurrency=1)
    shape = serving_fit._shape("gpt-oss-120b", "fp4", 1280)
    role = Role(name="server", servers=1, gpus=1)
    dep = attrs.evolve(_deployment(role), launcher="vllm", capacity_gib=hw.memory_gib)
    server = server_of(role, shape, hw, dep, work, DEFAULT)
    if not weight_only:
        assert server.moe_rate == 0.0
        return
    level = GEMM_LEVEL[accelerator, "bf16"]
    assert hw.dense_tflops["bf16"] == bf16_tflops
    assert server.moe_rate == pytest.approx(bf16_tflops * 1e12 * level * FUSED_MOE_SHARE["bf16"])
    prefill = server.prefill_compute(4096, 1024) - server.comm(4096)
    rest = (server.prefill_flops - server.expert_flops) / (
        bf16_tflops * 1e12 * level * DEFAULT.prefill_efficiency
    )
    assert prefill == pytest.approx(4096 * (rest + server.expert_flops / server.moe_rate))


@pytest.mark.parametrize(
    ("accelerator", "launcher", "batch", "budget"),
    [
        ("a100-80gb", "vllm", 256, 2048),
        ("a100-40gb", "vllm_disagg", 256, 2048),
        ("h100-sxm", "vllm", 1024, 8192),
        ("mi300x", "vllm", 1024, 8192),
        ("a100-80gb", "trtllm", 2048, 8192),
    ],
)
def test_vllms_defaults_follow_the_gpu(
    accelerator: str, launcher: str, batch: int, budget: int
) -> None:
    """vLLM's max_num_seqs and its API server's max_num_batched_tokens where the spec sets
    none: 256 and 2,048 on an A100 and on a GPU under 70 GiB, 1,024 and 8,192 on the others
    (vLLM's EngineArgs defaults by device); the other engines' do not follow the GPU."""
    hw = builtin()[accelerator]
    shape = serving_fit._shape("llama3.1-8b", "bf16", 2048)
    work = WorkloadTable(input_tokens=48, output_tokens=16, concurrency=1)
    role = Role(name="server", servers=1, gpus=1)
    dep = attrs.evolve(_deployment(role, launcher=launcher), capacity_gib=hw.memory_gib)
    server = server_of(role, shape, hw, dep, work, DEFAULT)
    assert server.capacity_seqs > batch  # the engine's limit binds, not its cache
    assert (server.max_batch, server.step_tokens) == (batch, budget)
    set_by_spec = attrs.evolve(role, max_batch=64, step_tokens=4096)
    server = server_of(set_by_spec, shape, hw, dep, work, DEFAULT)
    assert (server.max_batch, server.step_tokens) == (64, 4096)


def _llama70b_vllm(rate: float) -> tuple[Any, Any, WorkloadTable]:
    """Two vLLM replicas of Llama 3.1 70B (fp8, tp 2) on H100s at ``rate`` requests/s of
    2,000 / 200 tokens: one prompt fits one step's budget, and a dense model's chunk adds
    no expert reads."""
    hw = builtin()["h100-sxm"]
    shape = serving_fit._shape("llama3.1-70b", "fp8", 2200)
    role = Role(name="server", servers=2, gpus=2, tp=2)
    dep = Deployment(launcher="vllm", roles=(role,), capacity_gib=hw.memory_gib)
    work = WorkloadTable(input_tokens=2000, output_tokens=200, request_rate=rate)
    return server_of(role, shape, hw, dep, work, DEFAULT), dep, work


@pytest.mark.parametrize("rate", [0.5, 2.0, 4.0])
def test_an_open_loops_tokens_carry_the_prefill_share_its_rate_sets(rate: float) -> None:
    """vLLM V1 schedules a step's decode tokens first, then prompt chunks up to its budget:
    at r = rate / servers prompts a second of P seconds' compute each, a share r x P of
    the server's time is prefill, and the batch decodes one token a step in the rest: TPOT
    = decode step(B) / (1 - r x P). A prompt's own step is the batch's decode and its
    compute, S = step(B) + P, queued M/D/1 at load r x S, after half a decode step in
    flight when no prompt is."""
    server, dep, work = _llama70b_vllm(rate)
    p = predict(server.shape, server.hw, dep, work)
    r, ctx = rate / 2, 2000 + 200 / 2
    batch = p.batch["server"]
    prompt = server.prefill_compute(2000, 2000)
    decode = server.decode_step(batch, ctx)
    assert not p.overloaded and p.requests_per_s == pytest.approx(rate)
    # the batch printed is rounded: the step it implies is within a request's share
    assert p.tpot_ms / 1e3 == pytest.approx(decode / (1 - r * prompt), rel=0.02)
    own = decode + prompt
    load = r * own
    ttft = (1 - load) * decode / 2 + own + load / (2 * (1 - load)) * own
    assert p.ttft_ms / 1e3 == pytest.approx(ttft, rel=0.02)
    # Little's law holds the batch: rate per server x (TTFT + (output - 1) x TPOT)
    assert batch == pytest.approx(r * (p.ttft_ms + 199 * p.tpot_ms) / 1e3, abs=0.6)


def test_an_open_loops_ttft_and_tpot_grow_with_the_rate() -> None:
    seen = [predict(s.shape, s.hw, d, w) for s, d, w in map(_llama70b_vllm, (0.5, 2.0, 4.0))]
    assert [p.ttft_ms for p in seen] == sorted(p.ttft_ms for p in seen)
    assert [p.tpot_ms for p in seen] == sorted(p.tpot_ms for p in seen)
    assert seen[-1].tpot_ms > 1.2 * seen[0].tpot_ms


def test_an_open_loop_whose_prompts_outrun_the_server_is_overloaded() -> None:
    """Prompts past 1 / P a second per server leave no time to decode: overloaded."""
    server, dep, _ = _llama70b_vllm(1.0)
    rate = 2 * 1.05 / server.prefill_compute(2000, 2000)
    work = WorkloadTable(input_tokens=2000, output_tokens=200, request_rate=rate)
    p = predict(server.shape, server.hw, dep, work)
    assert p.overloaded and p.binding == "queueing" and p.requests_per_s < rate


def test_a_vllm_decode_servers_first_token_waits_for_its_step() -> None:
    """vLLM's P/D proxy streams the decode server's output: after the prompt's prefill
    (queued M/D/1 at its server's load) and its KV cache's transfer, the first token waits
    half a decode step for the scheduler and one step to be sampled. SGLang's comes back
    with its prefill: no decode step."""
    hw, shape = builtin()["h200"], serving_fit._shape("llama3.1-70b", "fp8", 2200)
    roles = (
        Role(name="prefill", servers=2, gpus=2, tp=2),
        Role(name="decode", servers=1, gpus=4, tp=4),
    )
    work = WorkloadTable(input_tokens=2000, output_tokens=200, request_rate=3.0)
    # Llama 3.1 70B's KV cache: 80 layers x 8 KV heads x 128 x (K, V) x 2 bytes a token,
    # sent by both GPUs of a prefill server over NVLink (all 8 GPUs on one node)
    transfer = 2000 * 80 * 8 * 128 * 2 * 2 / (2 * link_rate(hw, True)) + 1e-3
    for launcher, steps in (("vllm_disagg", 1.5), ("sglang_disagg", 0.0)):
        dep = Deployment(launcher=launcher, roles=roles, capacity_gib=hw.memory_gib)
        p = predict(shape, hw, dep, work)
        service = server_of(roles[0], shape, hw, dep, work, DEFAULT).prefill(2000, 2000)
        load = 3.0 / 2 * service
        wait = load / (2 * (1 - load)) * service
        decode = server_of(roles[1], shape, hw, dep, work, DEFAULT)
        step = decode.decode_step(p.batch["decode"], 2100)
        expected = service + wait + transfer + steps * step
        assert p.ttft_ms / 1e3 == pytest.approx(expected, rel=0.01), launcher


@pytest.mark.parametrize(
    ("accelerator", "budget"),
    [("a100-40gb", 4096), ("h100-sxm", 8192), ("h200", 8192), ("b200", 16384), ("mi300x", 16384)],
)
def test_sglangs_chunk_follows_the_gpus_memory(accelerator: str, budget: int) -> None:
    """SGLang's --chunked-prefill-size where the spec sets none: 4,096 below 60 GiB, 8,192
    below 160, 16,384 above (its server_args by GPU memory). A 16k prompt on a B200 or an
    MI300X prefills in one step, on an H200 in two: halving the budget adds as many steps'
    overheads (the prompt's compute is the same)."""
    hw = builtin()[accelerator]
    shape = serving_fit._shape("llama3.1-8b", "bf16", 16_640)
    work = WorkloadTable(input_tokens=16_384, output_tokens=256, concurrency=1)
    role = Role(name="server", servers=1, gpus=1)
    for launcher in ("sglang", "sglang_disagg"):
        dep = attrs.evolve(_deployment(role, launcher=launcher), capacity_gib=hw.memory_gib)
        server = server_of(role, shape, hw, dep, work, DEFAULT)
        assert server.step_tokens == budget
        half = server_of(attrs.evolve(role, step_tokens=budget // 2), shape, hw, dep, work, DEFAULT)
        steps = math.ceil(16_384 / budget)
        extra = half.prefill(16_384, 16_384) - server.prefill(16_384, 16_384)
        assert extra == pytest.approx(steps * DEFAULT.overhead(launcher))


def test_sglang_runs_a_prompts_steps_alone() -> None:
    """SGLang runs a prefill batch alone while prompts wait (no --enable-mixed-chunk): the
    decode pauses for it. Under a rate, its prompts take r x S of the server's time with S
    the prompt's prefill alone (its compute at e_pre and the step's overhead), TPOT =
    decode step / (1 - r x S), and TTFT = half a decode step in flight when no prompt is,
    S, and M/D/1's wait at load r x S: no decode step in the prompt's own."""
    vllm, dep, work = _llama70b_vllm(2.0)
    dep = attrs.evolve(dep, launcher="sglang")
    server = server_of(dep.roles[0], vllm.shape, vllm.hw, dep, work, DEFAULT)
    p = predict(server.shape, server.hw, dep, work)
    r, ctx = 1.0, 2000 + 200 / 2
    alone = server.prefill_compute(2000, 2000) + DEFAULT.overhead("sglang")
    assert server.prompt_steps(8, 2000, ctx) == pytest.approx((alone, alone))
    decode = server.decode_step(p.batch["server"], ctx)
    assert p.tpot_ms / 1e3 == pytest.approx(decode / (1 - r * alone), rel=0.02)
    load = r * alone
    ttft = (1 - load) * decode / 2 + alone + load / (2 * (1 - load)) * alone
    assert p.ttft_ms / 1e3 == pytest.approx(ttft, rel=0.02)
    # vLLM's prompt step carries the batch's decode too
    own, added = vllm.prompt_steps(8, 2000, ctx)
    assert own == pytest.approx(added + vllm.decode_step(8, ctx))


def test_the_fused_moe_launch_time_is_the_measured_kernels() -> None:
    """FUSED_MOE_FIXED_S is kernels.toml's [[fused_moe_launch]]: the Triton kernel at one
    token less its 8 experts' fp8 bytes at the chip's BabelStream Triad: Qwen3-30B-A3B on an
    H100 (vllm-project/vllm#24700) 44.54 us - 8 x 3 x 2048 x 768 B / 2.97 TB/s, and
    Qwen3-235B-A22B at tp 8 on an H200 (sgl-project/sglang#11730) 31.70 us - 8 x 3 x 4096 x
    192 B / 4.15 TB/s, averaged: about 29.5 us a MoE layer."""
    from mdc.tune import kernels
    from mdc.tune.serving_server import FUSED_MOE_FIXED_S

    qwen30 = 44.54e-6 - 8 * 3 * 2048 * 768 / 2.97e12
    qwen235 = 31.70e-6 - 8 * 3 * 4096 * 192 / 4.15e12
    assert kernels.fused_moe_fixed_s() == pytest.approx((qwen30 + qwen235) / 2)
    assert round(kernels.fused_moe_fixed_s(), 8) == FUSED_MOE_FIXED_S


def test_the_block_fp8_tile_rate_predicts_another_measured_gemm() -> None:
    """BLOCK_FP8_TILE_BYTES_S is kernels.toml's [block_fp8] (vLLM's CUTLASS block-FP8 GEMM
    on an H100 at batch 1, DeepSeek-V3's N = 2,112, K = 7,168 at 0.893 TFLOP/s: 33.9 us for
    17 tiles of 128 x 7,168 bytes), and it predicts a shape it was not read from: DeepSeek-V3's
    N = 7,168, K = 16,384 runs 56 tiles at once, each 128 x 16,384 bytes, 77.5 us, where
    SGLang's benchmark of the same vLLM kernel measured 77.18 us at batch 1
    (sgl-project/sglang#5820)."""
    from mdc.tune import kernels
    from mdc.tune.serving_server import BLOCK_FP8_TILE_BYTES_S

    seconds = 2 * 2112 * 7168 / 0.893065e12
    assert kernels.block_fp8_tile_rate() == pytest.approx(128 * 7168 / seconds)
    assert round(kernels.block_fp8_tile_rate(), -7) == BLOCK_FP8_TILE_BYTES_S
    predicted = 128 * 16384 / BLOCK_FP8_TILE_BYTES_S
    assert predicted == pytest.approx(77.18e-6, rel=0.02)


def _r1_server(launcher: str, gpu: str = "h200", dtype: str = "fp8") -> Any:
    role = Role(name="server", servers=1, gpus=8, tp=8)
    work = WorkloadTable(input_tokens=3200, output_tokens=800, concurrency=4)
    shape = serving_fit._shape("deepseek-v3", dtype, 4000)
    dep = attrs.evolve(_deployment(role), launcher=launcher)
    return server_of(role, shape, builtin()[gpu], dep, work, DEFAULT)


def test_deepseeks_block_fp8_gemms_at_a_few_rows_stream_on_a_few_sms() -> None:
    """DeepSeek-R1 at tp 8 on an H200 decoding 4 requests: each layer's block-FP8 GEMMs by
    hand (hidden 7,168; q_lora 1,536, kv_lora 512, rope 64, 128 heads of 128 + 64 query and
    128 value dims; 3 dense MLP layers of 18,432, 58 shared experts of 2,048), one tile of
    rows, ceil(N / 128) tiles of 128 x K bytes at the measured tile rate, less each GEMM's
    roofline; on an MI325X (not measured) and in bf16 (no blocks) nothing."""
    from mdc.tune.serving_server import BLOCK_FP8_TILE_BYTES_S

    server = _r1_server("vllm")
    rate: float = server.hbm_rate()

    def excess(n: int, k: int) -> float:
        tiles = -(-n // 128)
        assert tiles <= 132  # one wave on Hopper's 132 SMs
        return max(0.0, 128 * k / BLOCK_FP8_TILE_BYTES_S - n * k / rate)

    attention = excess(1536 + 512 + 64, 7168) + excess(16 * 192, 1536) + excess(7168, 16 * 128)
    dense = excess(2 * 18432 // 8, 7168) + excess(7168, 18432 // 8)
    shared = excess(2 * 2048 // 8, 7168) + excess(7168, 2048 // 8)
    expected = 61 * attention + 3 * dense + 58 * shared
    assert server.block_fp8_tiles(4.0) == pytest.approx(expected, rel=1e-9)
    assert 3e-3 < expected < 8e-3  # milliseconds a step: a third of the roofline's
    assert _r1_server("vllm", gpu="mi325x").block_fp8_tiles(4.0) == 0.0
    assert _r1_server("vllm", dtype="bf16").block_fp8_tiles(4.0) == 0.0
    # at a large batch the GEMMs' own FLOPs pass the tiles' stream
    assert server.block_fp8_tiles(4096.0) < expected / 4


def test_the_mi300x_block_fp8_table_is_kernels_toml_s() -> None:
    """BLOCK_FP8_MEASURED_US is kernels.toml's [[block_fp8_gemm]] (aiter's CK
    gemm_a8w8_blockscale tuned on an MI300X, ROCm/aiter#2881): DeepSeek-V3's fused q/kv
    down-projection (N = 2,112, K = 7,168) takes 19.50 us at one row, where its 15.1 MB take
    3.7 us at the MI300X's BabelStream Triad (4.09 TB/s)."""
    from mdc.tune import kernels
    from mdc.tune.serving_server import BLOCK_FP8_MEASURED_US

    assert kernels.block_fp8_measured_us() == BLOCK_FP8_MEASURED_US
    first = BLOCK_FP8_MEASURED_US["mi300x"][(2112, 7168)][0]
    assert first == (1, 19.5004)
    assert first[1] * 1e-6 / 5 > 2112 * 7168 / 4.09e12


def test_a_timed_gemm_between_and_past_its_measured_rows() -> None:
    """Between two measured row counts the straight line through them; below the first its
    time; past the last its time per row."""
    from mdc.tune.serving_server import measured_gemm_s

    points = ((2, 10.0), (8, 16.0), (64, 30.0))
    assert measured_gemm_s(points, 1.0) == pytest.approx(10e-6)
    assert measured_gemm_s(points, 4.0) == pytest.approx(12e-6)
    assert measured_gemm_s(points, 36.0) == pytest.approx(23e-6)
    assert measured_gemm_s(points, 128.0) == pytest.approx(60e-6)


def test_deepseeks_block_fp8_gemms_on_an_mi300x_take_their_measured_time() -> None:
    """DeepSeek-R1 at tp 8 on an MI300X decoding 4 requests: each block-FP8 GEMM aiter timed
    on the MI300X (ROCm/aiter#2881) at 4 rows, by hand, less its roofline: the fused q/kv
    down-projection 19.7582 us, the query up-projection (N = 16 x 192, K = 1,536) 6.6883, the
    output projection (N = 7,168, K = 16 x 128) 8.1083 in each of the 61 layers, and the 58
    shared experts' gate/up (N = 2 x 2,048 / 8, K = 7,168) between its 2 and 8 rows (19.1258
    and 19.6018); the shapes it did not time (the dense layers' MLP, the shared down
    projection) nothing. The same under SGLang; at tp 4 only the replicated down-projection
    (the others' shapes not timed); in bf16 nothing."""
    from mdc.tune.serving_server import BLOCK_FP8_ROWS

    server = _r1_server("vllm", gpu="mi300x")
    rate: float = server.hbm_rate()
    peak: float = server._peak() * DEFAULT.decode_efficiency

    def excess(n: int, k: int, us: float) -> float:
        return max(0.0, us * 1e-6 - max(n * k / rate, 4 * 2 * n * k / peak))

    attention = excess(2112, 7168, 19.7582) + excess(3072, 1536, 6.6883)
    attention += excess(7168, 2048, 8.1083)
    shared = excess(512, 7168, 19.1258 + (19.6018 - 19.1258) * 2 / 6)
    expected = 61 * attention + 58 * shared
    assert server.block_fp8_tiles(4.0) == pytest.approx(expected, rel=1e-9)
    assert 2e-3 < expected < 3e-3  # about 41 us a MoE layer
    assert server.fp8_gemms == ()  # not Hopper's tiles: the MI300X's own timings
    assert BLOCK_FP8_ROWS == 128
    assert _r1_server("sglang", gpu="mi300x").block_fp8_tiles(4.0) == pytest.approx(expected)
    assert _r1_server("vllm", gpu="mi300x", dtype="bf16").block_fp8_tiles(4.0) == 0.0
    role = Role(name="server", servers=1, gpus=4, tp=4)
    work = WorkloadTable(input_tokens=3200, output_tokens=800, concurrency=4)
    shape = serving_fit._shape("deepseek-v3", "fp8", 4000)
    mi300x = builtin()["mi300x"]
    tp4 = server_of(role, shape, mi300x, _deployment(role, launcher="vllm"), work, DEFAULT)
    assert tp4.block_fp8_tiles(4.0) == pytest.approx(61 * excess(2112, 7168, 19.7582))


def test_the_block_fp8_term_follows_the_checkpoint_s_weight_blocks() -> None:
    """The term is the checkpoint's fact, not the architecture's: DeepSeek-R1's shape without
    weight_block (a per-tensor FP8 checkpoint) has none; Qwen3-32B (grouped attention) with
    [128, 128] blocks (its -FP8 checkpoint) has its 64 layers' GEMMs at tp 1, by hand."""
    from mdc.tune.serving_server import BLOCK_FP8_TILE_BYTES_S

    role = Role(name="server", servers=1, gpus=8, tp=8)
    work = WorkloadTable(input_tokens=3200, output_tokens=800, concurrency=4)
    r1 = serving_fit._shape("deepseek-v3", "fp8", 4000)
    assert r1.weight_block == (128, 128)
    per_tensor = attrs.evolve(r1, weight_block=None)
    dep = _deployment(role)
    h200 = builtin()["h200"]
    assert server_of(role, per_tensor, h200, dep, work, DEFAULT).block_fp8_tiles(4.0) == 0.0

    qwen = serving_fit._shape("qwen3-32b", "fp8", 4000)
    assert qwen.weight_block is None
    one = Role(name="server", servers=1, gpus=1, tp=1)
    plain = server_of(one, qwen, h200, _deployment(one), work, DEFAULT)
    assert plain.block_fp8_tiles(4.0) == 0.0
    blocked = attrs.evolve(qwen, weight_block=(128, 128))
    server = server_of(one, blocked, h200, _deployment(one), work, DEFAULT)
    rate: float = server.hbm_rate()

    def excess(n: int, k: int) -> float:  # 4 rows: one tile of rows, waves of 132 SMs
        waves = math.ceil(math.ceil(n / 128) / 132)
        return max(0.0, waves * 128 * k / BLOCK_FP8_TILE_BYTES_S - n * k / rate)

    # hidden 5,120; 64 query heads and 8 KV groups of 128; MLP 25,600 (gated)
    attention = excess((64 + 2 * 8) * 128, 5120) + excess(5120, 64 * 128)
    mlp = excess(2 * 25600, 5120) + excess(5120, 25600)
    assert server.block_fp8_tiles(4.0) == pytest.approx(64 * (attention + mlp), rel=1e-9)


def test_the_block_fp8_tiles_follow_the_weight_block_and_the_chip_s_multiprocessors() -> None:
    """The tile's columns are the checkpoint's scale block and a wave is the catalogue's
    multiprocessor count: Qwen3-32B at tp 1 decoding 4 rows on an H200 (132 SMs, the
    catalogue's) with [64, 128] blocks runs ceil(N / 64) tiles of 64 x K, and on a Hopper
    with 114 SMs (as a plugin might give an H100 PCIe) more waves; a Hopper whose count the entry
    does not give gets no term."""
    from mdc.tune.serving_server import BLOCK_FP8_TILE_BYTES_S

    h200 = builtin()["h200"]
    assert h200.multiprocessors == 132 and builtin()["h100-sxm"].multiprocessors == 132
    one = Role(name="server", servers=1, gpus=1, tp=1)
    work = WorkloadTable(input_tokens=3200, output_tokens=800, concurrency=4)
    shape = attrs.evolve(serving_fit._shape("qwen3-32b", "fp8", 4000), weight_block=(64, 128))

    def tiles(hw: Accelerator) -> float:
        return server_of(one, shape, hw, _deployment(one), work, DEFAULT).block_fp8_tiles(4.0)

    def expected(hw: Accelerator, sms: int) -> float:
        rate = hw.memory_bandwidth_gb_s * hbm_level(hw) * 1e9 * DEFAULT.hbm_efficiency

        def excess(n: int, k: int) -> float:
            waves = math.ceil(math.ceil(n / 64) / sms)
            return max(0.0, waves * 64 * k / BLOCK_FP8_TILE_BYTES_S - n * k / rate)

        attention = excess((64 + 2 * 8) * 128, 5120) + excess(5120, 64 * 128)
        mlp = excess(2 * 25600, 5120) + excess(5120, 25600)
        return 64 * (attention + mlp)

    assert tiles(h200) == pytest.approx(expected(h200, 132), rel=1e-9)
    pcie = attrs.evolve(h200, id="hopper-114", multiprocessors=114)
    assert tiles(pcie) == pytest.approx(expected(pcie, 114), rel=1e-9)
    assert tiles(pcie) > tiles(h200)
    assert tiles(attrs.evolve(h200, multiprocessors=None)) == 0.0


def test_dp_attention_gathers_every_group_s_tokens_into_one_moe() -> None:
    """SGLang's DP attention over 8 H200 without expert parallel (DeepSeek-R1, 8 groups of
    attention tp 1): the MoE runs tensor parallel over the 8 GPUs on every group's tokens,
    so a step of 64 reads the experts 64 tokens touch (not a group's 8) and each of the 61
    MLP or MoE layers gathers the groups' hidden states and reduce-scatters its output (2
    collectives of the 64 tokens' bf16 activations, (n - 1) / n of them on the wire). vLLM's
    data-parallel engines without expert parallel are replicas: each its own 8 tokens, no
    gather; with expert parallel the all-to-all carries the tokens instead."""
    hw = builtin()["h200"]
    shape = serving_fit._shape("deepseek-v3", "fp8", 4000)
    work = WorkloadTable(input_tokens=3200, output_tokens=800, concurrency=64)

    def server(launcher: str, ep: int = 1) -> Any:
        role = Role(name="server", servers=1, gpus=8, tp=8, dp=8, ep=ep)
        return server_of(role, shape, hw, _deployment(role, launcher=launcher), work, DEFAULT)

    sglang, vllm = server("sglang"), server("vllm")
    assert sglang.gathers_groups() and not vllm.gathers_groups()
    assert not server("sglang", ep=8).gathers_groups()
    assert sglang.touched(8.0) == pytest.approx(1 - (1 - 8 / 256) ** 64)
    assert vllm.touched(8.0) == pytest.approx(1 - (1 - 8 / 256) ** 8)
    per = DEFAULT.allreduce_latency_s + 7 / 8 * (2 * 7168 * 64) / link_rate(hw, True)
    assert sglang.comm(8.0) == pytest.approx(2 * 61 * per)
    assert vllm.comm(8.0) == 0.0


def test_a_fused_moe_launch_costs_each_moe_layer_its_fixed_time() -> None:
    """vLLM and SGLang (Triton fused MoE) pay FUSED_MOE_FIXED_S per MoE layer a step, 58 for
    DeepSeek-R1; TensorRT-LLM's own MoE kernels and FP4 experts are not that kernel."""
    from mdc.tune.serving_server import FUSED_MOE_FIXED_S

    for launcher in ("vllm", "sglang"):
        server = _r1_server(launcher)
        assert server.fused_moe_fixed() == pytest.approx(58 * FUSED_MOE_FIXED_S)
        hbm, compute, comm = server.decode_parts(4.0, 3600)
        step = server.decode_step(4.0, 3600)
        rest = step - max(hbm, compute) - comm - DEFAULT.overhead(launcher)
        rest -= 4 * DEFAULT.request_overhead(launcher)
        assert rest == pytest.approx(58 * FUSED_MOE_FIXED_S + server.block_fp8_tiles(4.0))
    assert _r1_server("trtllm").fused_moe_fixed() == 0.0
    gpt_oss = serving_fit._shape("gpt-oss-120b", "fp4", 1024)
    role = Role(name="server", servers=1, gpus=1, tp=1)
    work = WorkloadTable(input_tokens=512, output_tokens=512, concurrency=4)
    dep = attrs.evolve(_deployment(role), launcher="vllm")
    assert (
        server_of(role, gpt_oss, builtin()["h100-sxm"], dep, work, DEFAULT).fused_moe_fixed() == 0
    )


def test_a_server_past_the_bridged_pair_talks_over_the_nic() -> None:
    """H100 NVL cards are NVLink-bridged in pairs: a tp 2 server's all-reduces run on the
    bridge, a tp 4 one's leave it (PCIe and the NICs) even on one 8-GPU node; on H100 SXM
    the node's NVSwitch joins all 8, and a server over two nodes of 4 leaves it."""
    shape = serving_fit._shape("llama3.1-70b", "fp8", 4096)
    work = WorkloadTable(input_tokens=2048, output_tokens=2048, concurrency=64)
    for ident, tp, per_node, scale_up in (
        ("h100-nvl", 2, 8, True),
        ("h100-nvl", 4, 8, False),
        ("h100-sxm", 8, 8, True),
        ("h100-sxm", 8, 4, False),
    ):
        hw = builtin()[ident]
        role = Role(name="server", servers=1, gpus=tp, tp=tp)
        dep = Deployment(
            launcher="vllm", roles=(role,), capacity_gib=hw.memory_gib, nproc_per_node=per_node
        )
        server = server_of(role, shape, hw, dep, work, DEFAULT)
        assert server.bandwidth() == link_rate(hw, scale_up), (ident, tp)


def test_an_expert_all_to_all_over_two_nodes_leaves_the_node() -> None:
    """ep 8 on H100 SXM nodes of 4 GPUs: half of each token's destinations are on the other
    node, over the NICs, where one node of 8 keeps them on its NVSwitch."""
    hw, shape = builtin()["h100-sxm"], _r1_shape()
    role = Role(name="decode", servers=1, gpus=8, tp=8, dp=8, ep=8)
    work = WorkloadTable(input_tokens=2000, output_tokens=1, concurrency=1)

    def alltoall(per_node: int) -> float:
        dep = attrs.evolve(_deployment(role), nproc_per_node=per_node)
        return server_of(role, shape, hw, dep, work, DEFAULT).alltoall(256)

    assert alltoall(4) > alltoall(8)


def test_a_kv_transfer_inside_an_nvl72_rack_stays_on_nvlink() -> None:
    """GB200 trays of 4 GPUs in one NVLink domain of 72: a prefill and a decode server on
    two trays move the KV cache over NVLink, as fast as on one node of 8."""
    hw = builtin()["gb200"]
    shape = serving_fit._shape("llama3.1-70b", "fp8", 6144)
    prefill = Role(name="prefill", servers=1, gpus=4, tp=4)
    decode = Role(name="decode", servers=1, gpus=4, tp=4)
    work = WorkloadTable(input_tokens=4096, output_tokens=1024, concurrency=32)

    def ttft(per_node: int) -> float:
        dep = Deployment(
            launcher="sglang_disagg",
            roles=(prefill, decode),
            capacity_gib=hw.memory_gib,
            nproc_per_node=per_node,
        )
        return predict(shape, hw, dep, work).ttft_ms

    assert ttft(4) == pytest.approx(ttft(8), rel=1e-12)


def test_an_eager_decode_step_adds_the_measured_launches_of_each_layer() -> None:
    """Without CUDA graphs each decode step adds, per layer, what SGLang's bench_latency
    measured at one request with and without --disable-cuda-graph (sgl-project/sglang#1401):
    a dense layer (Llama 3 8B: 9.28 against 7.06 ms a token, 32 layers), a MoE layer
    (DeepSeek-Coder-V2-Lite: 6.22 ms in graphs, 4x without; its one dense layer taken out,
    26 MoE layers). DeepSeek-R1: 3 dense and 58 MoE layers, 41.7 ms a step."""
    dense = (9.28e-3 - 7.06e-3) / 32
    moe = (4 * 6.22e-3 - 6.22e-3 - dense) / 26
    graphs = _r1_server("trtllm")
    work = WorkloadTable(input_tokens=3200, output_tokens=800, concurrency=4)
    dep = attrs.evolve(graphs.dep, cuda_graphs=False)
    eager = server_of(graphs.role, graphs.shape, graphs.hw, dep, work, DEFAULT)
    added = eager.decode_step(4, 3600) - graphs.decode_step(4, 3600)
    assert added == pytest.approx(3 * dense + 58 * moe)


#: TensorRT-LLM's CUDA graphs padded up to 1,024 requests a rank
PADDED_GRAPHS = {"enable_padding": True, "max_batch_size": 1024}

#: each engine's table with its CUDA graphs off, and on for every batch (TensorRT-LLM's
#: default replays one only up to 32 requests a rank: padded here, up to 1,024)
EAGER_TABLES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "vllm": ({"args": ["--enforce-eager"]}, {}),
    "sglang": ({"args": ["--disable-cuda-graph"]}, {}),
    "trtllm": (
        {"extra_llm_api_options": {"cuda_graph_config": None}},
        {"extra_llm_api_options": {"cuda_graph_config": PADDED_GRAPHS}},
    ),
}


@pytest.mark.parametrize("launcher", sorted(EAGER_TABLES))
def test_a_spec_without_cuda_graphs_is_predicted_eager(tmp_path: Path, launcher: str) -> None:
    """Each engine's switch that turns its CUDA graphs off (vLLM --enforce-eager, SGLang
    --disable-cuda-graph, TensorRT-LLM's cuda_graph_config null) reaches the estimate and
    the prediction: each token waits for every layer's eager launches more."""
    from mdc.tune.serving_server import eager_launches

    def spec(options: dict[str, Any]) -> dict[str, Any]:
        data = trtllm()
        del data["trtllm"]
        data["distributed"]["launcher"] = launcher
        data["job"]["command"] = ["serve"]
        data[launcher] = {"model": "deepseek-ai/DeepSeek-R1", **options}
        return data

    off, on = (spec(options) for options in EAGER_TABLES[launcher])
    for data, captured in ((off, False), (on, True)):
        memory = compile_(tmp_path, data).plan.serving_memory
        assert memory is not None and memory.cuda_graphs is captured
    eager, graphs = predicted(tmp_path, off), predicted(tmp_path, on)
    assert eager is not None and graphs is not None
    launches_ms = eager_launches(serving_fit._shape("deepseek-v3", "fp8", 9216)) * 1e3
    assert eager["tpot_ms"] - graphs["tpot_ms"] >= 0.9 * launches_ms


@pytest.mark.parametrize(
    ("launcher", "gpu", "tp", "limit"),
    [
        # vLLM's largest default capture size; SGLang's --cuda-graph-max-bs by the GPU's
        # memory and tp (server_args.py's tiers: 256 below tp 4, 512 from it on an H100)
        ("vllm", "h100-sxm", 1, 512),
        ("sglang", "h100-sxm", 2, 256),
        ("sglang", "h100-sxm", 8, 512),
        ("sglang", "a100-40gb", 8, 160),
    ],
)
def test_a_step_past_the_largest_captured_batch_runs_eager(
    launcher: str, gpu: str, tp: int, limit: int
) -> None:
    """vLLM and SGLang replay a CUDA graph only up to their largest captured batch; a
    larger decode step launches its kernels eagerly (:func:`eager_launches` more)."""
    from mdc.tune.serving_server import eager_launches

    role = Role(name="server", servers=1, gpus=tp, tp=tp)
    work = WorkloadTable(input_tokens=200, output_tokens=200, concurrency=1)
    shape = serving_fit._shape("qwen3-32b", "bf16", 400)
    dep = attrs.evolve(_deployment(role), launcher=launcher)
    server = server_of(role, shape, builtin()[gpu], dep, work, DEFAULT)
    assert server.eager(limit) == 0.0
    assert server.eager(limit + 1) == eager_launches(shape) > 0
    # a spec's own largest captured batch moves the bound (TensorRT-LLM's, its launcher's
    # reading of cuda_graph_config: test_trtllms_captured_batches_reach_the_estimate)
    own = server_of(role, shape, builtin()[gpu], attrs.evolve(dep, graph_batch=64), work, DEFAULT)
    assert own.eager(64) == 0.0 and own.eager(65) > 0
    # and a bound of 0 (listed sizes without a batch of 1) leaves every step eager
    none = server_of(role, shape, builtin()[gpu], attrs.evolve(dep, graph_batch=0), work, DEFAULT)
    assert none.eager(1) == eager_launches(shape)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ([], None),
        (["--cuda-graph-max-bs", "96"], 96),
        (["--cuda-graph-bs", "1", "2", "4", "768"], 768),
    ],
)
def test_sglangs_captured_batches_reach_the_estimate(
    tmp_path: Path, args: list[str], expected: int | None
) -> None:
    data = trtllm()
    del data["trtllm"]
    data["distributed"]["launcher"] = "sglang"
    data["job"]["command"] = ["serve"]
    data["sglang"] = {"model": "deepseek-ai/DeepSeek-R1", "args": args}
    memory = compile_(tmp_path, data).plan.serving_memory
    assert memory is not None and memory.graph_batch == expected


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        # CudaGraphConfig's defaults: 1 to 31, 32, 64 and 128 captured, no padding, so every
        # batch runs in one only up to 32
        ({}, 32),
        ({"cuda_graph_config": {}}, 32),
        ({"cuda_graph_config": {"max_batch_size": 16}}, 16),
        # padded: a batch rounds up to the next captured size, up to the largest
        ({"cuda_graph_config": {"enable_padding": True}}, 128),
        ({"cuda_graph_config": PADDED_GRAPHS}, 1024),
        ({"cuda_graph_config": {"enable_padding": True, "batch_sizes": [1, 8, 64]}}, 64),
        # listed sizes without padding: only the run 1, 2 of them covers every batch
        ({"cuda_graph_config": {"batch_sizes": [1, 2, 4, 8, 16]}}, 2),
        ({"cuda_graph_config": {"batch_sizes": [4, 8]}}, 0),
        ({"cuda_graph_config": None}, None),
        # values the engine's own config refuses are not read (and do not stop the compile)
        ({"cuda_graph_config": {"batch_sizes": ["a"]}}, None),
        ({"cuda_graph_config": {"max_batch_size": "many"}}, None),
    ],
)
def test_trtllms_captured_batches_reach_the_estimate(
    tmp_path: Path, options: dict[str, Any], expected: int | None
) -> None:
    data = trtllm()
    data["trtllm"]["extra_llm_api_options"] = options
    memory = compile_(tmp_path, data).plan.serving_memory
    assert memory is not None and memory.graph_batch == expected
