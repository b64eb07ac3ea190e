"""The published models of ``tests/published/models.toml``: mdc describes each one.

Each entry's ``model`` table is a valid ``[model]`` table; its parameter
count (and, for MoE models, its active count) is within 1 % of the number its authors
publish, cited in the entry.
"""

from __future__ import annotations

import math
import tomllib
from pathlib import Path
from typing import Any

import attrs
import pytest

from mdc.convert import structure
from mdc.plan.memory import active_parameter_count, parameter_count, resolve_shape
from mdc.plan.named_models import CATALOGUE_FILE
from mdc.schema import core_schema, validator_class
from mdc.spec import ModelTable

MODELS_FILE = Path(CATALOGUE_FILE)
MODELS: dict[str, dict[str, Any]] = tomllib.loads(MODELS_FILE.read_text())
TOLERANCE = 0.01


def test_every_entry_has_its_sources() -> None:
    for name, entry in MODELS.items():
        assert entry["source"].startswith("https://"), name
        assert entry["params_source"].startswith("https://"), name
        assert entry["published_params"] > 0, name
        assert set(entry) <= {
            "source",
            "hf_ids",
            "published_params",
            "params_source",
            "published_active_params",
            "active_params_exclude_embedding",
            "published_params_rounded_to",
            "published_params_exclude_mtp",
            "model",
        }, name


@pytest.mark.parametrize("name", sorted(MODELS))
def test_model_table_is_valid_for_the_schema(name: str) -> None:
    spec = {
        "job": {"name": "published", "command": "pretrain_gpt.py"},
        "distributed": {"launcher": "megatron"},
        "model": MODELS[name]["model"],
    }
    errors = [e.message for e in validator_class()(core_schema()).iter_errors(spec)]
    assert not errors, errors


def _shape(name: str) -> Any:
    shape = resolve_shape(structure(MODELS[name]["model"], ModelTable))
    assert shape is not None, name
    return shape


@pytest.mark.parametrize("name", sorted(MODELS))
def test_parameter_count_is_within_one_percent_of_the_published(name: str) -> None:
    published, shape = MODELS[name]["published_params"], _shape(name)
    if MODELS[name].get("published_params_exclude_mtp"):  # the source counts the main model
        shape = attrs.evolve(shape, mtp_layers=0)
    count = parameter_count(shape)
    # a size printed coarser than 1 % ("1.7" billion) stands for every count that rounds to it
    rounding = MODELS[name].get("published_params_rounded_to", 0) / 2
    assert math.isclose(count, published, rel_tol=TOLERANCE, abs_tol=rounding), (
        name,
        count,
        published,
    )


@pytest.mark.parametrize(
    "name", sorted(n for n, e in MODELS.items() if "published_active_params" in e)
)
def test_active_parameters_are_within_one_percent_of_the_published(name: str) -> None:
    entry = MODELS[name]
    published, shape = entry["published_active_params"], _shape(name)
    count = active_parameter_count(shape)
    if entry.get("active_params_exclude_embedding"):  # as the source counts them
        count -= shape.vocab * shape.hidden
    assert math.isclose(count, published, rel_tol=TOLERANCE), (name, count, published)


def test_a_dense_model_uses_every_parameter() -> None:
    shape = _shape("llama3-8b")
    assert active_parameter_count(shape) == parameter_count(shape)


def test_deepseek_v3_main_model_is_671_billion() -> None:
    """DeepSeek-V3's model card: 671B for the main model, without the MTP module."""
    shape = attrs.evolve(_shape("deepseek-v3"), mtp_layers=0)
    assert math.isclose(parameter_count(shape), 671e9, rel_tol=TOLERANCE)
