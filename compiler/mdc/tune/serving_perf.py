"""The serving model: TTFT, TPOT and output throughput of a deployment under a workload.

docs/tune-serving.md documents every term with its formula and source. In short, per
server of ``gpus`` GPUs (``pp`` stages of ``gpus / pp``; ``groups`` attention groups of
``attn_tp`` GPUs each: vLLM's data-parallel engines, SGLang's DP attention):

* a **decode step** at ``B`` running sequences is a roofline of HBM traffic (the stage's
  dense weights once, the experts the step's tokens touch, each sequence's KV cache at the
  mean context) against its GEMM and attention FLOPs, plus the tensor-parallel all-reduce
  and the expert all-to-all of every layer over the scale-up (or scale-out) network, plus
  the launcher's fitted per-step overhead (scheduler, CUDA graph launch);
* a **prefill** of ``N`` prompt tokens is compute: the forward FLOPs per token (GEMMs and
  the causal attention over the prompt, :func:`mdc.tune.flops.token_flops`) at the fitted
  prefill efficiency, at least one read of the weights, plus its communication;
* an **aggregated** server interleaves the two: each step decodes ``B`` tokens and
  prefills the ``B x input / output`` prompt tokens that keep the batch full (chunked
  prefill), so prefill slows every token; TTFT is the prompt's chunks at that step time;
  under a request rate the rate sets the prompts' share of the server's time, which
  stretches every token, and a prompt queues M/D/1 for the prompts ahead;
* a **disaggregated** deployment prefills on its prefill servers (queueing as M/D/1 at
  their load), sends the prompt's KV cache over the network, and decodes on its decode
  servers at the batch Little's law gives (behind vLLM the first token is the decode
  server's);
* the running batch is the smaller of the requests in flight, the KV cache's capacity
  (:mod:`mdc.plan.serving_memory`) and the engine's batch limit; requests past it queue.

A server's step costs are :mod:`mdc.tune.serving_server`'s; the fitted constants, the roles
and the prediction's record are :mod:`mdc.tune.serving_records`'s. This module composes them:
a deployment's servers under its workload, and the deployment a compiled plan runs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import attrs

from mdc.hardware import Accelerator
from mdc.plan.memory import GIB, Shape
from mdc.plan.serving_memory import DTYPE_BYTES, ServingMemory, kv_per_layer
from mdc.spec import WorkloadTable
from mdc.tune.serving_records import (
    DECODE_ROLES,
    DEFAULT,
    PREFILL_ROLES,
    Constants,
    Deployment,
    Role,
    ServingPrediction,
)
from mdc.tune.serving_server import Server, link_rate, mean_context, server_of
from mdc.tune.terms import scale_up_domain

if TYPE_CHECKING:
    from mdc.api import Launch
    from mdc.plan.model import Plan


def predict(
    shape: Shape,
    hw: Accelerator,
    dep: Deployment,
    workload: WorkloadTable,
    constants: Constants = DEFAULT,
    cache: dict[Any, Server] | None = None,
) -> ServingPrediction:
    """The deployment's TTFT, TPOT and throughput under ``workload``. A search passes one
    ``cache`` for all its deployments of one model, accelerator, engine and workload: a
    server's costs do not depend on how many of it there are."""
    servers = _servers(shape, hw, dep, workload, constants, cache)
    if any(s.capacity_seqs < 1 for s in servers):
        return _unfit(servers)
    if len(servers) == 1:
        return _aggregated(servers[0], workload)
    prefill = next(s for s in servers if s.role.name in PREFILL_ROLES)
    decode = next(s for s in servers if s.role.name in DECODE_ROLES)
    return _disaggregated(prefill, decode, workload)


def _servers(
    shape: Shape,
    hw: Accelerator,
    dep: Deployment,
    workload: WorkloadTable,
    constants: Constants,
    cache: dict[Any, Server] | None,
) -> list[Server]:
    """The deployment's roles' servers, from ``cache`` where it has them."""
    servers = []
    for r in dep.roles:
        key = (r.name, r.gpus, r.tp, r.pp, r.dp, r.ep, r.max_batch, r.step_tokens, r.share)
        found = cache.get(key) if cache is not None else None
        if found is None:
            found = server_of(r, shape, hw, dep, workload, constants)
            if cache is not None:
                cache[key] = found
        servers.append(found if found.role == r else attrs.evolve(found, role=r))
    return servers


def role_memory(
    shape: Shape,
    hw: Accelerator,
    dep: Deployment,
    workload: WorkloadTable,
    constants: Constants = DEFAULT,
    cache: dict[Any, Server] | None = None,
) -> dict[str, ServingMemory]:
    """Each role's serving memory estimate per GPU, by role name."""
    return {s.role.name: s.memory for s in _servers(shape, hw, dep, workload, constants, cache)}


def prefill_seconds(
    shape: Shape,
    hw: Accelerator,
    dep: Deployment,
    workload: WorkloadTable,
    constants: Constants = DEFAULT,
    cache: dict[Any, Server] | None = None,
) -> float:
    """Seconds one server of the deployment's first role takes to prefill a prompt alone:
    all a disaggregated prediction reads of the prefill role's step budget (its rate and
    the TTFT)."""
    (server, *_) = _servers(shape, hw, dep, workload, constants, cache)
    return server.prefill(workload.input_tokens, workload.input_tokens)


def shares_fit(
    shape: Shape,
    hw: Accelerator,
    dep: Deployment,
    workload: WorkloadTable,
    constants: Constants = DEFAULT,
    cache: dict[Any, Server] | None = None,
) -> bool:
    """Whether every role's engine share leaves room for what the engine keeps outside it
    (CUDA context and graphs): how far the serving search may raise a share."""
    return all(s.leaves_reserve for s in _servers(shape, hw, dep, workload, constants, cache))


def _unfit(servers: list[Server]) -> ServingPrediction:
    """A deployment whose weights leave no room for one request's KV cache: it serves
    nothing."""
    return ServingPrediction(
        ttft_ms=math.inf,
        tpot_ms=math.inf,
        output_tokens_per_s_per_gpu=0.0,
        output_tokens_per_s_per_user=0.0,
        requests_per_s=0.0,
        binding="memory",
        batch={s.role.name: 0 for s in servers},
        memory_gib={s.role.name: s.memory_gib for s in servers},
        overloaded=True,
    )


def _mdl_wait(load: float, service: float) -> float:
    """M/D/1's mean wait: Poisson arrivals at a server of fixed service time."""
    if load >= 1:
        return math.inf
    return load / (2 * (1 - load)) * service


def _aggregated(s: Server, w: WorkloadTable) -> ServingPrediction:
    n, inp, out = s.role.servers, w.input_tokens, w.output_tokens
    ctx = mean_context(w)
    cap = s.max_batch

    def step(batch: float) -> float:
        # each step also prefills the prompts that replace the finished sequences; a
        # request's tokens wait for the other requests' replacements, not its own (its own
        # prompt is in its TTFT): B - 1 prompts over its `out` tokens (an engine that runs
        # them alone pauses the decode for their steps)
        others = max(0.0, batch - 1)
        if others <= 0:
            extra = 0.0
        elif s.mixes_prompts():
            extra = s.prefill_compute(others * inp / out, inp)
        else:
            extra = others / out * s.prompt_steps(batch, inp, ctx)[1]
        return s.decode_step(batch, ctx) + extra

    def ttft(batch: float) -> float:
        return s.prompt_steps(batch, inp, ctx)[0]

    if w.request_rate is not None:
        return _aggregated_open(s, w)
    queue_wait, binding = 0.0, ""
    wanted = -(-(w.concurrency or 1) // n)
    batch = min(wanted, cap)
    if wanted > cap:
        binding = "KV capacity" if cap == s.capacity_seqs else "batch limit"
    tpot = step(batch)
    first = ttft(batch) + _step_in_flight(s, w, batch, ctx)
    requests = n * batch / (first + (out - 1) * tpot)
    if (w.concurrency or 1) > batch * n:
        queue_wait = ((w.concurrency or 1) - batch * n) / requests
    else:
        queue_wait, requests = _closed_prefill_wait(n * batch, first, tpot, out, inp, s)
    return ServingPrediction(
        ttft_ms=(first + queue_wait) * 1e3,
        tpot_ms=tpot * 1e3,
        output_tokens_per_s_per_gpu=requests * out / (n * s.role.gpus),
        output_tokens_per_s_per_user=1 / tpot,
        requests_per_s=requests,
        binding=binding or _bound(s, batch, ctx),
        batch={s.role.name: int(round(batch))},
        memory_gib={s.role.name: s.memory_gib},
    )


def _aggregated_open(s: Server, w: WorkloadTable) -> ServingPrediction:
    """An aggregated server under Poisson arrivals of ``rate = request_rate / servers``.
    The engine schedules each step's decode tokens first, then prompt chunks up to its
    budget (vLLM V1's scheduler; TensorRT-LLM's in-flight batching likewise; SGLang runs
    the prompts' steps alone, the decode paused), so a prompt's compute lands in the steps
    that carry it: the server spends ``busy = rate x P`` of its time on prompts (``P`` what
    one prompt adds, :meth:`Server.prompt_steps`) and decodes a step of the batch in the
    rest, one token per sequence per step, so the mean time per output token is ``decode
    step(B) / (1 - busy)``. A prompt's own steps take ``S`` (mixed in, each chunk's step
    with the batch's decode); a request waits
    M/D/1's mean for the prompts ahead at load ``rate x S``, and half a decode step for the
    step in flight when no prompt is. ``B`` holds Little's law, ``rate x (TTFT + (output -
    1) x TPOT)``; a rate no batch carries, or prompts past the server's rate, overload it."""
    n, inp, out = s.role.servers, w.input_tokens, w.output_tokens
    rate = float(w.request_rate or 0.0) / n
    ctx = mean_context(w)
    cap = s.max_batch

    def prompt(batch: float) -> float:
        return s.prompt_steps(batch, inp, ctx)[1]

    def own_prefill(batch: float) -> float:
        return s.prompt_steps(batch, inp, ctx)[0]

    def tpot(batch: float) -> float:
        busy = rate * prompt(batch)
        return math.inf if busy >= 1 else s.decode_step(batch, ctx) / (1 - busy)

    def ttft(batch: float) -> float:
        service = own_prefill(batch)
        load = rate * service
        residual = (1 - min(load, 1.0)) * s.decode_step(batch, ctx) / 2
        return residual + service + _mdl_wait(load, service)

    batch = _little(lambda b: rate * (ttft(b) + (out - 1) * tpot(b)), cap)
    overloaded = batch >= cap or math.isinf(ttft(batch)) or math.isinf(tpot(batch))
    first, step = ttft(batch), tpot(batch)
    if overloaded:
        # the server at its fullest: the prompts it takes at its batch, the rest queued
        batch = cap
        step = s.decode_step(batch, ctx) + prompt(batch) * batch / out
        first = ttft(batch)
        requests = n * batch / (own_prefill(batch) + (out - 1) * step)
    else:
        requests = rate * n
    return ServingPrediction(
        ttft_ms=first * 1e3,
        tpot_ms=step * 1e3,
        output_tokens_per_s_per_gpu=requests * out / (n * s.role.gpus),
        output_tokens_per_s_per_user=1 / step,
        requests_per_s=requests,
        binding="queueing" if overloaded else _bound(s, batch, ctx),
        batch={s.role.name: int(round(batch))},
        memory_gib={s.role.name: s.memory_gib},
        overloaded=overloaded,
    )


def _step_in_flight(s: Server, w: WorkloadTable, batch: float, ctx: float) -> float:
    """What a closed loop's request waits before its first step: the engine takes new
    requests between steps (vLLM's engine core drains its input queue at the top of each
    step; SGLang's scheduler and TensorRT-LLM's executor likewise), and a closed loop sends
    a request when another finishes, at a step's end, while the next step of the others
    still decoding has begun: one decode step of them. Alone (one in flight) it waits
    for nothing."""
    if w.concurrency is None or batch <= 1:
        return 0.0
    return s.decode_step(batch - 1, ctx)


def _closed_prefill_wait(
    held: float, first: float, tpot: float, out: int, inp: int, s: Server
) -> tuple[float, float]:
    """A closed loop's wait for the prefill (and its requests/s) while every request has a
    slot: prompts that arrive together queue for a step's prefill budget of
    ``step_tokens``, which takes ``floor(chunk / input)`` whole prompts (at least one).
    Each prompt holds the server's prefill for ``first`` over that count and waits M/D/1's
    mean at that load; the loop's requests/s counts the wait (a few rounds of the fixed
    point)."""
    service = first / max(1, s.step_tokens // inp)
    servers = s.role.servers
    wait, requests = 0.0, held / (first + (out - 1) * tpot)
    for _ in range(4):
        wait = _mdl_wait(min(requests / servers * service, 0.95), service)
        requests = held / (first + wait + (out - 1) * tpot)
    return wait, requests


def _little(needed: Any, cap: float, rounds: int = 40) -> float:
    """The batch ``b`` with ``needed(b) == b`` (Little's law), at most ``cap``."""
    low, high = 0.0, float(cap)
    if needed(high) >= high:
        return high
    for _ in range(rounds):
        mid = (low + high) / 2
        if needed(mid) > mid:
            low = mid
        else:
            high = mid
    return high


def _bound(s: Server, batch: float, ctx: float) -> str:
    hbm, compute, comm = s.decode_parts(batch, ctx)
    if comm > max(hbm, compute):
        return "network"
    return "HBM bandwidth" if hbm >= compute else "compute"


def _kv_transfer(p: Server, d: Server, w: WorkloadTable) -> float:
    """Seconds to move one prompt's KV cache from its prefill server to a decode server:
    every prefill GPU sends its share at once."""
    shape = p.shape
    kv_bytes = DTYPE_BYTES.get(p.dep.kv_dtype, 2) if p.dep.kv_dtype != "auto" else 2
    per_token = shape.pattern.parts(0, shape.layers).attention * kv_per_layer(shape, 1)
    total = w.input_tokens * per_token * kv_bytes
    inside = p.dep.gpus <= scale_up_domain(p.hw, p.dep.nproc_per_node)
    return total / (link_rate(p.hw, inside) * p.role.gpus) + 1e-3


def _decode_admission(d: Server, batch: float, ctx: float) -> float:
    """What a request's first token waits on a vLLM decode server after its KV cache
    arrived: the proxy in front (vLLM's disaggregated proxy, llm-d's routing sidecar) sends
    the prompt to a prefill server with ``max_tokens`` 1 and streams the client the decode
    server's output, whose scheduler takes the request between steps (half a step in flight
    on average) and samples its first token in its first step. 0 for the other launchers,
    whose first token comes back with the prefill."""
    if not d.dep.launcher.startswith("vllm"):
        return 0.0
    return 1.5 * d.decode_step(batch, ctx)


def _disaggregated(p: Server, d: Server, w: WorkloadTable) -> ServingPrediction:
    """Prefill servers, the KV transfer, decode servers. At a decode batch ``B`` per decode
    server a step takes ``step(B)``, so the decode servers finish ``X = D x B / (out x
    step(B))`` requests per second (Little's law); the prefill servers then run at load
    ``X x service / P`` and a request waits M/D/1's mean before its prefill. A closed loop
    holds ``D x B + X x TTFT`` requests, which grows with ``B``: the batch is the one that
    holds ``concurrency``. An open loop's batch is the one whose ``X`` is the rate."""
    inp, out = w.input_tokens, w.output_tokens
    ctx = mean_context(w)
    service = p.prefill(inp, inp)
    transfer = _kv_transfer(p, d, w)
    prefill_rate = p.role.servers / service
    cap = float(d.max_batch)
    decoders = d.role.servers
    gpus = p.role.servers * p.role.gpus + decoders * d.role.gpus

    def rate_at(batch: float) -> float:
        return decoders * batch / (out * d.decode_step(batch, ctx))

    # the prefill servers' limit: the batch past which they cannot keep up
    full = (
        cap
        if rate_at(cap) < 0.999 * prefill_rate
        else _bisect(lambda b: rate_at(b) < 0.999 * prefill_rate, cap)
    )
    overloaded, binding = False, ""
    if w.request_rate is not None:
        if rate_at(full) >= w.request_rate:
            target = w.request_rate
            batch = _bisect(lambda b: rate_at(b) < target, full)
        else:
            batch, overloaded = full, True
    else:
        concurrency = float(w.concurrency or 1)

        def held(batch: float) -> float:
            rate = rate_at(batch)
            wait = _mdl_wait(rate / prefill_rate, service)
            return decoders * batch + rate * (service + wait + transfer)

        batch = (
            full if held(full) <= concurrency else _bisect(lambda b: held(b) < concurrency, full)
        )
    rate = rate_at(batch)
    load = rate / prefill_rate
    if batch >= full and full < cap and (overloaded or w.request_rate is None):
        binding = "queueing"
    elif batch >= cap and (overloaded or (w.concurrency or 0) > decoders * cap):
        binding = "KV capacity" if cap == d.capacity_seqs else "batch limit"
    elif load > 0.85:
        binding = "queueing"
    wait = _mdl_wait(min(load, 0.999), service)
    tpot = d.decode_step(batch, ctx)
    ttft = service + wait + transfer + _decode_admission(d, batch, ctx)
    if w.concurrency is not None:
        # a closed loop holds ``concurrency`` requests: those past the decode servers'
        # batches wait for their first token (Little's law), as in an aggregated server
        ttft = max(ttft, (w.concurrency - decoders * batch) / rate)
    return ServingPrediction(
        ttft_ms=ttft * 1e3,
        tpot_ms=tpot * 1e3,
        output_tokens_per_s_per_gpu=rate * out / gpus,
        output_tokens_per_s_per_user=1 / tpot,
        requests_per_s=rate,
        binding=binding or _bound(d, batch, ctx),
        batch={"prefill": 1, "decode": int(round(batch))},
        memory_gib={"prefill": p.memory_gib, "decode": d.memory_gib},
        overloaded=overloaded,
    )


def _bisect(below: Any, high: float, rounds: int = 30) -> float:
    """The largest ``b`` in (0, high] with ``below(b)`` true (``below`` holds up to a point)."""
    low = 0.0
    for _ in range(rounds):
        mid = (low + high) / 2
        if below(mid):
            low = mid
        else:
            high = mid
    return max(low, 1e-6)


# -- the plan as written ---------------------------------------------------------------


def deployment_of(plan: Plan, servers: Sequence[Any]) -> Deployment | None:
    """The plan's servers as a deployment (None when it has none to predict)."""
    roles: dict[str, list[Any]] = {}
    for server in servers:
        if server.gpus <= 0:
            continue  # the router, on no GPU
        name = server.role
        if name in PREFILL_ROLES:
            name = "prefill"
        elif name in DECODE_ROLES:
            name = "decode"
        else:
            name = "server"
        roles.setdefault(name, []).append(server)
    if not roles or ("server" in roles and len(roles) > 1):
        return None
    if "server" not in roles and set(roles) != {"prefill", "decode"}:
        return None
    built = []
    for name in ("server", "prefill", "decode"):
        if name in roles:
            first = roles[name][0]
            built.append(
                Role(
                    name=name,
                    servers=len(roles[name]),
                    gpus=first.gpus,
                    tp=first.tp,
                    pp=first.pp,
                    dp=first.dp,
                    ep=first.ep,
                )
            )
    memory = plan.serving_memory
    hw = plan.hardware
    assert hw is not None
    if memory is not None:
        built = [with_limits(r, memory) for r in built]
    return Deployment(
        launcher=plan.launcher,
        roles=tuple(built),
        kv_dtype=memory.kv_dtype if memory is not None else "auto",
        share=memory.share if memory is not None else 0.9,
        share_of=memory.share_of if memory is not None else "capacity",
        capacity_gib=memory.capacity / GIB if memory is not None else hw.memory_gib,
        nproc_per_node=plan.nproc_per_node,
        cuda_graphs=memory.cuda_graphs if memory is not None else True,
        graph_batch=memory.graph_batch if memory is not None else None,
    )


def with_limits(role: Role, memory: ServingMemory) -> Role:
    """The role with the engine's per-step limits and memory share as the spec sets them: an
    aggregated server's from the estimate's own, a disaggregated role's from its entry (a
    spec written aggregated has none: its roles take the server's, as TensorRT-LLM's
    context and generation servers take [trtllm]'s)."""
    limits = memory.roles.get(role.name)
    if role.name == "server" or limits is None:
        return attrs.evolve(
            role, max_batch=memory.max_batch, step_tokens=memory.step_tokens, share=memory.share
        )
    share = limits.share if limits.share is not None else memory.share
    return attrs.evolve(
        role, max_batch=limits.max_batch, step_tokens=limits.step_tokens, share=share
    )


def predict_plan(plan: Plan, launch: Launch) -> ServingPrediction | None:
    """The prediction for a serving plan as written: with [workload], a complete [model] and
    a known accelerator model; None otherwise."""
    if plan.workload is None or plan.hardware is None or plan.model is None:
        return None
    from mdc.plan.memory import resolve_shape

    shape = resolve_shape(plan.model)
    dep = deployment_of(plan, launch.servers)
    if shape is None or dep is None:
        return None
    return predict(shape, plan.hardware, dep, plan.workload)
