"""mdc.tune.serving_burst: a burst of prompts sent at once, run to its last request."""

from __future__ import annotations

import math
from typing import Any

import pytest
from bench import serving_fit

from mdc.hardware import builtin
from mdc.spec import WorkloadTable
from mdc.tune.serving_burst import LAST, _Prompts, run, survival
from mdc.tune.serving_perf import predict
from mdc.tune.serving_records import DEFAULT, Deployment, Role
from mdc.tune.serving_server import server_of


@pytest.mark.parametrize(("mean", "cap"), [(196.0, 1833), (98.0, 100), (134.0, 200)])
def test_the_output_law_has_the_mean_and_stops_at_the_cap(mean: float, cap: int) -> None:
    alive_after = survival(mean, cap)
    # E[o] = sum over j >= 0 of P(o > j)
    assert sum(alive_after) == pytest.approx(mean, rel=1e-6)
    assert alive_after[0] == 1.0 and alive_after[cap] == 0.0
    ratios = {round(alive_after[j + 1] / alive_after[j], 9) for j in range(1, cap - 1)}
    assert len(ratios) == 1  # geometric: one ratio from step to step


def test_a_fixed_length_runs_every_request_to_it() -> None:
    assert survival(100.0, 100) == [1.0] * 100 + [0.0]


def _llama8b(launcher: str = "vllm") -> tuple[Any, tuple[Any, Any, Any]]:
    hw = builtin()["h100-sxm"]
    shape = serving_fit._shape("llama3.1-8b", "bf16", 1100)
    role = Role(name="server", servers=1, gpus=1)
    dep = Deployment(launcher=launcher, roles=(role,), capacity_gib=hw.memory_gib)
    work = WorkloadTable(input_tokens=1000, output_tokens=100, concurrency=1)
    return server_of(role, shape, hw, dep, work, DEFAULT), (shape, hw, dep)


def test_one_request_is_its_prefill_step_then_its_decode_steps_alone() -> None:
    """One prompt of 1,000 tokens and 100 generated: its first token with the prefill step
    (the weights' read and the prompt's compute), then 99 steps of a batch of one."""
    s, _ = _llama8b()
    ctx = 1000 + 100 / 2
    first = s.decode_step(0.0, ctx) + max(s.prefill_compute(1000, 1000), s.chunk_reads(0, 1000))
    got = run(s, 1, 1000, 100.0, 100)
    assert got.ttft_s == pytest.approx(first)
    assert got.tpot_s == pytest.approx(s.decode_step(1.0, ctx))
    assert got.duration_s == pytest.approx(first + 99 * s.decode_step(1.0, ctx))
    assert got.tokens == 100


def test_a_burst_drains_to_its_longest_request() -> None:
    """1,000 ShareGPT-like requests (mean 196 generated, at most 1,833): the run lasts until
    fewer than ln 2 requests are expected to run, each of those steps at least a batch of
    one's; a closed loop holding 1,000 in flight, whose ended requests are replaced at
    once, makes more tokens per second."""
    s, (shape, hw, dep) = _llama8b()
    alive_after = survival(196.0, 1833)
    last = next(j for j, a in enumerate(alive_after) if 1000 * a < LAST)
    # P(o > j) ~ exp(-(j - 1) / 195) past the first token: 1000 x that reaches ln 2 there
    assert last == pytest.approx(1 + 195 * math.log(1000 / LAST), rel=0.01)
    got = run(s, 1000, 1000, 196.0, 1833)
    assert got.duration_s > last * s.decode_step(1.0, 1000 + 98)
    work = WorkloadTable(input_tokens=1000, output_tokens=196, concurrency=1000)
    steady = predict(shape, hw, dep, work).output_tokens_per_s_per_gpu
    assert got.tokens / got.duration_s < steady


def test_sglang_decodes_nothing_while_a_prefill_batch_runs() -> None:
    """SGLang forms a prefill batch first and decodes only when none can be formed (its
    --enable-mixed-chunk is off unless set): two prompts of one budget each, 100 tokens
    generated. The first prompt's batch, then the second's alone, the first request waiting
    through it for its second token; then 99 steps decode both."""
    s, _ = _llama8b("sglang")
    size = s.step_tokens
    ctx = size + 100 / 2
    alone = s.prefill(size, size)
    both = s.decode_step(2.0, ctx)
    got = run(s, 2, size, 100.0, 100)
    assert got.ttft_s == pytest.approx((alone + 2 * alone) / 2)
    first, second = (alone + 99 * both) / 99, both  # the second prompt's batch in the first's
    assert got.tpot_s == pytest.approx((first + second) / 2)
    assert got.duration_s == pytest.approx(2 * alone + 99 * both)


def test_a_prompt_holds_its_slot_from_its_first_chunk() -> None:
    """Room for one request, prompts of 20,000 tokens and a budget of 8,192: the first
    prompt takes three steps, and the second starts only when nothing else runs."""
    queue = _Prompts(waiting=2, size=20_000, cap=1)
    assert queue.take(8192, 0.0) == (8192, 0)
    assert queue.take(8192, 0.0) == (8192, 0)
    assert queue.take(8192, 0.0) == (20_000 - 2 * 8192, 1)
    assert queue.take(8192, 1.0) == (0.0, 0)  # the first decodes: no slot for the second
    assert queue.take(8192, 0.0) == (8192, 0)
    assert not queue.empty


def test_gpustacks_bursts_ask_for_what_their_benchmark_asked() -> None:
    """GPUStack's runs send every prompt at once: a random prompt asks for
    --random-output-len (100 after 2,000 and 32,000 tokens, 200 after 4,000), a ShareGPT one
    for its answer, kept to prompt + answer <= 2,048 tokens; the runs at 4 in flight are a
    closed loop."""
    rows = [r for r in serving_fit.measurements() if r["source"] == "gpustack-performance-lab"]
    asked = {"random-2K": 100, "random-4K": 200, "random-32K": 100}
    for r in rows:
        if r["workload"] == "sharegpt-c4":
            assert r["sent_at_once"] is False
            continue
        assert r["sent_at_once"] is True
        want = asked.get(r["workload"], 2048 - r["input_tokens"])
        assert r["max_output_tokens"] == want >= r["output_tokens"]
