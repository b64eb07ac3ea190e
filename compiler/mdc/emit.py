"""The writer: checked artifact paths, manifest.json, and an all-or-nothing swap into ``-o``."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path, PurePosixPath

from mdc.api import Artifact

MANIFEST = "manifest.json"


class ArtifactError(ValueError):
    """An artifact path is absolute, escapes ``out/``, or repeats."""


def check_paths(artifacts: Iterable[Artifact], *, reserved: Iterable[str] = (MANIFEST,)
                ) -> list[Artifact]:
    """The artifacts sorted by path; raises :class:`ArtifactError` on a bad or repeated path."""
    taken = set(reserved)
    seen: dict[str, Artifact] = {}
    for artifact in artifacts:
        path = artifact.path
        pure = PurePosixPath(path)
        if (not path or pure.is_absolute() or "\\" in path or ".." in pure.parts
                or str(pure) != path or path in taken or "\0" in path):
            raise ArtifactError(f"artifact path {path!r} must be a plain relative path inside out/")
        if path in seen:
            raise ArtifactError(f"artifact path {path!r} is produced twice")
        if any(str(parent) in seen for parent in pure.parents if str(parent) != "."):
            raise ArtifactError(f"artifact path {path!r} lies under another artifact")
        seen[path] = artifact
    return [seen[p] for p in sorted(seen)]


def mode_of(artifact: Artifact) -> int:
    return 0o755 if artifact.executable else 0o644


def manifest(artifacts: Iterable[Artifact], *, spec_sha256: str,
             plugins: Mapping[str, str]) -> Artifact:
    """Every file with its sha256 and mode, the spec's hash, and the plugins that wrote them."""
    files = {a.path: {"sha256": hashlib.sha256(a.data).hexdigest(), "mode": f"{mode_of(a):04o}"}
             for a in artifacts}
    return Artifact.json(MANIFEST, {"files": files, "spec_sha256": spec_sha256,
                                    "plugins": dict(plugins)})


def finish(artifacts: Iterable[Artifact], *, spec_sha256: str,
           plugins: Mapping[str, str]) -> list[Artifact]:
    """The complete, sorted output tree: the artifacts plus their manifest."""
    checked = check_paths(artifacts)
    return check_paths([*checked, manifest(checked, spec_sha256=spec_sha256, plugins=plugins)],
                       reserved=())


def is_replaceable(out: Path) -> bool:
    """Only an absent or empty directory, or an earlier mdc output, may be replaced."""
    if not out.exists():
        return True
    if not out.is_dir():
        return False
    return not any(out.iterdir()) or (out / MANIFEST).is_file()


def write_tree(out: Path, tree: Iterable[Artifact]) -> None:
    """Build the tree beside ``out`` and swap it in; on any failure ``out`` is untouched."""
    out = out.absolute()
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.mdc-new-", dir=out.parent))
    try:
        for artifact in tree:
            target = staging / artifact.path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(artifact.data)
            os.chmod(target, mode_of(artifact))
        os.chmod(staging, 0o755)
        if out.exists():
            retired = Path(tempfile.mkdtemp(prefix=f".{out.name}.mdc-old-", dir=out.parent))
            os.replace(out, retired / out.name)
            os.replace(staging, out)
            shutil.rmtree(retired, ignore_errors=True)
        else:
            os.replace(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def drift(out: Path, tree: Iterable[Artifact]) -> list[str]:
    """How ``out`` differs from ``tree``: one line per missing, changed or extra file."""
    expected = {a.path: a for a in tree}
    found = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()} \
        if out.is_dir() else set()
    lines = []
    for path in sorted(expected.keys() | found):
        if path not in found:
            lines.append(f"missing: {path}")
        elif path not in expected:
            lines.append(f"extra: {path}")
        else:
            on_disk = out / path
            if on_disk.read_bytes() != expected[path].data:
                lines.append(f"changed: {path}")
            elif (on_disk.stat().st_mode & 0o777) != mode_of(expected[path]):
                lines.append(f"mode: {path}")
    return lines


def canonical_sha256(data: object) -> str:
    """Hash of the spec's meaning (canonical JSON), not of its formatting."""
    text = json.dumps(data, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()
