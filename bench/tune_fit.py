"""Fit mdc tune's throughput constants on published measured runs, and report the error.

    .venv/bin/python bench/tune_fit.py [--write]

Every megatron-launcher row of ``tests/published/runs.toml`` with a measured TFLOP/s or
tokens/s per GPU becomes a case: its model (``tests/published/models.toml``, through the
same spec the published-runs test compiles), its layout, accelerator and precision. A row
that states only tokens/s is compared in TFLOP/s by mdc's own FLOP count (its error is the
tokens/s error). A row whose source leaves its micro batch or virtual stages open (its
``unstated`` keys) is predicted at the best of the values that compile and fit. TorchTitan's
rows are left out: the model is of Megatron-Core's schedules
and kernels (docs/tune.md reports them apart). The constants of
:class:`mdc.tune.perf.Constants` are fitted by coordinate descent on the squared log error,
clipped at log(1.5),
of the rows whose index (sorted by id) is not a multiple of 3 plus 2; those rows are held
out and their error is reported apart. ``--write`` prints the fitted constants as Python.
The report (Markdown) goes to stdout.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import statistics
import sys
import tomllib
from pathlib import Path
from types import ModuleType
from typing import Any

import attrs

ROOT = Path(__file__).resolve().parent.parent
PUBLISHED = ROOT / "tests" / "published"

from mdc.convert import structure  # noqa: E402
from mdc.errors import SpecError  # noqa: E402
from mdc.hardware import builtin  # noqa: E402
from mdc.loaders import LoadedDocument  # noqa: E402
from mdc.pipeline import Compiler  # noqa: E402
from mdc.plan.memory import Shape, resolve_shape  # noqa: E402
from mdc.plan.model import TrainingSetup  # noqa: E402
from mdc.plan.ranks import divisors  # noqa: E402
from mdc.plan.stages import Model as StageModel  # noqa: E402
from mdc.plan.stages import PipelineSplit, split_layers  # noqa: E402
from mdc.plugin_manager import load_plugins  # noqa: E402
from mdc.spec import ModelTable  # noqa: E402
from mdc.tune.flops import token_flops  # noqa: E402
from mdc.tune.perf import DEFAULT, Constants, Layout, bf16_share, predict  # noqa: E402

#: the row's precision -> the GEMM precision whose peak runs it
PRECISION = {"bf16": "bf16", "fp16": "fp16", "fp8": "fp8", "mxfp8": "fp8", "nvfp4": "fp4"}
#: the paper whose TFLOP/s count all keys of the attention (and the recomputed pass)
NARAYANAN = "https://arxiv.org/abs/2104.04473"
#: fitted constants, and the factor range each may move in
FITTED = (
    "gemm_peak", "shape_knee", "width_knee", "attention_peak",
    "elementwise", "link_share", "ep_exposed",
    "moe_passes", "mamba_passes", "fp4_peak", "expert_overhead_us",
)  # fmt: skip


def _module(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@attrs.frozen(kw_only=True)
class Case:
    id: str
    shape: Shape
    model: ModelTable
    layout: Layout
    hardware: str
    precision: str
    causal: bool
    count_recompute: bool
    nproc: int
    measured: float
    #: the source's own model FLOPs per token, where it states a throughput beside its
    #: TFLOP/s (None: mdc's count, :func:`mdc.tune.flops.token_flops`, is the source's)
    source_flops: float | None = None
    #: share of the heaviest stage's layers the recipe keeps in bf16 under fp8 / fp4
    bf16_share: float = 0.0
    #: the other layouts the row's sizes allow where the source leaves settings unstated
    #: (its ``unstated`` keys): the row is predicted at the best of them and ``layout``
    variants: tuple[Layout, ...] = ()

    def predicted(self, constants: Constants = DEFAULT) -> float:
        return max(self._predicted(layout, constants) for layout in (self.layout, *self.variants))

    def _predicted(self, layout: Layout, constants: Constants) -> float:
        prediction = predict(
            self.shape,
            layout,
            builtin()[self.hardware],
            nproc_per_node=self.nproc,
            precision=self.precision,
            constants=constants,
            causal=self.causal,
            count_recompute=self.count_recompute,
            window=self.model.window_size,
            window_skip=self.model.window_attn_skip_freq,
            bf16_share=self.bf16_share,
        )
        if self.source_flops is None:
            return prediction.model_tflops_per_gpu
        return prediction.tokens_per_s_per_gpu * self.source_flops / 1e12


def stage_layers(run: dict[str, Any], shape: Shape) -> tuple[int | None, int | None]:
    """(the heaviest stage's layers, the last stage's) as the plan's own split places them
    under the row's uneven split keys ((None, None): the even split)."""
    table = run.get("launcher_table", {})
    split = PipelineSplit(
        rule="megatron",
        first=table.get("decoder_first_pipeline_num_layers"),
        last=table.get("decoder_last_pipeline_num_layers"),
        embedding=bool(table.get("account_for_embedding_in_pipeline_split")),
        loss=bool(table.get("account_for_loss_in_pipeline_split")),
    )
    pp = run.get("pp", 1)
    if pp == 1 or split == PipelineSplit(rule="megatron"):
        return None, None
    stages, _ = split_layers(split, StageModel(layers=shape.layers), pp, run.get("vpp"))
    if stages is None:
        return None, None
    return max(stages.layers_of(r) for r in range(pp)), stages.layers_of(pp - 1)


def layout_of(run: dict[str, Any], shape: Shape) -> Layout:
    """The row's layout as the throughput model reads it (an MoE row's unstated etp is 1,
    as NVIDIA's MoE recipes set it)."""
    moe = shape.experts > 0
    tp, pp, cp = run.get("tp", 1), run.get("pp", 1), run.get("cp", 1)
    ep = run.get("ep") or 1
    dp = run["gpus"] // (tp * pp * cp)
    mbs = run.get("micro_batch_size", 1)  # not stated: Megatron-LM's default, 1
    table = run.get("launcher_table", {})
    # Megatron-FSDP, or PyTorch's FSDP2 (which shards parameters, gradients and optimizer)
    fsdp = any(bool(x) for x in (table.get("use_megatron_fsdp"), table.get("use_torch_fsdp2"),
                                 run.get("fsdp")))  # fmt: skip
    paper = run["source"] == NARAYANAN  # 2021: no sequence parallel, plain DDP
    # Megatron-FSDP's sharding strategy (default optim_grads_params) as ZeRO stage
    strategy = table.get("data_parallel_sharding_strategy", "optim_grads_params")
    zero = {"optim": 1, "optim_grads": 2}.get(strategy, 3) if fsdp else (0 if paper else 1)
    heaviest, last = stage_layers(run, shape)
    return Layout(
        tp=tp, pp=pp, cp=cp, ep=ep, etp=run.get("etp") or (1 if moe else tp), dp=dp,
        stage_layers=heaviest, last_stage_layers=last,
        vpp=run.get("vpp") or 1,
        micro_batch_size=mbs, microbatches=max(1, run["global_batch_size"] // (mbs * dp)),
        sequence_parallel=tp > 1 and not paper, recompute=run.get("recompute", "none"),
        overlap_grad_reduce=table.get("overlap_grad_reduce", not paper),
        overlap_param_gather=not paper,
        overlap_p2p=table.get("overlap_p2p_comm") is not False,
        tp_comm_overlap=bool(table.get("tp_comm_overlap")),
        ep_comm_overlap=bool(table.get("overlap_moe_expert_parallel_comm")),
        # Megatron-LM's default where the row does not say
        dispatcher=table.get("moe_token_dispatcher_type", "allgather"),
        recompute_modules=tuple(table["recompute_modules"])
        if "recompute_modules" in table else None,
        recompute_layers=run.get("recompute_num_layers")
        if run.get("recompute_method") == "block" else None,
        zero_stage=zero,
        # Megatron-LM keeps fp16 gradients in fp16 (--accumulate-allreduce-grads-in-fp32
        # asks for fp32; the rows do not), bf16 ones in fp32 unless the recipe reduces them
        # in bf16 (--grad-reduce-in-bf16)
        grad_bytes=2 if run["precision"] == "fp16" or table.get("grad_reduce_in_bf16") else 4,
    )  # fmt: skip


def bf16_share_of(run: dict[str, Any], shape: Shape, layout: Layout) -> float:
    """Megatron's --first-last-layers-bf16 as the row's recipe sets it: the share of the
    heaviest stage's layers whose GEMMs stay in bf16 (TransformerConfig's default count 1)."""
    table = run.get("launcher_table", {})
    if not table.get("first_last_layers_bf16"):
        return 0.0
    counts = (
        table.get("num_layers_at_start_in_bf16", 1),
        table.get("num_layers_at_end_in_bf16", 1),
    )
    training = TrainingSetup(bf16_layers=counts, gemm_precision=PRECISION[run["precision"]])
    stage_layers = -(-shape.layers // layout.pp)
    stages = ("only",) if layout.pp == 1 else ("first", "last")
    return max(bf16_share(shape, training, stage, stage_layers) for stage in stages)


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


#: the settings a row may leave unstated, and the values each variant tries
UNSTATED = ("micro_batch_size", "vpp")


def variants(run: dict[str, Any], shape: Shape, compiler: Compiler, published: Any) -> list[Layout]:
    """The layouts of the row's sizes with its ``unstated`` settings (micro batch, virtual
    stages) set otherwise, as the source's authors could have set them: each value that
    divides (micro batches: the sequences of a data-parallel replica; virtual stages: a
    stage's layers), kept where the compiler accepts the spec and its memory estimate fits,
    as mdc tune keeps a candidate."""
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
            spec = published.spec_of(variant)
            document = LoadedDocument(path="variant.json", data=spec, values={}, keys={})
            try:
                memory = compiler.compile_document(document, tree=False).plan.memory
            except SpecError:
                continue
            if memory is None or memory.capacity is None or memory.total <= memory.capacity:
                found.append(layout_of(variant, shape))
    return found


def cases() -> list[Case]:
    """Every measured row whose model the published models table describes."""
    published = _module(PUBLISHED / "test_published_runs.py", "published_runs")
    compiler = Compiler(load_plugins(autoload=False))
    runs = tomllib.loads((PUBLISHED / "runs.toml").read_text(encoding="utf-8"))["run"]
    found = []
    for run in sorted(runs, key=lambda r: r["id"]):
        stated = run.get("measured", {})
        tokens_only = "tflops_per_gpu" not in stated and "tokens_per_s_per_gpu" in stated
        if not (tokens_only or "tflops_per_gpu" in stated) or "global_batch_size" not in run:
            continue
        if run["accelerator_model"] not in builtin() or run["launcher"] != "megatron":
            continue  # the model is of Megatron-Core's schedules and kernels
        try:
            spec = published.spec_of(run)
        except published.ModelNotListed:
            continue
        model = structure(spec["model"], ModelTable)
        shape = resolve_shape(model)
        if shape is None:
            continue
        if shape.dsv4 is not None:
            # DeepSeek-V4's compressed sparse attention, its indexer and the hyper-connections
            # are counted in parameters and memory, not yet in the FLOP count (mdc.tune.flops)
            continue
        layout = layout_of(run, shape)
        if tokens_only:  # TFLOP/s by mdc's own count: the error is the tokens/s error
            per_token = token_flops(
                shape, window=model.window_size, window_skip=model.window_attn_skip_freq
            ).total
            measured = stated["tokens_per_s_per_gpu"] * per_token / 1e12
            flops_of_source = per_token
        else:
            measured = stated["tflops_per_gpu"]
            flops_of_source = source_flops(run)
        found.append(
            Case(
                id=run["id"],
                shape=shape,
                model=model,
                layout=layout,
                hardware=run["accelerator_model"],
                precision=PRECISION[run["precision"]],
                # the source counts attention over every key, not the causal half
                causal=stated.get("attention_flops") != "full",
                count_recompute=bool(run["measured"].get("flops_include_recompute")),
                nproc=run["nproc_per_node"],
                measured=float(measured),
                source_flops=flops_of_source,
                bf16_share=bf16_share_of(run, shape, layout),
                variants=tuple(variants(run, shape, compiler, published))
                if run.get("unstated")
                else (),
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


def fit(train: list[Case], start: Constants = DEFAULT, rounds: int = 6) -> Constants:
    """Coordinate descent in log space: each constant in turn, a shrinking grid of factors."""
    best, best_loss = start, loss(start, train)
    for r in range(rounds):
        span = 0.5 / (r + 1)
        for name in FITTED:
            for step in range(-4, 5):
                value = getattr(best, name) * math.exp(span * step / 4)
                if name in ("gemm_peak", "attention_peak", "fp4_peak",
                            "link_share", "tp_exposed", "ep_exposed"):  # fmt: skip
                    value = min(value, 1.0)
                trial = attrs.evolve(best, **{name: value})
                trial_loss = loss(trial, train)
                if trial_loss < best_loss - 1e-12:
                    best, best_loss = trial, trial_loss
    return best


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--refit", action="store_true", help="fit from the defaults again")
    args = parser.parse_args()
    found = cases()
    constants = DEFAULT
    if args.refit:
        constants = fit([c for i, c in enumerate(found) if not held_out(i)])
    print(report(found, constants), end="")


if __name__ == "__main__":
    main()
