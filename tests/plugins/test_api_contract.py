"""``mdc.api`` is the plugin contract only; the helpers plugins may use live beside it.

The contract's names are listed here on purpose: adding one is a decision, made in this list
and in the plugin guide together.
"""

from __future__ import annotations

import enum
import importlib
import inspect
import subprocess
import sys
from pathlib import Path
from types import ModuleType, UnionType

import attrs
import pytest

import mdc.api
from mdc.runtime import Ref
from mdc.testing import subprocess_env

REPO = Path(__file__).resolve().parents[2]
GUIDE = REPO / "docs" / "plugin-guide.md"
API = REPO / "compiler" / "mdc" / "api"

#: everything ``mdc.api`` exports
CONTRACT = {
    # what the hooks register and what emit returns
    "LauncherSpec",
    "BackendSpec",
    "SearchSpace",
    "Launch",
    "Role",
    "Artifact",
    "Endpoint",
    "Server",
    # what emit and check receive, and what the launcher's hooks return
    "Plan",
    "JobTable",
    "ModelTable",
    "TrainingSetup",
    "PipelineSplit",
    "ServingSetup",
    "StepLimits",
    "SglangServer",
    "Accelerator",
    "ONE_NODE_ROLE",
    # the run-time words of a launch script, and what a backend sets
    "Word",
    "Ref",
    "Concat",
    "NODE_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "NODE_HOSTS",
    "OUT_DIR",
    "LAUNCH_ID",
    "RUNTIME_VARIABLES",
    # findings
    "Finding",
    "Severity",
    "Diagnostic",
    "report",
}

HELPERS = sorted(
    f"mdc.api.{path.stem}" for path in API.glob("*.py") if not path.stem.startswith("_")
)


def helper(name: str) -> ModuleType:
    return importlib.import_module(name)


def test_the_contract_is_the_list() -> None:
    assert set(mdc.api.__all__) == CONTRACT
    assert len(mdc.api.__all__) == len(CONTRACT)  # no name twice
    for name in CONTRACT:
        assert getattr(mdc.api, name) is not None


def test_the_contract_holds_records_words_and_findings_only() -> None:
    """No helper function in the contract: every name is a record (an attrs class or an
    enum), a run-time word or a constant of one, or :func:`mdc.api.report`."""
    not_records = []
    for name in CONTRACT:
        value = getattr(mdc.api, name)
        if inspect.isclass(value):
            if not (attrs.has(value) or issubclass(value, enum.Enum)):
                not_records.append(name)
        elif isinstance(value, (Ref, str, UnionType)) or (
            isinstance(value, tuple) and all(isinstance(v, str) for v in value)
        ):
            continue
        elif value is not mdc.api.report:
            not_records.append(name)
    assert not_records == []


def test_there_are_helpers() -> None:
    assert {"mdc.api.shell", "mdc.api.torchrun", "mdc.api.flags", "mdc.api.files"} <= set(HELPERS)


@pytest.mark.parametrize("module", HELPERS)
def test_a_helper_is_not_part_of_the_contract(module: str) -> None:
    """A helper's names are its module's: ``mdc.api`` does not give them (it did once: the
    torchrun lines, the flag tables and ``files_written`` were in the contract)."""
    names = helper(module).__all__
    assert names
    assert [name for name in names if hasattr(mdc.api, name)] == []


@pytest.mark.parametrize("module", HELPERS)
def test_a_helper_says_what_it_is(module: str) -> None:
    doc = helper(module).__doc__ or ""
    assert doc.startswith("Helpers for plugins"), doc
    assert "not part of the contract" in doc.lower(), doc


@pytest.mark.parametrize("module", HELPERS)
def test_a_helper_is_in_the_guide_with_its_names(module: str) -> None:
    text = GUIDE.read_text(encoding="utf-8")
    [row] = [line for line in text.splitlines() if line.startswith(f"| `{module}` |")]
    missing = [name for name in helper(module).__all__ if f"`{name}`" not in row]
    assert missing == []


def test_the_contract_is_in_the_guide() -> None:
    text = GUIDE.read_text(encoding="utf-8")
    assert [name for name in sorted(CONTRACT) if f"`{name}`" not in text] == []


def test_the_contract_loads_none_of_its_helpers() -> None:
    """Importing the contract loads no helper module: each is there for those who use it."""
    code = "import sys, mdc.api\nprint(sorted(m for m in sys.modules if m.startswith('mdc.api.')))"
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=subprocess_env(),
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_contract_reads_in_one_sitting() -> None:
    """The contract module stays short: its records and their fields, nothing else (it was
    490 lines with the helpers in it)."""
    assert len((API / "__init__.py").read_text(encoding="utf-8").splitlines()) <= 350
