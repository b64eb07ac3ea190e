"""The published pre-training runs (tests/published/runs.toml) as mdc specs: what the
published-runs tests compile and what bench's fits and targets predict, built one way.

Each row is a run that really ran (docs/published-runs.md); :func:`spec_of` writes the spec
that launches it, and :data:`AWAITING` names the rows mdc cannot express yet.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from mdc.convert import structure
from mdc.plan.memory import parameter_count, resolve_shape
from mdc.plan.named_models import CATALOGUE_FILE
from mdc.spec import ModelTable

#: the table of published runs, and its accelerators' datasheet figures
RUNS_FILE = Path(__file__).resolve().parent.parent / "tests" / "published" / "runs.toml"
RUNS: list[dict[str, Any]] = tomllib.loads(RUNS_FILE.read_text(encoding="utf-8"))["run"]
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
OVER_MEMORY = (
    "compiles (activations over the limit are a warning, MDC262), but the memory estimate "
    "exceeds the GPU's memory for a run that fit (issue 12 §2): the estimate counts more "
    "than the run held"
)

_META_SCHEDULE = (
    OVER_MEMORY
    + ": Meta's own pipeline schedule, not Megatron-LM's; the estimate holds Megatron-LM's "
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


def recipe_mtp_params(run: dict[str, Any]) -> int:
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
