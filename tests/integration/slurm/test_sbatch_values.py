"""mdc refuses the ``--time``, ``--mem`` and ``--gpus-per-node`` values a real sbatch refuses,
and only those.

Each value is put to ``sbatch --test-only --OPTION=VALUE --wrap=true`` on the local cluster
(as the #SBATCH line mdc writes would put it): a value sbatch cannot read is refused ("Invalid
--time specification"), as is a GPU count no node can have; the others fit the cluster (4
nodes, 8 fake GPUs and 4000 MB each) and are accepted. mdc must agree on every one.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from mdc.errors import SpecError
from mdc.pipeline import Compiler
from mdc.plugin_manager import load_plugins

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("loopback")]

#: every documented form, fields past their clock range, and what sbatch cannot read
TIMES = [
    "90",
    "90:30",
    "12:00:00",
    "25:61:61",
    "1:100:00",
    "2-00",
    "2-12:30",
    "0-100",
    "UNLIMITED",
    "-1",
    "5-",
    "٨",
    "１:００",
    "4h",
    "1.5",
    "1:2:3:4",
    "1:2-3",
    "1-2-3",
    ":5",
    "5::6",
    "-5",
    "10:",
    "-0:30",
    "1-:3:4",
    "-5-1",
    "2147483648",
    "99999999999",
    "0",
]
MEMORY = ["100", "1G", "1000M", "٨G", "８000", "1.5G"]
GPUS = ["8", "٨"]


def mdc_refuses(slurm: dict[str, Any], tmp_path: Path) -> bool:
    data = {
        "job": {"name": "values", "command": ["python", "train.py"]},
        "distributed": {"launcher": "torchrun", "backend": "slurm", "nnodes": 1},
        "slurm": slurm,
    }
    path = tmp_path / "values.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    try:
        Compiler(load_plugins(autoload=False)).compile(path, tree=False)
    except SpecError:
        return True
    return False


def sbatch_refuses(option: str, tmp_path: Path) -> bool:
    """Whether sbatch refuses a one-node job with ``option``."""
    done = subprocess.run(
        ["sbatch", "--test-only", "--nodes=1", "--mem=0", option, "--wrap=true"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (done.returncode == 0) == ("to start at" in done.stderr), done.stderr
    return done.returncode != 0


Case = Callable[[str], tuple[dict[str, Any], str]]
CASES: list[tuple[str, Case]] = [
    *[(t, lambda v: ({"time": v}, f"--time={v}")) for t in TIMES],
    *[(m, lambda v: ({"mem": v}, f"--mem={v}")) for m in MEMORY],
    *[(g, lambda v: ({"gpus_per_node": v}, f"--gpus-per-node={v}")) for g in GPUS],
]


@pytest.mark.parametrize(
    ("value", "case"), CASES, ids=[f"{i}-{v}" for i, (v, _) in enumerate(CASES)]
)
def test_mdc_refuses_what_sbatch_refuses(
    value: str, case: Case, slurm_cluster: Any, tmp_path: Path
) -> None:
    table, option = case(value)
    assert mdc_refuses(table, tmp_path) == sbatch_refuses(option, tmp_path), option
