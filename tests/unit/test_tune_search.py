"""mdc tune's bounded search ranks exactly as predicting and sorting every candidate does."""

from __future__ import annotations

import itertools
import json
import tomllib
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from tests.tools import REPO

from mdc.cli import main
from mdc.loaders import load_file
from mdc.pipeline import Compiler
from mdc.plan.memory import state_floor
from mdc.plan.named_models import CATALOGUE_FILE
from mdc.plugin_manager import load_plugins
from mdc.tune import search, terms
from mdc.tune.perf import bf16_share, bf16_stage, predict
from mdc.tune.search import Candidate, Result, Tuner

EXAMPLE = REPO / "examples" / "tune-llama70b-64xh100.toml"
MODELS = Path(CATALOGUE_FILE)


def _spec(**edits: dict[str, Any]) -> dict[str, Any]:
    data = tomllib.loads(EXAMPLE.read_text(encoding="utf-8"))
    for table, values in edits.items():
        data.setdefault(table, {}).update(values)
    return data


def _qwen3(**edits: Any) -> dict[str, Any]:
    model: dict[str, Any] = tomllib.loads(MODELS.read_text(encoding="utf-8"))["qwen3-30b-a3b"]
    return {"model": model["model"] | {"dtype": "bf16"} | edits}


SMALL = {"nnodes": 2}
SPECS = {
    # 78 layers: uneven pipeline splits (first/last stage, embedding and loss as layers)
    "dense-uneven": _spec(distributed=SMALL, batch={"global_batch_size": 64},
                          model={"num_layers": 78}),
    "dense-fp8": _spec(distributed=SMALL, batch={"global_batch_size": 64},
                       model={"dtype": "fp8"}),
    # 128 experts: ep x etp multiply the layouts; 46 layers do not divide by pp 4, 8, 16
    "moe-uneven": _spec(distributed=SMALL, batch={"global_batch_size": 64},
                        **_qwen3(num_layers=46)),
    # recompute held as written: every candidate of a class recomputes alike
    "moe-held-recompute": _spec(
        distributed=SMALL, batch={"global_batch_size": 64},
        megatron={"recompute_granularity": "full", "recompute_method": "uniform",
                  "recompute_num_layers": 1},
        **_qwen3(),
    ),
}  # fmt: skip


def _tuner(name: str, tmp_path: Path) -> Tuner:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(SPECS[name]), encoding="utf-8")
    return Tuner(Compiler(load_plugins(autoload=False)), load_file(str(path)))


def _seen(candidates: list[Candidate]) -> list[tuple[Any, ...]]:
    return [
        (c.key, c.label(), sorted(c.switches.items()), c.memory_bytes, c.prediction)
        for c in candidates
    ]


def _shown(result: Result) -> tuple[Any, ...]:
    rows = [
        (r.candidate.label(), r.candidate.key, r.candidate.prediction, r.data) for r in result.rows
    ]
    return (rows, result.generated, result.fitting, result.estimated, result.refused)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SPECS))
def test_bounded_ranking_is_the_exhaustive_sort(name: str, tmp_path: Path) -> None:
    tuner = _tuner(name, tmp_path)
    everything = sorted(tuner.candidates(), key=lambda c: c.key)
    count, ranked = tuner.ranked()
    # read to the end: every bound is checked against the candidates it stood for
    assert count == len(everything) > 100
    assert _seen(list(ranked)) == _seen(everything)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SPECS))
def test_search_result_equals_the_exhaustive_one(name: str, tmp_path: Path) -> None:
    tuner = _tuner(name, tmp_path)
    exhaustive = tuner.run_exhaustive(top=8)
    walked = _seen(tuner.walked)
    bounded = tuner.run(top=8)
    assert bounded.rows, "no layout found: the comparison would be empty"
    assert _shown(bounded) == _shown(exhaustive)
    assert _seen(tuner.walked) == walked
    # the walk went past candidates that do not fit: the bounds were tested below the top
    assert bounded.estimated > bounded.fitting


@pytest.mark.slow
def test_a_bound_the_model_breaks_falls_back_to_the_exhaustive_ranking(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    exhaustive = _tuner("moe-held-recompute", tmp_path).run_exhaustive(top=4)
    real = search._bound_key
    # bounds at half the speed: the first class predicted in full beats its own bound
    monkeypatch.setattr(search, "_bound_key", lambda c, tokens: real(c, tokens / 2))
    tuner = _tuner("moe-held-recompute", tmp_path)
    with pytest.raises(search.BoundMissed):
        list(tuner.ranked()[1])
    assert _shown(tuner.run(top=4)) == _shown(exhaustive)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SPECS))
def test_memory_pruning_rules_out_only_what_the_full_estimate_does(
    name: str, tmp_path: Path
) -> None:
    # 32 rows: deep enough that every spec's walk meets layouts whose state alone is too big
    full = _tuner(name, tmp_path)
    full.prune_memory = False
    reference = full.run(top=32)
    tuner = _tuner(name, tmp_path)
    result = tuner.run(top=32)
    assert _shown(result) == _shown(reference)
    # the walk skipped the full estimate of the candidates that do not fit: some by their
    # state alone, the others by the first stage found too big
    skipped = [c for c in tuner.walked if c.memory_bytes is None]
    assert 0 < len(skipped) < len(tuner.walked)
    by_state = [
        c for c in skipped if state_floor(tuner.shape, c.sizes, c.training) > tuner.capacity
    ]
    assert 0 < len(by_state) < len(skipped)
    # ... which the full estimate rules out too; the picture estimates them as before
    estimated = tuner.sample(limit=10**6)
    assert _seen(estimated) == _seen(full.walked)
    ruled_out = [e for c, e in zip(tuner.walked, estimated, strict=True) if c.memory_bytes is None]
    assert len(ruled_out) == len(skipped)
    assert all(e.memory_bytes is not None and e.memory_bytes > tuner.capacity for e in ruled_out)


@pytest.mark.slow
def test_where_no_layouts_state_fits_the_search_says_so_without_walking(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Qwen3-235B-A22B on one node of 8 H100s: its weights, gradients and Adam state alone
    # overfill every layout's GPUs
    model = tomllib.loads(MODELS.read_text(encoding="utf-8"))["qwen3-235b-a22b"]["model"]
    spec = _spec(
        distributed={"nnodes": 1}, batch={"global_batch_size": 64}, model=model | {"dtype": "bf16"}
    )
    path = tmp_path / "too-big.json"
    path.write_text(json.dumps(spec), encoding="utf-8")
    full = Tuner(Compiler(load_plugins(autoload=False)), load_file(str(path)))
    full.prune_memory = False
    reference = full.run(top=5)
    tuner = Tuner(Compiler(load_plugins(autoload=False)), load_file(str(path)))
    result = tuner.run(top=5)
    assert not reference.rows and reference.fitting == 0 and full.walked
    assert (result.rows, result.fitting, result.generated) == ((), 0, reference.generated)
    assert tuner.walked == []
    # the least state is the least of every candidate's, each above the GPU's memory
    floors = [state_floor(tuner.shape, c.sizes, c.training) for c in tuner.candidates()]
    assert result.least_state == min(floors) > tuner.capacity
    assert reference.least_state is None
    assert main(["tune", str(path)]) == 1
    said = capsys.readouterr().err
    assert f"take at least {min(floors) / 2**30:.1f} GiB on its fullest GPU" in said
    # --format json: the compiler's findings on the spec as written, as compile prints them
    assert main(["tune", str(path), "--format", "json"]) == 1
    printed = capsys.readouterr()
    assert json.loads(printed.out)["ok"] is False
    assert "the compiler on the spec as written" in printed.err


def _layout(candidate: Candidate) -> tuple[int, ...]:
    """A candidate's parallel sizes (dp follows from them and the world)."""
    L = candidate.layout
    return (L.tp, L.pp, L.cp, L.ep, L.etp)


def _traded(candidate: Candidate) -> tuple[Any, ...]:
    """The sizes but cp, and the sequences per micro batch per cp rank."""
    L = candidate.layout
    return (L.tp, L.pp, L.ep, L.etp, Fraction(L.micro_batch_size, L.cp))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["dense-uneven", "dense-fp8", "moe-uneven"])
def test_each_parallel_layout_is_shown_once_at_its_best_schedule(name: str, tmp_path: Path) -> None:
    tuner = _tuner(name, tmp_path)
    # no headroom: a shown layout's sizes do not come back to leave it
    result = tuner.run(top=8, headroom=0.0)
    shown = [_layout(r.candidate) for r in result.rows]
    assert len(set(shown)) == len(shown) == 8
    # where the walk met a shown layout at other micro batches or virtual-stage counts that
    # fit, it showed the fastest of them (the walk is in ranking order) but for one that
    # splits another row's tokens per rank over cp instead of the micro batch (that row's
    # variant); some layout was met at more than one micro batch or depth (the MoE search
    # meets its layouts at more than one micro batch: two rows of one layout before)
    traded = {_traded(r.candidate): r for r in result.rows}
    batches = interleaved = 0
    for row, layout in zip(result.rows, shown, strict=True):
        variants = [
            c
            for c in tuner.walked
            if _layout(c) == layout
            and c.memory_bytes is not None
            and c.memory_bytes <= tuner.capacity
            and traded.get(_traded(c), row) is row
        ]
        assert row.candidate.key == variants[0].key
        batches += len({c.batch.micro_batch_size for c in variants}) > 1
        interleaved += len({c.layout.vpp for c in variants}) > 1
    assert batches + interleaved
    assert batches or name != "moe-uneven"


@pytest.mark.slow
def test_virtual_stage_depths_wait_under_one_prediction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A layout's interleaving depths share one bound until it comes up: on 16,384 GPUs the
    search predicts the heads of fewer layout classes than a prediction bounds (and ranks
    as the exhaustive sort does: the tests above)."""
    path = tmp_path / "wide.json"
    spec = _spec(distributed={"nnodes": 2048}, batch={"global_batch_size": 16384})
    path.write_text(json.dumps(spec), encoding="utf-8")
    tuner = Tuner(Compiler(load_plugins(autoload=False)), load_file(str(path)))
    classes = [group for group in tuner.classes() if group.subgroups[0][1] is not None]
    assert len({group.family for group in classes}) < len(classes) / 2
    predicted: list[Any] = []
    real = tuner._candidate

    def candidate(*a: Any) -> Any:
        predicted.append(a[0])
        return real(*a)

    monkeypatch.setattr(tuner, "_candidate", candidate)
    assert tuner.run(top=5).rows
    # 833 of the 1,236 classes when this was written (every one before)
    assert len({id(group) for group in predicted}) < len(classes) * 3 / 4


def _recompute_modules(tuner: Tuner, sizes: tuple[int, int, int]) -> set[tuple[str, ...] | None]:
    """The selective recompute module sets the search tries on one layout's sizes."""
    return {
        c.layout.recompute_modules
        for c in tuner.candidates()
        if c.layout.recompute == "selective" and (c.layout.tp, c.layout.pp, c.layout.cp) == sizes
    }


@pytest.mark.slow
def test_selective_recompute_modules_are_searched_where_the_model_has_them(
    tmp_path: Path,
) -> None:
    # Megatron-Core's default (the attention core), and one more module each that names a
    # part the model has: dense MLPs for Llama; the MoE layer for Qwen3 (no shared experts,
    # no multi-latent attention: those sets are left out)
    dense = _recompute_modules(_tuner("dense-uneven", tmp_path), (4, 2, 1))
    assert dense == {None, ("core_attn", "mlp")}
    moe = _recompute_modules(_tuner("moe-uneven", tmp_path), (2, 2, 1))
    assert moe == {None, ("core_attn", "moe")}
    # held modules are not searched: every selective candidate keeps the written ones
    SPECS["dense-held-modules"] = _spec(
        distributed=SMALL, batch={"global_batch_size": 64},
        megatron={"recompute_modules": ["core_attn"]},
    )  # fmt: skip
    try:
        held = _recompute_modules(_tuner("dense-held-modules", tmp_path), (4, 2, 1))
    finally:
        del SPECS["dense-held-modules"]
    assert held == {("core_attn",)}


@pytest.mark.slow
def test_a_recompute_module_trades_time_for_memory_and_compiles(tmp_path: Path) -> None:
    tuner = _tuner("dense-uneven", tmp_path)
    pairs: dict[tuple[Any, ...], dict[tuple[str, ...] | None, Candidate]] = {}
    for c in tuner.candidates():
        L = c.layout
        if L.recompute == "selective":
            key = (L.tp, L.pp, L.cp, L.vpp, L.zero_stage, c.batch.micro_batch_size, L.stage_layers)
            pairs.setdefault(key, {})[L.recompute_modules] = tuner._with_memory(c)
    # the first layout whose MLP-recomputing setting fits the H100
    plain, mlp = next(
        (found[None], found[("core_attn", "mlp")])
        for found in pairs.values()
        if (found[("core_attn", "mlp")].memory_bytes or 0) <= tuner.capacity
    )
    # the MLP's GEMMs run again in the backward pass; its activations are not kept
    assert mlp.prediction.step_time_s > plain.prediction.step_time_s
    assert (mlp.memory_bytes or 0) < (plain.memory_bytes or 0)
    assert "rc:sel(core_attn+mlp)" in mlp.label()
    data = tuner.spec_data(mlp)
    assert list(data["megatron"]["recompute_modules"]) == ["core_attn", "mlp"]
    path = tmp_path / "modules.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    compiled = tuner.compiler.compile_document(load_file(str(path)), tree=False)
    assert list(compiled.plan.training.recompute_modules or ()) == ["core_attn", "mlp"]
    # and as the search compiles it, from the data itself
    doc = tuner.doc.__class__(path=tuner.doc.path, data=data, values={}, keys={})
    assert tuner.compiler.compile_document(doc, tree=False).plan is not None


def test_context_parallel_sizes_are_bounded_by_tokens_per_rank_alone(tmp_path: Path) -> None:
    # Megatron-Core bounds cp by nothing but the world; the search keeps only cp that leave
    # each rank 1,024 tokens or more. 64k tokens on 16 nodes x 8 GPUs: the divisors of 128
    # up to 65,536 / 1,024 = 64 (NeMo's long-sequence runs ran cp 32 for 1M tokens)
    SPECS["dense-64k"] = _spec(
        distributed={"nnodes": 16}, batch={"global_batch_size": 16},
        model={"seq_length": 65536},
    )  # fmt: skip
    try:
        tuner = _tuner("dense-64k", tmp_path)
    finally:
        del SPECS["dense-64k"]
    assert {group.sizes.cp for group in tuner.classes()} == {1, 2, 4, 8, 16, 32, 64}


@pytest.mark.slow
def test_the_walk_reads_one_state_floor_per_layout_and_optimizer_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the model state reads no recompute setting: the layouts that differ only in recompute
    # share one floor (the walk once read it again for each)
    tuner = _tuner("moe-uneven", tmp_path)
    calls: list[Candidate] = []
    real = Tuner._state_floor

    def counted(t: Tuner, c: Candidate) -> int:
        calls.append(c)
        return real(t, c)

    monkeypatch.setattr(Tuner, "_state_floor", counted)
    tuner.run(top=32)

    def state(c: Candidate) -> tuple[Any, ...]:
        L = c.layout
        return (L.tp, L.pp, L.cp, L.ep, L.etp, L.vpp, search._without_recompute(c.training))

    families = {(c.layout.tp, c.layout.pp, c.layout.cp, c.layout.ep, c.layout.etp,
                 c.layout.vpp, c.training) for c in tuner.walked}  # fmt: skip
    assert len(calls) == len({state(c) for c in tuner.walked}) < len(families)


@pytest.mark.slow
def test_the_models_cached_pieces_equal_ones_computed_cold(tmp_path: Path) -> None:
    # the recompute shares and a stage's parameters are cached by the layout fields they
    # read: one keyed without a field it reads would hand a layout another's prediction
    tuner = _tuner("moe-uneven", tmp_path)
    candidates = list(tuner.candidates())
    assert len({c.layout.recompute_layers for c in candidates}) > 2
    for c in candidates[:: max(1, len(candidates) // 400)]:
        assert c.layout.stage_layers is not None
        terms._recomputed.cache_clear()
        terms._stage_params.cache_clear()
        cold = predict(
            tuner.shape, c.layout, tuner.hardware, nproc_per_node=tuner.nproc,
            precision=tuner.precision, window=tuner.window, window_skip=tuner.window_skip,
            bf16_share=bf16_share(tuner.shape, c.training,
                                  bf16_stage(c.sizes, c.training), c.layout.stage_layers),
        )  # fmt: skip
        assert cold == c.prediction, c.label()


@pytest.mark.slow
def test_recompute_settings_wait_for_the_setting_that_bounds_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # full recompute of the first n layers of each chunk reruns no less of any term than of
    # fewer layers: it is predicted only once the ranking reads no faster than the next
    # fewer (an optimizer setting's recompute settings were once predicted together, when
    # the ranking came down to its step without recompute, most of them never read)
    tuner = _tuner("moe-uneven", tmp_path)
    waiting: list[tuple[str, float]] = []
    early: list[str] = []
    real = Tuner._candidate

    def blocks(training: Any) -> int | None:
        full = training.recompute == "full" and training.recompute_method == "block"
        return training.recompute_num_layers if full else None

    def counted(t: Tuner, group: Any, switches: Any, training: Any) -> Candidate:
        c = real(t, group, switches, training)
        n = blocks(training)
        alike = search._without_recompute(training)
        fewer = [
            (m, variant)
            for variant in group.variants
            if (m := blocks(variant[1])) is not None and m < (n or 0)
            and search._without_recompute(variant[1]) == alike
        ]  # fmt: skip
        if fewer:
            bound = real(t, group, *max(fewer, key=lambda f: f[0])[1])
            waiting.append((c.label(), bound.prediction.tokens_per_s_per_gpu))
        return c

    monkeypatch.setattr(Tuner, "_candidate", counted)
    _, ranked = tuner.ranked()
    waited = 0
    for c in itertools.islice(ranked, 4000):
        speed = c.prediction.tokens_per_s_per_gpu
        early += [label for label, bound in waiting if speed > bound * (1 + 1e-9)]
        waited += len(waiting)
        waiting.clear()
    assert waited > 100
    assert not early, early[:5]
