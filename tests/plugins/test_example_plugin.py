"""The example third-party plugin (examples/mdc-mpi) as mdc sees it once it is installed.

scripts/test installs it into .venv after mdc; its own behaviour and goldens are tested by
examples/mdc-mpi/tests (through mdc.testing). Here: discovery through the entry point,
``mdc plugins`` naming its distribution and version, the three ways to block it, that it
imports only the public surface, and that its schema fragment composes into ``mdc schema``.
"""

from __future__ import annotations

import ast
import importlib.metadata
import io
import json
import subprocess
import sys
import tomllib
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from tests.tools import REPO

from mdc.cli import main
from mdc.plugin_manager import DISTRIBUTION, GROUP
from mdc.testing import subprocess_env

PLUGIN = REPO / "examples" / "mdc-mpi"
PROJECT = tomllib.loads((PLUGIN / "pyproject.toml").read_text(encoding="utf-8"))["project"]
SPEC = PLUGIN / "examples" / "mpi-local-1x4.toml"
#: what a plugin may import from the mdc package (as tests/plugins/test_layering.py says): the
#: contract and its documented helpers
PUBLIC = {"mdc", "mdc.api"} | {
    f"mdc.api.{path.stem}"
    for path in (REPO / "compiler" / "mdc" / "api").glob("*.py")
    if not path.stem.startswith("_")
}


@pytest.fixture(autouse=True)
def ambient(monkeypatch: pytest.MonkeyPatch) -> None:
    """Autoload on, nothing blocked: the situation of a user who installed the plugin."""
    for name in ("MDC_DISABLE_PLUGIN_AUTOLOAD", "MDC_BLOCK_PLUGINS", "MDC_TRACE_PLUGINS"):
        monkeypatch.delenv(name, raising=False)


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def plugin_rows(*options: str) -> dict[str, dict[str, Any]]:
    code, out, err = run("plugins", "--format", "json", *options)
    assert code == 0, err
    return {row["name"]: row for row in json.loads(out)}


def test_it_is_installed_from_its_own_distribution() -> None:
    [entry] = [
        ep
        for ep in importlib.metadata.entry_points(group=GROUP)
        if ep.name in PROJECT["entry-points"]["mdc"]
    ]
    assert entry.value == PROJECT["entry-points"]["mdc"][entry.name] == "mdc_mpi"
    assert entry.dist is not None and entry.dist.name == PROJECT["name"] != DISTRIBUTION
    assert importlib.metadata.version(PROJECT["name"]) == PROJECT["version"]


def test_mdc_plugins_lists_it_with_distribution_and_version() -> None:
    row = plugin_rows()["mpirun"]
    assert row == {
        "name": "mpirun",
        "kind": "launcher",
        "distribution": "mdc-mpi",
        "version": PROJECT["version"],
        "entry_point": "mpirun = mdc_mpi",
        "description": row["description"],
    }
    code, out, _ = run("plugins")
    assert code == 0
    [line] = [line for line in out.splitlines() if line.startswith("mpirun ")]
    assert f"launcher  mdc-mpi {PROJECT['version']}  (mpirun = mdc_mpi)" in line


@pytest.mark.parametrize(
    "how", ["-p", "MDC_BLOCK_PLUGINS", "--no-plugin-autoload", "MDC_DISABLE_PLUGIN_AUTOLOAD"]
)
def test_blocking_removes_it(how: str, monkeypatch: pytest.MonkeyPatch) -> None:
    options: tuple[str, ...] = ()
    if how == "-p":
        options = ("-p", "no:mpirun")
    elif how == "--no-plugin-autoload":
        options = (how,)
    else:
        monkeypatch.setenv(how, "mpirun" if how == "MDC_BLOCK_PLUGINS" else "1")
    rows = plugin_rows(*options)
    assert "mpirun" not in rows
    assert {"torchrun", "local"} <= rows.keys()  # mdc's own stay
    code, _, err = run("validate", str(SPEC), *options)
    assert code == 1 and "'mpirun'" in err, err  # the launcher is unknown now
    monkeypatch.delenv("MDC_BLOCK_PLUGINS", raising=False)
    monkeypatch.delenv("MDC_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    assert run("validate", "-q", str(SPEC)) == (0, "", "")


def test_it_imports_only_the_public_surface() -> None:
    sources = sorted((PLUGIN / "src").rglob("*.py"))
    assert sources
    for path in sources:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module]
                if isinstance(node, ast.ImportFrom) and node.module
                else []
            )
            for name in names:
                if name == "mdc" or name.startswith("mdc."):
                    line = getattr(node, "lineno", 0)
                    assert name in PUBLIC, f"{path.relative_to(REPO)}:{line}: {name}"
                assert not name.startswith("mdc_builtin"), f"{path}: {name}"


def test_its_schema_fragment_composes_into_mdc_schema() -> None:
    code, out, err = run("schema")
    assert code == 0, err
    composed = json.loads(out)
    Draft202012Validator.check_schema(composed)
    fragment = json.loads(
        (PLUGIN / "src" / "mdc_mpi" / "schemas" / "mpirun.v1.schema.json").read_text(
            encoding="utf-8"
        )
    )
    Draft202012Validator.check_schema(fragment)
    assert fragment["additionalProperties"] is False
    assert all("description" in prop for prop in fragment["properties"].values())
    assert composed["properties"]["mpirun"]["properties"].keys() == fragment["properties"].keys()
    code, out, _ = run("schema", "-p", "no:mpirun")
    assert "mpirun" not in json.loads(out)["properties"]


def test_its_examples_stay_out_of_mdcs_own() -> None:
    """mdc's golden test compiles examples/*.toml with autoload off: no mpirun specs there."""
    for spec in (REPO / "examples").iterdir():
        if spec.is_file() and spec.suffix in (".toml", ".yaml", ".yml", ".json"):
            assert 'launcher = "mpirun"' not in spec.read_text(encoding="utf-8"), spec


# ---------------------------------------------------------------- mdc.testing, as the plugin uses it


def test_importing_mdc_does_not_import_the_test_harness() -> None:
    code = (
        "import sys, mdc, mdc.api, mdc.cli, mdc.plugin_manager, mdc.pipeline\n"
        "mdc.cli.main(['plugins'])\n"
        "assert 'mdc.testing' not in sys.modules and 'pytest' not in sys.modules, "
        "sorted(m for m in sys.modules if 'pytest' in m or m == 'mdc.testing')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=subprocess_env(),
    )
    assert done.returncode == 0, done.stderr


def test_only_plugins_blocks_every_other_third_party_plugin() -> None:
    from mdc.testing import only_plugins, run_mdc

    assert "no:mpirun" in only_plugins([])
    assert "no:mpirun" not in only_plugins(["mpirun"])
    assert not any(
        word.removeprefix("no:") in ("torchrun", "local") for word in only_plugins([])
    )  # mdc's own are never blocked
    with pytest.raises(LookupError, match="no entry point not_installed"):
        only_plugins(["not_installed"])
    names = {
        row["name"]
        for row in json.loads(run_mdc(["plugins", "--format", "json"], plugins=[]).stdout)
    }
    assert "mpirun" not in names and "torchrun" in names


@pytest.mark.slow
def test_both_suites_share_one_update_golden_option() -> None:
    """mdc's conftest and the plugin's both enable mdc.testing: one --update-golden."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "--collect-only",
            "-q",
            "tests/golden/test_golden.py",
            "examples/mdc-mpi/tests",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=subprocess_env(),
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "examples/mdc-mpi/tests/test_mpirun.py::test_example_matches_golden" in done.stdout


@pytest.mark.slow
def test_the_plugin_suite_refuses_update_golden_under_ci() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "--update-golden",
            "--collect-only",
            "-q",
            "tests",
        ],
        cwd=PLUGIN,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=subprocess_env(CI="true"),
    )
    assert done.returncode == pytest.ExitCode.USAGE_ERROR, done.stdout + done.stderr
    assert "--update-golden is refused when CI is set" in done.stderr
