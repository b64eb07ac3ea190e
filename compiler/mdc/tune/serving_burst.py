"""A burst: ``prompts`` requests sent at once to one aggregated server, run to the last.

Serving benchmarks measure this, not a steady state: ``vllm bench serve`` without a request
rate sends every prompt at once (its default ``--request-rate inf``), and a closed loop of
fixed lengths keeps its requests in waves that start together. Its throughput is the
generated tokens over the time until the last request ends, so the drain counts: once the
queue is empty the running batch shrinks as requests end, and the last ones decode alone,
each step costing nearly what a full one does (the weights are read whatever the batch).
docs/tune-serving.md ("Bursts") states the terms.

The requests' output lengths are geometric (the maximum-entropy law of a given mean),
truncated at the requested maximum: ``P(o > j) = q^(j-1)`` for ``1 <= j < max_output``,
with ``q`` set by the mean. A fixed length is ``q = 1``. The engine is stepped with the
expected counts of running requests: each step decodes the running requests and prefills
what its token budget and free slots take, whole prompts first come first served (a prompt
longer than the budget takes several steps and holds its slot from the first); a request's
first token comes with its prompt's last step. An engine that runs a prefill batch alone
while prompts wait (SGLang unless --enable-mixed-chunk: its scheduler forms a prefill batch
first and decodes only when none can be formed) decodes nothing in those steps: a request
already decoding waits through every prefill batch of the burst after its first token, and
its TPOT counts them. The run ends when fewer than ln 2 requests are expected to run (the
median of the last request's end).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import attrs

from mdc.tune.serving_records import DEFAULT, Constants, Deployment, ServingPrediction
from mdc.tune.serving_server import server_of

if TYPE_CHECKING:
    from mdc.hardware import Accelerator
    from mdc.plan.memory import Shape
    from mdc.spec import WorkloadTable
    from mdc.tune.serving_server import Server

#: the expected requests still running at which the last one is taken to end: where the
#: chance that none runs is one half, (1 - S)^N = 1/2, i.e. N S = ln 2
LAST = math.log(2)


@attrs.frozen
class BurstResult:
    #: mean time to first token and mean time per output token (of the requests with two
    #: tokens or more), seconds
    ttft_s: float
    tpot_s: float
    #: from the first prompt sent to the last token, seconds
    duration_s: float
    #: expected generated tokens of the burst
    tokens: float


def survival(mean: float, cap: int) -> list[float]:
    """``S[j] = P(o > j)`` for ``j = 0 .. cap`` of the truncated geometric law whose mean
    is ``mean`` (at least 1 token, at most ``cap``)."""
    cap = max(1, cap)
    q = _ratio(min(max(mean, 1.0), float(cap)), cap)
    out = [1.0] + [q ** (j - 1) for j in range(1, cap)] + [0.0]
    return out[: cap + 1]


def _ratio(mean: float, cap: int) -> float:
    """The ``q`` whose truncated law has ``mean``: ``1 + sum_{j=1}^{cap-1} q^(j-1)``."""
    if mean >= cap - 1e-9:
        return 1.0

    def mean_of(q: float) -> float:
        return 1.0 + sum(q**i for i in range(cap - 1))

    low, high = 0.0, 1.0
    for _ in range(60):
        mid = (low + high) / 2
        if mean_of(mid) < mean:
            low = mid
        else:
            high = mid
    return (low + high) / 2


def run(
    s: Server, prompts: float, input_tokens: int, mean_output: float, max_output: int
) -> BurstResult:
    """The burst of ``prompts`` requests on one server of ``s``'s role (the role's
    ``servers`` share them evenly)."""
    alive_after = survival(mean_output, max_output)
    ctx = input_tokens + mean_output / 2
    # vLLM's and TensorRT-LLM's step budgets count the decoding tokens too; SGLang's
    # chunked-prefill size is the prompt tokens alone
    shared_budget = not s.dep.launcher.startswith("sglang")
    mixed = s.mixes_prompts()
    queue = _Prompts(
        waiting=max(1, round(prompts / s.role.servers)), size=input_tokens, cap=s.max_batch
    )
    # (time of the first token, index of the decode step that gives the second, requests)
    cohorts: list[tuple[float, int, float]] = []
    ticks: list[float] = []  # the end of each step that decodes the running requests
    now = 0.0
    while True:
        done_ticks = len(ticks)
        alive = sum(
            n * alive_after[1 + done_ticks - base]
            for _, base, n in cohorts
            if 1 + done_ticks - base <= max_output
        )
        if queue.empty and alive < LAST:
            break
        budget = s.step_tokens - (alive if shared_budget and mixed else 0.0)
        tokens, done = queue.take(max(0.0, budget), alive)
        if tokens <= 0 and alive <= 0:
            break  # nothing runs and nothing can start: no slot for one prompt
        if tokens > 0 and not mixed:
            now += s.prefill(tokens, input_tokens)  # a prefill batch alone: no one decodes
        else:
            dt = s.decode_step(alive, ctx)  # with none running: the weights' read, overhead
            if tokens > 0:
                dt += max(s.prefill_compute(tokens, input_tokens), s.chunk_reads(alive, tokens))
            now += dt
            ticks.append(now)
        if done:
            cohorts.append((now, len(ticks), float(done)))
    return _result(cohorts, ticks, now, alive_after, queue.total, mean_output)


@attrs.define
class _Prompts:
    """The prompts not yet prefilled, first come first served: the head one may be part
    done (a prompt longer than the budget takes several steps), and a prompt starts only
    where a running slot is free (the engine's batch limit or its KV cache)."""

    waiting: int
    size: int
    cap: float
    #: tokens left of the prompt in prefill (0: none started)
    left: float = 0.0
    total: int = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.total = self.waiting

    @property
    def empty(self) -> bool:
        return self.waiting == 0 and self.left <= 0

    def take(self, budget: float, alive: float) -> tuple[float, int]:
        """(prompt tokens this step prefills, prompts it completes) with ``budget`` tokens
        and ``alive`` requests decoding."""
        tokens, done = 0.0, 0
        while budget > 1e-9:
            if self.left <= 0:
                if self.waiting == 0 or alive + done + 1 > self.cap + 1e-9:
                    break
                self.waiting -= 1
                self.left = float(self.size)
            chunk = min(budget, self.left)
            self.left -= chunk
            budget -= chunk
            tokens += chunk
            if self.left <= 1e-9:
                self.left = 0.0
                done += 1
        return tokens, done


def _result(
    cohorts: list[tuple[float, int, float]],
    ticks: list[float],
    duration: float,
    alive_after: list[float],
    prompts: float,
    mean_output: float,
) -> BurstResult:
    """Mean TTFT and TPOT over the requests (a request of ``o`` tokens: the time from its
    first token to its last, the ``o - 1``-th decode step after it, over ``o - 1``), and
    the run's duration."""
    last = len(ticks) - 1
    started = sum(n for _, _, n in cohorts) or 1.0
    ttft = sum(n * first for first, _, n in cohorts) / started
    tpot_sum, counted = 0.0, 0.0
    for first, base, n in cohorts:
        for o in range(2, len(alive_after)):
            p = alive_after[o - 1] - alive_after[o]
            if p <= 0 or last < 0:
                continue
            end = max(first, ticks[min(base + o - 2, last)])
            tpot_sum += n * p * (end - first) / (o - 1)
            counted += n * p
    tpot = tpot_sum / counted if counted else 0.0
    return BurstResult(ttft, tpot, duration, prompts * mean_output)


def predict_burst(
    shape: Shape,
    hw: Accelerator,
    dep: Deployment,
    workload: WorkloadTable,
    prompts: float,
    max_output: int,
    constants: Constants = DEFAULT,
) -> ServingPrediction:
    """An aggregated deployment's mean TTFT, mean TPOT and output tokens/s per GPU over a
    burst of ``prompts`` requests of ``workload.input_tokens`` prompt tokens and a mean of
    ``workload.output_tokens`` generated (at most ``max_output``)."""
    (role,) = dep.roles
    s = server_of(role, shape, hw, dep, workload, constants)
    if s.capacity_seqs < 1:
        raise ValueError("the deployment holds no request")
    got = run(s, prompts, workload.input_tokens, workload.output_tokens, max_output)
    tpot = got.tpot_s or s.decode_step(1.0, workload.input_tokens)
    return ServingPrediction(
        ttft_ms=got.ttft_s * 1e3,
        tpot_ms=tpot * 1e3,
        output_tokens_per_s_per_gpu=got.tokens / got.duration_s / role.gpus,
        output_tokens_per_s_per_user=1 / tpot,
        requests_per_s=prompts / got.duration_s,
        binding="queueing",
        batch={role.name: int(min(prompts / role.servers, s.max_batch))},
        memory_gib={role.name: s.memory_gib},
    )
