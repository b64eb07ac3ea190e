"""The layout search: every layout the spec leaves open, ranked by predicted throughput.

A candidate is the spec with its open keys filled in. The arithmetic stage estimates
each candidate's memory with the plan's own estimate (:func:`mdc.plan.memory.estimate`)
and its step time with :mod:`mdc.tune.perf`, and drops what does not fit. The best are
then compiled, in rank order, by the same :class:`~mdc.pipeline.Compiler` as
``mdc compile`` (plan pass, launcher and backend checks, no files written) until ``top``
of them compile; a candidate the compiler refuses is skipped with its diagnostic codes.
"""

from __future__ import annotations

import copy
import heapq
import itertools
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from fractions import Fraction
from math import inf
from typing import Any

import attrs

from mdc.api import SearchSpace
from mdc.convert import structure_spec
from mdc.errors import Finding, SpecError
from mdc.hardware import Accelerator, with_network
from mdc.loaders import LoadedDocument
from mdc.passes.accelerator import tensor_core_findings
from mdc.pipeline import Compiled, Compiler
from mdc.plan.build import DEFAULT_ORDER, framework_model
from mdc.plan.memory import (
    GIB,
    HEADROOM,
    REQUIRED_KEYS,
    MemoryEstimate,
    Shape,
    estimate,
    exceeds,
    missing_keys,
    resolve_shape,
    state_floor,
)
from mdc.plan.model import BatchPlan, Sizes, TrainingSetup
from mdc.plan.named_models import name_model
from mdc.plan.ranks import divisors
from mdc.plan.stages import Model, layout_vpp, split_layers
from mdc.spec import JobSpec, ModelTable
from mdc.tune.perf import (
    DEFAULT,
    Constants,
    Layout,
    Prediction,
    bf16_share,
    bf16_stage,
    gemm_precision,
    layout_of,
    predict,
    scale_up_domain,
)
from mdc.tune.terms import recompute_shares

#: shortest sequence slice a context-parallel rank keeps; no other bound on cp (Megatron-Core
#: sets none: NeMo's long-sequence runs of 1M tokens ran cp 32)
MIN_CP_TOKENS = 1024
MAX_VPP = 32
#: compile at most this many refused candidates before giving up on more rows
MAX_REFUSED = 400
#: the share of the memory a layout leaves by default: what compile warns past (MDC262), as
#: the estimate leaves out the CUDA/ROCm context, communication buffers and fragmentation
DEFAULT_HEADROOM = float(1 - HEADROOM)
#: past the top rows, walk at most this many more candidates for one that leaves the headroom
MAX_SEEK = 5000


@attrs.frozen(kw_only=True)
class Candidate:
    """One filled-in layout with its estimates."""

    layout: Layout
    #: the launcher-table switches this candidate sets (sequence parallel, optimizer, recompute)
    switches: Mapping[str, Any]
    prediction: Prediction
    sizes: Sizes
    batch: BatchPlan
    training: TrainingSetup
    #: the plan's memory estimate per GPU (None until estimated)
    memory_bytes: int | None = None

    @property
    def key(self) -> tuple[Any, ...]:
        """Best first: fastest, then smallest, then the layout's own order (deterministic)."""
        L = self.layout
        return (
            -round(self.prediction.tokens_per_s_per_gpu, 6),
            self.memory_bytes or 0,
            L.tp,
            L.pp,
            L.cp,
            L.ep,
            L.etp,
            L.vpp,
            self.batch.micro_batch_size,
            ("none", "selective", "full").index(L.recompute),
            L.recompute_modules or (),
            L.recompute_layers or 0,
            not L.sequence_parallel,
            not L.tp_comm_overlap,
            L.zero_stage,
        )

    def label(self) -> str:
        L = self.layout
        parts = [f"tp{L.tp}", f"pp{L.pp}"]
        if L.vpp > 1:
            parts.append(f"vpp{L.vpp}")
        split = self.switches
        if "decoder_first_pipeline_num_layers" in split:
            first = split["decoder_first_pipeline_num_layers"]
            last = split["decoder_last_pipeline_num_layers"]
            parts.append(f"first{first}/last{last}")
        elif any(k.startswith("account_for_") for k in split):
            counted = [k.split("_")[2] for k in sorted(split) if k.startswith("account_for_")]
            parts.append("+".join(counted) + "-as-layer")
        parts.append(f"cp{L.cp}")
        if L.ep > 1 or L.etp != L.tp:
            parts += [f"ep{L.ep}", f"etp{L.etp}"]
        parts.append(f"dp{L.dp}")
        parts.append(f"mbs{self.batch.micro_batch_size}")
        recompute = L.recompute
        if recompute == "full" and L.recompute_layers is not None:
            recompute = f"full{L.recompute_layers}"
        elif L.recompute_per_op:
            recompute = "selective-op"
        elif L.recompute == "selective" and L.recompute_modules:
            recompute = "sel(" + "+".join(L.recompute_modules) + ")"
        parts.append(f"rc:{recompute}")
        if L.tp > 1:
            parts.append("sp" if L.sequence_parallel else "no-sp")
        if L.tp_comm_overlap:
            parts.append("tp-overlap")
        if L.ep_comm_overlap:
            parts.append("ep-overlap")
        parts.append({0: "ddp", 1: "distopt", 3: "fsdp"}.get(L.zero_stage, f"zero{L.zero_stage}"))
        if L.optimizer_offload:
            parts.append("offload-opt" + ("+param" if L.param_offload else ""))
        return " ".join(parts)


@attrs.frozen(kw_only=True)
class Verified:
    candidate: Candidate
    compiled: Compiled
    data: Mapping[str, Any]

    @property
    def memory(self) -> MemoryEstimate | None:
        return self.compiled.plan.memory


@attrs.frozen(kw_only=True)
class Result:
    hardware: Accelerator
    rows: tuple[Verified, ...]
    #: candidates the search generated, how many had their memory estimated (best first,
    #: until enough compiled) and how many of those fit
    generated: int
    fitting: int
    estimated: int = 0
    #: diagnostic code -> candidates the compiler refused for it
    refused: Mapping[str, int]
    precision: str
    #: the spec of the fastest fitting candidate the compiler refused (None: none was)
    first_refused: Mapping[str, Any] | None = None
    #: bytes per GPU, and the share of them a layout should leave free (--headroom)
    capacity: int = 0
    headroom: float = 0.0
    #: where no layout's model state alone fits the memory, the least of them (bytes per
    #: GPU), found before any candidate is walked
    least_state: int | None = None

    def tight(self, row: Verified) -> bool:
        """Whether ``row``'s estimate eats into the headroom (shown, marked, not chosen)."""
        memory = row.memory.total if row.memory else row.candidate.memory_bytes or 0
        return memory > self.capacity * (1 - self.headroom)

    @property
    def best(self) -> int:
        """The index of the chosen row: the fastest that leaves the headroom (else the
        fastest: then none does)."""
        return next((i for i, row in enumerate(self.rows) if not self.tight(row)), 0)


def _finding(code: str, pointer: str, message: str, hint: str) -> Finding:
    return Finding(code=code, pointer=pointer, message=message, hint=hint)


class Tuner:
    """Search the layouts ``doc`` leaves open."""

    def __init__(self, compiler: Compiler, doc: LoadedDocument, constants: Constants = DEFAULT):
        doc, unnamed = name_model(doc)  # a named model's keys, as compile fills them
        # the flags of the arguments that stand for keys are held as those keys; the specs
        # tune writes keep them as the user wrote them
        read_doc, read = compiler.read_arguments(doc)
        self.compiler, self.doc, self.constants = compiler, doc, constants
        found = [*unnamed, *(d for d in read if d.is_error), *compiler.checker.check(read_doc)]
        if found:
            raise SpecError(found)
        data, written = read_doc.data, doc.data
        assert isinstance(data, dict) and isinstance(written, dict)
        self.data: dict[str, Any] = data
        self.written: dict[str, Any] = written
        self.spec: JobSpec = structure_spec(data, compiler.option_types)
        self.launcher = compiler.plugins.launcher(self.spec.distributed.launcher)
        self.options_type: Any = self.launcher.options_type
        #: [model] with what the launcher's framework fixes filled in (TorchTitan's flavor)
        self.model = framework_model(self.spec.model, self._training(self._options({})))
        self._requirements()
        assert self.launcher.search is not None
        self.space: SearchSpace = self.launcher.search
        model = self.model
        dtype = model.dtype if model is not None else None
        self.dtype = dtype
        self.precision = gemm_precision(dtype, self._training(self._options({})))
        self.window = model.window_size if model is not None else None
        self.window_skip = model.window_attn_skip_freq if model is not None else None
        self._variant_cache: dict[
            tuple[int, int, tuple[tuple[str, Any], ...]],
            list[tuple[dict[str, Any], TrainingSetup]],
        ] = {}
        self._split_cache: dict[int, list[tuple[dict[str, Any], int, int, int]]] = {}
        #: the variants' optimizer settings (:func:`_subgroups`), by id of a cached variant list
        self._subgroup_cache: dict[int, list[tuple[list[int], int | None]]] = {}
        self._predictions: dict[tuple[Layout, float], Prediction] = {}
        self._unrecomputed_cache: dict[int, tuple[TrainingSetup, TrainingSetup]] = {}
        #: the layout classes of the last :meth:`ranked`, in generation order
        self.ranked_classes: list[LayoutClass] = []
        #: the candidates the last walk checked for memory, in its order (for the picture)
        self.walked: list[Candidate] = []
        #: each optimizer setting's recompute settings by the one that bounds each
        #: (:meth:`_recompute_tree`), by id of a cached variant list, setting, stage and vpp
        self._tree_cache: dict[tuple[int, int, int, int], dict[int, list[int]]] = {}
        #: the launcher-table keys the spec holds (written, or read from its pass-through args)
        self._held = self._held_options()
        self.order: str = self._fixed("parallelism", "order") or DEFAULT_ORDER

    # ---- what the spec must give
    def _requirements(self) -> None:
        spec, problems = self.spec, []
        dist = spec.distributed
        if self.launcher.search is None:
            plugins = self.compiler.plugins
            tunable = [n for n in sorted(plugins.launchers) if plugins.launcher(n).search]
            problems.append(
                _finding(
                    "MDC610",
                    "/distributed/launcher",
                    f"the {dist.launcher!r} launcher declares no search space: mdc tune "
                    f"searches the layouts of {', '.join(tunable) or 'no installed launcher'}",
                    f"set launcher to one of: {', '.join(tunable)}"
                    if tunable
                    else "install a launcher plugin whose LauncherSpec has a search space",
                )
            )
        known = self.compiler.plugins.accelerators()
        if dist.accelerator_model is None or dist.accelerator_model not in known:
            problems.append(
                _finding(
                    "MDC611",
                    "/distributed/accelerator_model" if dist.accelerator_model else "/distributed",
                    "mdc tune needs a known [distributed] accelerator_model to predict throughput"
                    + (
                        f" ({dist.accelerator_model!r} is not one)"
                        if dist.accelerator_model
                        else ""
                    ),
                    f"set accelerator_model to one of: {', '.join(known)}",
                )
            )
        else:
            # GEMMs in a precision the chip has no tensor cores for: compile refuses every
            # layout for it (MDC602), so the search says so at once instead of compiling
            # hundreds of layouts to find it out
            training = self._training(self._options({}))
            hardware = known[dist.accelerator_model]
            problems += tensor_core_findings(spec, training, hardware, known)
        shape = resolve_shape(self.model) if self.model is not None else None
        if shape is None:
            missing = missing_keys(self.model or ModelTable()) or list(REQUIRED_KEYS)
            names = ", ".join(missing[:-1]) + (" and " if len(missing) > 1 else "") + missing[-1]
            problems.append(
                _finding(
                    "MDC612",
                    "/model",
                    f"mdc tune needs [model] {names}"
                    + ("" if self.model is not None else " (there is no [model] table)"),
                    f"add {names} to [model]",
                )
            )
        if spec.batch is None or spec.batch.global_batch_size is None:
            problems.append(
                _finding(
                    "MDC613",
                    "/batch",
                    "mdc tune needs [batch] global_batch_size (the batch is held fixed)",
                    "set [batch] global_batch_size",
                )
            )
        if problems:
            raise SpecError([Compiler._diag(self.doc, f) for f in problems])
        assert shape is not None and dist.accelerator_model is not None
        self.shape: Shape = shape
        self.nproc = dist.nproc_per_node or 1
        self.hardware: Accelerator = with_network(
            known[dist.accelerator_model], dist.network, self.nproc
        )
        self.world = (dist.nnodes or 1) * self.nproc
        memory = dist.accelerator_memory_gib or self.hardware.memory_gib
        self.capacity = int(memory * GIB)

    # ---- held-fixed values
    def _fixed(self, table: str, key: str) -> Any:
        if table == self.spec.distributed.launcher:
            return self._held.get(key)
        value = self.data.get(table, {})
        return value.get(key) if isinstance(value, dict) else None

    def _choices(self, table: str, key: str, options: list[Any]) -> list[Any]:
        fixed = self._fixed(table, key)
        return [fixed] if fixed is not None else options

    # ---- the arithmetic stage
    def classes(self) -> Iterator[LayoutClass]:
        """Every layout the spec leaves open (sizes, layer split, micro batch), with the
        training switches each may run (:meth:`_variants`), in generation order."""
        shape, world = self.shape, self.world
        domain = scale_up_domain(self.hardware, self.nproc)
        gbs = self.spec.batch.global_batch_size if self.spec.batch else None
        assert gbs is not None
        moe = shape.experts > 0
        # a data-parallel launcher (DeepSpeed) splits the model only where the user's script
        # does (its mpu, its PipelineModule's stages): those sizes are held as written
        model_split = self.launcher.parallelism == "model"
        tps = self._choices(
            "parallelism",
            "tp",
            [t for t in divisors(world) if domain % t == 0 and (model_split or t == 1)],
        )
        if self._training(self._options({})).tp_comm_overlap:
            # --tp-comm-overlap, held as written: Megatron-LM refuses it with tp 1 (MDC321)
            tps = [t for t in tps if t > 1]
        # --overlap-moe-expert-parallel-comm, held as written: Megatron-Core refuses it with
        # ep 1, with pp > 1 without virtual stages, and with an MTP layer on pp 1 (MDC321)
        ep_overlap = self._training(self._options({})).ep_comm_overlap
        pps = self._choices(
            "parallelism",
            "pp",
            [p for p in divisors(world) if p <= shape.layers] if model_split else [1],
        )
        if ep_overlap and shape.mtp_layers:
            pps = [p for p in pps if p > 1]
        cps = self._choices(
            "parallelism",
            "cp",
            [c for c in divisors(world) if shape.seq // c >= MIN_CP_TOKENS] if model_split else [1],
        )
        micro_batches = self._choices("batch", "micro_batch_size", list(self.space.micro_batches))
        for tp, pp, cp in itertools.product(tps, pps, cps):
            if world % (tp * pp * cp):
                continue
            dp = world // (tp * pp * cp)
            if gbs % dp:
                continue
            # the micro batches that divide the global batch (immutable: shared by classes)
            batches = [
                BatchPlan(global_batch_size=gbs, micro_batch_size=mbs,
                          grad_accum_steps=gbs // (mbs * dp))
                for mbs in micro_batches
                if gbs % (mbs * dp) == 0
            ]  # fmt: skip
            for ep, etp in self._experts(tp, pp, world, moe):
                if ep_overlap and ep == 1:
                    continue
                for split, vpp, heaviest, last in self._splits(pp):
                    placed = tuple(sorted(split.items()))
                    if ep_overlap and pp > 1 and vpp == 1:
                        continue
                    variants = self._variants(tp, -(-heaviest // vpp), split)
                    if not variants:
                        continue
                    subgroups = self._subgroup_cache.get(id(variants))
                    if subgroups is None:
                        subgroups = self._subgroup_cache[id(variants)] = _subgroups(variants)
                    sizes = Sizes(
                        tp=tp, pp=pp, cp=cp, ep=ep, etp=etp, dp=dp,
                        edp=world // (etp * ep * pp), vpp=vpp if vpp > 1 else None,
                    )  # fmt: skip
                    for batch in batches:
                        yield LayoutClass(sizes, batch, heaviest, last, variants, subgroups, placed)

    def candidates(self, keep: Callable[[LayoutClass], bool] | None = None) -> Iterator[Candidate]:
        """Every candidate, each predicted, in generation order (the exhaustive search);
        with ``keep``, only those of the layout classes it keeps (the others unpredicted)."""
        for group in self.classes():
            if keep is not None and not keep(group):
                continue
            for switches, training in group.variants:
                yield self._candidate(group, switches, training)

    def ranked(self) -> tuple[int, Iterator[Candidate]]:
        """How many candidates there are, and the candidates in the order of
        ``sorted(self.candidates(), key=key)``, predicted only as far as the caller reads.

        Two bounds keep most candidates unpredicted. Recompute only adds work, to every
        term: no switch setting runs faster than the same setting without recompute. And the
        optimizer's sharding changes only the data-parallel term: no setting of a layout
        class runs faster than one setting's step less that term. So each class is predicted
        once and waits in a heap under that bound, ahead of every candidate it holds; when
        it reaches the top, each optimizer setting is predicted without recompute and waits
        under that; then its recompute settings are predicted, each only once a setting
        that recomputes no more of any term (:meth:`_recompute_tree`) comes up, under
        that one's step. Before that, the classes
        that differ only in their virtual stages (a family) wait together under one bound:
        each depth runs the same work per micro batch but for the sends, over the micro
        batches and a fill that is shortest at the deepest interleaving. Ties keep generation
        order, as the stable sort does. A candidate that beats its parent's bound raises
        :class:`BoundMissed` (then :meth:`run` ranks exhaustively).
        """
        heap: list[_Entry] = []
        count = 0
        families: dict[tuple[Any, ...], list[tuple[int, LayoutClass]]] = {}
        self.ranked_classes = []
        for index, group in enumerate(self.classes()):
            self.ranked_classes.append(group)
            count += len(group.variants)
            if group.subgroups[0][1] is None:
                for i, (switches, training) in enumerate(group.variants):
                    c = self._candidate(group, switches, training)
                    heap.append((c.key, (index, i), c, None))
                continue
            families.setdefault(group.family, []).append((index, group))
        for members in families.values():
            index, group = members[0]
            if len(members) == 1:
                heap.append(self._class_entry(index, group))
                continue
            c = self._head(group)
            p, L = c.prediction, c.layout
            # the fastest any virtual-stage depth of the family can run: each depth runs the
            # same work per micro batch but for the sends, over its micro batches and the
            # fill, which is the shortest at the deepest interleaving; and the optimizer step
            deepest = max(g.sizes.vpp or 1 for _, g in members)
            least = L.microbatches + L.schedules * (L.pp - 1) / deepest
            work = sum(p.breakdown[k] for k in ("compute", "elementwise", "tp", "cp", "ep"))
            floor = least * work / L.microbatches + p.breakdown["optimizer"]
            bound = p.tokens_per_s_per_gpu * p.step_time_s / floor if floor > 0 else inf
            heap.append((_bound_key(c, bound * (1 + 1e-9)), (index, -3), c, members))
        heapq.heapify(heap)
        return count, self._pop(heap)

    def _head(self, group: LayoutClass) -> Candidate:
        """The class's first optimizer setting without recompute, predicted."""
        head = group.subgroups[0][1]
        assert head is not None
        return self._candidate(group, *group.variants[head])

    def _class_entry(
        self, index: int, group: LayoutClass, candidate: Candidate | None = None
    ) -> _Entry:
        """A class's heap entry: its head predicted (``candidate``, where it already is), the
        class under the fastest any optimizer setting can run, that step less its data-
        parallel term (a hair wider, against float rounding)."""
        c = candidate or self._head(group)
        p = c.prediction
        floor = p.step_time_s - p.breakdown.get("dp", 0.0)
        bound = p.tokens_per_s_per_gpu * p.step_time_s / floor if floor > 0 else inf
        return (_bound_key(c, bound * (1 + 1e-9)), (index, -2), c, (group, None))

    def _pop(self, heap: list[_Entry]) -> Iterator[Candidate]:
        """Pop ``heap`` in order, predicting a class's settings when its bound comes up."""
        while heap:
            entry = heapq.heappop(heap)
            key, order, candidate, pending = entry
            if pending is None:
                yield candidate
                continue
            children: list[_Entry] = []
            if isinstance(pending, list):  # a family: each class under its own bound
                children = [
                    self._class_entry(index, group, candidate if i == 0 else None)
                    for i, (index, group) in enumerate(pending)
                ]
                for child in children:
                    if child[:2] < entry[:2]:
                        raise BoundMissed(child[2].label())
                    heapq.heappush(heap, child)
                continue
            index = order[0]
            if len(pending) == 3:  # the recompute settings a predicted one bounds
                group, subgroup, parent = pending
                children = self._settings(group, subgroup, parent, order)
            elif pending[1] is not None:  # one optimizer setting: its recompute settings
                group, subgroup = pending
                children = [(candidate.key, (index, order[2]), candidate, None)]
                children += self._settings(group, subgroup, order[2], order)
            else:
                group = pending[0]  # the class: each optimizer setting without recompute
                for k, (members, head) in enumerate(group.subgroups):
                    if head is None:
                        for i in members:
                            c = self._candidate(group, *group.variants[i])
                            children.append((c.key, (index, i), c, None))
                        continue
                    c = candidate if k == 0 else self._candidate(group, *group.variants[head])
                    bound = c.prediction.tokens_per_s_per_gpu * (1 + 1e-9)
                    children.append((_bound_key(c, bound), (index, -1, head), c, (group, k)))
            for child in children:
                if child[:2] < entry[:2]:
                    raise BoundMissed(child[2].label())
                heapq.heappush(heap, child)

    def _settings(
        self, group: LayoutClass, subgroup: int, parent: int, order: tuple[int, ...]
    ) -> list[_Entry]:
        """The recompute settings ``parent`` bounds, each predicted; under each (a hair
        wider, against float rounding) the settings it bounds in turn, unpredicted."""
        tree = self._recompute_tree(group, subgroup)
        entries: list[_Entry] = []
        for i in tree.get(parent, ()):
            c = self._candidate(group, *group.variants[i])
            entries.append((c.key, (order[0], i), c, None))
            if i in tree:
                bound = c.prediction.tokens_per_s_per_gpu * (1 + 1e-9)
                entries.append((_bound_key(c, bound), (*order, i), c, (group, subgroup, i)))
        return entries

    def _recompute_tree(self, group: LayoutClass, subgroup: int) -> dict[int, list[int]]:
        """One optimizer setting's recompute settings (variant indices) under the setting
        that bounds each, parent -> children in generation order: its parent is, of the
        settings whose shares of the work run again (:func:`mdc.tune.terms.recompute_shares`)
        are each at most its own, the one that shares the most (then the latest generated);
        the head at the root. A setting none bounds hangs on the head, as all did before."""
        key = (id(group.variants), subgroup, group.heaviest, group.sizes.vpp or 1)
        tree = self._tree_cache.get(key)
        if tree is not None:
            return tree
        members, head = group.subgroups[subgroup]
        assert head is not None
        shares = {
            i: recompute_shares(self.shape, layout_of(
                group.sizes, group.batch, group.variants[i][1], self.dtype, self.order,
                group.heaviest, group.last,
            ))
            for i in members
        }  # fmt: skip
        ranking = sorted(members, key=lambda i: (i != head, sum(shares[i]), i))
        tree = {}
        for n, i in enumerate(ranking[1:], 1):
            below = [
                j
                for j in ranking[:n]
                if all(a <= b for a, b in zip(shares[j], shares[i], strict=True))
            ]
            tree.setdefault(below[-1] if below else head, []).append(i)
        for children in tree.values():
            children.sort()
        self._tree_cache[key] = tree
        return tree

    def _variants(
        self, tp: int, chunk_layers: int, split: Mapping[str, Any]
    ) -> list[tuple[dict[str, Any], TrainingSetup]]:
        """The switch settings to try with the launcher's training setup for each (cached)."""
        key = (tp, chunk_layers, tuple(sorted(split.items())))
        if key not in self._variant_cache:
            variants = [
                (switches, self._training(self._options(switches)))
                for switches in ({**split, **rest} for rest in self._switches(tp, chunk_layers))
            ]
            # Megatron-LM refuses --tp-comm-overlap beside sequence_parallel = false, and
            # --overlap-moe-expert-parallel-comm beside full recompute (MDC321)
            self._variant_cache[key] = [
                (switches, training)
                for switches, training in variants
                if (not training.tp_comm_overlap or (tp > 1 and training.sequence_parallel))
                and not (training.ep_comm_overlap and training.recompute == "full")
                and self._modules_apply(training, switches)
            ]
        return self._variant_cache[key]

    def _modules_apply(self, training: TrainingSetup, switches: Mapping[str, Any]) -> bool:
        """Whether the selective recompute modules a setting searches (not those the spec
        holds) each name a part the model has: dense MLP layers (mlp), experts (moe,
        shared_experts: shared ones), multi-latent attention (mla_up_proj)."""
        modules = training.recompute_modules
        if not modules or not any("recompute_modules" in k for k in switches):
            return True
        shape = self.shape
        parts = shape.pattern.parts(0, shape.layers)
        has = {
            "core_attn": True,
            "mlp": parts.mlp > 0,
            "moe": parts.moe > 0,
            "shared_experts": parts.moe > 0 and shape.shared_ffn > 0,
            "mla_up_proj": shape.latent is not None,
        }
        return all(has.get(module, True) for module in modules)

    def _splits(self, pp: int) -> list[tuple[dict[str, Any], int, int, int]]:
        """How the layers may go on ``pp`` stages: (the launcher's keys that place them, a
        vpp, the layers of the heaviest stage, those of the last), each checked by the plan's
        own split (:func:`mdc.plan.stages.split_layers`, the rules compile applies). Layers
        that divide by pp go evenly; a spec that writes a split keeps it (a layout string
        fixes pp and vpp). Otherwise the launcher's uneven splits are tried (its search
        space's ``uneven_splits``)."""
        if pp in self._split_cache:
            return self._split_cache[pp]
        layers = self.shape.layers
        launcher, space = self.spec.distributed.launcher, self.space
        written = any(self._fixed(launcher, k) is not None for k in space.split_keys)
        uneven = space.uneven_splits
        options: list[dict[str, Any]] = [{}]
        if uneven is not None and not written and pp > 1 and layers % pp:
            options = [dict(o) for o in uneven(layers, pp)]
        model = Model(layers=layers, mtp_layers=self.shape.mtp_layers or None)
        fixed_vpp = self._fixed("parallelism", "vpp")
        found: list[tuple[dict[str, Any], int, int, int]] = []
        interleaves = space.interleaves
        for split in options:
            training = self._training(self._options(split))
            pipeline = training.pipeline
            if pipeline.layout is not None:
                implied, problems = layout_vpp(pipeline, pp)
                vpps = [] if problems else [implied or 1]
            elif fixed_vpp is not None:
                vpps = [fixed_vpp]
            else:
                vpps = list(range(1, min(MAX_VPP, -(-layers // pp)) + 1)) if pp > 1 else [1]
            for vpp in vpps:
                if vpp > 1 and pp == 1:
                    continue  # the interleaved schedule needs pp > 1 (MDC206)
                if interleaves is not None and not interleaves(pp, vpp, {**self._held, **split}):
                    continue  # a schedule the launcher's framework refuses
                stages, _ = split_layers(pipeline, model, pp, vpp if vpp > 1 else None)
                if stages is not None:
                    found.append((split, vpp, stages.heaviest_layers(), stages.layers_of(pp - 1)))
        self._split_cache[pp] = found
        return found

    def _switches(self, tp: int, chunk_layers: int) -> Iterator[dict[str, Any]]:
        """The launcher's switch settings (its search space), less the keys the spec holds."""
        for setting in self.space.switches(tp, chunk_layers, self._held):
            yield {k: v for k, v in setting.items() if self._held.get(k) is None}

    def _experts(self, tp: int, pp: int, world: int, moe: bool) -> list[tuple[int, int]]:
        if not moe:
            ep = self._fixed("parallelism", "ep") or 1
            etp = self._fixed("parallelism", "etp") or tp
            return [(ep, etp)]
        experts = self.shape.experts
        open_eps = [e for e in divisors(experts) if world % e == 0]
        if self.launcher.parallelism != "model":
            open_eps = [1]
        eps = self._choices("parallelism", "ep", open_eps)
        etps = self._choices("parallelism", "etp", sorted({1, tp}))
        return [
            (ep, etp) for ep, etp in itertools.product(eps, etps) if world % (ep * etp * pp) == 0
        ]

    def _candidate(
        self, group: LayoutClass, switches: dict[str, Any], training: TrainingSetup
    ) -> Candidate:
        sizes, batch, heaviest = group.sizes, group.batch, group.heaviest
        order = self.order
        layout = layout_of(sizes, batch, training, self.dtype, order, heaviest, group.last)
        share = bf16_share(self.shape, training, bf16_stage(sizes, training), heaviest)
        # layer splits with the same heaviest stage are the same layout to the model
        prediction = self._predictions.get((layout, share))
        if prediction is None:
            prediction = predict(
                self.shape, layout, self.hardware, nproc_per_node=self.nproc,
                precision=self.precision, constants=self.constants,
                window=self.window, window_skip=self.window_skip, bf16_share=share,
            )  # fmt: skip
            self._predictions[(layout, share)] = prediction
        return Candidate(
            layout=layout,
            switches=switches,
            prediction=prediction,
            sizes=sizes,
            batch=batch,
            training=training,
        )

    def _written(self, table: str) -> dict[str, Any]:
        value = self.data.get(table, {})
        return dict(value) if isinstance(value, dict) else {}

    def _held_options(self) -> dict[str, Any]:
        """The launcher's table as written, with the keys its pass-through arguments set
        (``--recompute-granularity full`` in extra_args is recompute_granularity, read as
        the launcher reads it) and those the job's command overrides (TorchTitan's
        ``--activation_checkpoint.mode full``): every one held, none written again."""
        held = _dotted(self._written(self.spec.distributed.launcher))
        base = self._options({})
        if base is None:
            return held
        read = self._read_command(base)
        if self.launcher.read_args is not None:
            read = self.launcher.read_args(read)
        if read is base:
            return held
        before = _dotted(attrs.asdict(base, recurse=False))
        changed = {
            key: value
            for key, value in _dotted(attrs.asdict(read, recurse=False)).items()
            if value != before.get(key)
        }
        return {**changed, **held}

    def _read_command(self, options: Any) -> Any:
        """``options`` with what the job's command overrides read in (the launcher's
        ``read_command``, as compile reads them for the training setup)."""
        read_command = self.launcher.read_command
        if read_command is None or options is None:
            return options
        return read_command(options, self.spec.job.argv)

    def _options(self, switches: dict[str, Any]) -> Any:
        """The launcher's options with ``switches`` set, as its own type."""
        base: Any = self.spec.plugin_tables.get(self.spec.distributed.launcher)
        if base is None:
            base = self.options_type() if self.options_type else None
        if base is None:
            return None
        values: dict[str, Any] = {}
        for key, value in switches.items():
            if isinstance(value, list):  # a spec's array, as compile structures it
                value = tuple(value)
            name, _, path = key.partition(".")
            if path:  # a key of a nested table: merged into the option's mapping
                merged = values.get(name, getattr(base, name))
                value = _nested_set(merged, path, value)
            values[name] = value
        return attrs.evolve(base, **values)

    def _training(self, options: Any) -> TrainingSetup:
        """How the launcher trains with ``options``: its own ``training`` hook, as compile."""
        hook = self.launcher.training
        return hook(self._read_command(options)) if hook is not None else TrainingSetup()

    def _edits(self, candidate: Candidate) -> dict[tuple[str, str], Any]:
        L, batch = candidate.layout, candidate.batch
        edits: dict[tuple[str, str], Any] = {
            ("parallelism", "tp"): L.tp,
            ("parallelism", "pp"): L.pp,
            ("parallelism", "cp"): L.cp,
            ("batch", "micro_batch_size"): batch.micro_batch_size,
        }
        if self.shape.experts or self._fixed("parallelism", "ep") is not None:
            edits[("parallelism", "ep")] = L.ep
        if self.shape.experts or self._fixed("parallelism", "etp") is not None:
            edits[("parallelism", "etp")] = L.etp
        if L.vpp > 1 or self._fixed("parallelism", "vpp") is not None:
            edits[("parallelism", "vpp")] = L.vpp
        for key, value in candidate.switches.items():
            edits[(self.spec.distributed.launcher, key)] = value
        return edits

    def spec_data(self, candidate: Candidate) -> dict[str, Any]:
        """The spec as written with the candidate's values written in (a deep copy)."""
        data = copy.deepcopy(self.written)
        for (table, key), value in self._edits(candidate).items():
            if self._fixed(table, key) is None:
                data[table] = _nested_set(data.get(table, {}), key, value)
        par = data.get("parallelism", {})
        if "dp" in par and self._fixed("parallelism", "dp") is None:
            del par["dp"]
        return data

    def sample(self, limit: int = 1500) -> list[Candidate]:
        """Up to ``limit`` of the candidates whose memory was checked (for the picture), each
        with its estimate (made here for those the walk ruled out without it)."""
        walked = self.walked
        step = max(1, len(walked) // limit)
        return [
            c if c.memory_bytes is not None else self._with_memory(c)
            for c in walked[::step][:limit]
        ]

    def _unrecomputed(self, training: TrainingSetup) -> TrainingSetup:
        """``training`` without its recompute settings, made once per variant: keyed by
        identity (cheaper than hashing every field), the setup held so its id stays its."""
        held = self._unrecomputed_cache.get(id(training))
        if held is None:
            held = self._unrecomputed_cache[id(training)] = (training, _without_recompute(training))
        return held[1]

    def _state_floor(self, candidate: Candidate) -> int:
        return state_floor(self.shape, candidate.sizes, candidate.training)

    def _least_state(self, groups: list[LayoutClass]) -> int | None:
        """The least model state per GPU of any optimizer setting of ``groups``, where each
        exceeds the memory (:func:`mdc.plan.memory.state_floor`, which no batch or
        recompute setting lowers); None as soon as one fits. Where none does, no candidate
        fits, and the walk down the ranking would predict every one of them to find that
        out (seconds, for a large MoE model on a few nodes). The most split layouts hold
        the least state: checked first, the answer comes after a few where a layout fits."""

        def split(group: LayoutClass) -> int:
            s = group.sizes
            return -s.tp * s.pp * s.ep * s.etp

        least: int | None = None
        seen: set[tuple[Any, ...]] = set()
        for group in sorted(groups, key=split):
            s = group.sizes
            for members, _ in group.subgroups:
                training = self._unrecomputed(group.variants[members[0]][1])
                state = (s.tp, s.pp, s.cp, s.ep, s.etp, s.vpp, training)
                if state in seen:
                    continue
                seen.add(state)
                floor = state_floor(self.shape, s, training)
                if floor <= self.capacity:
                    return None
                least = floor if least is None else min(least, floor)
        return least

    def _none_fit(self, generated: int, headroom: float, least_state: int) -> Result:
        """The result where every candidate's model state alone exceeds the memory: no row,
        none walked."""
        self.walked = []
        return Result(
            hardware=self.hardware,
            rows=(),
            generated=generated,
            fitting=0,
            refused={},
            precision=self.precision,
            capacity=self.capacity,
            headroom=headroom,
            least_state=least_state,
        )

    def _exceeds(self, candidate: Candidate) -> bool:
        c = candidate
        return exceeds(self.shape, c.sizes, c.batch, c.training, self.capacity)

    def _with_memory(self, candidate: Candidate) -> Candidate:
        memory = estimate(self.shape, candidate.sizes, candidate.batch, candidate.training)
        return attrs.evolve(candidate, memory_bytes=memory.total)

    # ---- the compile stage
    def run(self, top: int = 5, headroom: float = DEFAULT_HEADROOM) -> Result:
        """Rank every candidate by predicted throughput, then walk down the ranking: the
        plan's memory estimate, then the compiler, until ``top`` candidates pass both, and
        one of them leaves ``headroom`` of the memory free (a faster layout above it stays
        in the ranking, marked: published layouts run there, and the estimate is one).

        The memory estimate grows with the micro batch (activations of min(pp, m) micro
        batches of b sequences each, with b * m fixed by the global batch), so once a layout
        does not fit at micro batch b, its larger micro batches are not estimated again.
        """
        try:
            count, ranked = self.ranked()
            least = self._least_state(self.ranked_classes) if self.prune_memory else None
            if least is not None:
                return self._none_fit(count, headroom, least)
            return self._walk(count, ranked, top, headroom)
        except BoundMissed:
            return self.run_exhaustive(top, headroom)

    def run_exhaustive(self, top: int = 5, headroom: float = DEFAULT_HEADROOM) -> Result:
        """:meth:`run` over every candidate predicted and sorted (the reference ranking)."""
        everything = sorted(self.candidates(), key=lambda c: c.key)
        return self._walk(len(everything), iter(everything), top, headroom)

    #: estimate in full only the candidates that fit: rule out one whose model state alone
    #: exceeds the capacity (:func:`mdc.plan.memory.state_floor`, a lower bound on the
    #: estimate) or one of whose stages does (:func:`mdc.plan.memory.exceeds`) without it.
    #: False: every candidate down the ranking is estimated in full, with the same result
    prune_memory = True

    def _walk(
        self, generated: int, ranked: Iterator[Candidate], top: int, headroom: float
    ) -> Result:
        rows: list[Verified] = []
        roomy = self.capacity * (1 - headroom)  # a row at most this large leaves the headroom
        chosen = False  # whether a row leaves it
        seek = MAX_SEEK
        refused: Counter[str] = Counter()
        first_refused: dict[str, Any] | None = None
        walked: list[Candidate] = []
        too_big: dict[tuple[Any, ...], int] = {}
        #: the model state of each family: the sizes and the training setup less its
        #: recompute settings fix it (state_floor reads none of those), so the families that
        #: differ only in recompute share one
        floors: dict[tuple[Any, ...], int] = {}
        shown: set[tuple[float, int | None]] = set()
        shown_sizes: set[tuple[int, ...]] = set()
        shown_traded: set[tuple[Any, ...]] = set()
        fitting = 0
        for candidate in ranked:
            if (len(rows) >= top and chosen) or sum(refused.values()) >= MAX_REFUSED:
                break
            if len(rows) >= top:
                seek -= 1
                if seek < 0:
                    break
            L = candidate.layout
            family = (L.tp, L.pp, L.cp, L.ep, L.etp, L.vpp, candidate.training)
            if candidate.batch.micro_batch_size >= too_big.get(family, 1 << 30):
                continue
            if not self.prune_memory:
                candidate = self._with_memory(candidate)
            else:
                state = family[:-1] + (self._unrecomputed(candidate.training),)
                if state not in floors:
                    floors[state] = self._state_floor(candidate)
                if floors[state] <= self.capacity and not self._exceeds(candidate):
                    candidate = self._with_memory(candidate)  # it fits
            walked.append(candidate)
            if candidate.memory_bytes is None or candidate.memory_bytes > self.capacity:
                too_big[family] = min(
                    too_big.get(family, 1 << 30), candidate.batch.micro_batch_size
                )
                continue
            fitting += 1
            # a layout that trades cp, dp and the micro batch for one another at the same
            # predicted speed and memory is the same choice: the first (simplest) one stands
            same = (round(candidate.prediction.tokens_per_s_per_gpu, 3), candidate.memory_bytes)
            # and each parallel layout (its sizes) once, at its best micro batch, virtual
            # stages and training switches: those are schedule settings of the layout, whose
            # variants lie within a few percent of one another and would fill the top rows
            sizes = (L.tp, L.pp, L.cp, L.ep, L.etp)
            # so is one that splits the same tokens per rank over cp instead of the micro
            # batch (cp 2 at two sequences, cp 1 at one): the same work and about the same
            # memory, a little slower for attention's shorter kernels; the faster stands
            traded = (L.tp, L.pp, L.ep, L.etp, Fraction(candidate.batch.micro_batch_size, L.cp))
            if len(rows) >= top and candidate.memory_bytes > roomy:
                continue  # past the top rows, only a layout that leaves the headroom
            # (which may be a shown layout's sizes with more recompute or sharding)
            repeats = sizes in shown_sizes or traded in shown_traded
            # a shown layout's sizes again before the top rows are full only where none of
            # those leaves the headroom and this one does (more sharding, offload, recompute)
            again = chosen or candidate.memory_bytes > roomy
            if same in shown or (repeats and len(rows) < top and again):
                shown.add(same)  # its equivalents are that layout's variants too
                continue
            data = self.spec_data(candidate)
            doc = attrs.evolve(self.doc, data=data)
            try:
                compiled = self.compiler.compile_document(doc, tree=False)
            except SpecError as exc:
                codes = sorted({d.code for d in exc.diagnostics if d.is_error})
                refused.update(codes or ["?"])
                if first_refused is None:
                    first_refused = data
                continue
            rows.append(Verified(candidate=candidate, compiled=compiled, data=data))
            chosen = chosen or candidate.memory_bytes <= roomy
            shown.add(same)
            shown_sizes.add(sizes)
            shown_traded.add(traded)
        self.walked = walked
        rows.sort(key=lambda r: r.candidate.key)
        return Result(
            hardware=self.hardware,
            rows=tuple(rows),
            generated=generated,
            fitting=fitting,
            estimated=len(walked),
            refused=dict(sorted(refused.items())),
            precision=self.precision,
            first_refused=first_refused,
            capacity=self.capacity,
            headroom=headroom,
        )


class BoundMissed(Exception):
    """A candidate ranked faster than its class's bound (see :meth:`Tuner.ranked`)."""


@attrs.frozen
class LayoutClass:
    """Sizes, layer split and micro batch: the candidates that differ only in switches."""

    sizes: Sizes
    batch: BatchPlan
    #: layers of the heaviest pipeline stage
    heaviest: int
    #: layers of the last pipeline stage (which also runs the output layer)
    last: int
    #: (launcher switches, training setup) the class may run, in generation order
    variants: list[tuple[dict[str, Any], TrainingSetup]]
    #: the variants' indices by optimizer setting, each with its head (:func:`_subgroups`)
    subgroups: list[tuple[list[int], int | None]]
    #: the launcher's keys that place the layers (sorted items; empty: the even split)
    split: tuple[tuple[str, Any], ...] = ()

    @property
    def family(self) -> tuple[Any, ...]:
        """The classes that differ only in their virtual stages share it."""
        s = self.sizes
        return (s.tp, s.pp, s.cp, s.ep, s.etp, self.batch.micro_batch_size, self.heaviest,
                self.last, self.split)  # fmt: skip


#: a heap entry: sort key, generation order (ties), the candidate, and what it stands for
#: (None: itself; a list: a family's classes; else the class and its optimizer settings, or
#: one setting's index; with a third item, the recompute settings that variant bounds)
_Entry = tuple[tuple[Any, ...], tuple[int, ...], Candidate, Any]


def _subgroups(
    variants: list[tuple[dict[str, Any], TrainingSetup]],
) -> list[tuple[list[int], int | None]]:
    """The variants by how they train other than recompute (the optimizer's sharding), each
    with the one whose step bounds the rest: the first without recompute, or the first when
    all recompute alike; None when neither (each is then predicted)."""
    members: dict[TrainingSetup, list[int]] = {}
    for i, (_, training) in enumerate(variants):
        members.setdefault(_without_recompute(training), []).append(i)
    found: list[tuple[list[int], int | None]] = []
    for indices in members.values():
        trainings = [variants[i][1] for i in indices]
        head = next(
            (i for i, t in zip(indices, trainings, strict=True) if t.recompute == "none"), None
        )
        kinds = {(t.recompute, t.recompute_method, t.recompute_num_layers) for t in trainings}
        if head is None and len(kinds) == 1:
            head = indices[0]
        found.append((indices, head))
    return found


def _dotted(table: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``table`` with the keys of its nested tables added as dotted keys ("a.b"): a
    search space names a nested switch that way, and the spec holds it when written."""
    found: dict[str, Any] = {}
    for key, value in table.items():
        found[prefix + key] = value
        if isinstance(value, Mapping):
            found.update(_dotted(value, f"{prefix}{key}."))
    return found


def _nested_set(table: Mapping[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A copy of ``table`` with the dotted ``path`` set to ``value`` (tables made as needed)."""
    head, _, rest = path.partition(".")
    copied = dict(table)
    if rest:
        inner = copied.get(head)
        copied[head] = _nested_set(inner if isinstance(inner, Mapping) else {}, rest, value)
    else:
        copied[head] = value
    return copied


def _without_recompute(training: TrainingSetup) -> TrainingSetup:
    return attrs.evolve(
        training, recompute="none", recompute_method=None, recompute_num_layers=None,
        recompute_every=None, recompute_modules=None,
    )  # fmt: skip


def _bound_key(candidate: Candidate, tokens_per_s: float) -> tuple[Any, ...]:
    """A sort key ahead of every candidate of ``candidate``'s sizes and micro batch that
    runs at most ``tokens_per_s``."""
    L = candidate.layout
    return (-round(tokens_per_s, 6), 0, L.tp, L.pp, L.cp, L.ep, L.etp, L.vpp,
            candidate.batch.micro_batch_size, -1)  # fmt: skip
