"""The throughput model is its terms: predict adds up short, documented term functions."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.tools import REPO

TUNE = REPO / "compiler" / "mdc" / "tune"


def _functions(path: Path) -> dict[str, ast.FunctionDef]:
    """The module's functions and its classes' methods (a method under a module-level
    function's name does not shadow it)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    found.update({n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)})
    return found


def test_predict_reads_in_one_screen_and_calls_the_terms() -> None:
    predict = _functions(TUNE / "perf.py")["predict"]
    assert predict.end_lineno is not None
    assert predict.end_lineno - predict.lineno < 100
    called = {
        n.func.attr
        for n in ast.walk(predict)
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and isinstance(n.func.value, ast.Name)
        and n.func.value.id == "terms"
    }
    expected = {
        "dense_gemms", "expert_gemms", "attention", "output_layer", "elementwise", "tp_comm",
        "cp_comm", "ep_comm", "pp_p2p", "moe_permute", "mamba", "expert_weights",
        "bubble_slots", "dp_comm", "optimizer",
    }  # fmt: skip
    assert expected <= called


def test_every_term_is_short_and_names_its_formula() -> None:
    for name, node in _functions(TUNE / "terms.py").items():
        assert node.end_lineno is not None
        assert node.end_lineno - node.lineno < 60, name
        if not name.startswith("_") and name not in ("span", "hbm", "moe_layers"):
            doc = ast.get_docstring(node)
            assert doc and len(doc) > 60, f"{name}: its formula and data in a docstring"
