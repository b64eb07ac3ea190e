"""Published pre-training runs compile: no refusal, the published size, a fit in memory.

Every row of ``runs.toml`` is a run that really ran (a paper's or a vendor's table, see
docs/published-runs.md). Each is compiled as its launcher's spec through mdc's real compile
path, with ``accelerator_memory_gib`` set to the GPU's memory, and must:

* compile: a framework does not refuse a run it ran, so neither may mdc;
* count the model's parameters within 1 % of the published size (or within half the unit
  of the last digit the source prints, when it rounds coarser than that);
* estimate the memory per GPU within the GPU's memory.

Rows mdc cannot express yet are listed in :data:`AWAITING` with the feature they wait for;
each must still be refused (a strict expected failure), so the list only shrinks.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import attrs
import pytest

from mdc.convert import structure
from mdc.errors import SpecError
from mdc.pipeline import Compiled, Compiler
from mdc.plan.memory import parameter_count, resolve_shape
from mdc.plan.named_models import CATALOGUE_FILE
from mdc.plugin_manager import load_plugins
from mdc.spec import ModelTable

HERE = Path(__file__).resolve().parent
RUNS: list[dict[str, Any]] = tomllib.loads((HERE / "runs.toml").read_text(encoding="utf-8"))["run"]
MODELS: dict[str, dict[str, Any]] = tomllib.loads(Path(CATALOGUE_FILE).read_text(encoding="utf-8"))

#: the row's precision -> [model] dtype and the Megatron fp8 format it runs with (TorchTitan
#: turns fp8 into its Float8 converter)
PRECISION = {
    "bf16": ("bf16", None),
    "fp16": ("fp16", None),
    "fp8": ("fp8", "hybrid"),
    "mxfp8": ("fp8", "e4m3"),
    "nvfp4": ("bf16", None),
}
#: the row's precision -> its [megatron] keys: Megatron-Bridge's NVFP4 recipe
#: (mixed_precision.py, bf16_with_nvfp4_mixed at 17a381f: fp4 = "e2m1", fp4_recipe = "nvfp4",
#: fp4_param_gather = True) in Megatron-LM's flags
MEGATRON_PRECISION: dict[str, dict[str, Any]] = {
    "nvfp4": {"fp4_format": "e2m1", "fp4_recipe": "nvfp4", "fp4_param_gather": True},
}

_LIGHTNING = (
    "the shape of Nemotron 3.5 Lightning is read by Megatron-Bridge from the Hugging Face "
    "config of nvidia/NVIDIA-Nemotron-3.5-Lightning-30B-A3B-BF16 (revision b3caaab, "
    "recipes/nemotronh/h100/nemotron_3_nano.py), which no source at hand states; the Bridge's "
    "verification card gives only the total, 32,913,266,240 parameters with the MTP layers"
)
_LAYOUT = (
    "61 layers over pp x vp stages that Megatron-LM splits only through "
    "--pipeline-model-parallel-layout, and no published layout for this pp and vp: the "
    "recipe's layout_map (Megatron-Bridge v0.2.0, recipes/deepseek/deepseek_v3.py) has "
    "(1, 1), (4, 1), (8, 1), (4, 2), (16, 1), (8, 2), (4, 4) only, and the 25.11 presets "
    "(scripts/performance/configs/deepseek/workload_base_configs.py) run GB300 and GB200 at "
    "pp 4 x vp 4, ep 64, not this row's layout"
)
_MEMORY = (
    "compiles (activations over the limit are a warning, MDC262), but the memory estimate "
    "exceeds the GPU's memory for a run that fit (issue 12 §2): the estimate counts more "
    "than the run held"
)

_META_SCHEDULE = (
    _MEMORY + ": Meta's own pipeline schedule, not Megatron-LM's; the estimate holds Megatron-LM's "
    "interleaved warm-up, (pp - rank - 1) * 2 + (vp - 1) * pp one-layer chunks in flight "
    "(141 on pipeline rank 1), 81.0 GiB of 79.6"
)

#: row id -> the feature it waits for. Each of these is still refused today; when the feature
#: lands the row compiles, its expected failure turns into an error, and it leaves this list.
AWAITING: dict[str, str] = {
    "mbridge-26.08-gb200-nemotron-3-5-lightning-mxfp8": _LIGHTNING,
    "mbridge-25.11-gb300-deepseek-v3-no-mtp-bf16": _LAYOUT,
    "mbridge-25.11-gb300-deepseek-v3-no-mtp-mxfp8": _LAYOUT,
    "mbridge-25.11-gb200-deepseek-v3-no-mtp-mxfp8": _LAYOUT,
    "llama3-paper-405b-8192gpu-cp1": _META_SCHEDULE,
}


class ModelNotListed(LookupError):
    """The row's model has no entry in models.toml yet."""


def spec_of(run: dict[str, Any], models: dict[str, dict[str, Any]] = MODELS) -> dict[str, Any]:
    """The mdc spec that launches ``run``: its layout, batch, model and memory capacity."""
    if run["model"] not in models:
        raise ModelNotListed(run["model"])
    dtype, fp8_format = PRECISION[run["precision"]]
    nproc = run["nproc_per_node"]
    model = {
        **models[run["model"]]["model"],
        **run.get("model_table", {}),
        "seq_length": run["seq_length"],
        "dtype": dtype,
    }
    batch = {k: run[k] for k in ("global_batch_size", "micro_batch_size") if k in run}
    parallelism = {k: run[k] for k in ("tp", "pp", "cp", "ep", "etp", "vpp") if k in run}
    launcher = run["launcher"]
    table: dict[str, Any] = {}
    if launcher == "megatron":
        table.update(_megatron_recompute(run))
        if fp8_format is not None:
            table["fp8_format"] = fp8_format
        table.update(MEGATRON_PRECISION.get(run["precision"], {}))
    elif "recompute" in run:
        table["config"] = {"activation_checkpoint": {"mode": run["recompute"]}}
    for key, value in run.get("launcher_table", {}).items():
        table[key] = {**table.get(key, {}), **value} if isinstance(value, dict) else value
    return {
        "job": {"name": "published-run", "command": ["python", "pretrain_gpt.py"]},
        "distributed": {
            "launcher": launcher,
            "backend": "slurm",
            "nnodes": run["gpus"] // nproc,
            "nproc_per_node": nproc,
            "accelerator_model": run["accelerator_model"],
            # the row's datasheet figure, explicit: it wins over the catalogue's default
            "accelerator_memory_gib": run["gpu_memory_gib"],
        },
        "parallelism": parallelism,
        "batch": batch,
        "model": model,
        launcher: table,
        "slurm": {"partition": "gpu"},
    }


def _recipe_mtp_params(run: dict[str, Any]) -> int:
    """Parameters of the multi-token-prediction layers a run's recipe adds to a model whose
    published count (the released checkpoint's) has none."""
    depths = run.get("model_table", {}).get("mtp_num_layers")
    own = MODELS[run["model"]]["model"]
    if not depths or own.get("mtp_num_layers"):
        return 0
    counts = []
    for mtp in (depths, 0):
        shape = resolve_shape(structure({**own, "mtp_num_layers": mtp}, ModelTable))
        assert shape is not None
        counts.append(parameter_count(shape))
    return counts[0] - counts[1]


def _megatron_recompute(run: dict[str, Any]) -> dict[str, Any]:
    recompute = run.get("recompute", "none")
    if recompute == "none":
        return {}
    keys: dict[str, Any] = {"recompute_granularity": recompute}
    for key in ("recompute_method", "recompute_num_layers"):
        if key in run:
            keys[key] = run[key]
    return keys


@pytest.fixture(scope="module")
def compiler() -> Compiler:
    return Compiler(load_plugins(autoload=False))


def compiled(compiler: Compiler, tmp_path: Path, run: dict[str, Any]) -> Compiled:
    path = tmp_path / f"{run['id']}.json"
    path.write_text(json.dumps(spec_of(run)), encoding="utf-8")
    return compiler.compile(path, tree=False)


def _param(run: dict[str, Any]) -> Any:
    waits = AWAITING.get(run["id"])
    # a memory row is no longer refused: it fails the estimate's own assertion
    raises = (
        (AssertionError,) if waits and waits.startswith(_MEMORY) else (SpecError, ModelNotListed)
    )
    marks = [pytest.mark.xfail(reason=waits, raises=raises, strict=True)] if waits else []
    return pytest.param(run, id=run["id"], marks=marks)


@pytest.mark.parametrize("run", [_param(r) for r in RUNS])
def test_published_run_compiles_with_its_size_and_fits(
    compiler: Compiler, tmp_path: Path, run: dict[str, Any]
) -> None:
    try:
        result = compiled(compiler, tmp_path, run)
    except SpecError as exc:
        if run["id"] in AWAITING:
            raise
        pytest.fail(
            f"{run['id']} ({run['source']}, {run['table']}) refused:\n"
            + "\n".join(d.render() for d in exc.diagnostics)
        )
    memory = result.plan.memory
    assert memory is not None, "a complete [model] table gives an estimate"
    entry = MODELS[run["model"]]
    published = entry["published_params"]
    tolerance = max(0.01 * published, entry.get("published_params_rounded_to", 0) / 2)
    # a run's recipe may add MTP depths the released model (and its published count) lacks
    counted = memory.params_total - _recipe_mtp_params(run)
    if entry.get("published_params_exclude_mtp"):  # the source counts the main model only
        shape = resolve_shape(structure(entry["model"], ModelTable))
        assert shape is not None
        counted = parameter_count(attrs.evolve(shape, mtp_layers=0))
    assert abs(counted - published) <= tolerance, (
        f"{counted:,} parameters, published {published:,.0f} ({entry['params_source']})"
    )
    capacity = run["gpu_memory_gib"] * 2**30
    assert memory.capacity == capacity
    assert memory.total <= capacity, (
        f"estimate {memory.total / 2**30:.1f} GiB > {run['gpu_memory_gib']} GiB"
    )


# ------------------------------------------------------------------ the table itself

REQUIRED = [
    "id",
    "source",
    "table",
    "date",
    "model",
    "launcher",
    "accelerator_model",
    "gpu_memory_gib",
    "gpus",
    "nproc_per_node",
    "precision",
    "seq_length",
]
MEASURED = {
    "tflops_per_gpu",
    "tokens_per_s_per_gpu",
    "mfu",
    "step_time_s",
    "memory_gib",
    "flops_include_recompute",
    "attention_flops",
}


def test_rows_are_complete_and_unique() -> None:
    accelerators = tomllib.loads((HERE / "runs.toml").read_text(encoding="utf-8"))["accelerators"]
    ids = [r["id"] for r in RUNS]
    assert len(ids) == len(set(ids))
    for run in RUNS:
        assert [k for k in REQUIRED if k not in run] == [], run["id"]
        assert run["source"].startswith("https://"), run["id"]
        assert run["launcher"] in ("megatron", "torchtitan"), run["id"]
        # the only other count is the causal half, which a row says by leaving the key out
        assert run.get("measured", {}).get("attention_flops", "full") == "full", run["id"]
        if "gpu_memory_source" not in run:  # a variant of the accelerator says where its size is
            assert run["gpu_memory_gib"] == accelerators[run["accelerator_model"]]["memory_gib"]
        assert run["gpus"] % run["nproc_per_node"] == 0, run["id"]
        assert set(run.get("measured", {})) <= MEASURED, run["id"]
        assert run["precision"] in PRECISION, run["id"]


def test_awaiting_names_only_rows_of_the_table() -> None:
    assert set(AWAITING) <= {r["id"] for r in RUNS}


MEASURED_MEMORY = [
    r for r in RUNS if "memory_gib" in r.get("measured", {}) and r["id"] not in AWAITING
]


@pytest.mark.parametrize("run", MEASURED_MEMORY, ids=[r["id"] for r in MEASURED_MEMORY])
def test_estimate_is_near_the_measured_peak(
    compiler: Compiler, tmp_path: Path, run: dict[str, Any]
) -> None:
    """Where the source states the peak memory per GPU (TorchTitan's benchmark tables: the
    allocator's peak, with its cache), the estimate stays within -45 % / +10 % of it: it
    leaves the CUDA context, buffers and fragmentation out, and torch.compile's fusions keep
    a little less than the eager layer it counts."""
    estimate = compiled(compiler, tmp_path, run).plan.memory
    assert estimate is not None
    measured = run["measured"]["memory_gib"] * 2**30
    assert 0.55 * measured <= estimate.total <= 1.10 * measured, (
        f"estimate {estimate.total / 2**30:.1f} GiB, measured {run['measured']['memory_gib']} "
        f"GiB ({run['source']}, {run['table']})"
    )
