"""Shared test setup: the ``--update-golden`` option and the fixtures around it.

Golden files live in ``golden/`` at the repository root (conventions 13 and 16
of the style anchors):

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

import difflib
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
GOLDEN_ROOT = REPO / "golden"

#: golden paths written during this session, for the terminal summary
_WRITTEN = pytest.StashKey[list[str]]()

#: environment variables that let plugins installed on the machine change mdc's output
PLUGIN_VARIABLES = ("MDC_DISABLE_PLUGIN_AUTOLOAD", "MDC_BLOCK_PLUGINS", "MDC_TRACE_PLUGINS")


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


#: where the CRDs may be, outside the project (never copied into it): $MDC_CRDS, then
#: ../shared/crds beside the checkout, then the workspace's (for clones made elsewhere)
CRD_PLACES = [Path(p) for p in (os.environ.get("MDC_CRDS"),) if p] + [
    REPO.parent / "shared" / "crds", Path("/work/shared/crds")]


@pytest.fixture(scope="session")
def shared_crds() -> Path:
    """The folder of CRD schemas and upstream samples; the test skips, saying why, without it."""
    found = next((p for p in CRD_PLACES if p.is_dir()), None)
    if found is None:
        pytest.skip(f"the CRDs are not here: none of {', '.join(map(str, CRD_PLACES))} exists")
    return found


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() not in ("", "0", "false", "no")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-golden", action="store_true", default=False,
        help="rewrite the goldens under golden/ that differ from the current output; "
             "those tests still fail, so review `git diff golden/` (refused under CI and xdist)")


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_WRITTEN] = []
    if not config.getoption("update_golden"):
        return
    if in_ci():
        raise pytest.UsageError(
            "--update-golden is refused when CI is set: update goldens on your machine, "
            "review `git diff golden/` and commit them")
    worker = hasattr(config, "workerinput") or os.environ.get("PYTEST_XDIST_WORKER")
    if worker or config.getoption("numprocesses", default=None):
        raise pytest.UsageError(
            "--update-golden cannot run under pytest-xdist (workers would race on golden/); "
            "rerun without -n")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter,
                            config: pytest.Config) -> None:
    written = config.stash.get(_WRITTEN, [])
    if written:
        terminalreporter.section("golden files written")
        for line in written:
            terminalreporter.write_line(line)
        terminalreporter.write_line(
            f"{len(written)} golden case(s) written; review `git diff golden/` before committing")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Under CI every tier runs: scripts/test installs what each needs, so a skip is a failure."""
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter is not None else []
    if not in_ci() or exitstatus != pytest.ExitCode.OK or not skipped:
        return
    reporter.ensure_newline()
    reporter.section("skipped under CI (a failure: every tier must run)")
    for report in skipped:
        reason = report.longrepr[-1] if isinstance(report.longrepr, tuple) else report.longrepr
        reporter.write_line(f"{report.nodeid}: {reason}")
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _shown(path: Path) -> str:
    try:
        return path.relative_to(REPO).as_posix()
    except ValueError:
        return str(path)


def normal_mode(mode: int) -> int:
    """The mode git can record: 0755 if any execute bit is set, else 0644."""
    return 0o755 if mode & 0o111 else 0o644


Tree = dict[str, tuple[bytes, int]]


def read_tree(root: Path, *, normalize: bool = False) -> Tree:
    """Every file under ``root`` by POSIX relative path: its bytes and permission bits."""
    tree: Tree = {}
    for path in sorted(root.rglob("*")):
        if path.is_symlink():
            raise AssertionError(f"{_shown(path)} is a symlink; mdc writes plain files only")
        if path.is_file():
            mode = path.stat().st_mode & 0o777
            tree[path.relative_to(root).as_posix()] = (
                path.read_bytes(), normal_mode(mode) if normalize else mode)
    return tree


def _text_diff(expected: bytes, actual: bytes, name: str, limit: int = 60) -> str:
    try:
        old, new = expected.decode("utf-8"), actual.decode("utf-8")
    except UnicodeDecodeError:
        return f"  {name}: binary content differs"
    lines = list(difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                      f"golden/{name}", f"actual/{name}"))
    if len(lines) > limit:
        lines = [*lines[:limit], f"... ({len(lines) - limit} more diff lines)\n"]
    return "".join(lines)


class Golden:
    """Compares output with the files under ``root`` and, when asked, rewrites them."""

    def __init__(self, root: Path, *, update: bool, written: list[str] | None = None) -> None:
        self.root = root
        self.update = update
        self.written = written if written is not None else []

    def _record_and_fail(self, verb: str, path: Path) -> None:
        shown = _shown(path)
        self.written.append(f"{verb} {shown}")
        if verb == "created":
            pytest.fail(f"created golden {shown}: it did not exist; read it, then rerun",
                        pytrace=False)
        pytest.fail(f"updated golden {shown}; review `git diff golden/`", pytrace=False)

    def check_text(self, expected: Path, actual: str) -> None:
        """``expected`` must hold exactly ``actual`` (UTF-8, LF line ends)."""
        data = actual.encode("utf-8")
        if not expected.exists():
            expected.parent.mkdir(parents=True, exist_ok=True)
            expected.write_bytes(data)
            self._record_and_fail("created", expected)
        old = expected.read_bytes()
        if old == data:
            return
        if self.update:
            expected.write_bytes(data)
            self._record_and_fail("updated", expected)
        pytest.fail(f"{_shown(expected)} differs from the output (rerun with --update-golden "
                    f"to accept it):\n{_text_diff(old, data, expected.name)}", pytrace=False)

    def check_tree(self, expected: Path, actual: Path) -> None:
        """``expected`` must hold exactly the files of ``actual``: names, bytes and modes."""
        found = read_tree(actual)
        bad_modes = sorted(p for p, (_, mode) in found.items() if mode not in (0o644, 0o755))
        if not expected.is_dir():
            self._write_tree(expected, found)
            self._record_and_fail("created", expected)
        want = read_tree(expected, normalize=True)
        problems = [f"  missing from the output: {p}" for p in sorted(want.keys() - found.keys())]
        problems += [f"  not in the golden: {p}" for p in sorted(found.keys() - want.keys())]
        problems += [f"  mode {found[p][1]:04o}, expected 0644 or 0755: {p}" for p in bad_modes]
        diffs = []
        for path in sorted(want.keys() & found.keys()):
            (old, old_mode), (new, new_mode) = want[path], found[path]
            if old_mode != new_mode and path not in bad_modes:
                problems.append(f"  mode {new_mode:04o}, golden has {old_mode:04o}: {path}")
            if old != new:
                problems.append(f"  content differs: {path}")
                diffs.append(_text_diff(old, new, path))
        if not problems:
            return
        if self.update and not bad_modes:
            self._write_tree(expected, found)
            self._record_and_fail("updated", expected)
        pytest.fail(f"{_shown(expected)}/ differs from the output (rerun with --update-golden "
                    "to accept it):\n" + "\n".join(problems) + "\n" + "".join(diffs),
                    pytrace=False)

    @staticmethod
    def _write_tree(expected: Path, found: Tree) -> None:
        if expected.exists():
            shutil.rmtree(expected)  # stale files go too
        expected.mkdir(parents=True)
        for path, (data, mode) in found.items():
            target = expected / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            target.chmod(normal_mode(mode))


@pytest.fixture
def golden(request: pytest.FixtureRequest) -> Golden:
    """Checks output against ``golden/`` (and rewrites it under ``--update-golden``)."""
    config = request.config
    return Golden(GOLDEN_ROOT, update=bool(config.getoption("update_golden")),
                  written=config.stash[_WRITTEN])


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


def subprocess_env(**overrides: str | None) -> dict[str, str]:
    """``os.environ`` without mdc's plugin variables, plus ``overrides`` (None removes)."""
    env = {k: v for k, v in os.environ.items() if k not in PLUGIN_VARIABLES}
    env.update({k: v for k, v in overrides.items() if v is not None})
    for key in [k for k, v in overrides.items() if v is None]:
        env.pop(key, None)
    return env


@pytest.fixture
def clean_env() -> Callable[..., dict[str, str]]:
    """A factory for subprocess environments: ``clean_env(PYTHONHASHSEED="0")``."""
    return subprocess_env
