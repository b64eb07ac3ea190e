"""emit.check_paths: which artifact paths a plugin may return."""

from __future__ import annotations

import pytest

from mdc.api import Artifact
from mdc.emit import ArtifactError, check_paths

PLAIN = ["plan.json", "launch/worker.sh", "a/b/c.txt", "é/ü.yaml", "a..b", ".hidden/x"]
REFUSED = [
    "",
    ".",
    "..",
    "/abs",
    "//abs",
    "a//b",
    "a/./b",
    "./a",
    "a/../b",
    "a/",
    "a\\b",
    "a\x00b",
    "manifest.json",
    # the writer's own folders inside out/ (its work in progress, see docs/output.md)
    ".mdc-staging/x",
    ".mdc-commit",
]


def artifacts(*paths: str) -> list[Artifact]:
    return [Artifact.text(p, p) for p in paths]


def test_plain_paths_come_back_sorted() -> None:
    assert [a.path for a in check_paths(artifacts(*PLAIN))] == sorted(PLAIN)


@pytest.mark.parametrize("path", REFUSED)
def test_refused(path: str) -> None:
    with pytest.raises(ArtifactError, match="plain relative path"):
        check_paths(artifacts("ok.txt", path))


@pytest.mark.parametrize("order", [("a/b", "a"), ("a", "a/b"), ("x/y/z", "x/y"), ("x/y", "x/y/z")])
def test_a_file_cannot_be_a_folder_in_either_order(order: tuple[str, str]) -> None:
    with pytest.raises(ArtifactError, match="lies under another"):
        check_paths(artifacts(*order))


def test_twice() -> None:
    with pytest.raises(ArtifactError, match="produced twice"):
        check_paths(artifacts("a/b", "c", "a/b"))
