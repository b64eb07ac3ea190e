"""Golden tests: the examples' output trees, the diagnostics users read, and determinism.

* ``golden/examples/<stem>/`` is the exact tree ``mdc compile examples/<file> -o OUT``
  writes (file list, bytes, modes), for every example spec.
* ``golden/diagnostics/<case>/`` holds ``spec.{toml,yaml,json}`` and ``expected.txt``:
  the exact stderr of ``mdc validate spec.<ext>`` run inside the case directory,
  then a line ``exit: N``.

Goldens are produced through :func:`mdc.cli.main` only, with plugin autoload off
so that plugins installed on the machine cannot change them. Rewrite them with
``pytest tests/golden --update-golden`` (see ``tests/conftest.py``).
"""

from __future__ import annotations

import io
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tests.tools import REPO

from mdc.cli import main
from mdc.testing import subprocess_env

EXAMPLES = REPO / "examples"
GOLDEN = REPO / "golden"
SPEC_SUFFIXES = (".toml", ".yaml", ".yml", ".json")

pytestmark = pytest.mark.usefixtures("no_ambient_plugins")


def example_specs() -> list[Path]:
    return sorted(p for p in EXAMPLES.iterdir() if p.is_file() and p.suffix in SPEC_SUFFIXES)


def diagnostic_cases() -> list[Path]:
    root = GOLDEN / "diagnostics"
    return sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []


def run_main(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(argv, stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def read_tree(root: Path) -> dict[str, tuple[bytes, int]]:
    return {
        p.relative_to(root).as_posix(): (p.read_bytes(), p.stat().st_mode & 0o777)
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.fixture
def at_repo_root(monkeypatch: pytest.MonkeyPatch) -> Path:
    """Run from the repository root, so spec paths (and anything derived) match everywhere."""
    monkeypatch.chdir(REPO)
    return REPO


# ---------------------------------------------------------------- examples


@pytest.mark.parametrize("spec", example_specs(), ids=lambda p: p.name)
def test_example_output_matches_golden(
    spec: Path, at_repo_root: Path, tmp_path: Path, golden: Any
) -> None:
    out = tmp_path / "out"
    code, stdout, stderr = run_main(["compile", "-q", f"examples/{spec.name}", "-o", str(out)])
    assert code == 0, f"mdc compile examples/{spec.name} exited {code}:\n{stderr}"
    assert stdout == ""
    golden.check_tree(GOLDEN / "examples" / spec.stem, out)


def test_example_goldens_have_examples(golden: Any) -> None:
    """Every golden/examples/<stem>/ belongs to an example; stems do not collide."""
    stems = [p.stem for p in example_specs()]
    assert len(stems) == len(set(stems)), f"two examples share a stem: {sorted(stems)}"
    root = GOLDEN / "examples"
    folders = sorted(p for p in root.iterdir()) if root.is_dir() else []
    orphans = [p for p in folders if p.name not in stems]
    if not orphans:
        return
    shown = ", ".join(f"golden/examples/{p.name}" for p in orphans)
    if golden.update:
        for folder in orphans:
            if folder.is_dir():
                shutil.rmtree(folder)
            else:
                folder.unlink()
            golden.written.append(f"deleted golden/examples/{folder.name}")
        pytest.fail(f"deleted orphan golden(s) {shown}; review `git diff golden/`", pytrace=False)
    pytest.fail(
        f"orphan golden(s) with no example in examples/: {shown} "
        "(delete them, or rerun with --update-golden)",
        pytrace=False,
    )


def test_there_are_examples() -> None:
    assert example_specs(), "examples/ holds no spec"


# ---------------------------------------------------------------- diagnostics


def _case_spec(case: Path) -> Path:
    specs = sorted(p for p in case.iterdir() if p.stem == "spec" and p.suffix in SPEC_SUFFIXES)
    assert len(specs) == 1, (
        f"golden/diagnostics/{case.name} needs exactly one "
        f"spec.{{toml,yaml,yml,json}}, found {[p.name for p in specs]}"
    )
    return specs[0]


def validate_case(case: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[int, str, str]:
    monkeypatch.chdir(case)
    return run_main(["validate", "-q", _case_spec(case).name])


@pytest.mark.parametrize("case", diagnostic_cases(), ids=lambda p: p.name)
def test_diagnostics_match_golden(case: Path, monkeypatch: pytest.MonkeyPatch, golden: Any) -> None:
    code, stdout, stderr = validate_case(case, monkeypatch)
    assert stdout == "", "validate prints diagnostics to stderr, nothing to stdout"
    golden.check_text(case / "expected.txt", f"{stderr}exit: {code}\n")


def test_enough_diagnostic_cases() -> None:
    assert len(diagnostic_cases()) >= 12


def test_hand_broken_spec_reports_every_mistake(monkeypatch: pytest.MonkeyPatch) -> None:
    """A schema error elsewhere must not hide the arithmetic errors, nor the reverse."""
    code, _, stderr = validate_case(GOLDEN / "diagnostics" / "hand-broken", monkeypatch)
    assert code == 1
    for what, code_ in (
        ("wrong type", "MDC102"),
        ("unknown key", "MDC101"),
        ("tp does not divide the world", "MDC201"),
        ("global batch not divisible", "MDC207"),
    ):
        assert f"error[{code_}]" in stderr, f"{what} ({code_}) is not reported:\n{stderr}"


def test_warning_only_spec_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    code, _, stderr = validate_case(GOLDEN / "diagnostics" / "warning-tp-spans-nodes", monkeypatch)
    assert code == 0
    assert "warning[MDC250]" in stderr and "error[" not in stderr


# ---------------------------------------------------------------- determinism


#: a fresh process that compiles each (spec, out) pair of its arguments with mdc's command line
COMPILE_ALL = """
import sys
from mdc.cli import main
from mdc.testing import subprocess_env
pairs = zip(sys.argv[1::2], sys.argv[2::2])
sys.exit(max([main(["compile", spec, "-o", out]) for spec, out in pairs], default=0))
"""


@pytest.fixture(scope="module")
def trees_by_seed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Every example compiled under PYTHONHASHSEED=0 (into .../out) and =1 (into
    .../elsewhere): one process per seed, not one per example and seed."""
    trees: dict[str, dict[str, Any]] = {}
    for seed, name in (("0", "out"), ("1", "elsewhere")):
        root = tmp_path_factory.mktemp(f"hash-seed-{seed}")
        pairs = [(spec, root / spec.name / name) for spec in example_specs()]
        done = subprocess.run(
            [sys.executable, "-c", COMPILE_ALL]
            + [word for spec, out in pairs for word in (f"examples/{spec.name}", str(out))],
            cwd=REPO,
            env=subprocess_env(PYTHONHASHSEED=seed, MDC_DISABLE_PLUGIN_AUTOLOAD="1"),
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        trees[seed] = {spec.name: read_tree(out) for spec, out in pairs}
    return trees


@pytest.mark.slow
@pytest.mark.xdist_group("hash-seed")  # one worker compiles the examples once per seed
@pytest.mark.parametrize("spec", example_specs(), ids=lambda p: p.name)
def test_output_does_not_depend_on_hash_seed(
    spec: Path, trees_by_seed: dict[str, dict[str, Any]]
) -> None:
    first, second = trees_by_seed["0"][spec.name], trees_by_seed["1"][spec.name]
    assert first, f"{spec.name} compiled to nothing"
    assert sorted(first) == sorted(second)
    changed = [path for path in first if first[path] != second[path]]
    assert not changed, f"PYTHONHASHSEED=0 and =1 wrote different bytes or modes: {changed}"


# ---------------------------------------------------------------- the harness itself


def test_golden_harness_creates_then_fails_then_updates(tmp_path: Path, golden: Any) -> None:
    """Missing: created and failed. Differing: failed, untouched. Updating: rewritten, failed."""
    harness = type(golden)
    check = harness(tmp_path, update=False, written=[])
    expected = tmp_path / "case" / "expected.txt"
    with pytest.raises(pytest.fail.Exception, match="created golden"):
        check.check_text(expected, "one\n")
    assert expected.read_text() == "one\n"
    check.check_text(expected, "one\n")  # now it matches
    with pytest.raises(pytest.fail.Exception, match="differs") as failed:
        check.check_text(expected, "two\n")
    assert "-one" in str(failed.value) and "+two" in str(failed.value)
    assert expected.read_text() == "one\n"
    updating = harness(tmp_path, update=True, written=[])
    with pytest.raises(pytest.fail.Exception, match=r"updated golden .*git diff golden/"):
        updating.check_text(expected, "two\n")
    assert expected.read_text() == "two\n"
    updating.check_text(expected, "two\n")  # nothing left to update: passes


def test_golden_harness_tree_update_deletes_stale_files(tmp_path: Path, golden: Any) -> None:
    harness = type(golden)
    actual, expected = tmp_path / "actual", tmp_path / "golden" / "tree"
    (actual / "sub").mkdir(parents=True)
    (actual / "run.sh").write_text("#!/bin/sh\n")
    (actual / "run.sh").chmod(0o755)
    (actual / "sub" / "a.json").write_text("{}\n")
    (actual / "sub" / "a.json").chmod(0o644)
    with pytest.raises(pytest.fail.Exception, match="created golden"):
        harness(tmp_path, update=False).check_tree(expected, actual)
    harness(tmp_path, update=False).check_tree(expected, actual)
    (expected / "stale.txt").write_text("old\n")
    (actual / "run.sh").chmod(0o644)
    with pytest.raises(pytest.fail.Exception) as failed:
        harness(tmp_path, update=False).check_tree(expected, actual)
    assert "stale.txt" in str(failed.value) and "mode 0644, golden has 0755" in str(failed.value)
    with pytest.raises(pytest.fail.Exception, match="updated golden"):
        harness(tmp_path, update=True).check_tree(expected, actual)
    assert not (expected / "stale.txt").exists()
    assert (expected / "run.sh").stat().st_mode & 0o777 == 0o644
    harness(tmp_path, update=False).check_tree(expected, actual)


@pytest.mark.slow
@pytest.mark.parametrize("variable", ["CI", "PYTEST_XDIST_WORKER"])
def test_update_flag_is_refused_under_ci_and_xdist(
    variable: str, clean_env: Callable[..., dict[str, str]]
) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--update-golden",
            "--collect-only",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/golden/test_golden.py",
        ],
        cwd=REPO,
        env=clean_env(**{variable: "1"}),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == pytest.ExitCode.USAGE_ERROR, done.stdout + done.stderr
    assert "--update-golden" in done.stderr
