"""The pictures and sessions the docs show are what mdc makes today: docs/img/ is
compared byte for byte with a fresh `mdc explain --svg` / `mdc tune --svg` (rerun with
--update-golden to redraw them), and docs/cli.md's `mdc explain` session with its stdout."""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

import pytest
from tests.tools import REPO

from mdc.cli import main

IMG = REPO / "docs" / "img"


def _run(*argv: str) -> str:
    argv = tuple(str(REPO / a) if a.startswith("examples/") else a for a in argv)
    out, err = io.StringIO(), io.StringIO()
    assert main(list(argv), stdout=out, stderr=err) == 0, err.getvalue()
    return out.getvalue()


def test_rank_map_picture_is_current(golden: Any, tmp_path: Path) -> None:
    picture = tmp_path / "map.svg"
    _run("explain", "examples/torchrun-hybrid-16x8.toml", "--svg", str(picture))
    golden.check_text(IMG / "rankmap-torchrun-hybrid-16x8.svg", picture.read_text("utf-8"))
    assert "(img/rankmap-torchrun-hybrid-16x8.svg)" in (REPO / "docs" / "cli.md").read_text()


@pytest.mark.slow
def test_tune_picture_is_current(golden: Any, tmp_path: Path) -> None:
    picture = tmp_path / "tune.svg"
    _run("tune", "examples/tune-llama70b-64xh100.toml", "--svg", str(picture))
    golden.check_text(IMG / "tune-llama70b-64xh100.svg", picture.read_text("utf-8"))
    assert "(img/tune-llama70b-64xh100.svg)" in (REPO / "docs" / "tune.md").read_text()


def test_explain_session_is_real(monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/cli.md shows `mdc explain` of an example: the block is today's stdout (run
    from the repository, as the session's relative path says)."""
    monkeypatch.chdir(REPO)
    text = (REPO / "docs" / "cli.md").read_text(encoding="utf-8")
    session = re.search(r"```\n\$ mdc (explain examples/\S+)\n(.*?)```", text, re.DOTALL)
    assert session, "docs/cli.md shows an `mdc explain` session"
    out, err = io.StringIO(), io.StringIO()
    assert main(session[1].split(), stdout=out, stderr=err) == 0, err.getvalue()
    assert out.getvalue() == session[2]
