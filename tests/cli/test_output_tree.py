"""What ``mdc compile -o OUT`` writes, replaces and never touches, and the files that
``explain --svg``, ``import -o`` and ``tune --write``/``--svg`` write.

mdc recognises a tree as its own by its manifest (mdc's keys, hashes and modes), never by
the name manifest.json; it replaces only the files that manifest lists. A folder, file or
filesystem that cannot be written is the user's situation: exit 2 with the path and the
cause, never exit 4 ("a bug in mdc"), and the previous tree as it was.
"""

from __future__ import annotations

import io
import json
import os
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from tests.tools import REPO

from mdc import emit
from mdc.cli import main

QUICKSTART = str(REPO / "examples" / "quickstart.toml")
SLURM = str(REPO / "examples" / "slurm-torchrun-2x8.toml")
TUNE = str(REPO / "examples" / "tune-llama70b-64xh100.toml")
MADENGINE = str(REPO / "tests" / "fixtures" / "madengine" / "local-env-vars.json")

pytestmark = pytest.mark.usefixtures("no_ambient_plugins")

#: a web app's manifest (https://www.w3.org/TR/appmanifest/) and a browser extension's
FOREIGN_MANIFESTS = {
    "web-app": {"name": "Demo", "start_url": "/", "display": "standalone", "icons": []},
    "extension": {"manifest_version": 3, "name": "x", "version": "1.0"},
    "files-only": {"files": {"index.html": {}}},
    "mdc-keys-other-values": {"files": {"../x": {}}, "plugins": {}, "spec_sha256": "0"},
}


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def snapshot(root: Path) -> dict[str, tuple[bytes, int]]:
    return {
        p.relative_to(root).as_posix(): (p.read_bytes(), p.stat().st_mode & 0o777)
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def compiled_tree(spec: str, tmp_path: Path) -> dict[str, tuple[bytes, int]]:
    """What a compile of ``spec`` into a fresh folder writes."""
    fresh = tmp_path / f"fresh-{Path(spec).stem}"
    assert run("compile", spec, "-o", str(fresh))[0] == 0
    return snapshot(fresh)


# ---------------------------------------------------------------- whose tree it is


@pytest.mark.parametrize("kind", sorted(FOREIGN_MANIFESTS))
def test_a_folder_with_a_manifest_mdc_did_not_write_is_refused(tmp_path: Path, kind: str) -> None:
    app = tmp_path / "app"
    app.mkdir()
    (app / "manifest.json").write_text(json.dumps(FOREIGN_MANIFESTS[kind]))
    (app / "index.html").write_text("<html></html>\n")
    before = snapshot(app)
    code, stdout, stderr = run("compile", QUICKSTART, "-o", str(app))
    assert (code, stdout) == (2, "")
    assert f"refusing to replace {app}" in stderr and "manifest.json" in stderr
    assert snapshot(app) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["app"]


def test_validate_walks_a_folder_whose_manifest_is_not_mdcs(tmp_path: Path) -> None:
    """A broken spec beside a web app's manifest.json is found; an mdc tree is skipped."""
    app = tmp_path / "specs" / "app"
    app.mkdir(parents=True)
    (app / "manifest.json").write_text(json.dumps(FOREIGN_MANIFESTS["web-app"]))
    (app / "job.toml").write_text('[job]\nname = "x"\n[distributed]\nnproc_per_node = "many"\n')
    assert run("compile", QUICKSTART, "-o", str(tmp_path / "specs" / "built"))[0] == 0
    (tmp_path / "specs" / "built" / "notes.yaml").write_text("not: [a spec\n")
    code, _, stderr = run("validate", str(tmp_path / "specs"))
    assert code == 1
    assert f"{app / 'job.toml'}:" in stderr
    assert "notes.yaml" not in stderr


def test_a_tree_mdc_wrote_is_recognised_by_its_manifest(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert run("compile", SLURM, "-o", str(out))[0] == 0
    listed = json.loads((out / "manifest.json").read_text())["files"]
    assert emit.listed_files(out) == frozenset(listed)
    (out / "manifest.json").write_text(
        json.dumps({**json.loads((out / "manifest.json").read_text()), "x": 1})
    )
    assert emit.listed_files(out) is None


# ---------------------------------------------------------------- files mdc did not write


def test_a_recompile_keeps_every_file_mdc_did_not_write(tmp_path: Path) -> None:
    """The job's log (``cd out && sbatch slurm/job.sbatch`` puts slurm-<jobid>.out there),
    a log beside mdc's scripts and a checkpoint folder survive recompiles of the same spec
    and of another; mdc's own files follow the spec."""
    out = tmp_path / "out"
    assert run("compile", SLURM, "-o", str(out))[0] == 0
    theirs = {
        "slurm-4242.out": b"step 1 loss 2.3\n",
        "slurm/slurm-4243.out": b"srun: error\n",
        "checkpoints/step-100/model.pt": b"\x00weights",
    }
    for name, data in theirs.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_bytes(data)
    for spec in (SLURM, QUICKSTART, SLURM):
        code, _, stderr = run("compile", spec, "-o", str(out))
        assert code == 0, stderr
        found = snapshot(out)
        assert {name: found[name][0] for name in theirs} == theirs
        assert {k: v for k, v in found.items() if k not in theirs} == compiled_tree(spec, tmp_path)
        assert run("compile", spec, "-o", str(out), "--check")[0] == 0


def test_a_file_mdc_did_not_write_where_the_tree_needs_one_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert run("compile", QUICKSTART, "-o", str(out))[0] == 0
    (out / "slurm").mkdir()
    (out / "slurm" / "job.sbatch").write_text("#!/bin/bash\n# mine\n")
    (out / "launch" / "worker.sh").unlink()
    (out / "launch" / "worker.sh").mkdir()  # a folder where mdc writes a file
    (out / "launch" / "worker.sh" / "mine.txt").write_text("mine\n")
    before = snapshot(out)
    code, _, stderr = run("compile", SLURM, "-o", str(out))
    assert code == 2
    assert "launch/worker.sh/" in stderr and "slurm/job.sbatch" in stderr
    assert snapshot(out) == before
    assert sorted(p.name for p in out.iterdir()) == [
        "launch",
        "local",
        "manifest.json",
        "plan.json",
        "slurm",
    ]


def test_an_edited_file_of_mdcs_is_replaced(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert run("compile", QUICKSTART, "-o", str(out))[0] == 0
    (out / "local" / "run.sh").write_text("edited\n")
    assert run("compile", QUICKSTART, "-o", str(out))[0] == 0
    assert snapshot(out) == compiled_tree(QUICKSTART, tmp_path)


# ---------------------------------------------------------------- -o naming a symlink


def test_a_symlink_output_is_written_through(tmp_path: Path) -> None:
    """The link stays; its target gets the new tree; nothing is left beside either."""
    target, link = tmp_path / "scratch" / "run1", tmp_path / "out"
    assert run("compile", SLURM, "-o", str(target))[0] == 0
    (target / "slurm-7.out").write_text("log\n")
    link.symlink_to(target)
    assert run("compile", QUICKSTART, "-o", str(link))[0] == 0
    assert link.is_symlink() and os.readlink(link) == str(target)
    found = snapshot(target)
    assert found.pop("slurm-7.out")[0] == b"log\n"
    assert found == compiled_tree(QUICKSTART, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fresh-quickstart", "out", "scratch"]
    assert sorted(p.name for p in target.parent.iterdir()) == ["run1"]
    assert run("compile", QUICKSTART, "-o", str(link), "--check")[0] == 0


def test_a_dangling_symlink_output_gets_its_target_created(tmp_path: Path) -> None:
    link = tmp_path / "out"
    link.symlink_to(tmp_path / "scratch" / "run1")
    code, _, stderr = run("compile", QUICKSTART, "-o", str(link))
    assert code == 0, stderr
    assert link.is_symlink()
    assert snapshot(tmp_path / "scratch" / "run1") == compiled_tree(QUICKSTART, tmp_path)


def test_a_symlink_to_a_folder_mdc_did_not_write_is_refused(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "thesis.tex").write_text("precious\n")
    (tmp_path / "out").symlink_to(home)
    before = snapshot(home)
    code, _, stderr = run("compile", QUICKSTART, "-o", str(tmp_path / "out"))
    assert code == 2 and "refusing" in stderr
    assert snapshot(home) == before


def test_a_symlinked_folder_inside_the_tree_is_not_written_through(tmp_path: Path) -> None:
    """out/launch replaced by a link to elsewhere: mdc neither writes nor deletes there."""
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    assert run("compile", QUICKSTART, "-o", str(out))[0] == 0
    (out / "launch").rename(elsewhere)
    (out / "launch").symlink_to(elsewhere)
    before = snapshot(elsewhere)
    code, _, stderr = run("compile", SLURM, "-o", str(out))
    assert code == 2 and "launch" in stderr
    assert snapshot(elsewhere) == before


# ---------------------------------------------------------------- modes


@pytest.fixture
def umask_077() -> Iterator[None]:
    old = os.umask(0o077)
    try:
        yield
    finally:
        os.umask(old)


@pytest.mark.usefixtures("umask_077")
def test_folders_have_one_mode_whatever_the_umask(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert run("compile", SLURM, "-o", str(out))[0] == 0
    assert run("compile", QUICKSTART, "-o", str(out))[0] == 0
    assert run("compile", SLURM, "-o", str(out))[0] == 0
    modes = {
        p.relative_to(out).as_posix(): p.stat().st_mode & 0o777 for p in [out, *out.rglob("*")]
    }
    assert modes == {
        ".": 0o755,
        "launch": 0o755,
        "launch/worker.sh": 0o755,
        "manifest.json": 0o644,
        "plan.json": 0o644,
        "slurm": 0o755,
        "slurm/job.sbatch": 0o755,
        "slurm/node.sh": 0o755,
    }


# ---------------------------------------------------------------- exit 2, not 4


def test_output_under_a_file_is_a_named_error(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("x\n")
    code, _, stderr = run("compile", QUICKSTART, "-o", str(tmp_path / "notes.txt" / "out"))
    assert code == 2
    assert f"{tmp_path / 'notes.txt'} is a file, not a folder" in stderr
    assert (tmp_path / "notes.txt").read_text() == "x\n"


def test_a_missing_parent_is_created(tmp_path: Path) -> None:
    out = tmp_path / "a" / "b" / "out"
    assert run("compile", QUICKSTART, "-o", str(out))[0] == 0
    assert snapshot(out) == compiled_tree(QUICKSTART, tmp_path)


WRITE_LIMITED = """
import resource, signal, sys
from mdc.cli import main
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[1]), int(sys.argv[1])))
sys.exit(main(sys.argv[2:]))
"""


def test_a_write_that_fails_midway_leaves_the_previous_tree(
    tmp_path: Path, clean_env: Callable[..., dict[str, str]]
) -> None:
    """A file-size limit (RLIMIT_FSIZE) makes the kernel refuse the tree's larger files, as
    a full disk would: exit 2, the file and the cause named, the earlier tree and the job's
    log as they were, nothing of the attempt left behind."""
    out = tmp_path / "out"
    assert run("compile", QUICKSTART, "-o", str(out))[0] == 0
    (out / "slurm-1.out").write_text("log\n")
    before = snapshot(out)
    done = subprocess.run(
        [sys.executable, "-c", WRITE_LIMITED, "600", "compile", SLURM, "-o", str(out)],
        capture_output=True,
        text=True,
        env=clean_env(MDC_DISABLE_PLUGIN_AUTOLOAD="1"),
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert f"mdc: cannot write {out}/" in done.stderr and "File too large" in done.stderr
    assert f"{out} is as it was" in done.stderr
    assert snapshot(out) == before


def test_a_failed_write_into_a_new_folder_leaves_nothing(
    tmp_path: Path, clean_env: Callable[..., dict[str, str]]
) -> None:
    out = tmp_path / "new" / "out"
    done = subprocess.run(
        [sys.executable, "-c", WRITE_LIMITED, "600", "compile", SLURM, "-o", str(out)],
        capture_output=True,
        text=True,
        env=clean_env(MDC_DISABLE_PLUGIN_AUTOLOAD="1"),
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A real 256 KiB filesystem (a tmpfs), unmounted afterwards; needs root."""
    mount = tmp_path / "fs"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root (CI runs as root)")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256k,mode=0755", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(folder: Path) -> None:
    """Take every free block of the filesystem of ``folder``."""
    with open(folder / "filler", "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError:
            pass


def test_a_full_filesystem_is_a_named_error(small_tmpfs: Path) -> None:
    out = small_tmpfs / "out"
    assert run("compile", QUICKSTART, "-o", str(out))[0] == 0
    fill(small_tmpfs)
    before = snapshot(out)
    code, _, stderr = run("compile", SLURM, "-o", str(out))
    assert code == 2, stderr
    assert "No space left on device" in stderr and str(out) in stderr
    assert snapshot(out) == before
    code, _, stderr = run("explain", QUICKSTART, "--svg", str(small_tmpfs / "map.svg"))
    assert code == 2 and "No space left on device" in stderr
    assert sorted(p.name for p in small_tmpfs.iterdir()) == ["filler", "out"]


def test_a_read_only_filesystem_is_a_named_error(small_tmpfs: Path) -> None:
    out, killed = small_tmpfs / "out", small_tmpfs / "killed"
    assert run("compile", QUICKSTART, "-o", str(out))[0] == 0
    assert run("compile", QUICKSTART, "-o", str(killed))[0] == 0
    (killed / emit.COMMIT).mkdir()  # what a write killed while moving files leaves
    (killed / emit.COMMIT / "plan.json").write_text("{}\n")
    before = snapshot(out)
    subprocess.run(["mount", "-o", "remount,ro", str(small_tmpfs)], check=True)
    for argv in (
        ("compile", SLURM, "-o", str(out)),
        ("compile", SLURM, "-o", str(killed)),
        ("compile", SLURM, "-o", str(small_tmpfs / "new")),
        ("explain", QUICKSTART, "--svg", str(small_tmpfs / "map.svg")),
        ("import", "madengine", MADENGINE, "-o", str(small_tmpfs / "job.toml")),
    ):
        code, _, stderr = run(*argv)
        assert code == 2, (argv, stderr)
        assert "Read-only file system" in stderr, stderr
    assert snapshot(out) == before


#: A compile that waits for GO to exist before it starts; every rename it makes then
#: takes 0.3 s longer, so two such compiles are inside each other's writes.
SLOW_RENAMES = """
import os, sys, time
from mdc.cli import main
rename = os.replace
def slow(*args, **kwargs):
    time.sleep(0.3)
    return rename(*args, **kwargs)
os.replace = slow
print("ready", flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.01)
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.slow
def test_two_compiles_creating_one_new_output_both_succeed(
    tmp_path: Path, clean_env: Callable[..., dict[str, str]]
) -> None:
    """Started together into one new folder: each exits 0, the tree is one of the two,
    and nothing is left beside it."""
    env = clean_env(MDC_DISABLE_PLUGIN_AUTOLOAD="1")
    trees = [compiled_tree(QUICKSTART, tmp_path), compiled_tree(SLURM, tmp_path)]
    go, out = tmp_path / "go", tmp_path / "runs" / "out"
    children = [
        subprocess.Popen(
            [sys.executable, "-c", SLOW_RENAMES, str(go), "compile", spec, "-o", str(out)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for spec in (QUICKSTART, SLURM)
    ]
    for child in children:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
    go.touch()
    for child in children:
        _, stderr = child.communicate(timeout=120)
        assert child.returncode == 0, stderr
    assert snapshot(out) in trees
    assert [p.name for p in out.parent.iterdir()] == ["out"]
    assert [p.name for p in out.iterdir() if p.name.startswith(".")] == []


# ---------------------------------------------------------------- single files


def file_commands(tmp_path: Path) -> dict[str, tuple[str, ...]]:
    spec = tmp_path / "job.toml"
    spec.write_text((REPO / "examples" / "quickstart.toml").read_text())
    tune = tmp_path / "tune.toml"
    tune.write_text(Path(TUNE).read_text())
    config = tmp_path / "context.json"
    config.write_text(Path(MADENGINE).read_text())
    return {
        "explain --svg": ("explain", str(spec), "--svg"),
        "import -o": ("import", "madengine", str(config), "-o"),
        "tune --write": ("tune", str(tune), "--top", "1", "--write"),
        "tune --svg": ("tune", str(tune), "--top", "1", "--svg"),
    }


INPUT_OF = {
    "explain --svg": "job.toml",
    "import -o": "context.json",
    "tune --write": "tune.toml",
    "tune --svg": "tune.toml",
}
COMMANDS = sorted(INPUT_OF)


@pytest.mark.slow
@pytest.mark.parametrize("command", COMMANDS)
def test_an_existing_file_is_replaced_only_with_force(tmp_path: Path, command: str) -> None:
    argv = file_commands(tmp_path)[command]
    target = tmp_path / "result.txt"
    target.write_text("mine\n")
    code, _, stderr = run(*argv, str(target))
    assert code == 2 and stderr == f"mdc: {target} exists; pass --force to replace it\n"
    assert target.read_text() == "mine\n"
    code, _, stderr = run(*argv, str(target), "--force")
    assert code in (0, 1), stderr  # 1: the imported spec has findings, and is written
    assert target.read_text() != "mine\n"


@pytest.mark.slow
@pytest.mark.parametrize("command", COMMANDS)
def test_the_input_is_never_overwritten(tmp_path: Path, command: str) -> None:
    argv = file_commands(tmp_path)[command]
    given = tmp_path / INPUT_OF[command]
    (tmp_path / "link").symlink_to(given)
    before = given.read_bytes()
    for target in (given, tmp_path / "link", tmp_path / "." / given.name):
        code, _, stderr = run(*argv, str(target), "--force")
        assert code == 2 and f"refusing to write {target}: it is the input" in stderr, stderr
        assert given.read_bytes() == before


@pytest.mark.slow
@pytest.mark.parametrize("command", COMMANDS)
def test_a_folder_or_a_path_under_a_file_is_a_named_error(tmp_path: Path, command: str) -> None:
    argv = file_commands(tmp_path)[command]
    (tmp_path / "folder").mkdir()
    code, _, stderr = run(*argv, str(tmp_path / "folder"), "--force")
    assert code == 2 and f"cannot write {tmp_path / 'folder'}: it is a folder" in stderr
    (tmp_path / "file").write_text("x\n")
    code, _, stderr = run(*argv, str(tmp_path / "file" / "out.txt"))
    assert code == 2 and f"{tmp_path / 'file'} is a file, not a folder" in stderr


@pytest.mark.slow
@pytest.mark.parametrize("command", COMMANDS)
def test_a_device_is_written_into_not_replaced(tmp_path: Path, command: str) -> None:
    """``--svg /dev/null`` (or /dev/stdout) writes into the stream; the device stays."""
    argv = file_commands(tmp_path)[command]
    code, _, stderr = run(*argv, os.devnull, "--force")
    assert code in (0, 1), stderr
    code, _, stderr = run(*argv, os.devnull)
    assert code in (0, 1), stderr
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)


@pytest.mark.slow
@pytest.mark.parametrize("command", COMMANDS)
def test_a_missing_parent_folder_is_created(tmp_path: Path, command: str) -> None:
    argv = file_commands(tmp_path)[command]
    target = tmp_path / "new" / "result.txt"
    code, _, stderr = run(*argv, str(target))
    assert code in (0, 1), stderr
    assert target.stat().st_size > 0
    assert sorted(p.name for p in target.parent.iterdir()) == ["result.txt"]


def test_finishing_a_killed_write_never_follows_a_link_out_of_the_tree(tmp_path: Path) -> None:
    """A write killed while moving files left .mdc-commit; meanwhile out/launch became a
    link to elsewhere. The next compile finishes the old write without writing there."""
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    assert run("compile", QUICKSTART, "-o", str(out))[0] == 0
    for path, (data, _) in compiled_tree(SLURM, tmp_path).items():
        (out / emit.COMMIT / path).parent.mkdir(parents=True, exist_ok=True)
        (out / emit.COMMIT / path).write_bytes(data)
    (out / "launch").rename(elsewhere)
    (out / "launch").symlink_to(elsewhere)
    before = snapshot(elsewhere)
    code, _, stderr = run("compile", SLURM, "-o", str(out))
    assert code == 2 and f"cannot write {out / 'launch'}: Not a directory" in stderr, stderr
    assert snapshot(elsewhere) == before
