"""Faulty third-party plugins through the command line: exit 3, the plugin named, nothing written.

test_plugin_manager.py covers each fault at the API (``load_plugins``, ``Compiler``) with
inline plugins. Here every fault comes from a real installed-looking distribution
(``faultplug 2.5``, a ``*.dist-info`` with an ``mdc`` entry point on ``sys.path``) and goes
through ``mdc compile`` as a user would run it, autoload on:

* the exit status is 3 (``ExitCode.PLUGIN_ERROR``), stdout is empty, no traceback;
* stderr names the distribution, its version, the entry point and the hook that failed,
  and says how to run without the plugin (``-p no:NAME``);
* an ``out/`` from an earlier compile is byte-for-byte what it was (same files, bytes and
  modes), nothing is left beside it, and a compile into a fresh directory creates nothing.
"""

from __future__ import annotations

import io
import os
import stat
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from tests.tools import REPO

from mdc.cli import main
from mdc.errors import ExitCode

DISTRIBUTION, VERSION = "faultplug", "2.5"

PLUGIN_SOURCE = '''\
"""A plugin with one fault, chosen by FAULT (written by tests/plugins/test_plugin_faults.py)."""
import mdc
from mdc.api import Artifact, BackendSpec, Launch, LauncherSpec, Role

FAULT = {fault!r}

if FAULT == "import-error":
    raise ImportError("faultplug needs libfrob, which is not installed")
if FAULT == "import-crash":
    {{}}["missing"]


def _roles(plan):
    return tuple(Role(name=r.name, argv=("true",)) for r in plan.roles)


def _launch(plan, options):
    if FAULT == "emit-raises":
        raise RuntimeError("the template engine exploded")
    if FAULT == "emit-wrong-type":
        return ["torchrun", "--nnodes", "2"]
    if FAULT == "emit-none":
        return None
    files = {{
        "file-parent": (Artifact.text("../escaped.txt", "x"),),
        "file-absolute": (Artifact.text("/tmp/faultplug-absolute.txt", "x"),),
        "file-dotdot": (Artifact.text("launch/../../escaped.txt", "x"),),
        "file-twice": (Artifact.text("launch/hosts", "a"), Artifact.text("launch/hosts", "b")),
        "file-clash": (Artifact.text("launch/worker.sh", "echo mine"),),
        "file-wrong-type": ("launch/hosts",),
    }}.get(FAULT, ())
    roles = _roles(plan)
    if FAULT == "role-wrong-type":
        roles = tuple(("worker", "true") for _ in roles)
    if FAULT == "role-argv-wrong-type":
        roles = tuple(Role(name=r.name, argv=("echo", 42)) for r in roles)
    if FAULT == "role-env-wrong-type":
        roles = tuple(Role(name=r.name, argv=("true",), env={{"X": None}}) for r in roles)
    return Launch(roles=roles, files=files)


def _check(plan, options):
    if FAULT == "check-raises":
        raise ZeroDivisionError("division by zero in the check")
    if FAULT == "check-wrong-type":
        return ["this is not a Finding"]
    return []


def _backend(plan, launch, options):
    if FAULT == "backend-raises":
        raise OSError("scheduler template missing")
    if FAULT == "backend-wrong-type":
        return "run.sh"
    if FAULT == "backend-items-wrong-type":
        return [b"#!/bin/sh"]
    return {{
        "backend-parent": [Artifact.text("../run.sh", "x")],
        "backend-absolute": [Artifact.text("/tmp/faultplug-run.sh", "x")],
        "backend-twice": [Artifact.text("sched/run.sh", "a"), Artifact.text("sched/run.sh", "b")],
        "backend-clash": [Artifact.text("plan.json", "{{}}")],
        "backend-manifest": [Artifact.text("manifest.json", "{{}}")],
        "backend-launch": [Artifact.text("launch/worker.sh", "echo mine")],
    }}.get(FAULT, [Artifact.text("sched/run.sh", "true", executable=True)])


@mdc.hookimpl
def mdc_register_launchers():
    if FAULT == "register-raises":
        raise RuntimeError("no licence server")
    if FAULT == "register-wrong-type":
        return {{"name": "faulty"}}
    if FAULT == "register-backend-record":
        return [BackendSpec(name="faulty", description="d", emit=_backend)]
    return [LauncherSpec(name="faulty", description="a launcher with a fault",
                         parallelism="data", emit=_launch, check=_check)]


@mdc.hookimpl
def mdc_register_backends():
    if FAULT == "register-backends-raises":
        raise KeyError("cluster")
    return [BackendSpec(name="faultyback", description="a backend with a fault", emit=_backend)]
'''


@pytest.fixture(autouse=True)
def ambient(monkeypatch: pytest.MonkeyPatch) -> None:
    """Autoload on, nothing blocked: a user who pip-installed the faulty plugin."""
    for name in ("MDC_DISABLE_PLUGIN_AUTOLOAD", "MDC_BLOCK_PLUGINS", "MDC_TRACE_PLUGINS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(REPO)


Install = Callable[[str], str]


@pytest.fixture
def install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Install]:
    """``install(fault)`` puts faultplug on sys.path; returns its entry point text."""
    modules: list[str] = []

    def install_(fault: str) -> str:
        module = f"faultplug_{uuid.uuid4().hex[:12]}"
        site = tmp_path / "site"
        info = site / f"{DISTRIBUTION}-{VERSION}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {DISTRIBUTION}\nVersion: {VERSION}\n"
        )
        (info / "entry_points.txt").write_text(f"[mdc]\nfaulty = {module}\n")
        (site / f"{module}.py").write_text(PLUGIN_SOURCE.format(fault=fault))
        monkeypatch.syspath_prepend(str(site))
        modules.append(module)
        return f"faulty = {module}"

    yield install_
    for module in modules:
        sys.modules.pop(module, None)


def spec_for(tmp_path: Path, launcher: str = "faulty", backend: str = "local") -> Path:
    spec = tmp_path / "spec.toml"
    spec.write_text(
        f'[job]\nname = "demo"\ncommand = ["python", "train.py"]\n\n'
        f'[distributed]\nlauncher = "{launcher}"\nbackend = "{backend}"\n'
        'nnodes = 2\nnproc_per_node = 2\naccelerator = "cpu"\n'
    )
    return spec


def snapshot(root: Path) -> dict[str, tuple[bytes, int]]:
    """Every file and directory under (and beside) ``root``: bytes and mode."""
    found: dict[str, tuple[bytes, int]] = {}
    for path in sorted(root.parent.rglob("*")):
        mode = stat.S_IMODE(path.lstat().st_mode)
        data = path.read_bytes() if path.is_file() else b""
        found[path.relative_to(root.parent).as_posix()] = (data, mode)
    return found


def mdc_compile(spec: Path, out: Path, *extra: str) -> tuple[int, str, str]:
    stdout, stderr = io.StringIO(), io.StringIO()
    code = main(["compile", str(spec), "-o", str(out), *extra], stdout=stdout, stderr=stderr)
    return code, stdout.getvalue(), stderr.getvalue()


def assert_plugin_error(
    code: int, stdout: str, stderr: str, entry_point: str, hook: str, *reason: str
) -> None:
    assert code == ExitCode.PLUGIN_ERROR, f"exit {code}:\n{stderr}"
    assert stdout == ""
    first = stderr.splitlines()[0]
    assert first.startswith("mdc: error: plugin "), stderr
    for part in (repr(entry_point), f"from {DISTRIBUTION} {VERSION}", f"failed in {hook}", *reason):
        assert part in first, f"{part!r} missing from: {stderr}"
    assert "-p no:faulty" in stderr
    assert "Traceback" not in stderr and "internal error" not in stderr


@pytest.fixture
def previous_out(tmp_path: Path) -> Path:
    """An out/ from an earlier, good compile (before the faulty plugin was installed)."""
    out = tmp_path / "work" / "out"
    code, _, stderr = mdc_compile(REPO / "examples" / "basic-1x2.toml", out, "--no-plugin-autoload")
    assert code == 0, stderr
    return out


def check_untouched(out: Path, before: dict[str, tuple[bytes, int]]) -> None:
    assert snapshot(out) == before, "the earlier out/ changed, or something was left beside it"


# ---------------------------------------------------------------- loading


LOAD_FAULTS = [
    ("import-error", "import", ["ImportError", "libfrob"]),
    ("import-crash", "import", ["KeyError", "missing"]),
    ("register-raises", "mdc_register_launchers", ["RuntimeError: no licence server"]),
    ("register-backends-raises", "mdc_register_backends", ["KeyError", "cluster"]),
    (
        "register-wrong-type",
        "mdc_register_launchers",
        ["returned dict", "expected a list of LauncherSpec"],
    ),
    ("register-backend-record", "mdc_register_launchers", ["expected a list of LauncherSpec"]),
]


@pytest.mark.parametrize(
    ("fault", "hook", "reason"), LOAD_FAULTS, ids=[f for f, _, _ in LOAD_FAULTS]
)
def test_a_plugin_that_fails_to_load(
    fault: str, hook: str, reason: list[str], tmp_path: Path, install: Install, previous_out: Path
) -> None:
    """Any command fails before reading the spec, even one that does not use the plugin."""
    before = snapshot(previous_out)
    entry_point = install(fault)
    for spec in (spec_for(tmp_path), REPO / "examples" / "basic-1x2.toml"):
        code, stdout, stderr = mdc_compile(spec, previous_out)
        assert_plugin_error(code, stdout, stderr, entry_point, hook, *reason)
        check_untouched(previous_out, before)
    fresh = tmp_path / "fresh" / "out"
    fresh.parent.mkdir()
    code, stdout, stderr = mdc_compile(spec_for(tmp_path), fresh)
    assert_plugin_error(code, stdout, stderr, entry_point, hook, *reason)
    assert list(fresh.parent.iterdir()) == []
    # the hint works: blocking the plugin runs the compile
    code, _, stderr = mdc_compile(
        REPO / "examples" / "basic-1x2.toml", previous_out, "-p", "no:faulty"
    )
    assert code == 0, stderr


# ---------------------------------------------------------------- compiling

LAUNCHER_FAULTS = [
    ("emit-raises", "launcher 'faulty' emit", ["RuntimeError: the template engine exploded"]),
    ("emit-wrong-type", "emit", ["returned list", "expected mdc.api.Launch"]),
    ("emit-none", "emit", ["returned NoneType"]),
    ("check-raises", "launcher 'faulty' check", ["ZeroDivisionError"]),
    ("check-wrong-type", "launcher 'faulty' check", ["mdc.api.Finding"]),
    ("file-parent", "emit", ["launch/"]),
    ("file-absolute", "emit", ["launch/"]),
    ("file-dotdot", "launcher 'faulty' emit", ["'launch/../../escaped.txt'"]),
    ("file-twice", "launcher 'faulty' emit", ["'launch/hosts' is produced twice"]),
    ("file-clash", "launcher 'faulty' emit", ["'launch/worker.sh' is produced twice"]),
    ("file-wrong-type", "emit", ["mdc.api.Artifact"]),
    ("role-wrong-type", "emit", ["mdc.api.Role"]),
    ("role-argv-wrong-type", "launcher 'faulty' emit", []),
    ("role-env-wrong-type", "launcher 'faulty' emit", []),
]
BACKEND_FAULTS = [
    ("backend-raises", "backend 'faultyback' emit", ["OSError: scheduler template missing"]),
    ("backend-wrong-type", "backend 'faultyback' emit", []),
    ("backend-items-wrong-type", "backend 'faultyback' emit", []),
    ("backend-parent", "backend 'faultyback' emit", ["'../run.sh'"]),
    ("backend-absolute", "backend 'faultyback' emit", ["'/tmp/faultplug-run.sh'"]),
    ("backend-twice", "backend 'faultyback' emit", ["sched/run.sh"]),
    ("backend-clash", "backend 'faultyback' emit", ["plan.json"]),
    ("backend-manifest", "backend 'faultyback' emit", ["manifest.json"]),
    ("backend-launch", "backend 'faultyback' emit", ["launch/worker.sh"]),
]
COMPILE_FAULTS = [
    *[(f, "faulty", "local", h, r) for f, h, r in LAUNCHER_FAULTS],
    *[(f, "torchrun", "faultyback", h, r) for f, h, r in BACKEND_FAULTS],
]


@pytest.mark.parametrize(
    ("fault", "launcher", "backend", "hook", "reason"),
    COMPILE_FAULTS,
    ids=[case[0] for case in COMPILE_FAULTS],
)
def test_a_plugin_that_fails_while_compiling(
    fault: str,
    launcher: str,
    backend: str,
    hook: str,
    reason: list[str],
    tmp_path: Path,
    install: Install,
    previous_out: Path,
) -> None:
    before = snapshot(previous_out)
    entry_point = install(fault)
    spec = spec_for(tmp_path, launcher, backend)
    code, stdout, stderr = mdc_compile(spec, previous_out)
    assert_plugin_error(code, stdout, stderr, entry_point, hook, *reason)
    check_untouched(previous_out, before)
    assert not Path("/tmp/faultplug-absolute.txt").exists()
    assert not Path("/tmp/faultplug-run.sh").exists()
    assert not (previous_out.parent / "escaped.txt").exists()
    fresh = tmp_path / "fresh" / "out"
    fresh.parent.mkdir()
    code, stdout, stderr = mdc_compile(spec, fresh)
    assert_plugin_error(code, stdout, stderr, entry_point, hook, *reason)
    assert list(fresh.parent.iterdir()) == []
    # validate and explain report it the same way
    for command in (["validate", str(spec)], ["explain", str(spec)]):
        out, err = io.StringIO(), io.StringIO()
        assert main(command, stdout=out, stderr=err) == ExitCode.PLUGIN_ERROR, err.getvalue()
        assert entry_point in err.getvalue() and out.getvalue() == ""


def test_the_faultless_plugin_compiles(tmp_path: Path, install: Install) -> None:
    """The control: the same distribution without a fault compiles both of its records."""
    install("none")
    for launcher, backend in (("faulty", "local"), ("torchrun", "faultyback")):
        out = tmp_path / f"{launcher}-{backend}"
        code, _, stderr = mdc_compile(spec_for(tmp_path, launcher, backend), out)
        assert code == 0, stderr
        assert os.access(
            out / ("sched/run.sh" if backend == "faultyback" else "launch/worker.sh"), os.R_OK
        )
