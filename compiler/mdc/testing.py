"""Golden-file testing for mdc plugins: the harness mdc's own test suite uses.

Opt in from your plugin's ``tests/conftest.py``::

    pytest_plugins = ["mdc.testing"]

    @pytest.fixture
    def golden_root() -> Path:          # where your goldens live (default: <rootdir>/golden)
        return Path(__file__).resolve().parent.parent / "golden"

and you get:

* the ``--update-golden`` option (refused when ``CI`` is set and under pytest-xdist);
* the ``golden`` fixture, a :class:`Golden`: ``golden.check_tree(expected_dir, actual_dir)``
  compares a compiled tree (file names, bytes, modes), ``golden.check_text(expected_file,
  text)`` a text such as diagnostics. A golden that does not exist is written and its test
  **fails** (look at it once before trusting it); a golden that differs fails with a diff and
  is left alone; under ``--update-golden`` it is rewritten and the test still fails, so every
  change is reviewed;
* the ``mdc_cli`` fixture, an :class:`MdcCli` that runs the real ``mdc`` command line in
  process with mdc's own plugins and only the third-party plugins you name, so other plugins
  installed on the machine cannot change your goldens: ``mdc_cli.compile(spec, out)``,
  ``mdc_cli.validate(spec)`` (stderr plus ``exit: N``, the diagnostics golden format).

Importing :mod:`mdc` never imports this module, so pytest is needed only by tests.

PYTEST_DONT_REWRITE: this module holds no assert statements; the marker lets a conftest
import names from it before ``pytest_plugins`` loads it, without pytest's warning.
"""

from __future__ import annotations

import contextlib
import difflib
import io
import os
import shutil
from collections.abc import Iterator, Sequence
from importlib.metadata import entry_points
from pathlib import Path

import attrs
import pytest

__all__ = [
    "PLUGIN_VARIABLES",
    "Golden",
    "MdcCli",
    "Run",
    "Tree",
    "in_ci",
    "normal_mode",
    "only_plugins",
    "read_tree",
    "run_mdc",
    "subprocess_env",
]

#: environment variables that let plugins installed on the machine change mdc's output
PLUGIN_VARIABLES = ("MDC_DISABLE_PLUGIN_AUTOLOAD", "MDC_BLOCK_PLUGINS", "MDC_TRACE_PLUGINS")

#: golden paths written during this session, for the terminal summary
_WRITTEN = pytest.StashKey[list[str]]()

Tree = dict[str, tuple[bytes, int]]


def in_ci() -> bool:
    """Whether ``CI`` is set to something other than empty, 0, false or no."""
    return os.environ.get("CI", "").lower() not in ("", "0", "false", "no")


def normal_mode(mode: int) -> int:
    """The mode git can record: 0755 if any execute bit is set, else 0644."""
    return 0o755 if mode & 0o111 else 0o644


def _shown(path: Path, base: Path | None = None) -> str:
    for root in (base, Path.cwd()):
        if root is None:
            continue
        try:
            return path.resolve().relative_to(root.resolve()).as_posix()
        except ValueError:
            continue
    return str(path)


def read_tree(root: Path, *, normalize: bool = False) -> Tree:
    """Every file under ``root`` by POSIX relative path: its bytes and permission bits."""
    tree: Tree = {}
    for path in sorted(root.rglob("*")):
        if path.is_symlink():
            raise AssertionError(f"{_shown(path)} is a symlink; mdc writes plain files only")
        if path.is_file():
            mode = path.stat().st_mode & 0o777
            tree[path.relative_to(root).as_posix()] = (
                path.read_bytes(),
                normal_mode(mode) if normalize else mode,
            )
    return tree


def _text_diff(expected: bytes, actual: bytes, name: str, limit: int = 60) -> str:
    try:
        old, new = expected.decode("utf-8"), actual.decode("utf-8")
    except UnicodeDecodeError:
        return f"  {name}: binary content differs"
    lines = list(
        difflib.unified_diff(
            old.splitlines(keepends=True),
            new.splitlines(keepends=True),
            f"golden/{name}",
            f"actual/{name}",
        )
    )
    if len(lines) > limit:
        lines = [*lines[:limit], f"... ({len(lines) - limit} more diff lines)\n"]
    return "".join(lines)


class Golden:
    """Compares output with the files under ``root`` and, when asked, rewrites them.

    ``update``: rewrite goldens that differ (the test still fails). ``written``: a list
    every write is appended to ("created PATH", "updated PATH"), for a session summary.
    ``base``: paths in messages are shown relative to it (default: the working directory).
    """

    def __init__(
        self,
        root: Path,
        *,
        update: bool,
        written: list[str] | None = None,
        base: Path | None = None,
    ) -> None:
        self.root = root
        self.update = update
        self.written = written if written is not None else []
        self.base = base

    def _record_and_fail(self, verb: str, path: Path) -> None:
        shown = _shown(path, self.base)
        self.written.append(f"{verb} {shown}")
        if verb == "created":
            pytest.fail(
                f"created golden {shown}: it did not exist; read it, then rerun", pytrace=False
            )
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
        pytest.fail(
            f"{_shown(expected, self.base)} differs from the output (rerun with "
            f"--update-golden to accept it):\n{_text_diff(old, data, expected.name)}",
            pytrace=False,
        )

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
        pytest.fail(
            f"{_shown(expected, self.base)}/ differs from the output (rerun with "
            "--update-golden to accept it):\n" + "\n".join(problems) + "\n" + "".join(diffs),
            pytrace=False,
        )

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


# ---------------------------------------------------------------- running mdc


def only_plugins(names: Sequence[str]) -> list[str]:
    """``-p no:NAME`` arguments that block every installed third-party plugin but ``names``.

    mdc's own plugins always load; a name in ``names`` that is not installed is an error,
    so a test never silently compiles without the plugin it is about.
    """
    from mdc.plugin_manager import DISTRIBUTION, GROUP

    installed = {ep.name: ep for ep in entry_points(group=GROUP)}
    missing = sorted(set(names) - set(installed))
    if missing:
        raise LookupError(
            f"no entry point {', '.join(missing)} in the group {GROUP!r}: install "
            "the plugin's distribution (e.g. pip install -e .) before testing it"
        )
    others = sorted(
        name
        for name, ep in installed.items()
        if name not in names and (ep.dist is None or ep.dist.name != DISTRIBUTION)
    )
    return [word for name in others for word in ("-p", f"no:{name}")]


@attrs.frozen
class Run:
    """What one ``mdc`` command did: exit code, stdout, stderr."""

    code: int
    stdout: str
    stderr: str


def subprocess_env(**overrides: str | None) -> dict[str, str]:
    """``os.environ`` without mdc's plugin variables, plus ``overrides`` (None removes)."""
    env = {k: v for k, v in os.environ.items() if k not in PLUGIN_VARIABLES}
    env.update({k: v for k, v in overrides.items() if v is not None})
    for key in [k for k, v in overrides.items() if v is None]:
        env.pop(key, None)
    return env


@contextlib.contextmanager
def _without_plugin_variables() -> Iterator[None]:
    saved = {name: os.environ.pop(name) for name in PLUGIN_VARIABLES if name in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


def run_mdc(argv: Sequence[str], *, plugins: Sequence[str] = ()) -> Run:
    """Run ``mdc ARGV`` in this process with mdc's own plugins and ``plugins`` (entry-point
    names) only; the MDC_* plugin variables are ignored for the call."""
    from mdc.cli import main

    if not argv:
        raise ValueError("run_mdc needs a subcommand")
    out, err = io.StringIO(), io.StringIO()
    with _without_plugin_variables():
        code = main([argv[0], *only_plugins(plugins), *argv[1:]], stdout=out, stderr=err)
    return Run(code=code, stdout=out.getvalue(), stderr=err.getvalue())


@attrs.frozen
class MdcCli:
    """The ``mdc`` command line with mdc's own plugins and ``plugins`` only."""

    plugins: tuple[str, ...] = ()

    def run(self, *argv: str) -> Run:
        return run_mdc(argv, plugins=self.plugins)

    def compile(self, spec: str | Path, out: Path) -> Run:
        """``mdc compile -q SPEC -o OUT``; fails the test unless it exits 0 and prints nothing."""
        done = self.run("compile", "-q", str(spec), "-o", str(out))
        if done.code != 0 or done.stdout:
            pytest.fail(
                f"mdc compile {spec} exited {done.code}:\n{done.stderr}{done.stdout}", pytrace=False
            )
        return done

    def validate(self, spec: str | Path) -> str:
        """``mdc validate SPEC`` as the diagnostics golden holds it: stderr, then ``exit: N``."""
        done = self.run("validate", "-q", str(spec))  # -q: no closing summary on stdout
        if done.stdout:
            pytest.fail(f"mdc validate printed to stdout:\n{done.stdout}", pytrace=False)
        return f"{done.stderr}exit: {done.code}\n"


# ---------------------------------------------------------------- the pytest plugin


def pytest_addoption(parser: pytest.Parser) -> None:
    # ValueError: registered already (a conftest of an older mdc): keep that one.
    with contextlib.suppress(ValueError):
        parser.addoption(
            "--update-golden",
            action="store_true",
            default=False,
            help="rewrite the goldens that differ from the current output; those tests still "
            "fail, so review `git diff golden/` (refused under CI and xdist)",
        )


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_WRITTEN] = []
    if not config.getoption("update_golden"):
        return
    if in_ci():
        raise pytest.UsageError(
            "--update-golden is refused when CI is set: update goldens on your machine, "
            "review `git diff golden/` and commit them"
        )
    worker = hasattr(config, "workerinput") or os.environ.get("PYTEST_XDIST_WORKER")
    if worker or config.getoption("numprocesses", default=None):
        raise pytest.UsageError(
            "--update-golden cannot run under pytest-xdist (workers would race on golden/); "
            "rerun without -n"
        )


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, config: pytest.Config
) -> None:
    written = config.stash.get(_WRITTEN, [])
    if written:
        terminalreporter.section("golden files written")
        for line in written:
            terminalreporter.write_line(line)
        terminalreporter.write_line(
            f"{len(written)} golden case(s) written; review `git diff golden/` before committing"
        )


@pytest.fixture
def golden_root(request: pytest.FixtureRequest) -> Path:
    """Where goldens live: ``<rootdir>/golden``. Override it in your conftest."""
    return Path(request.config.rootpath) / "golden"


@pytest.fixture
def golden(request: pytest.FixtureRequest, golden_root: Path) -> Golden:
    """Checks output against the goldens (and rewrites them under ``--update-golden``)."""
    config = request.config
    return Golden(
        golden_root,
        update=bool(config.getoption("update_golden")),
        written=config.stash[_WRITTEN],
        base=Path(config.rootpath),
    )


@pytest.fixture
def mdc_plugins() -> tuple[str, ...]:
    """The third-party plugins (entry-point names) ``mdc_cli`` loads. Override it in your
    conftest: ``return ("myplugin",)``."""
    return ()


@pytest.fixture
def mdc_cli(mdc_plugins: tuple[str, ...]) -> MdcCli:
    """The ``mdc`` command line, in process, with mdc's own plugins and ``mdc_plugins``."""
    return MdcCli(plugins=tuple(mdc_plugins))
