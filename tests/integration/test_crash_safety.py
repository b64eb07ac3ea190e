"""A writer killed with SIGKILL leaves ``out/`` old or new, never a mix, once recovered.

A child process rewrites one output directory in a loop, alternating two trees of a
few hundred files, and is killed at a random moment; most kills land inside a write.
After :func:`mdc.emit.recover` (what the next write into ``out/`` does first under its
lock), what is on disk must be exactly one of the two trees, plus the file mdc did not
write, untouched. Real ``mdc compile`` processes are killed the same way.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from mdc import emit

pytestmark = pytest.mark.slow

KILLS = 12

#: Writes tree A, then B, then A ... into argv[1] until killed. Prints "ready" once the
#: first tree is in place.
WRITER = """
import sys
from pathlib import Path
from mdc import emit
from mdc.api import Artifact

def tree(tag):
    files = [Artifact.text(f"d{i % 7}/f{i}.txt", f"{tag} {i}\\n" * 50) for i in range(300)]
    if tag == "b":
        files = files[:200] + [Artifact.text(f"b{i}/g.txt", "b\\n") for i in range(30)]
    return emit.finish(files, spec_sha256=tag * 64, plugins={})

out, trees = Path(sys.argv[1]), [tree("a"), tree("b")]
emit.write_tree(out, trees[0])
print("ready", flush=True)
n = 1
while True:
    emit.write_tree(out, trees[n % 2])
    n += 1
"""
#: a file the job wrote into the tree: every kill and recovery leaves it as it is
THEIRS = {"slurm-1.out": b"job log\n", "d3/slurm-2.out": b"step log\n"}


def expected_trees() -> list[dict[str, bytes]]:
    from mdc.api import Artifact

    trees = []
    for tag in "ab":
        files = [Artifact.text(f"d{i % 7}/f{i}.txt", f"{tag} {i}\n" * 50) for i in range(300)]
        if tag == "b":
            files = files[:200] + [Artifact.text(f"b{i}/g.txt", "b\n") for i in range(30)]
        written = emit.finish(files, spec_sha256=tag * 64, plugins={})
        trees.append({**{a.path: a.data for a in written}, **THEIRS})
    return trees


def on_disk(out: Path) -> dict[str, bytes]:
    return {
        p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()
    }


def kill_writer_at_random(
    tmp_path: Path, seed: int, clean_env: Callable[..., dict[str, str]]
) -> Path:
    out = tmp_path / "out"
    emit.write_tree(out, emit.finish([], spec_sha256="0" * 64, plugins={}))
    (out / "d3").mkdir()
    for name, data in THEIRS.items():
        (out / name).write_bytes(data)
    child = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(out)],
        stdout=subprocess.PIPE,
        text=True,
        env=clean_env(),
    )
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "ready"
    time.sleep(random.Random(seed).uniform(0.0, 0.4))
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=30)
    child.stdout.close()
    return out


@pytest.mark.parametrize("seed", range(KILLS))
def test_killed_writer_leaves_old_or_new_tree(
    seed: int, tmp_path: Path, clean_env: Callable[..., dict[str, str]]
) -> None:
    out = kill_writer_at_random(tmp_path, seed, clean_env)
    emit.recover(out)
    assert on_disk(out) in expected_trees()
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_a_second_writer_waits_for_the_first(
    tmp_path: Path, clean_env: Callable[..., dict[str, str]]
) -> None:
    """While one writer holds ``out``, another neither writes nor clears its work."""
    import fcntl

    out = tmp_path / "out"
    emit.write_tree(out, emit.finish([], spec_sha256="0" * 64, plugins={}))
    busy = out / emit.STAGING
    busy.mkdir()  # the first writer's work in progress
    fd = os.open(out, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        second = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(out)],
            env=clean_env(),
            stdout=subprocess.PIPE,
            text=True,
        )
        time.sleep(1.5)
        assert second.poll() is None and busy.is_dir()
        assert on_disk(out) == {"manifest.json": on_disk(out)["manifest.json"]}
    finally:
        os.close(fd)
    assert second.stdout is not None and second.stdout.readline().strip() == "ready"
    second.kill()
    second.wait(timeout=30)
    second.stdout.close()


@pytest.mark.parametrize("seed", range(6))
def test_killed_mdc_compile_leaves_previous_output_or_the_new_one(
    seed: int, tmp_path: Path, repo_root: Path, clean_env: Callable[..., dict[str, str]]
) -> None:
    examples = repo_root / "examples"
    first, second = examples / "quickstart.toml", examples / "slurm-torchrun-2x8.toml"
    out = tmp_path / "out"
    env = clean_env(MDC_DISABLE_PLUGIN_AUTOLOAD="1")
    compile_ = [sys.executable, "-m", "mdc", "compile"]
    subprocess.run([*compile_, str(second), "-o", str(tmp_path / "new")], env=env, check=True)
    subprocess.run([*compile_, str(first), "-o", str(out)], env=env, check=True)
    (out / "slurm-1.out").write_bytes(b"job log\n")
    old, new = on_disk(out), {**on_disk(tmp_path / "new"), "slurm-1.out": b"job log\n"}
    child = subprocess.Popen([*compile_, str(second), "-o", str(out)], env=env)
    time.sleep(random.Random(seed).uniform(0.1, 0.6))
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=30)
    emit.recover(out)
    assert on_disk(out) in (old, new)


def test_an_interrupted_commit_is_finished(tmp_path: Path) -> None:
    """Killed while moving files into place: some new files are in, the rest and the new
    manifest wait in .mdc-commit, the old manifest still says what was mdc's. Recovery
    finishes the move; an unfinished .mdc-staging is dropped."""
    from mdc.api import Artifact

    out = tmp_path / "out"
    old = emit.finish(
        [Artifact.text("a.txt", "old a"), Artifact.text("gone/b.txt", "old b")],
        spec_sha256="0" * 64,
        plugins={},
    )
    new = emit.finish(
        [Artifact.text("a.txt", "new a"), Artifact.text("c/d.txt", "new d")],
        spec_sha256="1" * 64,
        plugins={},
    )
    emit.write_tree(out, old)
    (out / "gone" / "log.txt").write_text("theirs\n")
    commit = out / emit.COMMIT
    for artifact in new:
        (commit / artifact.path).parent.mkdir(parents=True, exist_ok=True)
        (commit / artifact.path).write_bytes(artifact.data)
    (commit / "a.txt").replace(out / "a.txt")  # moved before the kill
    (out / emit.STAGING / "x").mkdir(parents=True)
    emit.recover(out)
    assert on_disk(out) == {
        **{a.path: a.data for a in new},
        "gone/log.txt": b"theirs\n",
    }
