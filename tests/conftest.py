"""Shared test setup: the golden harness (from :mod:`mdc.testing`) and fixtures.

Golden files live in ``golden/`` at the repository root (conventions 13 and 16
of the style anchors). The harness is :mod:`mdc.testing`, the same pytest plugin
third-party plugin authors enable, so mdc's goldens and theirs behave alike:

* a golden that does not match fails with a diff and is left alone;
* a golden that does not exist yet is written, and its test **fails**, so a
  new case is always looked at once before it is trusted;
* ``pytest --update-golden`` rewrites every golden that differs (stale files
  deleted) and those tests **still fail** with "updated golden ...; review
  `git diff golden/`". Goldens that already match are not touched and pass;
* the flag is refused when ``CI`` is set and under pytest-xdist, where workers
  would race on the same files.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from tests.tools import CRD_PLACES, REPO

from mdc.pipeline import Compiler
from mdc.plugin_manager import load_plugins
from mdc.testing import (  # re-exported for the tests that import them from here
    PLUGIN_VARIABLES,
    Golden,
    Tree,
    in_ci,
    normal_mode,
    read_tree,
    subprocess_env,
)

#: the golden harness and its --update-golden option, as plugin authors get them
pytest_plugins = ["mdc.testing"]

GOLDEN_ROOT = REPO / "golden"

__all__ = [
    "GOLDEN_ROOT",
    "PLUGIN_VARIABLES",
    "REPO",
    "Golden",
    "Tree",
    "in_ci",
    "normal_mode",
    "read_tree",
    "subprocess_env",
]


@pytest.fixture(scope="session")
def declared_builtins() -> dict[str, list[str]]:
    """mdc's own entry points as pyproject.toml declares them: kind -> sorted names.

    The kind comes from the module path (``mdc_builtin.launchers.*`` or ``.backends.*``),
    so tests that list the built-ins follow the packaging rather than a copy of it.
    """
    import tomllib

    declared = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    kinds: dict[str, list[str]] = {"launchers": [], "backends": []}
    for name, target in declared["project"]["entry-points"]["mdc"].items():
        kinds[target.split(".")[1]].append(name)
    return {kind: sorted(names) for kind, names in kinds.items()}


@pytest.fixture(scope="session")
def shared_crds() -> Path:
    """The folder of CRD schemas and upstream samples; the test skips, saying why, without it."""
    found = next((p for p in CRD_PLACES if p.is_dir()), None)
    if found is None:
        pytest.skip(f"the CRDs are not here: none of {', '.join(map(str, CRD_PLACES))} exists")
    return found


#: the xdist_group of the tests that start real multi-process runs on loopback ports
LOOPBACK = "loopback"


@pytest.hookimpl(tryfirst=True)  # before -m deselects
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test in the xdist_group "loopback" also carries the marker ``loopback``: scripts/test
    runs ``-m "not loopback"`` with a worker per core, then ``-m loopback`` in one process.
    A test marked ``torch`` skips where torch is not installed."""
    # the quick tier (scripts/test --quick) installs neither torch nor the frameworks: a test
    # marked torch then skips, saying so (under CI a skip fails the run: everything is there)
    no_torch = importlib.util.find_spec("torch") is None
    for item in items:
        groups = {m.kwargs.get("name", *m.args[:1]) for m in item.iter_markers("xdist_group")}
        if LOOPBACK in groups:
            item.add_marker(LOOPBACK)
        if no_torch and item.get_closest_marker("torch") is not None:
            item.add_marker(
                pytest.mark.skip(reason="needs torch and the frameworks (scripts/test)")
            )


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Under CI every tier runs: scripts/test installs what each needs, so a skip is a failure."""
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter is not None else []
    if reporter is None or not in_ci() or exitstatus != pytest.ExitCode.OK or not skipped:
        return
    reporter.ensure_newline()
    reporter.section("skipped under CI (a failure: every tier must run)")
    for report in skipped:
        reason = report.longrepr[-1] if isinstance(report.longrepr, tuple) else report.longrepr
        reporter.write_line(f"{report.nodeid}: {reason}")
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(scope="module")
def compiler() -> Compiler:
    """mdc's own plugins only (none installed elsewhere), one compiler per test module. A
    module that needs other plugins (a test plugin, some blocked) defines its own."""
    return Compiler(load_plugins(autoload=False))


@pytest.fixture
def golden_root() -> Path:
    """mdc's goldens: ``golden/`` at the repository root (for mdc.testing's ``golden``)."""
    return GOLDEN_ROOT


@pytest.fixture
def repo_root() -> Path:
    return REPO


@pytest.fixture
def no_ambient_plugins(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Only mdc's own plugins: third-party ones installed here must not change any output."""
    for name in PLUGIN_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MDC_DISABLE_PLUGIN_AUTOLOAD", "1")
    yield


@pytest.fixture
def clean_env() -> Callable[..., dict[str, str]]:
    """A factory for subprocess environments: ``clean_env(PYTHONHASHSEED="0")``."""
    return subprocess_env


def node_hosts_of(node_sh: str) -> list[str]:
    """What a Kubernetes pod's ``k8s/node.sh`` exports as NODE_HOSTS: its own lines run by
    bash (the block that builds it, without the rest of the pod's start)."""
    import subprocess

    start = node_sh.index('if [[ -z "${NODE_HOSTS:-}" ]]; then')
    block = node_sh[start : node_sh.index("\nfi\n", start) + 4]
    result = subprocess.run(
        ["bash", "-c", block + 'printf "%s" "$NODE_HOSTS"'],
        capture_output=True,
        text=True,
        check=True,
        env={},
        timeout=30,
    )
    return result.stdout.split(" ")


@pytest.fixture
def pod_node_hosts() -> Callable[[str], list[str]]:
    return node_hosts_of


@pytest.fixture(autouse=True)
def no_colour_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Outputs compared byte for byte: a FORCE_COLOR in the caller's shell must not colour them."""
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    monkeypatch.delenv("NO_COLOR", raising=False)
