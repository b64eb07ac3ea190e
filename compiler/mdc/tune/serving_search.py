"""The serving search: every deployment of the spec's GPUs its launcher can run, predicted
under its [workload], ranked by output throughput per GPU among those meeting the SLO.

A candidate is the spec with its deployment written in the launcher's own keys
(:data:`~mdc.tune.serving_layouts.WRITERS`): aggregated servers (tp, pp, ep, attention data parallel, and as many
replicas as the GPUs hold) and, where the launcher runs them, prefill/decode splits (the
count and sizes of each role). Each is first predicted from its arithmetic
(:func:`mdc.tune.serving_perf.predict`, with the serving memory estimate deciding what
fits); then, best first, compiled by the same :class:`~mdc.pipeline.Compiler` as ``mdc
compile`` and predicted again from the servers the launcher planned (what ``mdc explain``
shows), until ``top`` of them compile.
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import attrs

from mdc.errors import Finding, SpecError
from mdc.hardware import Accelerator, with_network
from mdc.loaders import LoadedDocument
from mdc.pipeline import Compiler
from mdc.plan.memory import GIB, Shape, resolve_shape
from mdc.plan.named_models import name_model
from mdc.plan.serving_memory import (
    SGLANG_OWN_SOURCE,
    ServingMemory,
    SglangServer,
    sglang_default_share,
)
from mdc.spec import JobSpec, WorkloadTable
from mdc.tune.serving_layouts import WRITERS, searches_graphs, write_graphs, write_share
from mdc.tune.serving_perf import (
    deployment_of,
    predict,
    predict_plan,
    prefill_seconds,
    role_memory,
    shares_fit,
    with_limits,
)
from mdc.tune.serving_records import DEFAULT, Constants, Deployment, Role, ServingPrediction

#: compile at most this many refused candidates before giving up on more rows
MAX_REFUSED = 200
#: the engine's memory share the arithmetic stage assumes where the spec does not compile
#: as written (else compile's estimate gives the spec's)
SHARE = {"trtllm": ("free", 0.9)}
#: the engines' default share, as their plugins estimate it (vLLM --gpu-memory-utilization
#: at 0.11.0, TensorRT-LLM free_gpu_memory_fraction); SGLang's roles instead take the one
#: it picks itself (:func:`sglang_baseline`)
DEFAULT_SHARE = 0.9
#: the larger shares the search tries where a vLLM or TensorRT-LLM role's KV capacity binds
#: and the spec leaves its share at the default, each as far as what the engine keeps
#: outside it allows (:func:`mdc.plan.serving_memory.leaves_reserve`)
RAISED_SHARES = (0.92, 0.95)
#: launchers whose engine is SGLang, which picks its own --mem-fraction-static when not
#: told (:func:`mdc.plan.serving_memory.sglang_default_share`)
SGLANG_SHARES = frozenset({"sglang_disagg"})


def sglang_server(r: Role, shape: Shape) -> SglangServer:
    """What SGLang's own share reads of a role's servers: its limits as the flags write
    them (per DP attention rank times the ranks)."""
    return SglangServer(
        role=r.name,
        tp=r.tp,
        pp=r.pp,
        dp=r.dp,
        chunked_prefill=None if r.step_tokens is None else r.step_tokens * r.dp,
        max_running=None if r.max_batch is None else r.max_batch * r.dp,
        mla=shape.latent is not None,
    )


def sglang_baseline(r: Role, shape: Shape, capacity_gib: float) -> Role:
    """A role whose share the spec leaves to SGLang, at the share SGLang picks for its
    layout, as compile's estimate takes it (0.893 for a DeepSeek-R1 prefill server of 8
    H200s, 0.929 for its decode servers); a share the spec writes is kept."""
    if r.share is not None:
        return r
    return attrs.evolve(r, share=sglang_default_share(capacity_gib, sglang_server(r, shape)))


def _split_counts(budget: int, p: Role, d: Role) -> list[int]:
    """The prefill server counts that leave the rest of ``budget`` GPUs to whole decode
    servers, at least one."""
    return [
        k
        for k in range(1, budget // p.gpus)
        if (budget - k * p.gpus) % d.gpus == 0 and budget > k * p.gpus
    ]


def _engine_settings(
    launcher: str, written: ServingMemory | None, capacity_gib: float
) -> tuple[float, str, str, float]:
    """The engine's memory share, what it is a share of, the KV-cache dtype and the GPU's
    GiB: as the spec writes them, else the engine's defaults; where SGLang picks its own
    share, the default (each layout then takes its own: :func:`sglang_baseline`)."""
    share_of, share = SHARE.get(launcher, ("capacity", DEFAULT_SHARE))
    if written is None:
        return share, share_of, "auto", capacity_gib
    share = DEFAULT_SHARE if written.share_source == SGLANG_OWN_SOURCE else written.share
    return share, written.share_of, written.kv_dtype, written.capacity / GIB


def _graph_settings(written: ServingMemory | None, searched: bool) -> dict[str, Any]:
    """The spec's CUDA-graph settings, which hold for every candidate (--enforce-eager,
    --cuda-graph-max-bs, ...); none written: the engine's defaults; ``searched``: graphs
    for every batch, as :func:`write_graphs` writes them."""
    if written is None or searched:
        return {}
    return {"cuda_graphs": written.cuda_graphs, "graph_batch": written.graph_batch}


def _written_limits(r: Role, written: ServingMemory) -> Role:
    """The role with the limits and share the spec writes; a share SGLang picks itself is
    left open (each layout takes its own: :func:`sglang_baseline`)."""
    r = with_limits(r, written)
    if r.name in written.picked:
        return attrs.evolve(r, share=None)
    return r


@attrs.frozen(kw_only=True)
class Candidate:
    deployment: Deployment
    prediction: ServingPrediction
    meets_slo: bool
    #: without an SLO: no other candidate gives both more per GPU and more per user
    pareto: bool = False
    #: the spec with the deployment written in (written for the rows compiled)
    data: Mapping[str, Any] = attrs.field(factory=dict)

    @property
    def family(self) -> str:
        """The curve the candidate belongs to in the picture: its mode and server sizes."""
        return " + ".join(_role_label(r, servers=False) for r in self.deployment.roles)

    def label(self) -> str:
        dep = self.deployment
        return " + ".join(_role_label(r, share=_share(r, dep)) for r in dep.roles)

    @property
    def key(self) -> tuple[Any, ...]:
        p = self.prediction
        return (
            not self.meets_slo,
            not self.pareto,
            -round(p.output_tokens_per_s_per_gpu, 6),
            -round(p.output_tokens_per_s_per_user, 6),
            round(p.ttft_ms, 6),
            self.label(),
        )


def _share(r: Role, dep: Deployment) -> float:
    """The role's engine memory share: its own, else the deployment's."""
    return r.share if r.share is not None else dep.share


def _role_label(r: Role, servers: bool = True, share: float = DEFAULT_SHARE) -> str:
    name = {"server": "", "prefill": "P ", "decode": "D "}[r.name]
    count = f"{r.servers}x " if servers else ""
    parts = [f"tp{r.tp}"]
    if r.pp > 1:
        parts.append(f"pp{r.pp}")
    if r.dp > 1:
        parts.append(f"dp{r.dp}" if r.dp != r.tp else "adp")
    if r.ep > 1:
        parts.append(f"ep{r.ep}")
    limit = f" b{r.max_batch}" if r.max_batch is not None else ""
    budget = f" t{_tokens(r.step_tokens)}" if r.step_tokens is not None else ""
    memory = f" m{share:g}" if share != DEFAULT_SHARE else ""
    return f"{name}{count}{'.'.join(parts)}{limit}{budget}{memory}"


def _tokens(n: int) -> str:
    """A token budget in the labels: 2k, 16k, or the count where it is no whole k."""
    return f"{n // 1024}k" if n % 1024 == 0 else str(n)


@attrs.frozen(kw_only=True)
class Shortfall:
    """Where no deployment holds one request: the one that comes closest (a server layout
    alone where no deployment was formed), and the memory per GPU of its role with the
    least room."""

    candidate: Candidate
    role: str
    memory: ServingMemory
    #: one request's tokens (prompt and output)
    tokens: int

    @property
    def needed(self) -> int:
        """Bytes of KV cache one request takes on one GPU of the role."""
        return self.memory.kv_per_token * self.tokens

    @property
    def lacking(self) -> int:
        """Bytes of KV cache the role lacks for that request."""
        return self.needed - self.memory.room


@attrs.frozen(kw_only=True)
class Result:
    rows: tuple[Candidate, ...]
    #: every candidate predicted (the picture draws them all)
    predicted: tuple[Candidate, ...]
    generated: int
    fitting: int
    refused: Mapping[str, int]
    workload: WorkloadTable
    gpus: int
    #: the spec of the best candidate the compiler refused (None: none was)
    first_refused: Mapping[str, Any] | None = None
    #: whether each row's spec carries TensorRT-LLM's CUDA graphs the search wrote
    #: (:func:`~mdc.tune.serving_layouts.searches_graphs`)
    graphs_written: bool = False
    #: where none fits memory: the deployment that comes closest (None: one fits)
    shortfall: Shortfall | None = None
    #: where servers hold a request alone but none were paired: the smallest of them
    smallest: Candidate | None = None


# -- the search ------------------------------------------------------------------------


def meets(p: ServingPrediction, w: WorkloadTable) -> bool:
    slo = w.slo
    if p.overloaded:
        return False
    if slo is None:
        return True
    ttft_ok = slo.ttft_ms is None or p.ttft_ms <= slo.ttft_ms
    tpot_ok = slo.tpot_ms is None or p.tpot_ms <= slo.tpot_ms
    return ttft_ok and tpot_ok


class ServingTuner:
    """The serving search of one spec (``doc``: as loaded, a named model not yet filled)."""

    def __init__(self, compiler: Compiler, doc: LoadedDocument, constants: Constants = DEFAULT):
        self.compiler = compiler
        self.doc = doc
        self.constants = constants
        #: deployments searched but not listed: a server that holds no request (dropped
        #: before any prediction), a server layout at the token budgets not chosen
        self.unfit = 0
        #: each server layout checked for memory, predicted as one server alone
        self.alone: dict[Role, Candidate] = {}
        named, _ = name_model(doc)
        from mdc.convert import structure_spec

        self.spec: JobSpec = structure_spec(named.data, compiler.option_types)  # type: ignore[arg-type]

    def requirements(self) -> tuple[Shape, Accelerator, WorkloadTable]:
        """What the search needs, or SpecError naming every missing piece."""
        spec, found = self.spec, []
        launcher = spec.distributed.launcher
        if launcher not in WRITERS:
            found.append(
                Finding(
                    code="MDC622",
                    pointer="/distributed/launcher",
                    message=f"mdc tune does not search {launcher!r}'s deployments yet",
                    hint=f"use one of {', '.join(sorted(WRITERS))}",
                )
            )
        if spec.workload is not None:
            from mdc.passes.serving import workload_findings

            launcher_spec = self.compiler.plugins.launcher(launcher)
            found += workload_findings(launcher_spec, spec.workload)
        if spec.workload is None:
            found.append(
                Finding(
                    code="MDC621",
                    pointer="/workload",
                    message="mdc tune on a serving launcher needs [workload]: the prompt and "
                    "output lengths, and the concurrency or request rate",
                    hint="add [workload] input_tokens, output_tokens and concurrency",
                )
            )
        hw = self._hardware()
        if hw is None:
            found.append(
                Finding(
                    code="MDC611",
                    pointer="/distributed/accelerator_model",
                    message="mdc tune needs a known accelerator_model to predict serving",
                    hint='set [distributed] accelerator_model (e.g. "h200")',
                )
            )
        shape = resolve_shape(spec.model) if spec.model is not None else None
        if shape is None:
            found.append(
                Finding(
                    code="MDC612",
                    pointer="/model",
                    message="mdc tune needs a complete [model] table to predict serving",
                    hint='name a published model: [model] name = "deepseek-ai/DeepSeek-R1"',
                )
            )
        if found:
            raise SpecError([self.compiler._diag(self.doc, f) for f in found])
        assert shape is not None and hw is not None and spec.workload is not None
        return shape, hw, spec.workload

    def _hardware(self) -> Accelerator | None:
        dist = self.spec.distributed
        if dist.accelerator_model is None:
            return None
        hw = self.compiler.plugins.accelerators().get(dist.accelerator_model)
        if hw is None:
            return None
        return with_network(hw, dist.network, dist.nproc_per_node or 1)

    def candidates(self) -> Iterator[Candidate]:
        """Every aggregated deployment, and for each pair of prefill and decode servers
        the split of the GPUs between them (:func:`_split_search`)."""
        shape, hw, workload = self.requirements()
        dist = self.spec.distributed
        launcher = dist.launcher
        nproc, gpus = dist.nproc_per_node or 1, (dist.nnodes or 1) * (dist.nproc_per_node or 1)
        generate = WRITERS[launcher][0]
        written = self._engine_memory()
        graphs = searches_graphs(launcher, self.doc.data)
        share, share_of, kv_dtype, capacity = _engine_settings(
            launcher, written, dist.accelerator_memory_gib or hw.memory_gib
        )
        cache: dict[Any, Any] = {}
        budgeted: dict[Role, Role] = {}

        def deployment(roles: tuple[Role, ...]) -> Deployment:
            return Deployment(
                launcher=launcher,
                roles=roles,
                share=share,
                share_of=share_of,
                kv_dtype=kv_dtype,
                capacity_gib=capacity,
                nproc_per_node=nproc,
                **_graph_settings(written, graphs),
            )

        def predicted(roles: tuple[Role, ...]) -> Candidate:
            dep = deployment(roles)
            prediction = predict(shape, hw, dep, workload, self.constants, cache)
            return Candidate(
                deployment=dep, prediction=prediction, meets_slo=meets(prediction, workload)
            )

        def candidate(roles: tuple[Role, ...]) -> Candidate:
            """The deployment, and where its KV capacity binds at the default share, at the
            best of the larger shares the engine's reserve allows (the others searched)."""
            if launcher in SGLANG_SHARES:  # the share SGLang picks itself, never more
                return predicted(tuple(sglang_baseline(r, shape, capacity) for r in roles))
            first = predicted(roles)
            if first.prediction.binding != "KV capacity" or share != DEFAULT_SHARE:
                return first
            bound = next(r for r in roles if r.name in ("server", "decode"))
            if bound.share not in (None, DEFAULT_SHARE):
                return first
            best = first
            for raised in RAISED_SHARES:
                more = tuple(attrs.evolve(r, share=raised) if r is bound else r for r in roles)
                if not shares_fit(shape, hw, deployment(more), workload, self.constants, cache):
                    break
                self.unfit += 1  # each share tried counts as searched
                tried = predicted(more)
                if tried.key < best.key:
                    best = tried
            return best

        def seconds(role: Role) -> float:
            """A server's seconds to prefill one prompt alone."""
            dep = deployment((role,))
            return prefill_seconds(shape, hw, dep, workload, self.constants, cache)

        def fits(role: Role) -> bool:
            """Whether one such server holds its weights and one request's KV cache."""
            alone = attrs.evolve(role, name="server", servers=1)
            if alone not in self.alone:
                self.alone[alone] = predicted((alone,))
            return _fits(self.alone[alone])

        self.unfit = 0
        self.alone = {}
        for roles in generate(gpus, nproc, shape.experts):
            if not all(fits(r) for r in roles):
                self.unfit += 1
                continue
            if written is not None:  # the per-step limits the spec sets, by role
                roles = tuple(_written_limits(r, written) for r in roles)
            if len(roles) == 1:
                # each server layout at its best token budget, then its batch limit
                whole = self._best_budget(launcher, roles[0], candidate)
                yield whole
                if launcher in BATCH_LIMITS:
                    yield from _batch_limits(whole, workload, candidate)
                continue
            p, d = roles
            if launcher in ROLE_LIMITS and p.step_tokens is None:
                if p not in budgeted:  # a prefill server's budget is every pairing's
                    budgeted[p] = self._prefill_budget(p, launcher, seconds, fits)
                p = budgeted[p]
            budget = gpus  # the router runs beside a server, on no GPU of its own
            counts = _split_counts(budget, p, d)

            def split(k: int, p: Role = p, d: Role = d, budget: int = budget) -> Candidate:
                rest = (budget - k * p.gpus) // d.gpus
                return candidate((attrs.evolve(p, servers=k), attrs.evolve(d, servers=rest)))

            splits = _split_search(counts, split)
            yield from splits
            if launcher in ROLE_LIMITS and d.max_batch is None and splits:
                yield from _decode_limits(counts, splits, workload, split)

    def _best_budget(
        self, launcher: str, role: Role, candidate: Callable[[tuple[Role, ...]], Candidate]
    ) -> Candidate:
        """An aggregated server at its best token budget (the others count as searched)."""
        budgets = _budgets(launcher, role, self.constants)
        self.unfit += len(budgets) - 1
        return min(
            (candidate((attrs.evolve(role, step_tokens=budget),)) for budget in budgets),
            key=lambda c: c.key,
        )

    def _prefill_budget(
        self, p: Role, launcher: str, seconds: Callable[[Role], float], fits: Callable[[Role], bool]
    ) -> Role:
        """The prefill role at the step budget that prefills a prompt soonest (fewer steps:
        fewer weight reads and step overheads), the smaller on a tie (its activations take
        less of the cache). A disaggregated prediction reads the prefill budget only through
        that time (the prefill servers' rate and the TTFT), so this budget is every split's
        and every decode server's best; the others count as searched."""
        tried = [
            attrs.evolve(p, step_tokens=b)
            for b in _budgets(launcher, p, self.constants)
            if fits(attrs.evolve(p, step_tokens=b))
        ]
        if not tried:
            return p
        self.unfit += len(tried) - 1
        return min(tried, key=lambda r: (seconds(r), r.step_tokens or 0))

    def curves(self, result: Result, families: int = 8) -> list[tuple[Candidate, list[Candidate]]]:
        """The best deployment of each of the first ``families`` families (by throughput
        per GPU), predicted at a ladder of requests in flight: the curve a serving
        benchmark draws for it."""
        shape, hw, workload = self.requirements()
        best: dict[str, Candidate] = {}
        for c in sorted(result.predicted, key=lambda c: c.key):
            best.setdefault(c.family, c)
        chosen = sorted(best.values(), key=lambda c: c.key)[:families]
        top = max(2 * (workload.concurrency or 0), 1024)
        ladder = [2**i for i in range(top.bit_length()) if 2**i <= top]
        cache: dict[Any, Any] = {}
        out = []
        for c in chosen:
            points = []
            for load in ladder:
                w = attrs.evolve(workload, concurrency=load, request_rate=None)
                p = predict(shape, hw, c.deployment, w, self.constants, cache)
                points.append(attrs.evolve(c, prediction=p, meets_slo=meets(p, workload)))
            out.append((c, points))
        return out

    def _engine_memory(self) -> ServingMemory | None:
        """The serving memory estimate of the spec as written (its engine's memory share
        and KV-cache dtype, read from the launcher's keys and flags); None when it does
        not compile as written."""
        try:
            plan = self.compiler.compile_document(self.doc, tree=False).plan
        except SpecError:
            return None
        return plan.serving_memory

    def written(self, c: Candidate) -> Candidate:
        """The candidate with its spec: the loaded document with the deployment written in
        the launcher's keys."""
        data = copy.deepcopy(self.doc.data)
        assert isinstance(data, dict)  # the schema check passed: a table
        launcher = self.spec.distributed.launcher
        WRITERS[launcher][1](data, c.deployment.roles)
        if searches_graphs(launcher, self.doc.data):
            write_graphs(data, c.deployment.roles, c.prediction.batch)
        for role in c.deployment.roles:
            if role.share is not None and role.share != c.deployment.share:
                write_share(launcher, data, role)
        return attrs.evolve(c, data=data)

    def run(self, top: int = 5) -> Result:
        workload = self.requirements()[2]
        everything = list(self.candidates())
        fitting = [c for c in everything if _fits(c)]
        if workload.slo is None:  # the front first: each is best at its speed per user
            fitting = pareto_front(fitting)
        fitting.sort(key=lambda c: c.key)
        rows: list[Candidate] = []
        refused: Counter[str] = Counter()
        first_refused: Mapping[str, Any] | None = None
        for c in fitting:
            if len(rows) >= top or sum(refused.values()) >= MAX_REFUSED:
                break
            written = self.written(c)
            compiled = self._compiled(written, refused)
            if compiled is not None:
                rows.append(compiled)
            elif first_refused is None:
                first_refused = written.data
        dist = self.spec.distributed
        return Result(
            rows=tuple(sorted(rows, key=lambda c: c.key)),
            predicted=tuple(fitting),
            generated=len(everything) + self.unfit,
            fitting=len(fitting),
            refused=dict(refused),
            first_refused=first_refused,
            workload=workload,
            gpus=(dist.nnodes or 1) * (dist.nproc_per_node or 1),
            graphs_written=searches_graphs(dist.launcher, self.doc.data),
            shortfall=None if fitting else self._shortfall(everything),
            smallest=None if fitting or everything else self._smallest(),
        )

    def _smallest(self) -> Candidate | None:
        """The server layout of the fewest GPUs that holds a request alone, where one does
        but no deployment was formed of them (a split needs a server of each role)."""
        fit = [(role, c) for role, c in self.alone.items() if _fits(c)]
        # the server as written (at its default token budget) where several budgets fit
        smallest = min(
            fit,
            key=lambda f: (f[1].deployment.gpus, f[0].step_tokens is not None, f[1].key),
            default=None,
        )
        return None if smallest is None else smallest[1]

    def _shortfall(self, everything: list[Candidate]) -> Shortfall | None:
        """Where no deployment holds one request: the one whose role with the least room
        lacks the least KV cache for it. Of the deployments formed, else of the server
        layouts checked alone (None: one of those holds a request, and no deployment was
        formed of it)."""
        pool = everything or list(self.alone.values())
        if any(_fits(c) for c in pool):
            return None
        shape, hw, workload = self.requirements()
        tokens = workload.input_tokens + workload.output_tokens
        found = []
        for c in pool:
            memories = role_memory(shape, hw, c.deployment, workload, self.constants)
            roles = [
                Shortfall(candidate=c, role=r, memory=m, tokens=tokens) for r, m in memories.items()
            ]
            found.append(max(roles, key=lambda s: s.lacking))
        return min(found, key=lambda s: s.lacking, default=None)

    def _compiled(self, c: Candidate, refused: Counter[str]) -> Candidate | None:
        """The candidate as compile plans it, predicted from its servers; None if refused."""
        doc = attrs.evolve(self.doc, data=c.data)
        try:
            compiled = self.compiler.compile_document(doc, tree=False)
        except SpecError as e:
            refused.update(d.code for d in e.diagnostics if d.is_error)
            return None
        plan, launch = compiled.plan, compiled.launch
        prediction = predict_plan(plan, launch)
        dep = deployment_of(plan, launch.servers)
        if prediction is None or dep is None:
            refused.update(["unpredicted"])
            return None
        assert plan.workload is not None
        return attrs.evolve(
            c, deployment=dep, prediction=prediction, meets_slo=meets(prediction, plan.workload)
        )


#: launchers whose aggregated servers' running batch the search limits (and writes)
BATCH_LIMITS = frozenset({"trtllm", "vllm"})
#: disaggregated launchers whose per-role limits the search tries and writes: the
#: prefill role's step budget, the decode role's batch limit (TensorRT-LLM's context and
#: generation tables, vLLM's prefill and decode args)
ROLE_LIMITS = frozenset({"trtllm", "vllm_disagg", "sglang_disagg"})
#: the per-step token budgets the search tries on an aggregated server that the spec leaves
#: open (vLLM --max-num-batched-tokens, TensorRT-LLM max_num_tokens; 8192 is both
#: engines' default): a bigger one prefills a prompt in fewer steps (TTFT) but its
#: activations take KV-cache room
STEP_BUDGETS = (2048, 8192, 16384)


def _budgets(launcher: str, role: Role, c: Constants) -> tuple[int | None, ...]:
    """The budgets to try: the spec's own where it sets one, else :data:`STEP_BUDGETS`
    where the launcher's search writes them; vLLM's none below its request cap, which it
    refuses (MDC625)."""
    if role.step_tokens is not None or launcher not in BATCH_LIMITS | ROLE_LIMITS:
        return (role.step_tokens,)
    if launcher.startswith("vllm"):
        cap = role.max_batch or c.max_batch.get(launcher, 1024)
        return tuple(b for b in STEP_BUDGETS if b >= cap) or (None,)
    return STEP_BUDGETS


def _batch_limits(
    whole: Candidate, workload: WorkloadTable, candidate: Callable[[tuple[Role, ...]], Candidate]
) -> Iterator[Candidate]:
    """Where a server misses the TPOT limit only for its running batch: the largest engine
    batch limit (per attention rank) that meets it. The requests past it queue (TTFT)."""
    slo = workload.slo
    if slo is None or slo.tpot_ms is None or whole.prediction.tpot_ms <= slo.tpot_ms:
        return
    (role,) = whole.deployment.roles
    batch = whole.prediction.batch.get("server", 0)
    per_rank = batch // role.dp
    tpot = slo.tpot_ms

    def limited(n: int) -> Candidate:
        return candidate((attrs.evolve(role, max_batch=n),))

    if per_rank < 2 or limited(1).prediction.tpot_ms > tpot:
        return
    low, high = 1, per_rank - 1
    if whole.deployment.launcher == "vllm" and role.step_tokens is not None:
        high = min(high, role.step_tokens)  # vLLM refuses a cap above its budget (MDC625)
    while low < high:
        mid = (low + high + 1) // 2
        if limited(mid).prediction.tpot_ms <= tpot:
            low = mid
        else:
            high = mid - 1
    yield limited(low)


def _decode_limits(
    counts: list[int],
    splits: list[Candidate],
    workload: WorkloadTable,
    split: Callable[..., Candidate],
) -> Iterator[Candidate]:
    """Where the best split misses the TPOT limit only for its decode batch: the largest
    decode batch limit (per attention rank) that meets it, and the splits searched again
    under it (the requests past it wait for a decode slot: TTFT)."""
    slo = workload.slo
    best = min(splits, key=lambda c: c.key)
    if slo is None or slo.tpot_ms is None or best.prediction.tpot_ms <= slo.tpot_ms:
        return
    p, d = best.deployment.roles
    per_rank = best.prediction.batch.get("decode", 0) // d.dp
    k = p.servers

    def limited(n: int, k: int = k) -> Candidate:
        return split(k, attrs.evolve(p, servers=0), attrs.evolve(d, servers=0, max_batch=n))

    if per_rank < 2 or limited(1).prediction.tpot_ms > slo.tpot_ms:
        return
    low, high = 1, per_rank - 1
    if best.deployment.launcher.startswith("vllm") and d.step_tokens is not None:
        high = min(high, d.step_tokens)  # vLLM refuses a cap above its budget (MDC625)
    while low < high:
        mid = (low + high + 1) // 2
        if limited(mid).prediction.tpot_ms <= slo.tpot_ms:
            low = mid
        else:
            high = mid - 1
    yield from _split_search(counts, lambda k: limited(low, k))


def pareto_front(candidates: list[Candidate]) -> list[Candidate]:
    """The candidates, those on the front of output per GPU against tokens/s per user
    marked (``pareto``)."""
    order = sorted(
        range(len(candidates)),
        key=lambda i: (
            -candidates[i].prediction.output_tokens_per_s_per_user,
            -candidates[i].prediction.output_tokens_per_s_per_gpu,
        ),
    )
    marked = list(candidates)
    best = -1.0
    for i in order:
        per_gpu = candidates[i].prediction.output_tokens_per_s_per_gpu
        if per_gpu > best:
            marked[i] = attrs.evolve(candidates[i], pareto=True)
            best = per_gpu
    return marked


#: the split search looks at this many prefill counts at a time
GRID = 10


def _split_search(counts: list[int], split: Callable[[int], Candidate]) -> list[Candidate]:
    """The candidates of the prefill server counts a coarse-to-fine search looks at: a
    grid over the counts (denser at few prefill servers), then a finer grid between the
    best one's neighbours, until the counts run out. Whole ranges of splits share one
    shape (throughput rises while the prefill servers hold back the decode ones, then
    falls as prefill takes GPUs the decode servers could use), so the best is found in
    a few dozen predictions instead of one per count."""
    seen: dict[int, Candidate] = {}
    low, high = 0, len(counts) - 1
    while high >= low:
        if high - low < GRID:
            for i in range(low, high + 1):
                seen.setdefault(i, split(counts[i]))
            break
        grid = sorted({low + round((high - low) * (j / (GRID - 1)) ** 2) for j in range(GRID)})
        for i in grid:
            seen.setdefault(i, split(counts[i]))
        best = min(grid, key=lambda i: seen[i].key)
        at = grid.index(best)
        low, high = grid[max(0, at - 1)], grid[min(len(grid) - 1, at + 1)]
    return [seen[i] for i in sorted(seen)]


def _fits(c: Candidate) -> bool:
    """Every role's server holds its weights and at least one request's KV cache."""
    return c.prediction.binding != "memory"
