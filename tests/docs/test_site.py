"""The documentation site builds with ``mkdocs build --strict``.

Strict mode (and ``validation`` in ``mkdocs.yml``) turns every warning into a failure: a link
to a page or an anchor that does not exist, a link that leaves the site, a page named in
``nav`` that is missing. The build goes to a temporary folder, never to ``site/``.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tests.tools import REPO


@pytest.mark.slow
def test_mkdocs_build_strict(tmp_path: Path) -> None:
    if importlib.util.find_spec("mkdocs") is None:
        pytest.skip("mkdocs is not installed (pip install -e '.[docs]')")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "--config-file",
            str(REPO / "mkdocs.yml"),
            "--site-dir",
            str(tmp_path / "site"),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stderr}"
    assert (tmp_path / "site" / "index.html").is_file()


def test_readme_links_exist() -> None:
    """Every relative link in README.md and CONTRIBUTING.md names a file of the repository."""
    import re

    for name in ("README.md", "CONTRIBUTING.md"):
        text = (REPO / name).read_text(encoding="utf-8")
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
            if "://" in target:
                continue
            assert (REPO / target).exists(), f"{name} links to {target}, which does not exist"


def test_readme_is_the_front_door() -> None:
    """README.md stays short; the rest of the documentation lives in docs/."""
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; move detail into docs/"


def test_readme_compile_sessions_are_real(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each `$ mdc compile` in README.md prints what the README shows and writes its tree."""
    import io
    import re

    from mdc.cli import main

    text = (REPO / "README.md").read_text(encoding="utf-8")
    sessions = re.findall(r"```console\n(.*?)```", text, re.DOTALL)
    compiled = [s for s in sessions if s.startswith("$ mdc compile ")]
    assert len(compiled) >= 2, "README.md shows a SLURM and a Kubernetes compile"
    for index, session in enumerate(compiled):
        here = tmp_path / str(index)
        here.mkdir()
        monkeypatch.chdir(here)
        command, *rest = session.splitlines()
        shown = rest[: next(i for i, line in enumerate(rest) if line.startswith("$ "))]
        argv = command.removeprefix("$ mdc ").split()
        argv = [str(REPO / a) if a.startswith("examples/") else a for a in argv]
        out = io.StringIO()
        assert main(argv, stdout=out, stderr=io.StringIO()) == 0, command
        assert out.getvalue().splitlines() == shown, command
        listing = session.split("$ find out -type f | sort\n")[1].split("\n$ ")[0]
        files = [line.split()[0] for line in listing.splitlines()]
        written = sorted(p.as_posix() for p in Path("out").rglob("*") if p.is_file())
        assert files == written, command


@pytest.mark.slow
def test_tune_worked_example_is_real() -> None:
    """docs/tune.md's worked example prints what `mdc tune` prints for its spec today."""
    import io
    import re

    from mdc.cli import main

    text = (REPO / "docs" / "tune.md").read_text(encoding="utf-8")
    session = re.search(r"```\n(\$ mdc tune examples/\S+)\n(.*?)```", text, re.DOTALL)
    assert session, "docs/tune.md shows an `mdc tune` session"
    argv = session.group(1).removeprefix("$ mdc ").split()
    argv = [str(REPO / a) if a.startswith("examples/") else a for a in argv]
    out = io.StringIO()
    assert main(argv, stdout=out, stderr=io.StringIO()) == 0
    assert out.getvalue() == session.group(2)
