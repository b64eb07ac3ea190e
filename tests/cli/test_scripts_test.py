"""scripts/test prints the wall time of each phase when it ends, however it ends.

The script runs for real under bash, in a copy of the checkout's layout whose ``.venv`` holds
stand-ins for python, ruff and mypy: each records its arguments, and pytest exits with the
status the test asks for. Nothing is installed and no test runs.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from tests.tools import REPO

#: the stand-in interpreter: ``-m pytest`` is logged and exits $PYTEST_EXIT, the rest succeeds
#: (``-c`` prints the torch version scripts/test pins)
FAKE_PYTHON = """#!/usr/bin/env bash
echo "python $*" >> "$CALLS"
case "$1" in
  -VV) echo "Python 3 (stand-in)" ;;
  -c) echo 2.13.0 ;;
  -) cat > /dev/null ;;
  -m) [[ "$2" != pytest ]] || exit "${PYTEST_EXIT:-0}" ;;
esac
exit 0
"""
FAKE_TOOL = '#!/usr/bin/env bash\necho "$(basename "$0") $*" >> "$CALLS"\n'


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A checkout with scripts/test, the pyproject files it hashes, and a stand-in .venv."""
    (tmp_path / "scripts").mkdir()
    shutil.copy2(REPO / "scripts" / "test", tmp_path / "scripts" / "test")
    shutil.copy2(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    plugin = tmp_path / "examples" / "mdc-mpi"
    plugin.mkdir(parents=True)
    shutil.copy2(REPO / "examples" / "mdc-mpi" / "pyproject.toml", plugin / "pyproject.toml")
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    for name, text in (("python", FAKE_PYTHON), ("ruff", FAKE_TOOL), ("mypy", FAKE_TOOL)):
        (bin_dir / name).write_text(text, encoding="utf-8")
        (bin_dir / name).chmod(stat.S_IRWXU)
    return tmp_path


def run(checkout: Path, *args: str, pytest_exit: int = 0) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env.update(CALLS=str(checkout / "calls.log"), PYTEST_EXIT=str(pytest_exit))
    return subprocess.run(
        ["bash", str(checkout / "scripts" / "test"), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


def phases(stderr: str) -> list[str]:
    """The phases named on the last line, in order ("install 0 s" -> "install")."""
    line = stderr.strip().splitlines()[-1]
    match = re.fullmatch(r"scripts/test: time per phase: (.*); total \d+ s", line)
    assert match, line
    found = match.group(1).split(", ")
    assert all(re.fullmatch(r"[a-z ]+ \d+ s", p) for p in found), found
    return [p.rsplit(" ", 2)[0] for p in found]


def calls(checkout: Path) -> list[str]:
    return (checkout / "calls.log").read_text(encoding="utf-8").splitlines()


def test_every_phase_is_timed_at_the_end(checkout: Path) -> None:
    result = run(checkout, "--lint")
    assert result.returncode == 0, result.stderr
    assert phases(result.stderr) == ["install", "lint", "first pass", "loopback pass"]
    assert [c.split()[0] for c in calls(checkout) if not c.startswith("python")] == [
        "ruff",
        "ruff",
        "mypy",
    ]
    assert sum("-m pytest" in c for c in calls(checkout)) == 2


def test_a_failing_run_still_prints_its_phases(checkout: Path) -> None:
    result = run(checkout, pytest_exit=1)
    assert result.returncode == 1
    assert phases(result.stderr) == ["install", "first pass", "loopback pass"]


def test_the_quick_tier_is_one_pass_and_asks_pip_once(checkout: Path) -> None:
    assert run(checkout, "--quick").returncode == 0
    (checkout / "calls.log").unlink()
    result = run(checkout, "--quick")
    assert result.returncode == 0, result.stderr
    assert phases(result.stderr) == ["install", "tests"]
    (pytest_call,) = [c for c in calls(checkout) if "-m pytest" in c]
    assert "-n auto --dist loadfile -m not slow and not loopback tests/unit" in pytest_call
    assert not [c for c in calls(checkout) if "-m pip" in c], "pip asked again"


def test_one_plain_run_is_one_phase(checkout: Path) -> None:
    result = run(checkout, "--quick", "-p", "no:xdist", pytest_exit=3)
    assert result.returncode == 3
    assert phases(result.stderr) == ["install", "tests"]


GROUPED = """
import pytest

pytestmark = pytest.mark.xdist_group("together")


@pytest.mark.parametrize("i", range(6))
def test_grouped(i):
    pass
"""


@pytest.mark.slow
def test_an_xdist_group_runs_on_one_worker(tmp_path: Path) -> None:
    """The first pass's --dist loadgroup keeps a group on one worker (scripts/test's groups
    share a costly fixture); with pytest 9.2 and pytest-xdist 3.8 it silently did not."""
    (tmp_path / "pytest.ini").write_text("[pytest]\n", encoding="utf-8")
    (tmp_path / "test_grouped.py").write_text(GROUPED, encoding="utf-8")
    (tmp_path / "test_other.py").write_text(GROUPED.replace('"together"', '"apart"'))
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-v"]
        + ["-p", "no:cacheprovider", "-c", str(tmp_path / "pytest.ini"), str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    workers: dict[str, set[str]] = {}
    for line in result.stdout.splitlines():
        match = re.match(r"\[(gw\d)\] .* PASSED test_(\w+)\.py::", line)
        if match:
            workers.setdefault(match.group(2), set()).add(match.group(1))
    assert set(workers) == {"grouped", "other"}, result.stdout
    assert all(len(found) == 1 for found in workers.values()), workers
