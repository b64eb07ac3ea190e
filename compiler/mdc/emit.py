"""The writer: checked artifact paths, manifest.json, and ``-o`` written file by file:
only what mdc wrote there before is replaced."""

from __future__ import annotations

# hashlib, shutil and secrets are imported where a tree is hashed or written:
# validate and explain check paths only, and do not pay for them.
import contextlib
import errno as _errno
import json
import os
import stat
from collections.abc import Iterable, Iterator, Mapping
from typing import TypeAlias

from mdc.api import Artifact

#: a path the user gave (str or pathlib.Path), shown back as given in messages
Where: TypeAlias = "str | os.PathLike[str]"

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
        if path in taken or not _is_plain(path):
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


def _is_plain(path: object) -> bool:
    """A relative path inside out/, clear of the writer's own folders there."""
    if not isinstance(path, str) or path.startswith("/") or "\\" in path or "\0" in path:
        return False
    parts = path.split("/")
    return parts[0] not in (STAGING, COMMIT) and all(p not in ("", ".", "..") for p in parts)


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


class OutputError(Exception):
    """The output cannot go where the user asked: the message names the path and why.

    A user's situation (a folder that is not mdc's, a full or read-only filesystem, a
    path under a file), never a bug in mdc: the command exits 2.
    """


#: Where a write is built inside ``out``, and the name it takes once complete (the commit).
STAGING, COMMIT = ".mdc-staging", ".mdc-commit"
_MANIFEST_KEYS = frozenset({"files", "plugins", "spec_sha256"})
_MANIFEST_CAP = 64 << 20  # bytes; the manifest of 100,000 files is about 15 MB


def listed_files(folder: str | os.PathLike[str]) -> frozenset[str] | None:
    """The files that mdc's ``manifest.json`` in ``folder`` lists; None if it holds none.

    A manifest is mdc's by what mdc writes into it (exactly its keys, sha256 hashes, the
    two modes, plain relative paths), never by its name: a web app has a manifest.json too.
    """
    nofollow = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(os.path.join(folder, MANIFEST), os.O_RDONLY | nofollow)
    except OSError:
        return None
    with open(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = f.read(_MANIFEST_CAP + 1)
    try:
        value = json.loads(data) if len(data) <= _MANIFEST_CAP else None
    except (ValueError, RecursionError):
        return None
    return _listed(value)


def _listed(value: object) -> frozenset[str] | None:
    if not isinstance(value, dict) or value.keys() != _MANIFEST_KEYS:
        return None
    files, plugins = value["files"], value["plugins"]
    if not (
        _is_sha256(value["spec_sha256"])
        and isinstance(plugins, dict)
        and all(isinstance(v, str) for v in plugins.values())
        and isinstance(files, dict)
    ):
        return None
    for path, entry in files.items():
        if not (
            _is_plain(path)
            and path != MANIFEST
            and isinstance(entry, dict)
            and entry.keys() == {"mode", "sha256"}
            and entry["mode"] in ("0644", "0755")
            and _is_sha256(entry["sha256"])
        ):
            return None
    return frozenset(files)


def _is_sha256(value: object) -> bool:
    return isinstance(value, str) and len(value) == 64 and not value.strip("0123456789abcdef")


def is_replaceable(out: Where) -> bool:
    """Whether ``out`` is absent, an empty folder, or a tree mdc wrote (a quick look; the
    writer checks again under its lock)."""
    if not os.path.lexists(out):
        return True
    if not os.path.isdir(out):
        return False
    entries = set(os.listdir(out))
    if COMMIT in entries:  # a killed write, finished first: the tree is mdc's
        return True
    return not (entries - {STAGING}) or listed_files(out) is not None


def write_tree(out: Where, tree: Iterable[Artifact]) -> None:
    """Write ``tree`` into ``out``, replacing only what mdc wrote there before.

    ``out`` may be absent, an empty folder, or a tree whose ``manifest.json`` mdc wrote:
    the files that manifest lists are replaced or removed; every other file (a job's
    ``slurm-<jobid>.out``, checkpoints) stays. A symlink is written through to its target.
    The new files are first written complete into ``out/.mdc-staging``; a failure there
    (a full or read-only filesystem) leaves ``out`` as it was. Renamed ``.mdc-commit``,
    they are moved into place and the manifest last; a writer killed during the moves
    leaves the commit, which the next write into ``out`` finishes before its own.
    Concurrent writers into one ``out`` take turns (an exclusive lock on the folder).

    Raises :class:`OutputError` when ``out`` may not or cannot be written.
    """
    files = list(tree)
    root = os.path.realpath(out)
    for _ in range(3):  # again if a failed writer removed the folder it had just created
        created = _make_folders(out, root)
        with _locked(out, root) as still_there:
            if still_there:
                try:
                    _recover(root)
                    _replace(out, root, files, created)
                except OSError as exc:  # e.g. a folder of the tree mdc may not read
                    raise _cannot(out, exc, root) from None
                return
    raise OutputError(f"cannot write {out}: the folder {root} keeps disappearing")


def recover(out: Where) -> None:
    """Finish (or drop) what a writer killed while writing ``out`` left there."""
    root = os.path.realpath(out)
    if os.path.isdir(root):
        with _locked(out, root) as still_there:
            if still_there:
                try:
                    _recover(root)
                except OSError as exc:
                    raise _cannot(out, exc, root) from None


def _make_folders(out: Where, root: str, *, tree: bool = True) -> list[str]:
    """Create ``root`` (the tree's folder, or a file's) and its missing parents; the ones
    created, outermost first."""
    missing, path = [], root
    while not os.path.lexists(path):
        missing.append(path)
        path = os.path.dirname(path)
    if not os.path.isdir(path):
        what = "a file, not a folder" if os.path.isfile(path) else "not a folder"
        if tree and path == root:
            raise OutputError(f"refusing to replace {out}: it is {what}")
        raise OutputError(f"cannot write {out}: {path} is {what}")
    made: list[str] = []
    for folder in reversed(missing):
        try:
            os.mkdir(folder)
        except FileExistsError:  # another writer made it meanwhile
            continue
        except OSError as exc:
            _remove_folders(made)
            raise _cannot(out, exc, root) from None
        made.append(folder)
    if tree and root in made:
        os.chmod(root, 0o755)  # the tree's own mode, whatever the umask
    return made


def _remove_folders(made: list[str]) -> None:
    for folder in reversed(made):
        try:
            os.rmdir(folder)  # only while empty: another writer may be using it
        except OSError:
            return


@contextlib.contextmanager
def _locked(out: Where, root: str) -> Iterator[bool]:
    """Hold an exclusive lock on the folder ``root``; yields whether it is still there."""
    try:
        fd = os.open(root, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError as exc:
        raise _cannot(out, exc, root) from None
    try:
        try:
            import fcntl
        except ImportError:  # no flock (Windows): writers do not take turns
            pass
        else:
            with contextlib.suppress(OSError):  # a filesystem without locks
                fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            still_there = os.path.samestat(os.fstat(fd), os.stat(root))
        except OSError:
            still_there = False
        yield still_there
    finally:
        os.close(fd)


def _recover(root: str) -> None:
    """Under the lock, whatever lies in STAGING or COMMIT is a dead writer's."""
    import shutil

    if os.path.lexists(os.path.join(root, COMMIT)):
        _roll_forward(root)
    shutil.rmtree(os.path.join(root, STAGING), ignore_errors=True)


def _replace(out: Where, root: str, files: list[Artifact], created: list[str]) -> None:
    import shutil

    old = _owned(out, root)
    in_the_way = _in_the_way(root, [a.path for a in files], old | {MANIFEST})
    if in_the_way:
        raise OutputError(
            f"refusing to write {out}: mdc did not write "
            + ", ".join(in_the_way)
            + f" (not listed in its {MANIFEST}), and the new tree needs the place; "
            "move them away, then compile again"
        )
    staging = os.path.join(root, STAGING)
    try:
        _stage(staging, files)
        os.replace(staging, os.path.join(root, COMMIT))
    except OSError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        _remove_folders(created)
        raise _cannot(out, exc, root, f"; {out} is as it was") from None
    try:
        _roll_forward(root)
    except OSError as exc:
        raise _cannot(
            out, exc, root, f"; the next compile into {out} finishes this one first"
        ) from None


def _owned(out: Where, root: str) -> frozenset[str]:
    """What mdc wrote into ``root`` before; refuses a folder that is not mdc's."""
    try:
        empty = not os.listdir(root)
    except OSError as exc:
        raise _cannot(out, exc, root) from None
    listed = frozenset() if empty else listed_files(root)
    if listed is None:
        raise OutputError(
            f"refusing to replace {out}: it is not empty and holds no {MANIFEST} "
            "written by mdc (mdc writes only into an empty folder or a tree it wrote)"
        )
    return listed


def _in_the_way(root: str, paths: list[str], old: frozenset[str]) -> list[str]:
    """Entries mdc did not write that occupy a path (or a folder of one) the new tree needs."""
    stale = old - set(paths)
    found: list[str] = []
    for path in paths:
        parts = path.split("/")
        for i in range(1, len(parts) + 1):
            here = "/".join(parts[:i])
            mode = _lmode(os.path.join(root, *parts[:i]))
            if mode is None or (here in old and not stat.S_ISDIR(mode)):
                break  # absent, or mdc's own file: removed or replaced
            if i < len(parts) and stat.S_ISDIR(mode):
                continue
            if not (stat.S_ISDIR(mode) and _holds_only(root, here, stale)):
                found.append(here + ("/" if stat.S_ISDIR(mode) else ""))
            break
    return sorted(set(found))


def _holds_only(root: str, folder: str, stale: frozenset[str]) -> bool:
    """Whether ``folder`` holds nothing but files of the old tree that go away."""
    for top, dirs, names in os.walk(os.path.join(root, *folder.split("/"))):
        rel = os.path.relpath(top, root).replace(os.sep, "/")
        if any(os.path.islink(os.path.join(top, d)) for d in dirs):
            return False
        if any(f"{rel}/{name}" not in stale for name in names):
            return False
    return True


def _lmode(path: str) -> int | None:
    try:
        return os.lstat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None


def _stage(staging: str, files: list[Artifact]) -> None:
    """Every new file, complete and with its mode, under ``staging``."""
    os.mkdir(staging, 0o700)
    for artifact in files:
        target = os.path.join(staging, *artifact.path.split("/"))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        try:
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with open(fd, "wb") as f:
                f.write(artifact.data)
            os.chmod(target, mode_of(artifact))
        except OSError as exc:
            exc.filename = exc.filename or target  # a failed write names no file
            raise


def _roll_forward(root: str) -> None:
    """Move a complete write into place: old files removed, new ones renamed in, manifest
    last (until then the old manifest says what was mdc's). Safe to repeat."""
    import shutil

    commit = os.path.join(root, COMMIT)
    new = listed_files(commit)
    if new is not None:  # else the manifest, moved last, is in place already
        old = listed_files(root) or frozenset()
        for path in sorted(old - new):
            _remove(root, path)
        for path in sorted(new):
            _place(commit, root, path)
        os.replace(os.path.join(commit, MANIFEST), os.path.join(root, MANIFEST))
    shutil.rmtree(commit)


def _remove(root: str, path: str) -> None:
    """Remove an old file of mdc's, then its folders that became empty."""
    parts = path.split("/")
    if not _real_folders(root, parts[:-1]):
        return  # a folder replaced by a link or file since: nothing of mdc's to remove there
    target = os.path.join(root, *parts)
    mode = _lmode(target)
    if mode is not None and not stat.S_ISDIR(mode):
        os.unlink(target)
    for i in range(len(parts) - 1, 0, -1):
        try:
            os.rmdir(os.path.join(root, *parts[:i]))
        except OSError:  # not empty: it holds other files
            return


def _place(commit: str, root: str, path: str) -> None:
    parts = path.split("/")
    source = os.path.join(commit, *parts)
    if not os.path.lexists(source):
        return  # moved already, by the writer that was killed
    for i in range(1, len(parts)):
        folder = os.path.join(root, *parts[:i])
        with contextlib.suppress(FileExistsError):
            os.mkdir(folder)
        if not stat.S_ISDIR(os.lstat(folder).st_mode):  # never through a link out of the tree
            raise NotADirectoryError(_errno.ENOTDIR, os.strerror(_errno.ENOTDIR), folder)
        os.chmod(folder, 0o755)  # mdc's folders have one mode on every machine
    target = os.path.join(root, *parts)
    mode = _lmode(target)
    if mode is not None and stat.S_ISDIR(mode):  # emptied of old files: empty folders left
        for top, _, _ in sorted(os.walk(target), reverse=True):
            os.rmdir(top)  # never a file: one would fail this
    os.replace(source, target)


def _real_folders(root: str, parts: list[str]) -> bool:
    for i in range(1, len(parts) + 1):
        mode = _lmode(os.path.join(root, *parts[:i]))
        if mode is None or not stat.S_ISDIR(mode):
            return False
    return True


def _cannot(out: Where, exc: OSError, root: str, tail: str = "") -> OutputError:
    """A failed system call as a message about the path the user gave."""
    where = exc.filename if isinstance(exc.filename, str) else root
    for inner in (os.path.join(root, STAGING), os.path.join(root, COMMIT)):
        if where == inner or where.startswith(inner + os.sep):
            where = root + where[len(inner) :]  # the file it was going to be
    cause = exc.strerror or str(exc)
    if where == root:
        return OutputError(f"cannot write {out}: {cause}{tail}")
    if where.startswith(root + os.sep):
        shown = os.path.join(os.fspath(out), os.path.relpath(where, root))
        return OutputError(f"cannot write {shown}: {cause}{tail}")
    return OutputError(f"cannot write {out}: {where}: {cause}{tail}")


def write_file(path: str, data: bytes, *, force: bool = False, inputs: Iterable[str] = ()) -> None:
    """Write one file the user named (an SVG, a spec): never one of ``inputs``, an existing
    file only with ``force``; a symlink is written through. The file is replaced in one
    rename, so a failure leaves what was there."""
    target = os.path.realpath(path)
    for given in inputs:
        if target == os.path.realpath(given) or _same_file(target, given):
            raise OutputError(f"refusing to write {path}: it is the input {given}")
    if os.path.isdir(target):
        raise OutputError(f"cannot write {path}: it is a folder")
    if os.path.exists(target) and not os.path.isfile(target):
        _write_into(path, data)  # /dev/stdout, /dev/null, a FIFO: a stream, not a file
        return
    if os.path.lexists(path) and not force:
        raise OutputError(f"{path} exists; pass --force to replace it")
    import secrets

    folder = os.path.dirname(target)
    created = [] if os.path.isdir(folder) else _make_folders(path, folder, tree=False)
    temporary = os.path.join(folder, f".{os.path.basename(target)}.{secrets.token_hex(4)}.mdc")
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask's mode
        with open(fd, "wb") as f:
            f.write(data)
        os.replace(temporary, target)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        _remove_folders(created)
        raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from None


def _write_into(path: str, data: bytes) -> None:
    try:
        with open(path, "wb") as f:
            f.write(data)
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from None


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def drift(out: Where, tree: Iterable[Artifact]) -> list[str]:
    """How ``out`` differs from ``tree``, one line per file: missing, changed, a wrong mode,
    or extra (listed in the manifest on disk, not in ``tree``). Files mdc did not write are
    not drift: a compile leaves them alone."""
    expected = {a.path: a for a in tree}
    folder = os.fspath(out)
    listed = (listed_files(folder) if os.path.isdir(folder) else None) or frozenset()
    lines = []
    for path in sorted(expected.keys() | listed):
        on_disk = os.path.join(folder, *path.split("/"))
        mode = _lmode(on_disk) if _real_folders(folder, path.split("/")[:-1]) else None
        is_file = mode is not None and stat.S_ISREG(mode)
        if path not in expected:
            if is_file:
                lines.append(f"extra: {path}")
        elif not is_file:
            lines.append(f"missing: {path}")
        else:
            with open(on_disk, "rb") as f:
                same = f.read() == expected[path].data
            if not same:
                lines.append(f"changed: {path}")
            elif stat.S_IMODE(mode or 0) != mode_of(expected[path]):
                lines.append(f"mode: {path}")
    return lines


def canonical_sha256(data: object) -> str:
    """Hash of the spec's meaning (canonical JSON), not of its formatting."""
    text = json.dumps(data, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return _sha256(text.encode())


def _sha256(data: bytes) -> str:
    import hashlib  # with the writer's other modules, only when a tree is built or written

    return hashlib.sha256(data).hexdigest()
