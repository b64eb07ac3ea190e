"""Fit mdc tune's throughput constants on published measured runs, and report the error.

    .venv/bin/python -m bench.tune_fit [--refit]

Every megatron-launcher row of ``tests/published/runs.toml`` with a measured TFLOP/s or
tokens/s per GPU becomes a case: the spec the published-runs test compiles for it, compiled,
and predicted from its plan as ``mdc explain`` predicts it (a row mdc refuses is left out),
with the data-parallel overlaps NVIDIA's recipes turn on where the row does not say. A row
that states only tokens/s is compared in TFLOP/s by mdc's own FLOP count (its error is the
tokens/s error). A row whose source leaves its micro batch or virtual stages open (its
``unstated`` keys) is predicted at the best of the values that compile and fit. TorchTitan's
rows are left out: the model is of Megatron-Core's schedules
and kernels (docs/tune-model-fit.md reports them apart). The constants of
:class:`mdc.tune.perf.Constants` are fitted by coordinate descent on the squared log error,
clipped at log(1.5),
of the rows whose index (sorted by id) is not a multiple of 3 plus 2; those rows are held
out and their error is reported apart. The report (Markdown) goes to stdout: with the
shipped constants, or with ``--refit`` those fitted again from them. With ``--by-source``
it also reports each row predicted by constants fitted without its source family
(:data:`FAMILIES`; every constant the family informs started from :data:`NEUTRAL`, so the
family's rows never reach its prediction through the shipped constants), by family, dense/MoE, launcher (TorchTitan's rows, not fitted, at the
shipped constants), FSDP-style and GPU generation.
"""

from __future__ import annotations

import argparse
import math
import statistics
from typing import Any

import attrs

from bench.published import MODELS, RUNS, spec_of
from mdc.errors import SpecError
from mdc.hardware import builtin
from mdc.loaders import LoadedDocument
from mdc.pipeline import Compiler
from mdc.plan.memory import Shape
from mdc.plan.ranks import divisors
from mdc.plugin_manager import load_plugins
from mdc.tune.flops import token_flops
from mdc.tune.perf import DEFAULT, Constants, PlanInputs, plan_inputs

#: the paper whose TFLOP/s count all keys of the attention (and the recomputed pass)
NARAYANAN = "https://arxiv.org/abs/2104.04473"
#: fitted constants, and the factor range each may move in
FITTED = (
    "gemm_peak", "shape_knee", "width_knee", "attention_peak",
    "elementwise", "ep_exposed",
    "mamba_overhead", "fp4_peak",
)  # fmt: skip


@attrs.frozen(kw_only=True)
class Case:
    id: str
    #: what mdc explain predicts the row's spec from, with the row's overlaps (see overlaps)
    inputs: PlanInputs
    causal: bool
    count_recompute: bool
    measured: float
    #: the source's own model FLOPs per token, where it states a throughput beside its
    #: TFLOP/s (None: mdc's count, :func:`mdc.tune.flops.token_flops`, is the source's)
    source_flops: float | None = None
    #: the row with its ``unstated`` settings set otherwise, where the source leaves them
    #: open: the row is predicted at the best of them and ``inputs``
    variants: tuple[PlanInputs, ...] = ()
    #: what the report groups the row by (:func:`family`, dense/MoE, launcher, generation)
    family: str = ""
    moe: bool = False
    launcher: str = "megatron"
    generation: str = ""
    #: parameters gathered per use (Megatron-FSDP, PyTorch FSDP/FSDP2: ZeRO-3)
    fsdp: bool = False

    def predicted(self, constants: Constants = DEFAULT) -> float:
        return max(self._predicted(inputs, constants) for inputs in (self.inputs, *self.variants))

    def _predicted(self, inputs: PlanInputs, constants: Constants) -> float:
        prediction = inputs.predict(
            constants, causal=self.causal, count_recompute=self.count_recompute
        )
        if self.source_flops is None:
            return prediction.model_tflops_per_gpu
        return prediction.tokens_per_s_per_gpu * self.source_flops / 1e12


def overlaps(run: dict[str, Any], inputs: PlanInputs) -> PlanInputs:
    """The row's inputs with the data-parallel overlaps its recipe turns on: NVIDIA's
    recipes set overlap_grad_reduce and overlap_param_gather (Megatron-LM's defaults are
    off), which few rows state; the 2021 paper's rows state what ran."""
    table = run.get("launcher_table", {})
    paper = run["source"] == NARAYANAN
    layout = attrs.evolve(
        inputs.layout,
        overlap_grad_reduce=table.get("overlap_grad_reduce", not paper),
        overlap_param_gather=table.get("overlap_param_gather", not paper),
    )
    return attrs.evolve(inputs, layout=layout)


def compiled(run: dict[str, Any], compiler: Compiler, *, fits: bool = False) -> PlanInputs | None:
    """The row's spec compiled as mdc compile does, and the model's inputs from its plan
    (None where it does not compile, or with ``fits``, where its memory estimate does not
    fit)."""
    document = LoadedDocument(path=f"{run['id']}.json", data=spec_of(run), values={},
                              keys={})  # fmt: skip
    try:
        plan = compiler.compile_document(document, tree=False).plan
    except SpecError:
        return None
    memory = plan.memory
    if (
        fits
        and memory is not None
        and memory.capacity is not None
        and memory.total > memory.capacity
    ):
        return None
    inputs = plan_inputs(plan)
    if inputs is None or run["launcher"] != "megatron":
        return inputs  # TorchTitan's rows: as mdc explain predicts their specs
    return overlaps(run, inputs)


def source_flops(run: dict[str, Any]) -> float | None:
    """The model FLOPs per token the row's TFLOP/s were counted with, where the source
    also states the tokens/s or the step time. Sources count differently (Megatron-Bridge's
    formula changed between releases; NeMo 24.07 counted attention over every key), so the
    predicted throughput is converted to TFLOP/s by the source's own count: the model
    predicts time, and the comparison is of like with like."""
    measured = run["measured"]
    tflops = measured["tflops_per_gpu"] * 1e12
    if measured.get("tokens_per_s_per_gpu"):
        return float(tflops / measured["tokens_per_s_per_gpu"])
    if measured.get("step_time_s"):
        tokens = run["global_batch_size"] * run["seq_length"] / run["gpus"]
        return float(tflops * measured["step_time_s"] / tokens)
    return None


#: the source families: one table's releases (NVIDIA's performance summaries in NeMo's docs,
#: Megatron-Bridge's docs and their archives are one table release after release) never sit
#: on both sides of a held-out split; by the source address's first match
FAMILIES = (
    ("performance_long_sequence", "NeMo long-sequence table"),
    ("Megatron-Bridge", "NVIDIA performance summaries"),
    ("nemo-framework", "NVIDIA performance summaries"),
    ("NVIDIA/NeMo/", "NVIDIA performance summaries"),
    ("2104.04473", "Megatron-LM paper (2021)"),
    ("NVIDIA/Megatron-LM", "Megatron-LM README"),
    ("2407.21783", "Llama 3 paper"),
    ("2201.11990", "MT-NLG paper"),
    ("rocm-blogs", "AMD Primus (ROCm blog)"),
    ("bigscience", "BLOOM (BigScience)"),
    ("torchtitan", "TorchTitan benchmarks"),
)
#: accelerator -> its generation, for the report
GENERATIONS = {
    "a100-80gb": "Ampere", "a100-40gb": "Ampere", "h100-sxm": "Hopper", "h200": "Hopper",
    "b200": "Blackwell", "gb200": "Blackwell", "b300": "Blackwell Ultra",
    "gb300": "Blackwell Ultra", "mi300x": "CDNA 3", "mi325x": "CDNA 3", "mi355x": "CDNA 4",
}  # fmt: skip


def family(source: str) -> str:
    """The source family of a row's source address (the address itself where none matches)."""
    return next((name for key, name in FAMILIES if key in source), source)


#: the settings a row may leave unstated, and the values each variant tries
UNSTATED = ("micro_batch_size", "vpp")


def variants(run: dict[str, Any], shape: Shape, compiler: Compiler) -> list[PlanInputs]:
    """The row with its ``unstated`` settings (micro batch, virtual stages) set otherwise, as
    the source's authors could have set them: each value that divides (micro batches: the
    sequences of a data-parallel replica; virtual stages: a stage's layers), kept where the
    compiler accepts the spec and its memory estimate fits, as mdc tune keeps a candidate."""
    unstated = set(run.get("unstated", ()))
    assert unstated <= set(UNSTATED), run["id"]
    tp, pp, cp = run.get("tp", 1), run.get("pp", 1), run.get("cp", 1)
    per_replica = run["global_batch_size"] // (run["gpus"] // (tp * pp * cp))
    micros = divisors(per_replica) if "micro_batch_size" in unstated else [None]
    depths = divisors(shape.layers // pp) if "vpp" in unstated and pp > 1 else [None]
    found = []
    for micro in micros:
        for vpp in depths:
            variant = dict(run)
            if micro is not None:
                variant["micro_batch_size"] = micro
            if vpp is not None and vpp > 1:
                variant["vpp"] = vpp
            inputs = compiled(variant, compiler, fits=True)
            if inputs is not None:
                found.append(inputs)
    return found


def cases(launchers: tuple[str, ...] = ("megatron",)) -> list[Case]:
    """Every measured row of ``launchers`` whose model the published models table describes
    (the fit's: Megatron-LM's; TorchTitan's rows are predicted, never fitted)."""
    compiler = Compiler(load_plugins(autoload=False))
    found = []
    for run in sorted(RUNS, key=lambda r: r["id"]):
        stated = run.get("measured", {})
        tokens_only = "tflops_per_gpu" not in stated and "tokens_per_s_per_gpu" in stated
        if not (tokens_only or "tflops_per_gpu" in stated) or "global_batch_size" not in run:
            continue
        if run["accelerator_model"] not in builtin() or run["launcher"] not in launchers:
            continue  # the model is of Megatron-Core's schedules and kernels
        if run["model"] not in MODELS:
            continue
        inputs = compiled(run, compiler)
        if inputs is None:
            continue  # a row mdc refuses (bench.published.AWAITING): mdc predicts nothing for it
        shape = inputs.shape
        if shape.dsv4 is not None:
            # DeepSeek-V4's compressed sparse attention, its indexer and the hyper-connections
            # are counted in parameters and memory, not yet in the FLOP count (mdc.tune.flops)
            continue
        if tokens_only:  # TFLOP/s by mdc's own count: the error is the tokens/s error
            per_token = token_flops(
                shape, window=inputs.window, window_skip=inputs.window_skip
            ).total
            measured = stated["tokens_per_s_per_gpu"] * per_token / 1e12
            flops_of_source: float | None = per_token
        else:
            measured = stated["tflops_per_gpu"]
            flops_of_source = source_flops(run)
        found.append(
            Case(
                id=run["id"],
                inputs=inputs,
                # the source counts attention over every key, not the causal half
                causal=stated.get("attention_flops") != "full",
                count_recompute=bool(run["measured"].get("flops_include_recompute")),
                measured=float(measured),
                source_flops=flops_of_source,
                variants=tuple(variants(run, shape, compiler)) if run.get("unstated") else (),
                family=family(run["source"]),
                moe=shape.experts > 0,
                launcher=run["launcher"],
                generation=GENERATIONS.get(run["accelerator_model"], run["accelerator_model"]),
                fsdp=inputs.layout.zero_stage >= 3,
            )
        )
    return found


def held_out(index: int) -> bool:
    return index % 3 == 2


#: a row further off than this (in log) counts as this far: rows whose run the model does
#: not describe (a software release's own slowness) must not pull the constants for the rest
ROBUST = math.log(1.5)


def loss(constants: Constants, train: list[Case]) -> float:
    return statistics.fmean(
        min(math.log(c.predicted(constants) / c.measured) ** 2, ROBUST**2) for c in train
    )


#: the shares a fit never lifts above 1
SHARES = ("gemm_peak", "attention_peak", "fp4_peak", "ep_exposed")


def fit(
    train: list[Case], start: Constants = DEFAULT, rounds: int = 6, coarse: tuple[str, ...] = ()
) -> Constants:
    """Coordinate descent in log space: each constant in turn, a shrinking grid of factors.
    The ``coarse`` constants (started far from their fit: :data:`NEUTRAL`) are first walked
    twice over factors of 2 from 1/32 to 32 of where they stand, so the descent reaches them."""
    best, best_loss = start, loss(start, train)
    for name in coarse * 2:
        base = getattr(best, name)
        for k in range(-5, 6):
            best, best_loss = _try(best, best_loss, name, base * 2.0**k, train)
    for r in range(rounds):
        span = 0.5 / (r + 1)
        for name in FITTED:
            for step in range(-4, 5):
                value = getattr(best, name) * math.exp(span * step / 4)
                best, best_loss = _try(best, best_loss, name, value, train)
    return best


def _try(
    best: Constants, best_loss: float, name: str, value: float, train: list[Case]
) -> tuple[Constants, float]:
    """``best`` with ``name`` at ``value`` where that lowers the loss (a share at most 1)."""
    if name in SHARES:
        value = min(value, 1.0)
    trial = attrs.evolve(best, **{name: value})
    trial_loss = loss(trial, train)
    return (trial, trial_loss) if trial_loss < best_loss - 1e-12 else (best, best_loss)


def within(cases: list[Case], constants: Constants, tolerance: float = 0.2) -> float:
    hits = [abs(c.predicted(constants) / c.measured - 1) <= tolerance for c in cases]
    return sum(hits) / len(hits) if hits else 0.0


def report(all_cases: list[Case], constants: Constants) -> str:
    train = [c for i, c in enumerate(all_cases) if not held_out(i)]
    test = [c for i, c in enumerate(all_cases) if held_out(i)]

    def mape(items: list[Case]) -> float:
        return statistics.fmean(abs(c.predicted(constants) / c.measured - 1) for c in items)

    lines = [
        f"fitted on {len(train)} rows, held out {len(test)} (every third row by id)",
        "",
        "| set | rows | mean abs error | within +-20 % |",
        "|---|---|---|---|",
        f"| fitted | {len(train)} | {mape(train) * 100:.1f} % "
        f"| {within(train, constants) * 100:.1f} % |",
        f"| held out | {len(test)} | {mape(test) * 100:.1f} % "
        f"| {within(test, constants) * 100:.1f} % |",
        f"| all | {len(all_cases)} | {mape(all_cases) * 100:.1f} % "
        f"| {within(all_cases, constants) * 100:.1f} % |",
        "",
        "| row | set | measured TFLOP/s/GPU | predicted | error |",
        "|---|---|---|---|---|",
    ]
    for i, c in enumerate(all_cases):
        p = c.predicted(constants)
        lines.append(
            f"| {c.id} | {'held out' if held_out(i) else 'fitted'} | {c.measured:.0f} | "
            f"{p:.0f} | {(p / c.measured - 1) * 100:+.0f} % |"
        )
    lines += ["", "constants:", ""]
    lines += [f"- `{k}` = {v:.4g}" for k, v in constants.to_json().items()]
    return "\n".join(lines) + "\n"


#: where a fold starts each constant that its held-out family informs (:func:`informed`):
#: a value no fit chose, so the held-out rows never reach the fold through the shipped value
NEUTRAL = {
    "gemm_peak": 1.0,  # the accelerator's measured GEMM level itself (kernels.toml)
    "shape_knee": 128.0,  # efficiency halves at one 128-token tile of the GEMM kernels
    "width_knee": 128.0,  # ... and at one 128-wide tile of the weight
    "attention_peak": 1.0,  # FlashAttention at the bf16 dense peak
    "elementwise": 1.0,  # one HBM pass per activation byte Korthikanti counts
    "ep_exposed": 1.0,  # nothing of the all-to-all hidden
    "mamba_overhead": 1.0,  # the Mamba layer's counted work at its kernels' measured rates
    "fp4_peak": 1.0,  # FP4 GEMMs at the level fp8's reach
}


def informed(rows: list[Case], start: Constants = DEFAULT) -> tuple[str, ...]:
    """The fitted constants that move some prediction of ``rows`` (scaled by 0.8): those the
    rows informed when the shipped constants were fitted on them."""
    found = []
    for name in FITTED:
        moved = attrs.evolve(start, **{name: getattr(start, name) * 0.8})
        if any(abs(c.predicted(moved) / c.predicted(start) - 1) > 1e-9 for c in rows):
            found.append(name)
    return tuple(found)


def fold_start(rows: list[Case]) -> tuple[Constants, tuple[str, ...]]:
    """Where the fit without ``rows`` starts: the shipped constants with every one that
    ``rows`` inform at :data:`NEUTRAL`, and those constants' names."""
    reset = informed(rows)
    return attrs.evolve(DEFAULT, **{k: NEUTRAL[k] for k in reset}), reset


def held_out_by_source(fitted: list[Case], rounds: int = 6) -> dict[str, float]:
    """Each fitted row's prediction by constants fitted without its source family: row id ->
    predicted TFLOP/s. Every constant the family informs (:func:`informed`) starts from
    :data:`NEUTRAL` and is fitted on the other families' rows alone (a constant no other
    family informs stays neutral); the rest start from the shipped constants, which the
    family's rows could not move. ``rounds`` rounds of :func:`fit`."""
    predicted: dict[str, float] = {}
    for name in sorted({c.family for c in fitted}):
        rows = [c for c in fitted if c.family == name]
        train = [c for c in fitted if c.family != name]
        start, reset = fold_start(rows)
        constants = fit(train, start=start, rounds=rounds, coarse=reset)
        predicted.update({c.id: c.predicted(constants) for c in rows})
    return predicted


def _errors(items: list[tuple[Case, float]]) -> str:
    errors = [abs(p / c.measured - 1) for c, p in items]
    if not errors:
        return "| 0 | | |"
    inside = sum(e <= 0.2 for e in errors) / len(errors)
    return f"| {len(errors)} | {statistics.fmean(errors) * 100:.1f} % | {inside * 100:.1f} % |"


def held_out_pairs(
    fitted: list[Case], others: list[Case], rounds: int = 6
) -> list[tuple[Case, float]]:
    """(row, predicted TFLOP/s): each fitted row predicted with its source family held out
    of the fit (:func:`held_out_by_source`), the unfitted launchers' rows at the shipped
    constants."""
    loso = held_out_by_source(fitted, rounds)
    return [(c, loso[c.id]) for c in fitted] + [(c, c.predicted()) for c in others]


def source_report(fitted: list[Case], others: list[Case], rounds: int = 6) -> str:
    """Error by group of :func:`held_out_pairs`."""
    pairs = held_out_pairs(fitted, others, rounds)
    groups: list[tuple[str, Any]] = [
        ("source family", lambda c: c.family),
        ("dense / MoE", lambda c: "MoE" if c.moe else "dense"),
        ("launcher", lambda c: c.launcher + ("" if c.launcher == "megatron" else " (not fitted)")),
        ("FSDP-style (parameters gathered per use)", lambda c: "yes" if c.fsdp else "no"),
        ("GPU generation", lambda c: c.generation),
    ]
    lines = [
        f"each of the {len(fitted)} fitted rows predicted by constants fitted without its "
        f"source family; the {len(others)} rows of unfitted launchers at the shipped constants",
        "",
    ]
    for title, key in groups:
        lines += [f"| {title} | rows | mean abs error | within +-20 % |", "|---|---|---|---|"]
        for value in sorted({key(c) for c, _ in pairs}):
            lines.append(f"| {value} " + _errors([(c, p) for c, p in pairs if key(c) == value]))
        lines.append("| all " + _errors(pairs))
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--refit", action="store_true", help="fit from the defaults again")
    parser.add_argument(
        "--by-source",
        action="store_true",
        help="also report the error held out by source family (a fit per family: minutes)",
    )
    args = parser.parse_args()
    found = cases()
    constants = DEFAULT
    if args.refit:
        constants = fit([c for i, c in enumerate(found) if not held_out(i)])
    print(report(found, constants), end="")
    if args.by_source:
        others = cases(("torchtitan",))
        print("\n" + source_report(found, others), end="")


if __name__ == "__main__":
    main()
