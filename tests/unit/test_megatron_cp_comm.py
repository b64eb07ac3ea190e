"""[megatron] cp_comm_type and hierarchical_context_parallel_sizes: keys or Megatron-LM's
flags, emitted as --cp-comm-type and --hierarchical-context-parallel-sizes, refused
(MDC321) only where Megatron-LM core_v0.16.1 refuses them, with its text."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from mdc.errors import Diagnostic, SpecError
from mdc.pipeline import Compiler
from mdc.plugin_manager import load_plugins

COMPILER = Compiler(load_plugins(autoload=False))
BASE: dict[str, Any] = json.loads(
    (Path(__file__).resolve().parent / "flags_as_keys/megatron-cp-comm.json").read_text("utf-8")
)


def _spec(megatron: dict[str, Any], cp: int = 4, layers: int = 4) -> dict[str, Any]:
    data = copy.deepcopy(BASE)
    data["megatron"] = megatron
    data["parallelism"]["cp"] = cp
    data["model"]["num_layers"] = layers
    return data


def _compile(tmp_path: Path, data: dict[str, Any]) -> list[str]:
    """The worker script's words (the compile must succeed)."""
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    compiled = COMPILER.compile(path)
    (script,) = [a for a in compiled.tree if a.path == "launch/worker.sh"]
    return script.data.decode().split()


def _refusals(tmp_path: Path, data: dict[str, Any]) -> list[Diagnostic]:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(SpecError) as raised:
        COMPILER.compile(path)
    return [d for d in raised.value.diagnostics if d.is_error]


def test_a2a_compiles_and_is_passed(tmp_path: Path) -> None:
    """8 heads / tp 2 = 4 per rank, divisible by cp 4: a2a runs; passed as written."""
    words = _compile(tmp_path, _spec({"cp_comm_type": ["a2a"]}))
    at = words.index("--cp-comm-type")
    assert words[at + 1] == "a2a"
    assert "--hierarchical-context-parallel-sizes" not in words


def test_one_type_per_layer_is_passed_in_order(tmp_path: Path) -> None:
    types = ["p2p", "p2p", "a2a", "a2a+p2p"]
    megatron = {"cp_comm_type": types, "hierarchical_context_parallel_sizes": [2, 2]}
    words = _compile(tmp_path, _spec(megatron))
    at = words.index("--cp-comm-type")
    assert words[at + 1 : at + 5] == types
    at = words.index("--hierarchical-context-parallel-sizes")
    assert words[at + 1 : at + 3] == ["2", "2"]


def test_the_key_and_the_flag_give_the_same_script(tmp_path: Path) -> None:
    keyed = _compile(tmp_path, _spec({"cp_comm_type": ["all_gather"]}))
    flagged = _compile(tmp_path, _spec({"extra_args": ["--cp-comm-type", "all_gather"]}))
    assert keyed == flagged
    assert keyed.count("--cp-comm-type") == 1


def test_a2a_p2p_without_hierarchical_sizes_is_refused(tmp_path: Path) -> None:
    (found,) = _refusals(tmp_path, _spec({"cp_comm_type": ["a2a+p2p"]}))
    assert found.code == "MDC321"
    assert found.location.pointer == "/megatron/cp_comm_type"
    assert (
        "'--hierarchical-context-parallel-sizes must be set when a2a+p2p is used in cp comm'"
        in found.message
    )


def test_hierarchical_sizes_not_multiplying_to_cp_are_refused(tmp_path: Path) -> None:
    megatron = {"cp_comm_type": ["a2a+p2p"], "hierarchical_context_parallel_sizes": [2, 4]}
    (found,) = _refusals(tmp_path, _spec(megatron))
    assert found.code == "MDC321"
    assert found.location.pointer == "/megatron/hierarchical_context_parallel_sizes"
    assert "product 8 is not cp = 4" in found.message
    assert "prod(args.hierarchical_context_parallel_sizes)" in found.message


def test_types_per_layer_must_match_the_layers_with_cp(tmp_path: Path) -> None:
    megatron = {"cp_comm_type": ["p2p", "a2a"]}
    (found,) = _refusals(tmp_path, _spec(megatron))
    assert found.code == "MDC321"
    assert found.location.pointer == "/megatron/cp_comm_type"
    assert (
        "'Length of cp_comm_type (2) should equal to the total number of transformer "
        "layers (4)!'" in found.message
    )
    # Megatron-Core checks the list only with cp > 1
    words = _compile(tmp_path, _spec(megatron, cp=1))
    assert "--cp-comm-type" in words
