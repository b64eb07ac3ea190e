"""Which transformer layers each pipeline stage holds, by the launcher's framework's rule.

Pure arithmetic, no I/O. A launcher names its rule in ``TrainingSetup.pipeline``:

* ``"even"``: every stage holds num_layers / pp layers, and each of its virtual
  stages num_layers / (pp * vpp) (the rule mdc applied to every launcher before).
* ``"megatron"``: Megatron-LM / megatron-core 0.16 (``megatron/training/arguments.py``,
  ``TransformerConfig.__post_init__``, ``get_num_layers_to_build`` and
  ``PipelineParallelLayerLayout``): an even split, optionally counting the input
  embedding and the loss as one layer each (``--account-for-embedding-in-pipeline-split``,
  ``--account-for-loss-in-pipeline-split``), or fixed first/last stages
  (``--decoder-first-pipeline-num-layers``, ``--decoder-last-pipeline-num-layers``) with
  the rest even, or an explicit layout string (``--pipeline-model-parallel-layout``).
* ``"torchtitan"``: TorchTitan 0.2.2 (``torchtitan/distributed/pipeline_parallel.py``):
  num_layers plus the first/last stage weights spread over pp * vpp stages, the first
  ``remainder`` stages one layer more; stages go to ranks looped (rank r: r, r + pp, ...)
  or V-shaped (rank r: r and 2 pp - 1 - r).

A split is kept as runs of consecutive pipeline ranks that hold the same layers, so it
costs O(number of runs), not O(pp), however large the job.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

import attrs

from mdc.errors import Finding, Severity

#: the layout string's characters (megatron-core's PipelineParallelLayerLayout)
LAYOUT_CHARS = {"E": "embedding", "L": "loss", "t": "decoder", "m": "mtp"}
#: a layout longer than this once its repetitions are unrolled is refused unread
MAX_LAYOUT = 1 << 20


@attrs.frozen(kw_only=True, cache_hash=True)
class PipelineSplit:
    """A launcher's rule for placing layers on pipeline stages (``TrainingSetup.pipeline``).
    Hashed once: it keys the memory estimate's cached split."""

    rule: str = "even"
    #: Megatron-LM: --decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers
    first: int | None = None
    last: int | None = None
    #: Megatron-LM: --account-for-embedding-in-pipeline-split / ...-loss-in-pipeline-split
    embedding: bool = False
    loss: bool = False
    #: Megatron-LM: --pipeline-model-parallel-layout
    layout: str | None = None
    #: TorchTitan: pipeline_parallel_first_stage_less_layers / ..._last_stage_less_layers
    first_less: int = 1
    last_less: int = 1
    #: TorchTitan: a V-shaped schedule (ZBVZeroBubble, DualPipeV) places stages in a V
    v_shaped: bool = False
    #: virtual stages per rank the framework makes when vpp is not written (TorchTitan's
    #: looped schedules: 2)
    default_vpp: int | None = None
    #: where each of the keys above was written: (key, JSON pointer) pairs, for findings
    pointers: tuple[tuple[str, str], ...] = ()

    def pointer(self, key: str, default: str = "/parallelism/pp") -> str:
        return dict(self.pointers).get(key, default)


@attrs.frozen(kw_only=True)
class StageRun:
    """Pipeline ranks first_rank .. first_rank + count - 1, which hold the same layers."""

    first_rank: int
    count: int
    #: decoder layers of each virtual stage (model chunk) of one of these ranks
    chunks: tuple[int, ...]

    @property
    def layers(self) -> int:
        return sum(self.chunks)


@attrs.frozen(kw_only=True)
class StageLayers:
    """The decoder layers of every pipeline rank and virtual stage."""

    pp: int
    vpp: int
    runs: tuple[StageRun, ...]

    def chunks_of(self, rank: int) -> tuple[int, ...]:
        for run in self.runs:
            if run.first_rank <= rank < run.first_rank + run.count:
                return run.chunks
        raise IndexError(rank)

    def layers_of(self, rank: int) -> int:
        return sum(self.chunks_of(rank))

    def layer_spans(self, rank: int) -> list[tuple[int, int]]:
        """The layer indices (start, stop) of each virtual stage of ``rank``: layers are
        numbered through virtual stage 0 of ranks 0..pp-1, then virtual stage 1, ..."""
        spans = []
        base = 0
        for k in range(self.vpp):
            before = sum(
                run.chunks[k] * (min(run.first_rank + run.count, rank) - run.first_rank)
                for run in self.runs
                if run.first_rank < rank
            )
            size = self.chunks_of(rank)[k]
            spans.append((base + before, base + before + size))
            base += sum(run.chunks[k] * run.count for run in self.runs)
        return spans

    def heaviest_layers(self) -> int:
        """The most decoder layers any stage holds (each run's ranks hold alike)."""
        return max(run.layers for run in self.runs)

    def candidate_ranks(self) -> list[int]:
        """The ranks whose memory can be the largest: the first of each run and the last
        rank (within a run, a lower rank keeps more micro batches in flight)."""
        return sorted({run.first_rank for run in self.runs} | {self.pp - 1})

    def as_json(self) -> list[dict[str, object]]:
        return [
            {
                "ranks": [run.first_rank, run.first_rank + run.count - 1],
                "layers": run.layers,
                "virtual_stages": list(run.chunks),
            }
            for run in self.runs
        ]


def _runs(
    pp: int, breaks: Iterable[int], chunks_of: Callable[[int], tuple[int, ...]]
) -> StageLayers:
    """Runs from the ranks where the chunks may change (evaluated at each break only)."""
    starts = sorted({b for b in breaks if 0 <= b < pp} | {0})
    runs: list[StageRun] = []
    for index, start in enumerate(starts):
        end = starts[index + 1] if index + 1 < len(starts) else pp
        chunks = chunks_of(start)
        if runs and runs[-1].chunks == chunks:
            last = runs[-1]
            runs[-1] = attrs.evolve(last, count=last.count + end - start)
        else:
            runs.append(StageRun(first_rank=start, count=end - start, chunks=chunks))
    vpp = len(runs[0].chunks)
    return StageLayers(pp=pp, vpp=vpp, runs=tuple(runs))


# only read, never compared or printed: no generated ==, hash or repr (start-up time)
@attrs.frozen(kw_only=True, eq=False, repr=False)
class Model:
    """What the split needs from [model]."""

    layers: int
    #: multi-token-prediction layers (a layout string places them); None: none
    mtp_layers: int | None = None


def split_layers(
    split: PipelineSplit, model: Model, pp: int, vpp: int | None
) -> tuple[StageLayers | None, list[Finding]]:
    """The layers of every stage, or None and the framework's refusals."""
    if split.rule == "megatron":
        if split.layout is not None:
            return _megatron_layout(split, model, pp, vpp)
        if split.first is not None or split.last is not None:
            return _megatron_uneven(split, model.layers, pp, vpp)
        return _megatron_even(split, model.layers, pp, vpp)
    if split.rule == "torchtitan":
        return _torchtitan(split, model.layers, pp, vpp or 1)
    return _megatron_even(PipelineSplit(rule="even"), model.layers, pp, vpp)


# ----------------------------------------------------------------------------- Megatron


def _divisors(n: int, limit: int = 12) -> str:
    found = [d for d in range(1, min(n, 10**6) + 1) if n % d == 0]
    return ", ".join(map(str, found[:limit])) + (", ..." if len(found) > limit else "")


def _even_hint(layers: int, pp: int, megatron: bool) -> str:
    text = f"pp can be one of {_divisors(layers)}"
    if not megatron:
        return text
    options = []
    for embedding, loss in ((True, True), (True, False), (False, True)):
        if (layers + embedding + loss) % pp == 0:
            keys = [k for k, on in (("embedding", embedding), ("loss", loss)) if on]
            options.append(" and ".join(f"account_for_{k}_in_pipeline_split = true" for k in keys))
    if options:
        return f"{text}; or keep pp {pp} with [megatron] {options[0]}"
    return (
        f"{text}; or give the first and last stages their own layer counts ([megatron] "
        "decoder_first_pipeline_num_layers, decoder_last_pipeline_num_layers)"
    )


def _megatron_even(
    split: PipelineSplit, layers: int, pp: int, vpp: int | None
) -> tuple[StageLayers | None, list[Finding]]:
    megatron = split.rule == "megatron"
    ends = int(split.embedding) + int(split.loss)
    counted = layers + ends
    described = (
        f"num_layers ({layers})"
        if not ends
        else f"num_layers + {ends} (the "
        + " and the ".join(
            k for k, on in (("embedding", split.embedding), ("loss", split.loss)) if on
        )
        + f", counted as layers) = {counted}"
    )
    if counted % pp:
        return None, [
            Finding(
                code="MDC222",
                message=f"{described} is not divisible by pp ({pp})"
                + (
                    " (Megatron-LM: 'Number of layers should be divisible by the "
                    "pipeline-model-parallel size')"
                    if megatron
                    else ""
                ),
                pointer="/model/num_layers",
                hint=_even_hint(layers, pp, megatron),
            )
        ]
    per_rank = counted // pp
    v = vpp or 1
    if per_rank % v:
        fitting = [str(d) for d in range(2, min(per_rank, 10**6) + 1) if per_rank % d == 0]
        return None, [
            Finding(
                code="MDC223",
                message=f"layers per pipeline stage ({counted} / {pp} = {per_rank}) is not "
                f"divisible by vpp ({v})"
                + (
                    " (megatron-core: 'num_layers_per_pipeline_rank should be divisible by "
                    "vp_size')"
                    if megatron
                    else ""
                ),
                pointer="/parallelism/vpp",
                hint=f"vpp can be one of {', '.join(fitting[:12])}" if fitting else "remove vpp",
            )
        ]
    chunk = per_rank // v
    findings = []
    # the embedding (loss) takes one layer's place in the first (last) virtual stage
    for on, name, key in ((split.embedding, "first", "embedding"), (split.loss, "last", "loss")):
        if on and chunk < 1:
            findings.append(
                Finding(
                    code="MDC227",
                    message=f"the {key}, counted as a layer, fills the {name} virtual stage "
                    f"({chunk} layer(s)), leaving a negative number of transformer layers "
                    f"(megatron-core: 'Not enough layers in the {name} virtual pipeline stage')",
                    pointer=split.pointer(key),
                    hint="use fewer virtual stages (vpp) or turn the accounting off",
                )
            )
    if findings:
        return None, findings

    def chunks_of(rank: int) -> tuple[int, ...]:
        sizes = [chunk] * v
        if split.embedding and rank == 0:
            sizes[0] -= 1
        if split.loss and rank == pp - 1:
            sizes[-1] -= 1
        return tuple(sizes)

    return _runs(pp, (0, 1, pp - 1), chunks_of), []


def _megatron_uneven(
    split: PipelineSplit, layers: int, pp: int, vpp: int | None
) -> tuple[StageLayers | None, list[Finding]]:
    """TransformerConfig's checks for --decoder-first/last-pipeline-num-layers, in its order."""
    findings = _accounting_beside_counts(split) or _end_counts_against_vpp(split, vpp)
    if findings:
        return None, findings
    ends = [(n, v) for n, v in (("first", split.first), ("last", split.last)) if v is not None]
    middle = _Middle(
        layers=layers - sum(v for _, v in ends),
        stages=pp - len(ends),
        given=" and ".join(f"decoder_{n}_pipeline_num_layers ({v})" for n, v in ends),
        pointer=split.pointer("first" if split.first is not None else "last"),
    )
    refused = _middle_refused(split, layers, pp, vpp, middle)
    if refused is not None:
        return None, [refused]
    return _uneven_stages(split, layers, pp, vpp, middle)


def _accounting_beside_counts(split: PipelineSplit) -> list[Finding]:
    """The embedding or loss accounted as a layer beside first/last stage counts."""
    return [
        Finding(
            code="MDC227",
            message=f"account_for_{key}_in_pipeline_split cannot be combined with "
            "decoder_first_pipeline_num_layers or decoder_last_pipeline_num_layers "
            "(megatron-core: 'num_layers_in_first_pipeline_stage and "
            "num_layers_in_last_pipeline_stage cannot be set at the same time with "
            "account_for_embedding_in_pipeline_split and "
            "account_for_loss_in_pipeline_split')",
            pointer=split.pointer(key),
            hint=f"remove account_for_{key}_in_pipeline_split, or the first/last "
            "stage layer counts",
        )
        for key in ("embedding", "loss")
        if getattr(split, key)
    ]


def _end_counts_against_vpp(split: PipelineSplit, vpp: int | None) -> list[Finding]:
    """A first or last stage count that the virtual stages do not divide."""
    return [
        Finding(
            code="MDC227",
            message=f"decoder_{name}_pipeline_num_layers ({value}) must be divisible "
            f"by vpp ({vpp}) (megatron-core: 'number of layers at {name} stage ... "
            "must be divisible by virtual pipeline parallel degree')",
            pointer=split.pointer(name),
            hint=f"use a multiple of {vpp}",
        )
        for name, value in (("first", split.first), ("last", split.last))
        if value is not None and vpp is not None and value % vpp
    ]


@attrs.frozen
class _Middle:
    """What the first/last stage counts leave to the middle stages."""

    layers: int
    #: pp less the stages given a count (negative: pp 1 with both counts)
    stages: int
    #: the counts given, for messages
    given: str
    pointer: str

    @property
    def per_stage(self) -> int:
        return self.layers // self.stages if self.stages > 0 else 0


def _middle_refused(
    split: PipelineSplit, layers: int, pp: int, vpp: int | None, middle: _Middle
) -> Finding | None:
    """The first of megatron-core's checks of the middle stages that fails, if any."""
    given, pointer, per_middle = middle.given, middle.pointer, middle.per_stage
    if bool(middle.layers) != bool(middle.stages):
        return Finding(
            code="MDC227",
            message=f"with {given}, {middle.layers} layer(s) remain for "
            f"{middle.stages} middle pipeline stage(s) (megatron-core: 'Mismatch: "
            "middle layers remaining but middle PP stages available')",
            pointer=pointer,
            hint=f"the first and last stages must hold all {layers} layers when pp = {pp}"
            if middle.stages <= 0
            else "leave layers for the middle stages",
        )
    if middle.stages and middle.layers % middle.stages:
        return Finding(
            code="MDC227",
            message=f"with {given}, the {middle.layers} remaining layers do not divide "
            f"over the {middle.stages} middle pipeline stages (megatron-core: 'number of "
            "layers at middle stage must be divisible by the middle pipeline model "
            "parallel size')",
            pointer=pointer,
            hint=_uneven_hint(layers, pp, split),
        )
    if middle.stages and vpp is not None and per_middle % vpp:
        return Finding(
            code="MDC227",
            message=f"each middle pipeline stage holds {per_middle} layers, not divisible "
            f"by vpp ({vpp}) (megatron-core: 'number of layers on each middle pipeline "
            "rank must be divisible by virtual pipeline parallel degree')",
            pointer="/parallelism/vpp",
            hint="change vpp, or the first/last stage layer counts",
        )
    if middle.stages > 0 and per_middle < 0:
        # TransformerConfig lets this through (a negative multiple of the middle stages);
        # get_num_layers_to_build would then build a negative number of layers
        return Finding(
            code="MDC227",
            message=f"{given} add up to more than num_layers ({layers}): each middle "
            f"stage would hold {per_middle} layers",
            pointer=pointer,
            hint=f"the first and last stages can hold at most {layers} layers together",
        )
    return None


def _uneven_stages(
    split: PipelineSplit, layers: int, pp: int, vpp: int | None, middle: _Middle
) -> tuple[StageLayers, list[Finding]]:
    """The stages megatron-core builds, and a warning where they are not every layer."""
    v = vpp or 1

    def chunks_of(rank: int) -> tuple[int, ...]:
        count = middle.per_stage
        if rank == 0 and split.first is not None:
            count = split.first
        if rank == pp - 1 and split.last is not None:
            count = split.last
        return (count // v,) * v

    stages = _runs(pp, (0, 1, pp - 1), chunks_of)
    built = sum(run.layers * run.count for run in stages.runs)
    if built != layers:
        # pp = 1 with both counts: megatron-core accepts, and builds the last stage's count
        return stages, [
            Finding(
                code="MDC227",
                severity=Severity.WARNING,
                message=f"with {middle.given} and pp = {pp}, megatron-core builds {built} of "
                f"the {layers} layers",
                pointer=middle.pointer,
                hint="remove the first/last stage layer counts when pp = 1",
            )
        ]
    return stages, []


def _uneven_hint(layers: int, pp: int, split: PipelineSplit) -> str:
    """First/last counts (equal, smallest middle imbalance) that Megatron accepts."""
    if pp <= 2:
        return "change the first/last stage layer counts"
    best = None
    for ends in range(1, layers // 2 + 1):
        middle = layers - 2 * ends
        if middle > 0 and middle % (pp - 2) == 0:
            per = middle // (pp - 2)
            if best is None or abs(per - ends) < abs(best[1] - best[0]):
                best = (ends, per)
    if best is None:
        return "change the first/last stage layer counts"
    return (
        f"e.g. decoder_first_pipeline_num_layers = decoder_last_pipeline_num_layers = "
        f"{best[0]} leaves {best[1]} layers on each middle stage"
    )


def parse_layout(text: str) -> list[list[str]] | str:
    """Megatron's layout string as stages of layer kinds, or why it does not parse.

    The grammar of PipelineParallelLayerLayout.parse_str_to_list: commas are
    cosmetic, ``(...)*n`` repeats a group, ``x*n`` a character, ``|`` ends a stage.
    """
    text = text.replace(",", "")
    for pattern in (r"\(([^)]+)\)\*(\d+)", r"(.)\*(\d+)"):
        compiled = re.compile(pattern)
        length = len(text)
        for match in compiled.finditer(text):
            length += len(match.group(1)) * int(match.group(2)) - len(match.group(0))
            if length > MAX_LAYOUT:
                return f"it unrolls to more than {MAX_LAYOUT:,} characters"
        text = compiled.sub(lambda m: m.group(1) * int(m.group(2)), text)
    stages: list[list[str]] = []
    for stage in text.split("|"):
        kinds = []
        for char in stage:
            if char not in LAYOUT_CHARS:
                return (
                    f"invalid layer character {char!r} (megatron-core knows "
                    f"{', '.join(LAYOUT_CHARS)})"
                )
            kinds.append(LAYOUT_CHARS[char])
        stages.append(kinds)
    return stages


def layout_vpp(split: PipelineSplit, pp: int) -> tuple[int | None, list[Finding]]:
    """The vpp a layout string implies (None: 1), or Megatron-LM's refusal."""
    if split.layout is None:
        return None, []
    stages = parse_layout(split.layout)
    pointer = split.pointer("layout")
    if isinstance(stages, str):
        return None, [
            Finding(
                code="MDC228",
                message=f"pipeline_model_parallel_layout does not parse: {stages}",
                pointer=pointer,
                hint="write stages of E (embedding), t (decoder layer), m (MTP layer) and "
                "L (loss) separated by |, e.g. 'Ettt|(tttt|)*6tttL'",
            )
        ]
    if len(stages) % pp:
        return None, [
            Finding(
                code="MDC228",
                message=f"pipeline_model_parallel_layout has {len(stages)} stages, not a "
                f"multiple of pp ({pp}) (Megatron-LM: 'The length of "
                "pipeline_model_parallel_layout must be divisible by "
                "pipeline_model_parallel_size')",
                pointer=pointer,
                hint=f"write pp * vpp stages, e.g. {pp} or {2 * pp}",
            )
        ]
    vpp = len(stages) // pp
    return (vpp if vpp > 1 else None), []


def _megatron_layout(
    split: PipelineSplit, model: Model, pp: int, vpp: int | None
) -> tuple[StageLayers | None, list[Finding]]:
    pointer = split.pointer("layout")
    others = [
        key
        for key, on in (
            ("decoder_first_pipeline_num_layers", split.first is not None),
            ("decoder_last_pipeline_num_layers", split.last is not None),
            ("account_for_embedding_in_pipeline_split", split.embedding),
            ("account_for_loss_in_pipeline_split", split.loss),
        )
        if on
    ]
    if others:
        return None, [
            Finding(
                code="MDC228",
                message=f"pipeline_model_parallel_layout cannot be set with {', '.join(others)} "
                "(megatron-core: 'pipeline_model_parallel_layout cannot be set with other "
                "pipeline layout arguments')",
                pointer=pointer,
                hint="keep the layout string, or the other keys",
            )
        ]
    implied, findings = layout_vpp(split, pp)
    if findings:
        return None, findings
    stages = parse_layout(split.layout or "")
    assert not isinstance(stages, str)
    v = implied or 1
    if vpp is not None and vpp != v:
        return None, [
            Finding(
                code="MDC228",
                message=f"vpp = {vpp} but pipeline_model_parallel_layout has {len(stages)} "
                f"stages for pp = {pp}, i.e. {v} virtual stage(s) per rank (Megatron-LM takes "
                "the virtual stages from the layout; megatron-core: "
                "'virtual_pipeline_model_parallel_size conflicts with "
                "pipeline_model_parallel_layout')",
                pointer="/parallelism/vpp",
                hint=f"remove vpp (the layout gives it), or write {pp * vpp} stages",
            )
        ]
    findings = _layout_findings(stages, model, pp, v, pointer)
    if findings:
        return None, findings

    def chunks_of(rank: int) -> tuple[int, ...]:
        return tuple(stages[k * pp + rank].count("decoder") for k in range(v))

    return _runs(pp, range(pp), chunks_of), []


def _layout_findings(
    stages: list[list[str]], model: Model, pp: int, vpp: int, pointer: str
) -> list[Finding]:
    """PipelineParallelLayerLayout.validate_layer_layout's conditions."""
    # flattened in layer order: virtual stage 0 of every rank, then virtual stage 1, ...
    flat = [kind for k in range(vpp) for rank in range(pp) for kind in stages[k * pp + rank]]
    mtp = model.mtp_layers
    problems = []
    if not flat or flat[0] != "embedding":
        problems.append("the first layer must be the embedding (E)")
    if not flat or flat[-1] != "loss":
        problems.append("the last layer must be the loss (L)")
    for kind, char in (("embedding", "E"), ("loss", "L")):
        if flat.count(kind) != 1:
            problems.append(f"{kind} ({char}) must appear exactly once, not {flat.count(kind)}")
    decoders = flat.count("decoder")
    if decoders != model.layers:
        problems.append(f"it holds {decoders} decoder layers (t), but num_layers = {model.layers}")
    mtps = flat.count("mtp")
    if mtps != (mtp or 0):
        problems.append(f"it holds {mtps} MTP layers (m), but the model has {mtp or 0}")
    if "mtp" in flat and "decoder" in flat[flat.index("mtp") :]:
        problems.append("decoder layers must come before the MTP layers")
    for rank in range(pp):
        if any("mtp" in stages[k * pp + rank] for k in range(vpp - 1)):
            problems.append("MTP layers must be in a rank's last virtual stage")
            break
    for rank in range(pp):
        last = stages[(vpp - 1) * pp + rank]
        if "mtp" in last and last.count("mtp") != mtp:
            problems.append("all MTP layers must be in one virtual stage")
            break
    return [
        Finding(
            code="MDC228",
            message=f"pipeline_model_parallel_layout: {problem} (megatron-core's "
            "PipelineParallelLayerLayout.validate_layer_layout)",
            pointer=pointer,
            hint="e.g. 'E' + 't' * num_layers split by '|' into pp * vpp stages + 'L'",
        )
        for problem in problems
    ]


# ----------------------------------------------------------------------------- TorchTitan


def torchtitan_shares(
    stages: int, layers: int, first_less: int, last_less: int
) -> Callable[[int], int] | str:
    """Decoder layers of stage i, or why TorchTitan refuses: the rule of its
    generate_llm_fqn_per_model_part (effective layers = layers + the first and last
    stages' weights, spread evenly, the first ``remainder`` stages one more)."""
    if stages < 1:
        return "the number of stages must be at least 1"
    if stages == 1:
        return lambda stage: layers
    effective = layers + first_less + last_less
    if stages > effective:
        return f"{stages} stages are more than the {effective} effective layers"
    base, extra = divmod(effective, stages)
    for name, weight in (("first", first_less), ("last", last_less)):
        if weight > base:
            return (
                f"pipeline_parallel_{name}_stage_less_layers ({weight}) exceeds the minimum "
                f"layers per stage ({base})"
            )

    def share(stage: int) -> int:
        count = base + (1 if stage < extra else 0)
        if stage == 0:
            count -= first_less
        elif stage == stages - 1:
            count -= last_less
        return count

    return share


def _torchtitan(
    split: PipelineSplit, layers: int, pp: int, vpp: int
) -> tuple[StageLayers | None, list[Finding]]:
    stages = pp * vpp
    share = torchtitan_shares(stages, layers, split.first_less, split.last_less)
    if isinstance(share, str):
        return None, [
            Finding(
                code="MDC390",
                message=f"TorchTitan cannot split {layers} layers into pp * vpp = {stages} "
                f"stages: {share} (torchtitan's generate_llm_fqn_per_model_part)",
                pointer="/parallelism/pp" if vpp == 1 else "/parallelism/vpp",
                hint="use fewer pipeline stages, or smaller first/last stage weights",
            )
        ]
    extra = (layers + split.first_less + split.last_less) % stages
    get = share
    if split.v_shaped and vpp == 2:
        # rank r runs stages r and 2 pp - 1 - r
        breaks: tuple[int, ...] = (0, 1, pp - 1, extra, 2 * pp - extra)

        def chunks_of(rank: int) -> tuple[int, ...]:
            return (get(rank), get(stages - 1 - rank))

    else:
        # rank r runs stages r, r + pp, ...; only one of them can cross the remainder
        breaks = (0, 1, pp - 1, extra % pp)

        def chunks_of(rank: int) -> tuple[int, ...]:
            return tuple(get(rank + k * pp) for k in range(vpp))

    return _runs(pp, breaks, chunks_of), []
