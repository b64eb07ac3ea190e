"""bench/serving_targets.py: issue 38's targets on rows held out by source."""

from __future__ import annotations

import functools
from typing import Any

import pytest
from bench import serving_fit, serving_targets
from bench.serving_targets import Scored


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


def test_the_mode_winner_counts_where_the_modes_differ_by_15_percent() -> None:
    agg = _deployment(8, (1000.0, 50.0), (1200.0, 45.0))
    dis = Scored({**agg.row, "disaggregated": True}, {"throughput": 1300.0}, {"throughput": 1100.0})
    close = Scored({**agg.row, "disaggregated": True}, {"throughput": 1100.0}, {"throughput": 0.0})
    assert serving_targets.mode_cases([agg, dis]) == [False]
    assert serving_targets.mode_cases([agg, close]) == []
    assert serving_targets.mode_cases([agg]) == []


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


#: the held-out medians of the sources kept out of the fit (docs/tune-serving.md)
UNSEEN_FLOORS = {
    ("gpustack-performance-lab", "throughput"): 0.74,
    ("gpustack-performance-lab", "tpot"): 0.32,
    ("oracle-oci-mi300x-405b", "throughput"): 0.32,
}


@pytest.mark.slow
@pytest.mark.parametrize(("source", "metric"), sorted(UNSEEN_FLOORS))
def test_the_unseen_sources_keep_their_floor(source: str, metric: str) -> None:
    mine = [s for s in _scored() if s.row["source"] == source]
    errs = serving_targets.metric_errors(mine, metric)
    assert len(errs) >= 10
    assert sorted(abs(e) for e in errs)[len(errs) // 2] <= UNSEEN_FLOORS[source, metric]


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason="docs/tune-serving.md: not met held out by source")
@pytest.mark.parametrize("metric", ["tpot", "throughput", "ttft"])
def test_issue_38_accuracy_target(metric: str) -> None:
    (verdict,) = [v for v in serving_targets.verdicts(_scored()) if v[0] == metric]
    assert verdict[2], verdict[1]


@pytest.mark.slow
def test_issue_38_choosing_target() -> None:
    groups = serving_targets.groups(_scored())
    cases = [ok for g in groups for _, ok in serving_targets.choice_cases(g)]
    assert len(cases) >= 10
    assert sum(cases) / len(cases) >= 0.75
