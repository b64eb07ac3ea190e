"""The pre-commit hooks in ``.pre-commit-hooks.yaml``, run the way users run them.

The hook repository is a git snapshot of this checkout's package files (what pre-commit's
``language: python`` pip-installs), so the hooks on disk are tested, committed or not. The
user's repository is a fresh git repository with good and bad specs. Real ``pre-commit``
(installed next to this interpreter by the test extra) builds the hook's virtualenv and
installs mdc into it from the snapshot, its dependencies from the package index.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.tools import REPO

from mdc.cli import main

PRE_COMMIT = Path(sys.executable).parent / "pre-commit"
#: what pip needs to build and install mdc, and the hook manifest
PACKAGE_FILES = (
    "pyproject.toml",
    "README.md",
    ".pre-commit-hooks.yaml",
    "compiler",
    "plugins",
    "schemas",
)
GIT_IDENTITY = {
    "GIT_AUTHOR_NAME": "mdc tests",
    "GIT_AUTHOR_EMAIL": "tests@example.invalid",
    "GIT_COMMITTER_NAME": "mdc tests",
    "GIT_COMMITTER_EMAIL": "tests@example.invalid",
}

GOOD = REPO / "examples" / "quickstart.toml"
BAD_BATCH = REPO / "golden" / "diagnostics" / "global-batch-not-divisible" / "spec.yaml"
BAD_SYNTAX = REPO / "golden" / "diagnostics" / "toml-syntax-error" / "spec.toml"
BAD_MISSING = REPO / "golden" / "diagnostics" / "missing-required-key" / "spec.yaml"

# xdist_group: one worker builds the module's hook environment once, under pytest-xdist
pytestmark = [
    pytest.mark.slow,
    pytest.mark.usefixtures("no_ambient_plugins"),
    pytest.mark.xdist_group("pre-commit"),
]


def git(cwd: Path, *args: str) -> str:
    env = {**os.environ, **GIT_IDENTITY}
    return subprocess.run(
        ["git", "-c", "commit.gpgsign=false", *args],
        cwd=cwd,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


@pytest.fixture(scope="module")
def pre_commit_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One store for the module: the hook environment is built once for the config runs."""
    return tmp_path_factory.mktemp("pre-commit-home")


def pre_commit(cwd: Path, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    assert PRE_COMMIT.is_file(), f"{PRE_COMMIT} is missing: install the test extra"
    env = {**os.environ, "PRE_COMMIT_HOME": str(home)}
    env.pop("MDC_DISABLE_PLUGIN_AUTOLOAD", None)  # the hook runs as on a user's machine
    return subprocess.run(
        [str(PRE_COMMIT), *args, "--color=never"],
        check=False,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=900,
    )


@pytest.fixture(scope="module")
def hook_repo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A git repository holding this checkout's package files; its path and commit."""
    root = tmp_path_factory.mktemp("hook-repo")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in PACKAGE_FILES:
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, root / name, ignore=ignore)
        else:
            shutil.copy2(source, root / name)
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "snapshot")
    return root, git(root, "rev-parse", "HEAD")


@pytest.fixture
def user_repo(tmp_path: Path) -> Iterator[Path]:
    """A user's repository: specs under jobs/, and YAML/JSON/TOML files that are not specs."""
    root = tmp_path / "user"
    (root / "jobs" / "nested").mkdir(parents=True)
    shutil.copy(GOOD, root / "jobs" / "good.toml")
    shutil.copy(BAD_BATCH, root / "jobs" / "bad.yaml")
    shutil.copy(BAD_SYNTAX, root / "jobs" / "broken.toml")
    shutil.copy(BAD_MISSING, root / "jobs" / "nested" / "incomplete.yaml")
    # a plugin's project inside the spec folder: its metadata and schema are not specs
    (root / "jobs" / "plugin").mkdir()
    (root / "jobs" / "plugin" / "pyproject.toml").write_text('[project]\nname = "p"\n')
    (root / "jobs" / "plugin" / "p.v1.schema.json").write_text('{"type": "object"}\n')
    (root / ".github" / "workflows").mkdir(parents=True)
    (root / ".github" / "workflows" / "ci.yml").write_text("on: push\njobs: {}\n")
    (root / "package.json").write_text('{"name": "not-a-spec"}\n')
    (root / "other").mkdir()
    shutil.copy(BAD_BATCH, root / "other" / "elsewhere.yaml")  # outside the default folders
    git(root, "init", "-q")
    yield root


def mdc_validate(cwd: Path, *files: str) -> tuple[int, list[str]]:
    """What `mdc validate` prints for ``files`` when run directly (in this process)."""
    err = io.StringIO()
    old = Path.cwd()
    os.chdir(cwd)
    try:
        code = main(["validate", *files], stdout=io.StringIO(), stderr=err)
    finally:
        os.chdir(old)
    return code, err.getvalue().splitlines()


def write_config(root: Path, hook_repo: tuple[Path, str], hooks: str) -> None:
    path, rev = hook_repo
    (root / ".pre-commit-config.yaml").write_text(
        f"repos:\n- repo: {path}\n  rev: {rev}\n  hooks:\n{hooks}"
    )


# ---------------------------------------------------------------- mdc-validate via try-repo


def test_manifest_is_valid() -> None:
    done = subprocess.run(
        [str(PRE_COMMIT), "validate-manifest", ".pre-commit-hooks.yaml"],
        check=False,
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_try_repo_fails_on_bad_specs_with_diagnostics(
    hook_repo: tuple[Path, str], user_repo: Path, tmp_path: Path
) -> None:
    files = ["jobs/good.toml", "jobs/bad.yaml", "jobs/broken.toml"]
    code, expected = mdc_validate(user_repo, *files)
    assert code == 1
    done = pre_commit(
        user_repo,
        tmp_path / "home",
        "try-repo",
        str(hook_repo[0]),
        "mdc-validate",
        "--files",
        *files,
    )
    assert done.returncode == 1, done.stdout
    assert "mdc validate" in done.stdout and "Failed" in done.stdout
    # the direct run's diagnostics, file:line:col and code, appear as they are
    assert any(line.startswith("jobs/bad.yaml:12:22: error[MDC207]") for line in expected)
    assert any(line.startswith("jobs/broken.toml:6:1: error[MDC001]") for line in expected)
    for line in expected:
        assert line in done.stdout.splitlines(), (line, done.stdout)
    assert "jobs/good.toml:" not in done.stdout


def test_try_repo_passes_good_specs(
    hook_repo: tuple[Path, str], user_repo: Path, tmp_path: Path
) -> None:
    done = pre_commit(
        user_repo,
        tmp_path / "home",
        "try-repo",
        str(hook_repo[0]),
        "mdc-validate",
        "--files",
        "jobs/good.toml",
    )
    assert done.returncode == 0, done.stdout
    assert "Passed" in done.stdout


# ---------------------------------------------------------------- configured hooks


def test_default_files_pick_specs_only(
    hook_repo: tuple[Path, str], user_repo: Path, pre_commit_home: Path
) -> None:
    """--all-files: only jobs/ specs reach mdc; other YAML/JSON and compiled trees do not."""
    out = user_repo / "jobs" / "out" / "quickstart"
    assert (
        main(["compile", str(GOOD), "-o", str(out)], stdout=io.StringIO(), stderr=io.StringIO())
        == 0
    )
    assert (out / "plan.json").is_file() and (out / "manifest.json").is_file()
    write_config(user_repo, hook_repo, "  - id: mdc-validate\n")
    git(user_repo, "add", "-A")
    done = pre_commit(user_repo, pre_commit_home, "run", "mdc-validate", "--all-files")
    assert done.returncode == 1, done.stdout
    _, expected = mdc_validate(
        user_repo,
        "jobs/bad.yaml",
        "jobs/broken.toml",
        "jobs/nested/incomplete.yaml",
        "jobs/good.toml",
    )
    assert any(
        line.startswith("jobs/nested/incomplete.yaml:3:3: error[MDC103]") for line in expected
    )
    for line in expected:
        assert line in done.stdout.splitlines(), (line, done.stdout)
    for never in (
        "ci.yml",
        "package.json",
        "other/elsewhere.yaml",
        "plan.json",
        "manifest.json",
        ".pre-commit-config.yaml",
        "pyproject.toml",
        "schema.json",
        "jobs/good.toml:",
    ):
        assert never not in done.stdout, (never, done.stdout)


def test_narrowed_files(
    hook_repo: tuple[Path, str], user_repo: Path, pre_commit_home: Path
) -> None:
    """`files:` in the user's config replaces the default folder pattern."""
    write_config(user_repo, hook_repo, "  - id: mdc-validate\n    files: ^other/\n")
    git(user_repo, "add", "-A")
    done = pre_commit(user_repo, pre_commit_home, "run", "mdc-validate", "--all-files")
    assert done.returncode == 1, done.stdout
    assert "other/elsewhere.yaml:12:22: error[MDC207]" in done.stdout
    assert "jobs/" not in done.stdout


def test_hook_environment_has_no_torch(
    hook_repo: tuple[Path, str], user_repo: Path, pre_commit_home: Path
) -> None:
    write_config(user_repo, hook_repo, "  - id: mdc-validate\n")
    done = pre_commit(user_repo, pre_commit_home, "install-hooks")
    assert done.returncode == 0, done.stdout
    site = sorted(pre_commit_home.glob("repo*/py_env-*/lib/python*/site-packages"))
    assert site, sorted(p.name for p in pre_commit_home.iterdir())
    installed = {p.name.lower() for s in site for p in s.iterdir()}
    assert "mdc" in installed and "mdc_builtin" in installed, sorted(installed)
    assert not {"torch", "megatron", "deepspeed", "torchtitan"} & installed, sorted(installed)


# ---------------------------------------------------------------- mdc-compile-check


def test_compile_check_fresh_then_stale(
    hook_repo: tuple[Path, str], user_repo: Path, pre_commit_home: Path
) -> None:
    spec, out = "jobs/good.toml", "jobs/out/quickstart"
    assert (
        main(
            ["compile", str(user_repo / spec), "-o", str(user_repo / out)],
            stdout=io.StringIO(),
            stderr=io.StringIO(),
        )
        == 0
    )
    write_config(
        user_repo, hook_repo, f"  - id: mdc-compile-check\n    args: [{spec}, -o, {out}]\n"
    )
    git(user_repo, "add", "-A")
    fresh = pre_commit(user_repo, pre_commit_home, "run", "mdc-compile-check", "--all-files")
    assert fresh.returncode == 0, fresh.stdout
    assert "mdc compile --check" in fresh.stdout and "Passed" in fresh.stdout

    # the spec changes, the committed tree does not: the hook names what drifted
    text = (user_repo / spec).read_text()
    assert "nnodes = 1" in text
    (user_repo / spec).write_text(text.replace("nnodes = 1", "nnodes = 2", 1))
    (user_repo / out / "stray.txt").write_text("not written by mdc\n")
    git(user_repo, "add", "-A")
    stale = pre_commit(user_repo, pre_commit_home, "run", "mdc-compile-check", "--all-files")
    assert stale.returncode == 1, stale.stdout
    assert "Failed" in stale.stdout
    for line in (
        f"{out}: changed: plan.json",
        f"{out}: changed: manifest.json",
    ):
        assert line in stale.stdout.splitlines(), (line, stale.stdout)
    # a file mdc did not write is no drift: the compile the hook asks for would keep it
    assert "stray.txt" not in stale.stdout


# ---------------------------------------------------------------- the documented snippet

SNIPPET_PAGE = REPO / "docs" / "pre-commit.md"


def documented_config() -> str:
    """The ``.pre-commit-config.yaml`` block of docs/pre-commit.md, as a user pastes it."""
    text = SNIPPET_PAGE.read_text(encoding="utf-8")
    block = re.search(r"```yaml\n(# \.pre-commit-config\.yaml\n.*?)```", text, re.DOTALL)
    assert block is not None, "docs/pre-commit.md has no .pre-commit-config.yaml block"
    return block.group(1)


def test_documented_rev_is_the_release_tag() -> None:
    from mdc import __version__ as version

    revs = re.findall(r"^\s+rev: (\S+)", documented_config(), re.MULTILINE)
    assert revs == [f"v{version}"], "the snippet's rev: must be the release tag v<version>"


def test_documented_config_runs_as_pasted(
    hook_repo: tuple[Path, str], user_repo: Path, pre_commit_home: Path
) -> None:
    """The snippet with only repo: and rev: pointed at a snapshot: both hooks pass."""
    path, rev = hook_repo
    config = re.sub(r"(?m)^(\s+- repo: )\S+", rf"\g<1>{path}", documented_config())
    config = re.sub(r"(?m)^(\s+rev: )\S+", rf"\g<1>{rev}", config)
    (user_repo / ".pre-commit-config.yaml").write_text(config)
    for bad in ("bad.yaml", "broken.toml", "nested/incomplete.yaml"):
        (user_repo / "jobs" / bad).unlink()
    shutil.copy(GOOD, user_repo / "jobs" / "train.toml")
    quiet = io.StringIO()
    argv = ["compile", "jobs/train.toml", "-o", "jobs/out/train"]
    old = Path.cwd()
    os.chdir(user_repo)
    try:
        assert main(argv, stdout=quiet, stderr=quiet) == 0
    finally:
        os.chdir(old)
    git(user_repo, "add", "-A")
    done = pre_commit(user_repo, pre_commit_home, "run", "--all-files")
    assert done.returncode == 0, done.stdout
    assert "mdc validate" in done.stdout and "mdc compile --check" in done.stdout
