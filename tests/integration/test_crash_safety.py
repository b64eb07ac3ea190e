"""A writer killed with SIGKILL leaves ``out/`` wholly old or wholly new, never a mix.

A child process rewrites one output directory in a loop, alternating two trees of a
few hundred files, and is killed at a random moment; most kills land inside a write.
What is on disk afterwards must be exactly one of the two trees (after the next
writer's recovery, for the two-rename fallback used where directories cannot be
exchanged atomically). Real ``mdc compile`` processes are killed the same way.
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

#: Writes tree A, then B, then A ... into argv[1] until killed; argv[2] "fallback" disables
#: the atomic exchange. Prints "ready" once the first tree is in place.
WRITER = """
import sys
from pathlib import Path
from mdc import emit
from mdc.api import Artifact

def tree(tag):
    files = [Artifact.text(f"d{i % 7}/f{i}.txt", f"{tag} {i}\\n" * 50) for i in range(300)]
    return emit.finish(files, spec_sha256=tag * 64, plugins={})

if sys.argv[2] == "fallback":
    emit._exchange = lambda a, b: False
out, trees = Path(sys.argv[1]), [tree("a"), tree("b")]
emit.write_tree(out, trees[0])
print("ready", flush=True)
n = 1
while True:
    emit.write_tree(out, trees[n % 2])
    n += 1
"""


def expected_trees() -> list[dict[str, bytes]]:
    from mdc.api import Artifact

    trees = []
    for tag in "ab":
        files = [Artifact.text(f"d{i % 7}/f{i}.txt", f"{tag} {i}\n" * 50) for i in range(300)]
        trees.append({a.path: a.data for a in emit.finish(files, spec_sha256=tag * 64, plugins={})})
    return trees


def on_disk(out: Path) -> dict[str, bytes]:
    return {
        p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()
    }


def kill_writer_at_random(
    tmp_path: Path, mode: str, seed: int, clean_env: Callable[..., dict[str, str]]
) -> Path:
    out = tmp_path / "out"
    child = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(out), mode],
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
    out = kill_writer_at_random(tmp_path, "exchange", seed, clean_env)
    assert on_disk(out) in expected_trees()


@pytest.mark.parametrize("seed", range(KILLS))
def test_killed_fallback_writer_is_recovered_by_the_next_write(
    seed: int, tmp_path: Path, clean_env: Callable[..., dict[str, str]]
) -> None:
    out = kill_writer_at_random(tmp_path, "fallback", seed, clean_env)
    if not out.exists():  # killed between the two renames: the old tree is parked
        parked = list(tmp_path.glob(".out.mdc-old-*/out"))
        assert len(parked) == 1, sorted(p.name for p in tmp_path.iterdir())
    emit._recover(out)
    assert on_disk(out) in expected_trees()
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_a_live_writers_staging_is_left_alone(tmp_path: Path) -> None:
    """Two compiles into one directory: the other's work in progress is not deleted."""
    out = tmp_path / "out"
    busy = tmp_path / f".out.mdc-new-{os.getpid()}-abc"
    busy.mkdir()
    emit.write_tree(out, emit.finish([], spec_sha256="0" * 64, plugins={}))
    assert busy.is_dir()


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
    old, new = on_disk(out), on_disk(tmp_path / "new")
    child = subprocess.Popen([*compile_, str(second), "-o", str(out)], env=env)
    time.sleep(random.Random(seed).uniform(0.1, 0.6))
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=30)
    assert on_disk(out) in (old, new)


def test_a_tree_parked_by_a_killed_writer_comes_back(tmp_path: Path) -> None:
    """The window between the fallback's two renames, made by hand: out/ is gone, the old
    tree is parked under the dead writer's pid; the next write restores it first."""
    finished = subprocess.Popen(["true"])
    finished.wait()
    parked = tmp_path / f".out.mdc-old-{finished.pid}-xyz" / "out"
    parked.mkdir(parents=True)
    (parked / "old.txt").write_text("old\n")
    staging = tmp_path / f".out.mdc-new-{finished.pid}-xyz"
    staging.mkdir()
    (staging / "half.txt").write_text("half\n")
    emit._recover(tmp_path / "out")
    assert on_disk(tmp_path / "out") == {"old.txt": b"old\n"}
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
