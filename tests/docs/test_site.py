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

REPO = Path(__file__).resolve().parents[2]


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
