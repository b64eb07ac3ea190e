"""Only regular files are read, never past the size cap, and ``python -m mdc`` imports
nothing from the current directory. Each run is a subprocess with a timeout and a memory
limit: a regression fails the test instead of hanging the suite or eating the machine."""

from __future__ import annotations

import os
import resource
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from tests.tools import REPO

from mdc.loaders import MAX_BYTES
from mdc.testing import subprocess_env

pytestmark = pytest.mark.usefixtures("no_ambient_plugins")

QUICKSTART = REPO / "examples" / "quickstart.toml"
#: Python's default limit on converting an integer to or from decimal text
MAX_INT_DIGITS = 4300
#: address space for one mdc run: plenty for a spec, far less than /dev/zero read to the end
MEMORY = 2 << 30


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))


def mdc(*argv: str, cwd: Path | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mdc", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
        env=subprocess_env(**env),
        preexec_fn=_limit_memory,
    )


def fifo(path: Path) -> None:
    os.mkfifo(path)


def dev_zero(path: Path) -> None:
    path.symlink_to("/dev/zero")


def dev_null(path: Path) -> None:
    path.symlink_to("/dev/null")


def folder(path: Path) -> None:
    path.mkdir()


def unix_socket(path: Path) -> None:
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))  # the file stays after the close; it cannot be opened
    server.close()


SPECIAL: dict[str, tuple[Callable[[Path], None], str]] = {
    "fifo": (fifo, "FIFO"),
    "dev-zero": (dev_zero, "character device"),
    "dev-null": (dev_null, "character device"),
    "folder": (folder, "folder"),
    "socket": (unix_socket, "socket"),
}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kind", "suffix"),
    [
        ("dev-null", ".toml"),
        ("dev-zero", ".json"),
        ("fifo", ".yaml"),
        ("folder", ".toml"),
        ("socket", ".json"),
    ],
)
def test_a_special_file_is_refused_not_read(tmp_path: Path, kind: str, suffix: str) -> None:
    # before: a FIFO blocked forever and /dev/zero was read until memory ran out
    make, what = SPECIAL[kind]
    spec = tmp_path / f"spec{suffix}"
    make(spec)
    for command in ("validate", "compile", "explain"):
        if command == "validate" and kind == "folder":
            continue  # validate reads a folder's specs
        out = ("-o", str(tmp_path / "out")) if command == "compile" else ()
        result = mdc(command, str(spec), *out)
        assert result.returncode == 1, result.stderr
        assert f"{spec}: error[MDC003]: not a regular file but " in result.stderr
        assert what in result.stderr
        assert not (tmp_path / "out").exists()


def test_special_files_in_a_folder_are_refused_beside_the_good_spec(tmp_path: Path) -> None:
    (tmp_path / "good.toml").write_bytes(QUICKSTART.read_bytes())
    fifo(tmp_path / "pipe.yaml")
    dev_zero(tmp_path / "zero.json")
    result = mdc("validate", str(tmp_path))
    assert result.returncode == 1, result.stderr
    assert f"{tmp_path / 'pipe.yaml'}: error[MDC003]" in result.stderr
    assert f"{tmp_path / 'zero.json'}: error[MDC003]" in result.stderr
    assert "1 spec ok, 2 invalid" in result.stdout + result.stderr


def test_a_huge_file_is_not_read_past_the_cap(tmp_path: Path) -> None:
    spec = tmp_path / "huge.json"
    with open(spec, "wb") as file:
        file.truncate(64 << 30)  # sparse: 64 GiB of zeros that take no disk
    result = mdc("validate", str(spec))
    assert result.returncode == 1, result.stderr
    assert f"specs are limited to {MAX_BYTES}" in result.stderr


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("n.toml", f'[job]\nname = "a"\nseed = {"1" * (MAX_INT_DIGITS + 1)}\n'),
        ("n.yaml", f"job:\n  name: a\n  seed: {'1' * (MAX_INT_DIGITS + 1)}\n"),
        ("n.json", f'{{"job": {{"name": "a", "seed": {"1" * (MAX_INT_DIGITS + 1)}}}}}'),
        ("f.toml", "[torchrun]\nmonitor_interval = -inf\n"),
        ("f.yaml", "torchrun:\n  monitor_interval: .NaN\n"),
        ("f.json", '{"torchrun": {"monitor_interval": 2e308}}'),
    ],
)
def test_numbers_no_spec_holds_exit_1_not_4(tmp_path: Path, name: str, text: str) -> None:
    spec = tmp_path / name
    spec.write_text(text)
    result = mdc("validate", str(spec))
    assert result.returncode == 1, result.stderr
    assert "error[MDC020]" in result.stderr
    assert "internal error" not in result.stderr


def test_integers_up_to_the_limit_whatever_the_environment_says(tmp_path: Path) -> None:
    # PYTHONINTMAXSTRDIGITS=640 would make printing this number a ValueError (exit 4)
    spec = tmp_path / "spec.toml"
    spec.write_text(
        QUICKSTART.read_text().replace("nnodes = 1", f"nnodes = {'9' * MAX_INT_DIGITS}")
    )
    result = mdc("validate", str(spec), PYTHONINTMAXSTRDIGITS="640")
    assert result.returncode == 1, result.stderr
    assert "error[MDC105]: must be <= " in result.stderr


@pytest.mark.slow
def test_python_m_mdc_imports_nothing_from_the_working_directory(tmp_path: Path) -> None:
    # before: `python -m mdc` put the working directory first on sys.path, so these ran
    marker = tmp_path / "imported"
    trap = f"open({str(marker)!r}, 'a').write(__name__ + '\\n')\n"
    (tmp_path / "pluggy.py").write_text(trap)  # imported by the mdc package itself
    (tmp_path / "yaml.py").write_text(trap)
    (tmp_path / "mdc_builtin").mkdir()  # the built-in plugins' package
    (tmp_path / "mdc_builtin" / "__init__.py").write_text(trap)
    (tmp_path / "evil_plugin.py").write_text(trap)
    info = tmp_path / "evil_plugin-1.0.dist-info"  # a plugin registered by metadata
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: evil-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[mdc]\nevil = evil_plugin\n")
    result = mdc("validate", str(QUICKSTART), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert not marker.exists(), marker.read_text()
    listed = mdc("plugins", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert "evil" not in listed.stdout
    joined = subprocess.run(  # the option's other spelling
        [sys.executable, "-mmdc", "validate", str(QUICKSTART)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env=subprocess_env(),
    )
    assert joined.returncode == 0, joined.stderr
    assert not marker.exists(), marker.read_text()


def test_another_program_run_with_m_keeps_its_working_directory(tmp_path: Path) -> None:
    # only mdc's own module run drops it: a tool that imports mdc still finds its neighbours
    (tmp_path / "tool").mkdir()  # a package: its __init__ runs while "-m" is being resolved
    (tmp_path / "tool" / "__init__.py").write_text("import mdc\n")
    (tmp_path / "tool" / "__main__.py").write_text("import neighbour\nprint(neighbour.NAME)\n")
    (tmp_path / "neighbour.py").write_text("NAME = 'found'\n")
    done = subprocess.run(
        [sys.executable, "-m", "tool"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env=subprocess_env(),
    )
    assert (done.returncode, done.stdout) == (0, "found\n"), done.stderr
