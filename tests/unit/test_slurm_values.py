"""SLURM values refused as sbatch refuses them, and only those.

sbatch reads ``--time`` with src/common/parse_time.c (``time_str2mins``): it checks the shape
(ASCII digits, one '-' before any ':', at most two ':', a run of digits per field), never
the range of a field, and passes on even a negative day count (SLURM 22.05 submits
``--time=-5``); ``--mem`` and ``--gpus-per-node`` counts are read with C's
``strtol``, which knows ASCII digits only. tests/integration/slurm/test_sbatch_values.py puts
the same cases to a real sbatch.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from mdc.errors import SpecError
from mdc.pipeline import Compiler
from mdc_builtin.backends.slurm_time import INFINITE, time_minutes

#: (--time, the minutes it is): every documented form, fields past their clock range (SLURM
#: adds them up: 25:61:61 is 25 h + 61 min + 61 s, rounded up to a minute), "-1" and 0
TIMES = [
    ("90", 90),
    ("90:30", 91),
    ("12:00:00", 720),
    ("25:61:61", 25 * 60 + 61 + 2),
    ("1:100:00", 160),
    ("2-00", 2 * 1440),
    ("2-12:30", 2 * 1440 + 12 * 60 + 30),
    ("2-00:00:01", 2 * 1440 + 1),
    ("0-100", 6000),
    ("0", 0),
    ("5-", 5 * 1440),
    ("-5", -7199),  # (-5 * 86400 + 59) / 60, C dividing toward zero
    ("-1", INFINITE),
    ("UNLIMITED", INFINITE),
    ("infinite", INFINITE),
]
#: Unicode digits, units, more fields than the forms, a '-' after a ':', a field left empty
REFUSED_TIMES = [
    "٨",
    "１:００",
    "4h",
    "1.5",
    "1:2:3:4",
    "1:2-3",
    "1-2-3",
    ":5",
    "5::6",
    "10:",
    "-0:30",
    "1-:3:4",
]


def errors(compiler: Compiler, tmp_path: Path, slurm: dict[str, Any]) -> list[tuple[str, str]]:
    data = {
        "job": {"name": "unit", "command": ["python", "train.py"]},
        "distributed": {"launcher": "torchrun", "backend": "slurm", "nnodes": 2},
        "slurm": slurm,
    }
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    try:
        compiler.compile(path)
    except SpecError as exc:
        return [(d.code, d.location.pointer) for d in exc.diagnostics if d.is_error]
    return []


@pytest.mark.parametrize(("text", "minutes"), TIMES)
def test_the_time_limits_sbatch_reads(text: str, minutes: int) -> None:
    assert time_minutes(text) == minutes


@pytest.mark.parametrize("text", [t for t, _ in TIMES])
def test_every_time_sbatch_reads_is_taken(compiler: Compiler, tmp_path: Path, text: str) -> None:
    assert errors(compiler, tmp_path, {"time": text}) == []


@pytest.mark.parametrize("text", REFUSED_TIMES)
def test_a_time_sbatch_refuses_is_refused(compiler: Compiler, tmp_path: Path, text: str) -> None:
    assert time_minutes(text) is None
    assert errors(compiler, tmp_path, {"time": text}) == [("MDC415", "/slurm/time")]


@pytest.mark.parametrize(
    ("key", "text", "code"),
    [("mem", "٨G", "MDC416"), ("mem", "８000", "MDC416"), ("gpus_per_node", "h100:٨", "MDC417")],
)
def test_unicode_digits_in_sizes_and_counts_are_refused(
    compiler: Compiler, tmp_path: Path, key: str, text: str, code: str
) -> None:
    assert errors(compiler, tmp_path, {key: text}) == [(code, f"/slurm/{key}")]


@pytest.mark.parametrize("minutes", [0, -1, 90, 2**31])
def test_a_time_in_minutes_is_what_sbatch_reads_of_its_digits(
    compiler: Compiler, tmp_path: Path, minutes: int
) -> None:
    # 0 is no limit and -1 unlimited to sbatch; 2**31 minutes overflow its int seconds and
    # wrap around to a limit it takes
    assert time_minutes(str(minutes)) is not None
    assert errors(compiler, tmp_path, {"time": minutes}) == []
