"""The writer: checked artifact paths, manifest.json, and an all-or-nothing swap into ``-o``."""

from __future__ import annotations

# hashlib, shutil, tempfile and glob are imported where a tree is hashed or written:
# validate and explain check paths only, and do not pay for them (about 8 ms).
import errno as _errno
import json
import os
import sys
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from mdc.api import Artifact

if TYPE_CHECKING:  # pathlib only where a tree is written or compared
    from pathlib import Path

MANIFEST = "manifest.json"


class ArtifactError(ValueError):
    """An artifact path is absolute, escapes ``out/``, or repeats."""


def check_paths(
    artifacts: Iterable[Artifact], *, reserved: Iterable[str] = (MANIFEST,)
) -> list[Artifact]:
    """The artifacts sorted by path; raises :class:`ArtifactError` on a bad or repeated path."""
    taken = set(reserved)
    seen: dict[str, Artifact] = {}
    folders: set[str] = set()  # every folder an artifact lies in
    for artifact in artifacts:
        path = artifact.path
        parts = path.split("/")
        if (
            path in taken
            or path.startswith("/")
            or "\\" in path
            or "\0" in path
            or any(part in ("", ".", "..") for part in parts)
        ):
            raise ArtifactError(f"artifact path {path!r} must be a plain relative path inside out/")
        if path in seen:
            raise ArtifactError(f"artifact path {path!r} is produced twice")
        parents = ["/".join(parts[:i]) for i in range(1, len(parts))]
        if path in folders or any(parent in seen for parent in parents):
            raise ArtifactError(
                f"artifact path {path!r} lies under another artifact, or another lies under it"
            )
        seen[path] = artifact
        folders.update(parents)
    return [seen[p] for p in sorted(seen)]


def mode_of(artifact: Artifact) -> int:
    return 0o755 if artifact.executable else 0o644


def manifest(
    artifacts: Iterable[Artifact], *, spec_sha256: str, plugins: Mapping[str, str]
) -> Artifact:
    """Every file with its sha256 and mode, the spec's hash, and the plugins that wrote them."""
    files = {a.path: {"sha256": _sha256(a.data), "mode": f"{mode_of(a):04o}"} for a in artifacts}
    return Artifact.json(
        MANIFEST, {"files": files, "spec_sha256": spec_sha256, "plugins": dict(plugins)}
    )


def finish(
    artifacts: Iterable[Artifact], *, spec_sha256: str, plugins: Mapping[str, str]
) -> list[Artifact]:
    """The complete, sorted output tree: the artifacts plus their manifest."""
    checked = check_paths(artifacts)
    return check_paths(
        [*checked, manifest(checked, spec_sha256=spec_sha256, plugins=plugins)], reserved=()
    )


def is_replaceable(out: Path) -> bool:
    """Only an absent or empty directory, or an earlier mdc output, may be replaced."""
    if not out.exists():
        return True
    if not out.is_dir():
        return False
    return not any(out.iterdir()) or (out / MANIFEST).is_file()


def write_tree(out: Path, tree: Iterable[Artifact]) -> None:
    """Build the tree beside ``out`` and swap it in; on any failure ``out`` is untouched.

    Where the kernel can exchange two directories atomically (Linux ``renameat2``), a
    SIGKILL at any point leaves ``out`` wholly old or wholly new. Elsewhere the swap is
    two renames; a compile killed between them leaves the old tree parked beside
    ``out``, and the next compile puts it back before doing anything else.
    """
    import shutil
    import tempfile
    from pathlib import Path

    out = out.absolute()
    out.parent.mkdir(parents=True, exist_ok=True)
    _recover(out)
    staging = Path(tempfile.mkdtemp(prefix=_prefix(out, "new"), dir=out.parent))
    try:
        for artifact in tree:
            target = staging / artifact.path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(artifact.data)
            os.chmod(target, mode_of(artifact))
        os.chmod(staging, 0o755)
        if not out.exists():
            os.replace(staging, out)
        elif _exchange(staging, out):
            shutil.rmtree(staging, ignore_errors=True)  # now the old tree
        else:
            parked = Path(tempfile.mkdtemp(prefix=_prefix(out, "old"), dir=out.parent))
            os.replace(out, parked / out.name)
            os.replace(staging, out)
            shutil.rmtree(parked, ignore_errors=True)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _prefix(out: Path, kind: str) -> str:
    """Leftover names carry the writer's pid, so only a dead writer's leftovers are cleared."""
    return f".{out.name}.mdc-{kind}-{os.getpid()}-"


def _recover(out: Path) -> None:
    """Undo what a killed writer left beside ``out``: restore a parked tree, drop staging."""
    import glob
    import shutil

    for leftover in sorted(out.parent.glob(f".{glob.escape(out.name)}.mdc-*-*-*")):
        kind, pid = leftover.name[len(out.name) + 1 :].split("-")[1:3]
        if not pid.isdigit() or _alive(int(pid)):
            continue
        parked = leftover / out.name
        if kind == "old" and parked.is_dir() and not out.exists():
            os.replace(parked, out)
        shutil.rmtree(leftover, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


_RENAME_EXCHANGE = 2  # linux/fs.h
_AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> bool:
    """Swap two directories in one step; False where the platform or filesystem cannot."""
    if sys.platform != "linux":
        return False
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is None:
        return False
    result = renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if result == 0:
        return True
    errno = ctypes.get_errno()
    if errno in (_errno.EINVAL, _errno.ENOSYS, _errno.EOPNOTSUPP):
        return False  # e.g. a filesystem without exchange support
    raise OSError(errno, os.strerror(errno), str(b))


def drift(out: Path, tree: Iterable[Artifact]) -> list[str]:
    """How ``out`` differs from ``tree``: one line per missing, changed or extra file."""
    expected = {a.path: a for a in tree}
    found = (
        {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
        if out.is_dir()
        else set()
    )
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
    return _sha256(text.encode())


def _sha256(data: bytes) -> str:
    import hashlib  # with the writer's other modules, only when a tree is built or written

    return hashlib.sha256(data).hexdigest()
