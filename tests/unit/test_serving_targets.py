"""bench/serving_targets.py: issue 38's targets on rows held out by source."""

from __future__ import annotations

import functools
import statistics
from typing import Any

import pytest
from bench import serving_fit, serving_targets
from bench.serving_targets import Scored

from mdc.hardware import builtin
from mdc.spec import WorkloadTable
from mdc.tune.serving_perf import predict
from mdc.tune.serving_records import DEFAULT, Deployment, Role
from mdc.tune.serving_server import server_of


@functools.cache
def _rows() -> tuple[dict[str, Any], ...]:
    return tuple(serving_fit.measurements())


@functools.cache
def _scored() -> tuple[Scored, ...]:
    return tuple(serving_targets.score(list(_rows())))


def test_ttft_counts_where_the_requests_in_flight_are_decoding() -> None:
    """NIM's 5,000 / 500 rows: output tokens/s x ITL is the requests decoding (Little's
    law). At 50 in flight 814.37 x 59.73 ms = 48.6 of 50 decode; at 100, 917.26 x 92.91 ms
    = 85.2 of 100 (the rest wait for a slot), and past it fewer still."""
    nim = [r for r in _rows() if r["source"] == "nim-benchmarking" and r["input_tokens"] == 5000]
    counted = {r["concurrency"]: serving_targets.not_overloaded(r) for r in nim}
    assert counted == {
        1: True,
        5: True,
        25: True,
        50: True,
        100: False,
        150: False,
        200: False,
        250: False,
    }


def test_an_open_loops_ttft_counts_where_its_requests_are_decoding() -> None:
    """At a rate r a request's latency is TTFT + (output - 1) x TPOT, and r times it are in
    flight (Little's law), r x output x TPOT of them decoding. llm-d's aggregated
    replicas: 250 x 25 = 6,250 ms of 532 + 249 x 25 = 6,757 (92.5 %) counts; its
    disaggregated deployment: 250 x 5.698 = 1,424.5 ms of 1,156.88 + 249 x 5.698 =
    2,575.7 (55.3 %) does not, its TTFT the prefill servers' queue."""
    counted = {r["launcher"]: serving_targets.not_overloaded(r) for r in _llm_d()}
    assert counted == {"vllm": True, "vllm_disagg": False}
    assert not serving_targets.not_overloaded(
        {"request_rate": 1.0, "output_tokens": 100, "ttft_ms": 100.0, "tpot_ms": 0.1}
    )


def test_a_closed_loop_in_waves_counts_as_the_burst_it_is() -> None:
    """dstack's runs: fixed lengths, a closed loop. vLLM 0.7 and SGLang prefill every
    waiting prompt before they decode again, so the requests stay in waves and each one's
    TTFT is the time to its prefill in its wave (H200 vLLM: 976 ms at 4 in flight, 1,766 at
    8, 3,369 at 16: about 0.22 s a request in flight), a burst the model predicts, not a
    queue waiting for slots. Such a row counts where its wave fits the running slots; the
    Little's-law share, which a wave's own prefill queue lowers, is not its rule."""
    dstack = [r for r in _rows() if r["source"] == "dstack-deepseek-r1"]
    waves = {r["launcher"] for r in dstack if serving_targets.in_waves(r)}
    assert waves == {"vllm", "sglang"}
    (row,) = [
        r
        for r in dstack
        if r["launcher"] == "sglang" and r["accelerator_model"] == "h200"
        if r["concurrency"] == 128 and r["output_tokens"] == 800
    ]
    # read as a steady state it would not count: 69 % of its 128 requests decoding
    assert not serving_targets.not_overloaded({**row, "fixed_lengths": False})
    assert serving_targets.not_overloaded(row, running=128)
    assert not serving_targets.not_overloaded(row, running=127)
    assert not serving_targets.not_overloaded(row)
    # TensorRT-LLM's in-flight batching is a steady state: the measured share rules it
    trt = [r for r in dstack if r["launcher"] == "trtllm" and r["output_tokens"] == 800]
    counted = sorted(r["concurrency"] for r in trt if serving_targets.not_overloaded(r, 1e9))
    assert counted == [4, 8, 16, 32, 64]


@pytest.mark.slow
def test_dstacks_waves_count_where_the_predicted_slots_hold_them() -> None:
    """Every wave row of dstack's counts but the H200 vLLM runs of 3,200 and 6,400 output
    tokens at 128 in flight, whose 6,400 and 9,600-token requests the KV cache left beside
    the FP8 weights holds fewer than 128 of: 34 wave rows and TensorRT-LLM's 5."""
    dstack = [s for s in _scored() if s.row["source"] == "dstack-deepseek-r1"]
    out = sorted(
        s.row["output_tokens"]
        for s in dstack
        if serving_targets.in_waves(s.row) and "ttft" not in s.measured
    )
    assert out == [3200, 6400]
    assert len(serving_targets.metric_errors(dstack, "ttft")) == 39


def test_a_burst_without_a_ttft_and_a_role_never_count() -> None:
    burst = {"concurrency": 1000, "output_tokens_per_s": 9000.0, "tpot_ms": 90.0}
    role = {**burst, "concurrency": 10, "ttft_ms": 50.0, "role": "decode"}
    assert not serving_targets.not_overloaded(burst)
    assert not serving_targets.not_overloaded(role)


def test_within_two_is_a_factor_either_way() -> None:
    errs = [-0.5, 1.0, -0.51, 1.01, 0.25, -0.3]
    assert serving_targets.within(errs, 1.0) == pytest.approx(4 / 6)
    assert serving_targets.within(errs, 0.30) == pytest.approx(2 / 6)


def _deployment(tp: int, measured: tuple[float, float], predicted: tuple[float, float]) -> Scored:
    row = {"source": "s", "model": "m", "tp": tp}
    return Scored(
        row,
        {"throughput": measured[0], "tpot": measured[1]},
        {"throughput": predicted[0], "tpot": predicted[1]},
    )


def test_the_pick_under_each_measured_tpot_limit() -> None:
    """Three layouts (tokens/s per GPU, TPOT ms). Limit 20: only tp 4 meets it, and mdc
    predicts only tp 4 does: good. Limit 40: tp 2 is best measured (900); mdc's pick among
    those it predicts within 40 ms (tp 2 at 35, tp 4 at 18) is tp 2: good. Limit 60: tp 1
    is best measured (1,000); mdc predicts tp 1 at 70 ms (over the limit) and picks tp 2,
    900 of 1,000 = 90 %: good. A model that thought tp 4 fastest at 60 ms would pick 500 of
    1,000: not good."""
    group = [
        _deployment(1, (1000.0, 60.0), (1100.0, 70.0)),
        _deployment(2, (900.0, 40.0), (950.0, 35.0)),
        _deployment(4, (500.0, 20.0), (520.0, 18.0)),
    ]
    assert serving_targets.choice_cases(group) == [(20.0, True), (40.0, True), (60.0, True)]
    wrong = [*group[:2], _deployment(4, (500.0, 20.0), (2000.0, 18.0))]
    assert serving_targets.choice_cases(wrong) == [(20.0, True), (40.0, False), (60.0, False)]


#: a whole disaggregated deployment's layout: its prefill and decode tables
_SPLIT = {"prefill": {"servers": 2, "tp": 2}, "decode": {"servers": 1, "tp": 4}}


def test_the_mode_winner_counts_where_the_modes_differ_by_15_percent() -> None:
    agg = _deployment(8, (1000.0, 50.0), (1200.0, 45.0))
    dis = Scored({**agg.row, **_SPLIT}, {"throughput": 1300.0}, {"throughput": 1100.0})
    close = Scored({**agg.row, **_SPLIT}, {"throughput": 1100.0}, {"throughput": 0.0})
    assert serving_targets.mode_cases([agg, dis]) == [False]
    assert serving_targets.mode_cases([agg, close]) == []
    assert serving_targets.mode_cases([agg]) == []


def test_an_engines_disaggregated_launcher_groups_with_its_aggregated_one() -> None:
    """vllm_disagg runs vLLM's engine: its end-to-end rows are the same group's choices as
    vLLM's aggregated layouts (one workload, two modes); SGLang's are another group. A
    row without a published throughput is no choice, but its workload is still measured
    in both modes."""
    base = {"source": "s", "model": "m", "request_rate": 4.0}
    agg = Scored({**base, "launcher": "vllm", "tp": 8}, {"throughput": 10.0}, {})
    dis = Scored({**base, "launcher": "vllm_disagg", **_SPLIT}, {"throughput": 13.0}, {})
    other = Scored({**base, "launcher": "sglang_disagg", **_SPLIT}, {"throughput": 9.0}, {})
    latency_only = Scored({**base, "launcher": "vllm", "tp": 4}, {"tpot": 20.0}, {})
    (group,) = serving_targets.groups([agg, dis, other, latency_only])
    assert [s.row["launcher"] for s in group] == ["vllm", "vllm_disagg"]
    pairs = serving_targets.both_modes([agg, dis, other, latency_only])
    assert [len(g) for g in pairs] == [3]


def _llm_d() -> list[dict[str, Any]]:
    return [r for r in _rows() if r["source"] == "llm-d-pd-gpt-oss-120b-h200"]


def test_llm_ds_rows_read_what_their_page_prints() -> None:
    """llm-d's P/D guide: 16 H200, 8 prefill servers of tp 1 and 2 decode servers of tp 4
    (its modelserver/gpu/vllm/base patches) against 16 replicas of tp 1 (its baseline
    manifest), 5,000 / 250 tokens at 45 requests/s. The rate=45 report prints 12,035.85
    output tokens/s, TTFT 1.1569 s and time_per_output_token 5.698 ms; the aggregated
    column TTFT 532 ms and ITL 25 ms, and no output tokens/s."""
    dis, agg = sorted(_llm_d(), key=lambda r: r["launcher"], reverse=True)
    assert (dis["launcher"], agg["launcher"]) == ("vllm_disagg", "vllm")
    assert serving_fit.gpus(dis) == serving_fit.gpus(agg) == 16
    assert serving_fit.measured(dis) == pytest.approx(12035.85 / 16)
    assert (dis["ttft_ms"], dis["tpot_ms"]) == (1156.88, 5.698)
    assert serving_fit.measured(agg) is None
    assert (agg["ttft_ms"], agg["tpot_ms"]) == (532, 25)
    assert all(r["request_rate"] == 45.0 and r["input_tokens"] == 5000 for r in (dis, agg))


def test_an_end_to_end_disaggregated_row_is_its_two_roles_at_its_rate() -> None:
    """The row's prediction is the deployment its prefill and decode tables state, at its
    open loop's arrival rate (not one server of its first role's size)."""
    (dis,) = [r for r in _llm_d() if r["launcher"] == "vllm_disagg"]
    hw = builtin()["h200"]
    dep = Deployment(
        launcher="vllm_disagg",
        roles=(
            Role(name="prefill", servers=8, gpus=1, tp=1),
            Role(name="decode", servers=2, gpus=4, tp=4),
        ),
        capacity_gib=hw.memory_gib,
    )
    work = WorkloadTable(input_tokens=5000, output_tokens=250, request_rate=45.0)
    shape = serving_fit._shape("gpt-oss-120b", "fp4", 5250)
    assert serving_fit.prediction(dis) == predict(shape, hw, dep, work)
    assert serving_fit.family(dis)["mode"] == "disaggregated"


def test_a_group_is_one_model_gpu_engine_and_workload_with_several_layouts() -> None:
    base = {"source": "s", "model": "m", "launcher": "vllm", "concurrency": 8}
    rows = [
        Scored({**base, "tp": 1}, {"throughput": 10.0}, {"throughput": 1.0}),
        Scored({**base, "tp": 1}, {"throughput": 12.0}, {"throughput": 1.0}),
        Scored({**base, "tp": 2}, {"throughput": 9.0}, {"throughput": 1.0}),
        Scored({**base, "tp": 2, "launcher": "sglang"}, {"throughput": 9.0}, {"throughput": 1.0}),
    ]
    (group,) = serving_targets.groups(rows)
    assert sorted((s.row["tp"], s.measured["throughput"]) for s in group) == [(1, 12.0), (2, 9.0)]


def test_gpustacks_rows_read_what_their_pages_ran() -> None:
    """deepseek-r1/h200.md starts SGLang with --tp-size 8 --enable-dp-attention and no
    --dp-size: SGLang keeps dp_size 1 and turns DP attention off there, so the rows are tp 8
    alone. qwen3-32b/h100.md's FP8 run of 1,926.06 output tokens/s shows an SGLang script
    under a TensorRT-LLM heading and summary: no row, its engine is not known."""
    gpustack = [r for r in _rows() if r["source"] == "gpustack-performance-lab"]
    deepseek_sglang = [
        r for r in gpustack if r["model"] == "deepseek-v3" and r["launcher"] == "sglang"
    ]
    assert len(deepseek_sglang) == 5
    assert all(r.get("dp", 1) == 1 for r in deepseek_sglang)
    assert all(r["output_tokens_per_s"] != 1926.06 for r in gpustack)
    assert len(gpustack) == 100


def test_gpustacks_sglang_rows_run_at_the_share_sglang_picks() -> None:
    """GPUStack starts SGLang 0.5 without --mem-fraction-static: its rows hold the requests
    that SGLang's own share for the server leaves room for (mdc explain's estimate), fewer
    than vLLM's 0.9 of the GPU would."""
    row = next(
        r
        for r in _rows()
        if r["source"] == "gpustack-performance-lab"
        and r["launcher"] == "sglang"
        and r["model"] == "qwen3-32b"
        and r["accelerator_model"] == "h100-sxm"
        and r["dtype"] == "bf16"
        and r["concurrency"] == 1000
    )
    own = serving_fit.prediction(row)
    at_09 = serving_fit.prediction({**row, "sglang_share": None})
    assert own.batch["server"] < at_09.batch["server"]
    assert own.memory_gib["server"] < at_09.memory_gib["server"]


#: the held-out medians of the sources kept out of the fit (docs/tune-serving-targets.md)
UNSEEN_FLOORS = {
    # GPUStack's runs predicted as the bursts they are (mdc.tune.serving_burst): throughput
    # 73.1 % -> 41.5 %, TPOT 28.1 % -> 35.6 % (the drain's small batches decode faster than
    # the full batch a steady state held; the measured TPOTs stay above both); the block-FP8
    # GEMMs' tiles and the fused-MoE launches: throughput 41.5 % -> 38.9 %, TPOT 35.6 % -> 35.1 %;
    # gpt-oss's MXFP4 experts weight-only in bf16 below Blackwell: 38.9 % -> 33.0 %, TPOT
    # 35.1 % -> 33.1 %; the block-FP8 tiles on Qwen3's -FP8 checkpoints too (their
    # weight_block_size): TPOT 33.1 % -> 33.7 % (the 235B's rows already slow, a little slower);
    # SGLang's prefill batches alone in its bursts: TPOT 33.7 % -> 29.0 %; SGLang's rows at
    # the share SGLang picks itself (GPUStack sets none): throughput 33.0 % -> 32.1 %, TPOT
    # 29.0 % -> 30.4 % (fewer requests decode, at a step the model already has too fast);
    # a step past vLLM's and SGLang's largest captured batch eager: throughput 32.1 % ->
    # 31.0 %, TPOT 30.4 % -> 26.5 %
    ("gpustack-performance-lab", "throughput"): 0.32,
    ("gpustack-performance-lab", "tpot"): 0.27,
    ("oracle-oci-mi300x-405b", "throughput"): 0.32,
    # each row at its engine version's step limits (200.8 % -> 200.5 %) and its 500 prompts'
    # last wave (198.8 %): the rest is the early-2025 engines' step cost; the block-FP8
    # GEMMs' tiles and the fused-MoE launches: 198.8 % -> 171.3 %; SGLang's prefill batches
    # alone in its waves: 171.3 % -> 172.4 %; SGLang's DP attention gathering its groups'
    # tokens into one MoE (the experts they touch, the gather and reduce-scatter): 172.4 %
    # -> 138.3 %, TPOT 61.7 % -> 53.9 %; the MI300X's block-FP8 GEMMs at aiter's measured
    # times: 138.3 % -> 130.6 %, TPOT 53.9 % -> 52.8 %; TensorRT-LLM 0.17's PyTorch backend
    # decoding without CUDA graphs (its default then): 130.6 % -> 117.6 %, TPOT 52.8 % -> 48.6 %
    ("dstack-deepseek-r1", "throughput"): 1.18,
    ("dstack-deepseek-r1", "tpot"): 0.49,
    # its waves counted as the bursts they are (5 rows, 75.5 % -> 39 rows, 68.7 %): the
    # early-2025 engines' prefill 2.5 to 7x slower than the model's, as their TPOT is 2x
    ("dstack-deepseek-r1", "ttft"): 0.69,
}


@pytest.mark.slow
@pytest.mark.parametrize(("source", "metric"), sorted(UNSEEN_FLOORS))
def test_the_unseen_sources_keep_their_floor(source: str, metric: str) -> None:
    mine = [s for s in _scored() if s.row["source"] == source]
    errs = serving_targets.metric_errors(mine, metric)
    assert len(errs) >= 10
    assert sorted(abs(e) for e in errs)[len(errs) // 2] <= UNSEEN_FLOORS[source, metric]


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason="docs/tune-serving-targets.md: not met held out by source")
@pytest.mark.parametrize("metric", ["tpot", "throughput", "ttft"])
def test_issue_38_accuracy_target(metric: str) -> None:
    (verdict,) = [v for v in serving_targets.verdicts(_scored()) if v[0] == metric]
    assert verdict[2], verdict[1]


def _one_mode(group: list[Scored]) -> bool:
    return len({serving_fit.disaggregated(s.row) for s in group}) == 1


@pytest.mark.slow
def test_issue_38_choosing_target_within_one_mode() -> None:
    """Among the layouts of one mode the pick reaches 85 % of the best in >= 75 % of the
    cases (12 cases, 83 %)."""
    groups = [g for g in serving_targets.groups(_scored()) if _one_mode(g)]
    cases = [ok for g in groups for _, ok in serving_targets.choice_cases(g)]
    assert len(cases) >= 10
    assert sum(cases) / len(cases) >= 0.75


@pytest.mark.slow
@pytest.mark.xfail(
    strict=True, reason="docs/tune-serving-targets.md: the B200 groups' 11 of 12 cases missed"
)
def test_issue_38_choosing_target() -> None:
    """With the Dynamo B200 study's four groups of both modes (12 cases, 1 good: the
    pick is the disaggregated deployment the aggregated one beats): 24 cases, 46 %."""
    groups = serving_targets.groups(_scored())
    cases = [ok for g in groups for _, ok in serving_targets.choice_cases(g)]
    assert len(cases) >= 10
    assert sum(cases) / len(cases) >= 0.75


#: llm-d's pair held out (docs/tune-serving-targets.md): the disaggregated row's throughput (its
#: rate's tokens: 703 predicted against 752 per GPU counted by the benchmark), both
#: modes' TPOT (5.7 ms disaggregated, 25 ms aggregated; 10.6 and 13.6 predicted) and the
#: aggregated replicas' TTFT (532 ms; 143 predicted)
LLM_D_FLOORS = {"throughput": 0.07, "tpot": 0.66, "ttft": 0.74}


@pytest.mark.slow
@pytest.mark.parametrize("metric", sorted(LLM_D_FLOORS))
def test_llm_ds_pair_keeps_its_floor(metric: str) -> None:
    mine = [s for s in _scored() if s.row["source"] == "llm-d-pd-gpt-oss-120b-h200"]
    errs = serving_targets.metric_errors(mine, metric)
    assert len(errs) == {"throughput": 1, "tpot": 2, "ttft": 1}[metric]
    assert statistics.median(abs(e) for e in errs) <= LLM_D_FLOORS[metric]


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason="docs/tune-serving-targets.md: 0 of 4 cases called")
def test_issue_38_aggregated_or_disaggregated_target() -> None:
    """Five workloads are measured in both modes: llm-d's (a fixed request rate, no
    aggregated throughput: no case) and the four of the Dynamo B200 study, where the
    aggregated replicas win by 58 % to 6.7x and the model calls the disaggregated
    deployment the winner (docs/tune-serving-targets.md says why)."""
    assert len(serving_targets.both_modes(_scored())) == 5
    cases = [ok for g in serving_targets.groups(_scored()) for ok in serving_targets.mode_cases(g)]
    assert len(cases) == 4
    assert sum(cases) / len(cases) >= 0.80


#: the Dynamo B200 study's workloads (13_master.md, section 4; the 4-GPU runs from
#: 12_benchmarking-standard-vllm-4xtp1.md): (prompt tokens, requests in flight) -> total
#: output tokens/s by (disaggregated, GPUs): aggregated 2 x tp 4 or 4 x tp 1,
#: disaggregated 4 x tp 1 + tp 4 or 3 x tp 1 + tp 1
DYNAMO_B200 = {
    (3000, 16): {(False, 8): 1350.12, (True, 8): 856.73, (False, 4): 446.01, (True, 4): 414.88},
    (3000, 32): {(False, 8): 3035.79, (True, 8): 1113.47, (False, 4): 560.56, (True, 4): 499.24},
    (8000, 16): {(False, 8): 546.63, (True, 8): 94.30},
    (8000, 32): {(False, 8): 628.28, (True, 8): 94.10},
}


@pytest.mark.slow
def test_the_dynamo_b200_pairs_are_cases_of_the_mode_target(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Each of the study's four workloads is measured in both modes, its throughput per
    GPU the table's total over the deployment's GPUs, the best of each mode >= 15 % apart
    (so each is one case of the target), and the report prints the measure and each row."""
    pairs = [
        g
        for g in serving_targets.both_modes(_scored())
        if g[0].row["source"] == "dynamo-gke-b200-llama70b"
    ]
    found = {}
    for g in pairs:
        row = g[0].row
        found[row["input_tokens"], row["concurrency"]] = {
            (serving_fit.disaggregated(s.row), serving_fit.gpus(s.row)): s.measured["throughput"]
            * serving_fit.gpus(s.row)
            for s in g
        }
        assert len(serving_targets.mode_cases(g)) == 1
    assert found.keys() == DYNAMO_B200.keys()
    for key, totals in DYNAMO_B200.items():
        assert found[key] == pytest.approx(totals)
    serving_targets.report_scored(_scored())
    out = capsys.readouterr().out
    assert "aggregated or disaggregated: 4 cases, 0 % called (>= 80 %): NOT met" in out
    for totals in DYNAMO_B200.values():
        for (dis, gpus), total in totals.items():
            mode = "disaggregated" if dis else "aggregated"
            line = f"dynamo-gke-b200-llama70b {mode}: throughput {total / gpus:.4g} -> "
            assert line in out


def _dstack() -> list[dict[str, Any]]:
    return [r for r in _rows() if r["source"] == "dstack-deepseek-r1"]


def test_dstacks_throughput_is_the_nodes_generated_tokens() -> None:
    """dstack's output_throughput is the 8-GPU node's generated tokens/s: with it, output
    tokens/s x TPOT (the requests decoding, Little's law) stays within the requests in flight
    on every row (H200 vLLM at 4: 148.58 x 25.73 ms = 3.8 of 4). Read as the input and
    output tokens (x 5 at 3,200 / 800) or as one GPU's (x 8), the 4-request rows would
    decode 19 or 31 requests at once."""
    rows = _dstack()
    assert len(rows) == 45
    for row in rows:
        decoding = row["output_tokens_per_s"] * row["tpot_ms"] / 1e3
        assert decoding <= row["concurrency"], row
    low = [r for r in rows if r["concurrency"] == 4]
    assert len(low) == 5
    for row in low:
        decoding = row["output_tokens_per_s"] * row["tpot_ms"] / 1e3
        total = decoding * (row["input_tokens"] + row["output_tokens"]) / row["output_tokens"]
        assert total > 4 and decoding * 8 > 4


def test_dstacks_rows_carry_their_engines_step_limits() -> None:
    """The engines of dstack's README (deepseek-r1-benchmark branch), with the defaults of
    their versions: TensorRT-LLM's trtllm-serve --max_num_tokens 16384 --max_batch_size 512;
    vLLM 0.7's max_num_seqs 256, on MI300X V0 with MLA and no chunked prefill (a ROCm
    platform), so max_num_batched_tokens = max(--max-model-len 32768, 2048), on H200 MLA's
    chunked prefill at the API server's 2048; SGLang 0.4.2's --chunked-prefill-size 8192 on
    a GPU of 25 GB or more (MI300X; today's 16,384 tier came later)."""
    expected = {
        ("trtllm", "h200"): (512, 16384),
        ("vllm", "mi300x"): (256, max(32768, 2048)),
        ("vllm", "h200"): (256, 2048),
        ("sglang", "mi300x"): (None, 8192),
    }
    seen = set()
    for row in _dstack():
        key = (row["launcher"], row["accelerator_model"])
        if key == ("sglang", "h200"):
            assert row["dp"] == 8 and "step_tokens" not in row  # dp_size = tp_size in 0.4.3
            continue
        assert (row.get("max_batch"), row["step_tokens"]) == expected[key]
        seen.add(key)
    assert seen == set(expected)


def test_a_closed_loops_last_wave_runs_what_is_left() -> None:
    """dstack's runs send 500 prompts in waves of their concurrency: at 128, three full waves
    and one of 116. Two full waves run as one does; a last wave of one request takes its 800
    decode steps, each at least a step of one request (the weights read whatever the
    batch), so 129 prompts come out below 129 / 128 of the full wave's rate, by at least
    that wave's time."""
    (row,) = [
        r
        for r in _dstack()
        if r["launcher"] == "vllm" and r["accelerator_model"] == "h200"
        if r["concurrency"] == 128 and r["output_tokens"] == 800
    ]
    assert row["prompts"] == 500
    wave = serving_fit.prediction({**row, "prompts": 128})
    two = serving_fit.prediction({**row, "prompts": 256})
    assert two.output_tokens_per_s_per_gpu == pytest.approx(wave.output_tokens_per_s_per_gpu)
    assert two.ttft_ms == pytest.approx(wave.ttft_ms)
    hw = builtin()[row["accelerator_model"]]
    shape = serving_fit._shape(row["model"], row["dtype"], 4000)
    role = serving_fit._role("server", row)
    dep = Deployment(launcher="vllm", roles=(role,), capacity_gib=hw.memory_gib, nproc_per_node=8)
    one_step = server_of(role, shape, hw, dep, serving_fit._workload(row), DEFAULT).decode_step(
        1, 3200
    )
    wave_s = 128 / wave.requests_per_s
    bound = 129 * 800 / (wave_s + 800 * one_step) / 8
    odd = serving_fit.prediction({**row, "prompts": 129})
    assert odd.output_tokens_per_s_per_gpu <= bound
    assert odd.output_tokens_per_s_per_gpu < 129 / 128 * wave.output_tokens_per_s_per_gpu
    full = serving_fit.prediction(row)  # 500: 3 x 128 + 116
    assert full.output_tokens_per_s_per_gpu < wave.output_tokens_per_s_per_gpu


def test_the_tpot_report_groups_each_rows_ratio() -> None:
    """bench.serving_fit --tpot: each TPOT row's predicted / measured, and per group the
    rows, the median ratio and the median |ratio - 1|, groups in order (4 before 16)."""
    from bench import serving_tpot

    def scored(load: int, measured: float, predicted: float) -> serving_targets.Scored:
        row = {"concurrency": load}
        return serving_targets.Scored(row, {"tpot": measured}, {"tpot": predicted, "ttft": 1.0})

    pairs = serving_tpot.ratios(
        [scored(16, 10.0, 5.0), scored(4, 20.0, 30.0), scored(16, 40.0, 30.0)]
        + [serving_targets.Scored({"concurrency": 4}, {}, {"tpot": 1.0})]
    )
    assert [ratio for _, ratio in pairs] == [0.5, 1.5, 0.75]
    by_load = serving_tpot.grouped(pairs, lambda r: r["concurrency"])
    assert list(by_load) == ["4", "16"]
    assert by_load["4"] == (1, 1.5, 0.5)
    count, mean, spread = by_load["16"]
    assert count == 2
    assert (mean, spread) == pytest.approx((0.625, 0.375))


def test_the_block_fp8_checkpoints_carry_their_weight_blocks() -> None:
    """GPUStack's Qwen3 FP8 rows ran Qwen's -FP8 checkpoints (FP8 in 128 x 128 blocks, which
    the catalogue's BF16 Qwen3 entries lack); TensorRT-LLM's overview ran Model Optimizer's
    per-tensor FP8 checkpoints (no blocks); DeepSeek's blocks come from the catalogue."""
    rows = _rows()
    qwen_fp8 = [
        r
        for r in rows
        if r["source"] == "gpustack-performance-lab"
        and r["model"].startswith("qwen3")
        and r["dtype"] == "fp8"
    ]
    assert len(qwen_fp8) == 17
    assert all(r["weight_block_size"] == [128, 128] for r in qwen_fp8)
    others = [r for r in rows if r not in qwen_fp8]
    assert not any("weight_block_size" in r for r in others)
    overview = [r for r in rows if r["source"] == "trtllm-perf-overview"]
    assert all(
        serving_fit._shape(r["model"], r["dtype"], 4096).weight_block is None for r in overview
    )
    assert serving_fit._shape("deepseek-v3", "fp8", 4096).weight_block == (128, 128)
