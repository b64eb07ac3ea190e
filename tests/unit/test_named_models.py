"""Models by name (``[model] name``) and by Hugging Face config (``[model] hf_config``).

``tests/fixtures/hf_configs/<id>.json`` is the ``config.json`` published at the ``source`` of
catalogue entry ``<id>`` (the keys as the model's repository has them). Reading it must give
the catalogue's ``[model]`` table, which an earlier hand read of the same source wrote and
tests/unit/test_published_models.py holds to the published parameter counts: two readings
of one source that must agree.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import tomlkit

from mdc.errors import SpecError
from mdc.pipeline import Compiler
from mdc.plan.hf_config import model_keys
from mdc.plan.named_models import RUN_KEYS, architecture, catalogue, lookup, names
from mdc.plugin_manager import load_plugins

CONFIGS = Path(__file__).resolve().parents[1] / "fixtures" / "hf_configs"
COMPILER = Compiler(load_plugins(autoload=False))


def _spec(model: dict[str, Any]) -> dict[str, Any]:
    return {
        "job": {"name": "named", "command": ["python", "pretrain_gpt.py"]},
        "distributed": {"launcher": "megatron", "nnodes": 2, "nproc_per_node": 8},
        "parallelism": {"tp": 8, "pp": 2},
        "batch": {"global_batch_size": 16, "micro_batch_size": 1},
        "model": model,
    }


def _compile(tmp_path: Path, spec: dict[str, Any], name: str = "job.toml") -> Any:
    path = tmp_path / name
    path.write_text(tomlkit.dumps(spec), encoding="utf-8")
    return COMPILER.compile(path)


def _errors(tmp_path: Path, spec: dict[str, Any]) -> list[Any]:
    with pytest.raises(SpecError) as caught:
        _compile(tmp_path, spec)
    return list(caught.value.diagnostics)


@pytest.mark.parametrize("config", sorted(p.stem for p in CONFIGS.glob("*.json")))
def test_a_config_json_reads_as_its_catalogue_table(config: str) -> None:
    data = json.loads((CONFIGS / f"{config}.json").read_text(encoding="utf-8"))
    assert model_keys(data) == architecture(config)


def test_every_hugging_face_id_names_its_entry_in_any_case() -> None:
    for ident, entry in catalogue().items():
        assert lookup(ident) == ident
        for hf_id in entry.get("hf_ids", ()):
            assert lookup(hf_id) == ident and lookup(hf_id.upper()) == ident
            # an id names the repository its entry was read from, or a release beside it
            assert hf_id.count("/") == 1
    assert "meta-llama/Llama-3.3-70B-Instruct" in names()


def test_a_named_model_compiles_as_its_keys_written_out(tmp_path: Path) -> None:
    """The same artifacts, byte for byte, from the name as from the catalogue's keys."""
    keys = architecture("llama3.1-70b") | {"seq_length": 4096}
    by_name = _compile(tmp_path, _spec({"name": "meta-llama/Llama-3.3-70B-Instruct",
                                        "seq_length": 4096}), "a.toml")  # fmt: skip
    by_keys = _compile(tmp_path, _spec(keys), "b.toml")
    assert by_name.launch == by_keys.launch
    trees = [
        {a.path: a.data for a in c.tree if a.path != "manifest.json"} for c in (by_name, by_keys)
    ]
    assert trees[0] == trees[1] and "plan.json" in trees[0]
    assert b"--num-query-groups 8" in b"".join(trees[0].values())


def test_keys_written_beside_a_name_win(tmp_path: Path) -> None:
    spec = _spec({"name": "llama3.1-70b", "num_layers": 40, "seq_length": 2048})
    written = b"".join(a.data for a in _compile(tmp_path, spec).tree)
    assert b"--num-layers 40 " in written and b"--hidden-size 8192 " in written


def test_the_run_keys_are_the_spec_s(tmp_path: Path) -> None:
    assert RUN_KEYS.isdisjoint(architecture("deepseek-v3"))


def test_an_unknown_name_is_located_with_a_suggestion_beside_other_findings(
    tmp_path: Path,
) -> None:
    spec = _spec({"name": "meta-llama/Llama-3.1-70B-Instruc", "seq_length": 4096})
    spec["distributed"]["nnodes"] = "two"  # a schema error elsewhere, reported too
    found = _errors(tmp_path, spec)
    named = [d for d in found if d.code == "MDC040"]
    assert len(named) == 1 and named[0].location.pointer == "/model/name"
    assert named[0].location.line is not None
    assert "meta-llama/Llama-3.1-70B-Instruct" in (named[0].hint or "")
    assert any(d.location.pointer == "/distributed/nnodes" for d in found)


def test_a_finding_about_a_named_key_points_at_the_name(tmp_path: Path) -> None:
    """tp 3 does not divide Llama-3.1-70B's 64 heads: Megatron-LM refuses it."""
    spec = _spec({"name": "llama3.1-70b", "seq_length": 4096})
    spec["distributed"]["nproc_per_node"] = 3
    spec["parallelism"]["tp"] = 3
    found = _errors(tmp_path, spec)
    groups = [d for d in found if d.location.pointer.startswith("/model/")]
    assert groups, [d.render() for d in found]
    source = (tmp_path / "job.toml").read_text(encoding="utf-8").splitlines()
    assert source[groups[0].location.line - 1].startswith("name = ")


def test_hf_config_is_read_relative_to_the_spec(tmp_path: Path) -> None:
    (tmp_path / "ckpt").mkdir()
    shutil.copy(CONFIGS / "qwen3-30b-a3b.json", tmp_path / "ckpt" / "config.json")
    by_config = _compile(tmp_path, _spec({"hf_config": "ckpt/config.json", "seq_length": 4096}))
    keys = architecture("qwen3-30b-a3b") | {"seq_length": 4096}
    assert by_config.launch == _compile(tmp_path, _spec(keys), "b.toml").launch


def test_an_unreadable_model_type_says_to_write_the_keys(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "t5", "num_layers": 6}), encoding="utf-8"
    )
    found = _errors(tmp_path, _spec({"hf_config": "config.json"}))
    assert [d.code for d in found] == ["MDC041"]
    assert "'t5'" in found[0].message and found[0].location.pointer == "/model/hf_config"


def test_a_missing_config_is_a_reading_error_not_a_bug(tmp_path: Path) -> None:
    found = _errors(tmp_path, _spec({"hf_config": "nowhere/config.json"}))
    assert [d.code for d in found] == ["MDC003"]


def test_a_name_that_is_not_a_string_is_the_schema_s_to_refuse(tmp_path: Path) -> None:
    found = _errors(tmp_path, _spec({"name": 70, "seq_length": 4096}))
    assert [(d.code, d.location.pointer) for d in found] == [("MDC102", "/model/name")]


@pytest.mark.parametrize(
    ("quantization", "expected"),
    [
        # DeepSeek-V3/R1 and Qwen3's -FP8 checkpoints: FP8 scaled per 128 x 128 block
        ({"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}, [128, 128]),
        # per-tensor FP8 (no weight_block_size) and other methods: no blocks
        ({"quant_method": "fp8", "activation_scheme": "static"}, None),
        ({"quant_method": "fbgemm_fp8", "weight_block_size": [128, 128]}, None),
        (None, None),
    ],
)
def test_a_config_s_fp8_weight_blocks_read_as_weight_block_size(
    quantization: dict[str, Any] | None, expected: list[int] | None
) -> None:
    data = json.loads((CONFIGS / "qwen3-32b.json").read_text(encoding="utf-8"))
    if quantization is not None:
        data["quantization_config"] = quantization
    assert model_keys(data).get("weight_block_size") == expected


def test_a_malformed_weight_block_size_is_named() -> None:
    data = json.loads((CONFIGS / "qwen3-32b.json").read_text(encoding="utf-8"))
    data["quantization_config"] = {"quant_method": "fp8", "weight_block_size": [128]}
    with pytest.raises(ValueError, match="weight_block_size"):
        model_keys(data)


def test_deepseek_v3_s_checkpoint_is_block_fp8_and_llama_s_is_not() -> None:
    """The catalogue's blocks are its sources' config.json: DeepSeek-V3's quantization_config
    has weight_block_size [128, 128]; Llama 3.1's and Qwen3's (BF16) configs have none."""
    assert architecture("deepseek-v3")["weight_block_size"] == [128, 128]
    assert architecture("deepseek-v3-no-mtp")["weight_block_size"] == [128, 128]
    for ident in ("llama3.1-70b", "qwen3-32b", "qwen3-235b-a22b", "deepseek-v2"):
        assert "weight_block_size" not in architecture(ident)


def test_weight_block_size_is_a_model_key_the_schema_checks(tmp_path: Path) -> None:
    """Written beside a name (a checkpoint the catalogue holds in BF16), it compiles; a
    block that is not two positive integers is the schema's to refuse, located."""
    spec = _spec({"name": "qwen3-32b", "weight_block_size": [128, 128], "seq_length": 4096})
    assert _compile(tmp_path, spec).tree
    found = _errors(tmp_path, _spec({"name": "qwen3-32b", "weight_block_size": [128, 0],
                                     "seq_length": 4096}))  # fmt: skip
    assert [d.location.pointer for d in found] == ["/model/weight_block_size/1"]
