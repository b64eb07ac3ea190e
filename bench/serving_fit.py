"""Fit and check mdc tune's serving model on published measurements (bench/serving_data.toml).

    .venv/bin/python -m bench.serving_fit [--fit] [--rows] [--targets] [--tpot]

Prints the error of output throughput per GPU, TTFT and TPOT: every row at the shipped
constants, by family (dense or MoE, GPU vendor, launcher), and held out by source (each
source's rows predicted with the constants fitted on the other sources' rows). ``--rows``
prints every row's prediction; ``--fit`` prints the grid's best constants on every row.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import math
import statistics
import sys
import tomllib
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from mdc.convert import structure
from mdc.hardware import Accelerator, builtin
from mdc.plan.memory import Shape, resolve_shape
from mdc.plan.named_models import architecture
from mdc.spec import ModelTable, WorkloadTable
from mdc.tune.serving_burst import predict_burst
from mdc.tune.serving_perf import predict
from mdc.tune.serving_records import DEFAULT, Constants, Deployment, Role, ServingPrediction
from mdc.tune.serving_search import sglang_baseline
from mdc.tune.serving_server import server_of

DATA = Path(__file__).with_name("serving_data.toml")
#: an offline run ("max"): every request queued at once
OFFLINE = 1_000_000
#: the measured quantities: the row's key and how a prediction gives it
METRICS: dict[str, Callable[[Mapping[str, Any], ServingPrediction], float]] = {
    "throughput": lambda row, p: p.output_tokens_per_s_per_gpu,
    "ttft": lambda row, p: p.ttft_ms,
    "tpot": lambda row, p: p.tpot_ms,
}


def measurements(path: Path = DATA) -> list[dict[str, Any]]:
    data = tomllib.loads(path.read_text())
    sources = data["sources"]
    rows = []
    for row in data["measurement"]:
        source = {
            k: v for k, v in sources[row["source"]].items() if k not in ("url", "what", "why")
        }
        rows.append({**source, **row})
    return rows


@functools.cache
def _shape(model: str, dtype: str, seq: int, blocks: tuple[int, ...] = ()) -> Shape:
    """The catalogue model's shape; ``blocks``: the row's checkpoint's weight_block_size."""
    own = {"weight_block_size": list(blocks)} if blocks else {}
    table = structure({**architecture(model), **own, "dtype": dtype, "seq_length": seq}, ModelTable)
    shape = resolve_shape(table)
    assert shape is not None, model
    return shape


def _blocks(row: Mapping[str, Any]) -> tuple[int, ...]:
    return tuple(row.get("weight_block_size", ()))


def family(row: Mapping[str, Any]) -> dict[str, str]:
    """The row's families: mode, dense or MoE, GPU vendor, launcher."""
    experts = _shape(row["model"], row["dtype"], 4096).experts
    return {
        "mode": "disaggregated" if row.get("role") or disaggregated(row) else "aggregated",
        "model": "MoE" if experts else "dense",
        "vendor": row.get("vendor", "nvidia"),
        "launcher": row["launcher"],
    }


def disaggregated(row: Mapping[str, Any]) -> bool:
    """Whether the row measures a whole prefill/decode disaggregated deployment."""
    return "prefill" in row and "decode" in row


def _role(name: str, layout: Mapping[str, Any]) -> Role:
    """A role of the layout a row (or its prefill or decode table) states."""
    tp, pp = layout.get("tp", 1), layout.get("pp", 1)
    return Role(
        name=name,
        servers=layout.get("servers", 1),
        gpus=tp * pp,
        tp=tp,
        pp=pp,
        dp=layout.get("dp", 1),
        ep=layout.get("ep", 1),
        max_batch=layout.get("max_batch"),
        step_tokens=layout.get("step_tokens"),
    )


def prediction(row: Mapping[str, Any], constants: Constants = DEFAULT) -> ServingPrediction:
    """The model's prediction for one measurement, at its layout and load."""
    hw: Accelerator = builtin()[row["accelerator_model"]]
    inp, out = row["input_tokens"], row["output_tokens"]
    shape = _shape(row["model"], row["dtype"], inp + out, _blocks(row))
    roles: tuple[Role, ...]
    if disaggregated(row):
        roles = (_role("prefill", row["prefill"]), _role("decode", row["decode"]))
    else:
        roles = (_role("server", row),)
    if row["launcher"].startswith("sglang") and row.get("sglang_share") == "own":
        # SGLang picked its own --mem-fraction-static, as mdc explain estimates it
        roles = tuple(sglang_baseline(r, shape, hw.memory_gib) for r in roles)
    dep = Deployment(
        launcher=row["launcher"],
        roles=roles,
        kv_dtype=row.get("kv_dtype", "auto"),
        share=0.9,
        share_of="free" if row["launcher"] == "trtllm" else "capacity",
        capacity_gib=hw.memory_gib,
        nproc_per_node=8,
        cuda_graphs=row["launcher"] not in row.get("eager", ()),
        graph_batch=graph_batch(row),
    )
    workload = _workload(row)
    load = row.get("concurrency")
    if row.get("sent_at_once") and isinstance(load, int) and len(roles) == 1:
        # the row's requests sent at once (or a closed loop's waves of them): the burst run
        # to its last request, output lengths up to what each request asked for
        cap = int(row.get("max_output_tokens", out))
        wave = predict_burst(shape, hw, dep, workload, load, cap, constants)
        last = int(row.get("prompts", load)) % load
        if not last:
            return wave
        return _waves(wave, predict_burst(shape, hw, dep, workload, last, cap, constants), row)
    return predict(shape, hw, dep, workload, constants)


def _waves(
    wave: ServingPrediction, last: ServingPrediction, row: Mapping[str, Any]
) -> ServingPrediction:
    """A closed loop's run of ``prompts`` requests in waves of ``concurrency``: its full
    waves, then the remainder's wave, whose requests take every decode step of a full
    one's at their own smaller batch (each step still reads the weights): the run's tokens
    over its waves' time, and TTFT and TPOT averaged over its requests."""
    size, prompts = int(row["concurrency"]), int(row["prompts"])
    full, rest = divmod(prompts, size)
    seconds = full * size / wave.requests_per_s + rest / last.requests_per_s
    tokens = wave.output_tokens_per_s_per_gpu * size / wave.requests_per_s
    per_request = tokens / size  # generated tokens per request, per GPU

    def mean(a: float, b: float) -> float:
        return (full * size * a + rest * b) / prompts

    return attrs.evolve(
        wave,
        ttft_ms=mean(wave.ttft_ms, last.ttft_ms),
        tpot_ms=mean(wave.tpot_ms, last.tpot_ms),
        output_tokens_per_s_per_gpu=prompts * per_request / seconds,
        output_tokens_per_s_per_user=1e3 / mean(wave.tpot_ms, last.tpot_ms),
        requests_per_s=prompts / seconds,
    )


def graph_batch(row: Mapping[str, Any]) -> int | None:
    """The largest decode batch a row's engine replays in a CUDA graph where its source
    states one: the row's, or its source's for the row's launcher."""
    stated = row.get("graph_batch")
    return stated.get(row["launcher"]) if isinstance(stated, Mapping) else stated


def _workload(row: Mapping[str, Any]) -> WorkloadTable:
    """The row's load: its arrival rate (open loop), else its requests in flight."""
    inp, out = row["input_tokens"], row["output_tokens"]
    if row.get("request_rate") is not None:
        return WorkloadTable(
            input_tokens=inp, output_tokens=out, request_rate=float(row["request_rate"])
        )
    load = row["concurrency"]
    return WorkloadTable(
        input_tokens=inp,
        output_tokens=out,
        concurrency=OFFLINE if load == "max" else int(load),
    )


def gpus(row: Mapping[str, Any]) -> int:
    """The GPUs of a row's whole deployment (both roles of a disaggregated one)."""
    layouts = (row["prefill"], row["decode"]) if disaggregated(row) else (row,)
    return sum(int(x.get("tp", 1) * x.get("pp", 1) * x.get("servers", 1)) for x in layouts)


def role_rate(row: Mapping[str, Any], constants: Constants = DEFAULT) -> float:
    """Tokens/s per GPU of one role measured alone: a prefill server's prompt tokens at
    ``tokens_per_gpu`` a step, or a decode server's generated tokens at ``batch_per_gpu``
    running requests (its KV capacity with "max") and a mean context of ``context_tokens``."""
    hw: Accelerator = builtin()[row["accelerator_model"]]
    gpus = int(row["gpus"])
    prompt = int(row.get("input_tokens", row.get("context_tokens", 1)))
    context = int(row.get("context_tokens", prompt))
    shape = _shape(row["model"], row["dtype"], context + 1, _blocks(row))
    role = Role(
        name=row["role"],
        servers=1,
        gpus=gpus,
        tp=row.get("tp", gpus),
        dp=row.get("dp", 1),
        ep=row.get("ep", 1),
    )
    dep = Deployment(
        launcher=row["launcher"],
        roles=(role,),
        kv_dtype=row.get("kv_dtype", "auto"),
        capacity_gib=hw.memory_gib,
        nproc_per_node=row.get("nproc_per_node", 8),
        graph_batch=graph_batch(row),
    )
    if row["role"] == "prefill":
        work = WorkloadTable(input_tokens=prompt, output_tokens=1, concurrency=1)
        server = server_of(role, shape, hw, dep, work, constants)
        tokens = float(row["tokens_per_gpu"]) * gpus
        return tokens / server.prefill(tokens, prompt) / gpus
    # a decode step at the mean context: the workload's context with no output to add
    work = WorkloadTable(input_tokens=context, output_tokens=1, concurrency=1)
    server = server_of(role, shape, hw, dep, work, constants)
    load = row["batch_per_gpu"]
    batch = float(server.capacity_seqs if load == "max" else load * gpus)
    return batch / server.decode_step(batch, context) / gpus


def measured(row: Mapping[str, Any], metric: str = "throughput") -> float | None:
    if row.get("role"):
        if metric != "throughput":
            return None
        done = row.get("output_tokens_per_s", row.get("input_tokens_per_s"))
        return float(done) / int(row["gpus"])
    if metric == "throughput":
        done = row.get("output_tokens_per_s")
        return None if done is None else float(done) / gpus(row)
    value = row.get(f"{metric}_ms")
    return None if value is None else float(value)


def errors(
    rows: Iterable[Mapping[str, Any]],
    constants: Constants = DEFAULT,
    metric: str = "throughput",
) -> list[float]:
    """Signed relative errors, (predicted - measured) / measured, of the rows that publish
    ``metric``."""
    out = []
    for row in rows:
        truth = measured(row, metric)
        if truth is None:
            continue
        if row.get("role"):
            out.append(role_rate(row, constants) / truth - 1)
        else:
            out.append(METRICS[metric](row, prediction(row, constants)) / truth - 1)
    return out


def summary(errs: Sequence[float]) -> str:
    if not errs:
        return "no rows"
    absolute = [abs(e) for e in errs]
    within = sum(a <= 0.30 for a in absolute) / len(absolute)
    twice = sum(1 / 2 <= 1 + e <= 2 for e in errs) / len(errs)
    return (
        f"{len(errs)} rows: median |error| {statistics.median(absolute) * 100:.1f} %, "
        f"within 30 % {within * 100:.0f} %, within 2x {twice * 100:.0f} %"
    )


#: the grid --fit searches: HBM efficiency, prefill efficiency, TensorRT-LLM's step overhead
GRID = {
    "hbm_efficiency": (0.6, 0.65, 0.7, 0.75, 0.8),
    "prefill_efficiency": (0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8),
    "trtllm_overhead_ms": (0.5, 1.0, 2.0, 4.0),
}


#: the second stage: vLLM's host work per running request, microseconds, searched with the
#: first stage's best held (only vLLM's rows read it)
REQUEST_GRID_US = (0.0, 10.0, 20.0, 30.0, 40.0, 60.0)


def constants_of(
    hbm: float, prefill: float, overhead_ms: float, vllm_request_us: float = 0.0
) -> Constants:
    request = vllm_request_us / 1e6
    return attrs.evolve(
        DEFAULT,
        hbm_efficiency=hbm,
        prefill_efficiency=prefill,
        step_overhead_s={**DEFAULT.step_overhead_s, "trtllm": overhead_ms / 1e3},
        request_overhead_s={"vllm": request, "vllm_disagg": request},
    )


def score(rows: Sequence[Mapping[str, Any]], c: Constants) -> float:
    """The fit's loss: over the sources, the mean of the median |log error| of each metric
    the source publishes (every source counts once, whatever its rows and metrics)."""
    total = 0.0
    for source in sorted({r["source"] for r in rows}):
        group = [r for r in rows if r["source"] == source]
        medians = []
        for metric in METRICS:
            errs = [e for e in errors(group, c, metric) if e > -1]
            if errs:
                medians.append(statistics.median(abs(math.log(1 + e)) for e in errs))
        total += statistics.fmean(medians)
    return total


def fit(rows: Sequence[Mapping[str, Any]]) -> tuple[Constants, float]:
    """The grid's constants of the least loss on ``rows`` (the folds that hold out a
    checked source all train on the fitted sources: one search serves them)."""
    key = tuple(repr(sorted(r.items())) for r in rows)
    if key not in _FITS:
        _FITS[key] = _search(rows)
    return _FITS[key]


_FITS: dict[tuple[str, ...], tuple[Constants, float]] = {}


def _search(rows: Sequence[Mapping[str, Any]]) -> tuple[Constants, float]:
    """The grid first (with no host work per request), then vLLM's host work per request
    with the grid's best held; the first of equal losses wins (a fold without vLLM's rows
    keeps 0)."""
    grid = [tuple(float(x) for x in v) for v in itertools.product(*GRID.values())]
    losses = [score(rows, constants_of(*v)) for v in grid]
    hbm, prefill, overhead_ms = grid[losses.index(min(losses))]
    best_us, best_loss = REQUEST_GRID_US[0], math.inf
    for us in REQUEST_GRID_US:
        loss = score(rows, constants_of(hbm, prefill, overhead_ms, us))
        if loss < best_loss:
            best_us, best_loss = us, loss
    return constants_of(hbm, prefill, overhead_ms, best_us), best_loss


def held_out(
    rows: Sequence[Mapping[str, Any]], key: str = "source"
) -> dict[str, tuple[Constants, list[Mapping[str, Any]]]]:
    """Each group's rows with the constants fitted on the other groups' rows."""
    out = {}
    for group in sorted({r[key] for r in rows}):
        train = [r for r in rows if r[key] != group and r.get("fit", True)]
        test = [r for r in rows if r[key] == group]
        c, _ = fit(train)
        out[group] = (c, test)
    return out


def held_out_errors(
    rows: Sequence[Mapping[str, Any]], metric: str, key: str = "source"
) -> dict[str, list[float]]:
    return {g: errors(test, c, metric) for g, (c, test) in held_out(rows, key).items()}


def describe(c: Constants) -> str:
    return (
        f"e_hbm {c.hbm_efficiency}, e_pre {c.prefill_efficiency}, "
        f"TensorRT-LLM overhead {c.step_overhead_s['trtllm'] * 1e3:g} ms, "
        f"vLLM per request {c.request_overhead('vllm') * 1e6:g} us"
    )


def report(rows: Sequence[Mapping[str, Any]]) -> None:
    """Every metric: at the shipped constants by family, held out by source."""
    folds = held_out(rows, "source")
    for source, (c, _) in folds.items():
        print(f"fitted without {source}: {describe(c)}")
    for metric in METRICS:
        print(f"== {metric}")
        print("  shipped constants, all:", summary(errors(rows, DEFAULT, metric)))
        for axis in ("model", "vendor", "launcher"):
            for value in sorted({family(r)[axis] for r in rows}):
                group = [r for r in rows if family(r)[axis] == value]
                errs = errors(group, DEFAULT, metric)
                if errs:
                    print(f"  shipped constants, {value}:", summary(errs))
        pooled: list[tuple[Mapping[str, Any], float]] = []
        for source, (c, test) in folds.items():
            errs = errors(test, c, metric)
            if errs:
                print(f"  held out {source}:", summary(errs))
            pooled += [(r, e) for r in test for e in errors([r], c, metric)]
        print("  held out by source, pooled:", summary([e for _, e in pooled]))
        for axis in ("model", "vendor"):
            for value in sorted({family(r)[axis] for r, _ in pooled}):
                errs = [e for r, e in pooled if family(r)[axis] == value]
                print(f"  held out by source, {value}:", summary(errs))


def _layout(row: Mapping[str, Any]) -> str:
    """A row's layout in a few characters: tp, or each role's servers x tp."""
    if disaggregated(row):
        p, d = row["prefill"], row["decode"]
        return f"{p.get('servers', 1)}xtp{p.get('tp', 1)}+{d.get('servers', 1)}xtp{d.get('tp', 1)}"
    return f"tp{row.get('tp', 1)}"


def _row_line(row: Mapping[str, Any]) -> str:
    """One row's measured and predicted numbers (``--rows``)."""
    truth = measured(row)
    done = math.nan if truth is None else truth
    head = f"{row['source'][:12]:<12} {row['launcher']:<7} {row['model']:<15} "
    if row.get("role"):
        return (
            f"{head}{row['accelerator_model']:<8} {row['role']} of {row['gpus']} GPUs "
            f"tok/s/GPU {done:7.0f} -> {role_rate(row):7.0f}"
        )
    p = prediction(row)
    rate = row.get("request_rate")
    load = f"c={row['concurrency']!s:<4}" if rate is None else f"r={rate:<4g}"
    return (
        f"{head}{row['accelerator_model']:<8} {_layout(row)} "
        f"{row['input_tokens']:>5}/{row['output_tokens']:<5} {load} "
        f"tok/s/GPU {done:7.0f} -> {p.output_tokens_per_s_per_gpu:7.0f}  "
        f"TTFT {row.get('ttft_ms', math.nan):9.0f} -> {p.ttft_ms:9.0f}  "
        f"TPOT {row.get('tpot_ms', math.nan):6.1f} -> {p.tpot_ms:6.1f}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--fit", action="store_true", help="search the grid on every row")
    parser.add_argument("--rows", action="store_true", help="print every row's prediction")
    parser.add_argument(
        "--targets", action="store_true", help="only the report against issue 38's targets"
    )
    parser.add_argument(
        "--tpot", action="store_true", help="every TPOT row held out, the ratio by group"
    )
    args = parser.parse_args(argv)
    rows = measurements()
    if args.tpot:
        from bench import serving_tpot

        serving_tpot.report(rows)
        return 0
    if args.targets:
        from bench import serving_targets

        serving_targets.report(rows)
        return 0
    if args.rows:
        for row in rows:
            print(_row_line(row))
    report(rows)
    if args.fit:
        c, loss = fit([r for r in rows if r.get("fit", True)])
        print(f"fit on all rows: {describe(c)} (loss {loss:.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
