"""Who may import what: built-ins use the public API only, the core never sees them or torch."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from tests.tools import REPO

CORE = REPO / "compiler" / "mdc"
BUILTINS = REPO / "plugins" / "mdc_builtin"
#: what a plugin may import from the mdc package: the contract and its documented helpers
PUBLIC = {"mdc", "mdc.api"} | {
    f"mdc.api.{path.stem}" for path in (CORE / "api").glob("*.py") if not path.stem.startswith("_")
}


def python_files(root: Path) -> list[Path]:
    return sorted(root.rglob("*.py"))


def imported_modules(path: Path) -> Iterator[tuple[int, str]]:
    """Every absolute module an import statement anywhere in ``path`` names.

    ``from mdc import x`` yields ``mdc.x`` as well as ``mdc`` when ``x`` is a
    submodule of ``mdc``, since that imports the submodule.
    """
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module
            for alias in node.names:
                yield node.lineno, f"{node.module}.{alias.name}"
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, (ast.Name, ast.Attribute))
            and (node.func.id if isinstance(node.func, ast.Name) else node.func.attr)
            in ("import_module", "__import__")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            yield node.lineno, node.args[0].value


def is_module_of_mdc(name: str) -> bool:
    """Whether ``name`` is ``mdc`` or a real module inside it (not an attribute like hookimpl)."""
    if name == "mdc":
        return True
    if not name.startswith("mdc."):
        return False
    relative = Path(*name.split(".")[1:])
    return (CORE / relative).with_suffix(".py").is_file() or (CORE / relative).is_dir()


def within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def test_the_scans_see_files() -> None:
    assert len(python_files(BUILTINS)) >= 3 and len(python_files(CORE)) >= 10
    assert {"mdc.api.shell", "mdc.api.torchrun", "mdc.api.flags"} <= PUBLIC
    assert "mdc.runtime" not in PUBLIC and "mdc.plan.model" not in PUBLIC


def test_import_scan_understands_the_forms(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import mdc.errors\nfrom mdc import hookimpl, plan\n"
        "def f():\n    import torch.nn\n"
        "importlib.import_module('mdc_builtin.x')\n"
    )
    names = {name for _, name in imported_modules(sample)}
    assert {"mdc.errors", "mdc.hookimpl", "mdc.plan", "torch.nn", "mdc_builtin.x"} <= names
    assert not is_module_of_mdc("mdc.hookimpl") and is_module_of_mdc("mdc.plan")


@pytest.mark.parametrize(
    "path", python_files(BUILTINS), ids=lambda p: p.relative_to(BUILTINS).as_posix()
)
def test_builtins_use_only_the_public_api(path: Path) -> None:
    private = [
        f"{path.relative_to(REPO)}:{line}: imports {name}"
        for line, name in imported_modules(path)
        if is_module_of_mdc(name) and name not in PUBLIC
    ]
    assert not private, "built-ins may import only mdc, mdc.api and its helpers:\n" + "\n".join(
        private
    )


#: programs the workers of ``mdc rehearse`` run (under torchrun, never inside mdc's process);
#: the in-process test below proves compile, validate and explain still never load torch
WORKER_PROGRAMS = {REPO / "compiler" / "mdc" / "rehearse" / "probe.py"}


@pytest.mark.parametrize(
    "path",
    python_files(REPO / "compiler"),
    ids=lambda p: p.relative_to(REPO / "compiler").as_posix(),
)
def test_core_never_imports_builtins_or_torch(path: Path) -> None:
    torch_allowed = path in WORKER_PROGRAMS
    bad = [
        f"{path.relative_to(REPO)}:{line}: imports {name}"
        for line, name in imported_modules(path)
        if within(name, "mdc_builtin") or (within(name, "torch") and not torch_allowed)
    ]
    assert not bad, "\n".join(bad)


#: the command line sits on top: only it, ``python -m mdc`` and the test helpers (which run it)
#: import it, so that no compiler module depends on the CLI (an import cycle through it)
CLI_USERS = {CORE / "__main__.py", CORE / "testing.py"}


@pytest.mark.parametrize("path", python_files(CORE), ids=lambda p: p.relative_to(CORE).as_posix())
def test_only_the_command_line_imports_the_command_line(path: Path) -> None:
    if path in CLI_USERS or path.is_relative_to(CORE / "cli"):
        return
    bad = [
        f"{path.relative_to(REPO)}:{line}: imports {name}"
        for line, name in imported_modules(path)
        if within(name, "mdc.cli")
    ]
    assert not bad, "\n".join(bad)


#: runs validate and compile through the CLI, then reports whether torch got imported
PROBE = """\
import io
import sys
from mdc.cli import main
codes = (main(["validate", "-q", "examples/quickstart.toml"]),
         main(["compile", "-q", "examples/quickstart.toml", "-o", sys.argv[1]]),
         main(["explain", "examples/quickstart.toml"], stdout=io.StringIO()))
print("codes", *codes)
print("torch imported:", 'torch' in sys.modules)
"""


@pytest.mark.slow
@pytest.mark.parametrize("trap", [False, True], ids=["as-installed", "with-a-torch-trap"])
def test_validate_and_compile_do_not_import_torch(
    trap: bool, tmp_path: Path, clean_env: Callable[..., dict[str, str]]
) -> None:
    """Checked as installed, and with a stand-in ``torch`` on the path that any import loads.

    The stand-in makes the check bite even where torch is not installed.
    """
    env = clean_env(MDC_DISABLE_PLUGIN_AUTOLOAD="1")
    if trap:
        fake = tmp_path / "trap"
        (fake / "torch").mkdir(parents=True)
        (fake / "torch" / "__init__.py").write_text("# stand-in: importing it is the failure\n")
        env["PYTHONPATH"] = str(fake) + (f":{env['PYTHONPATH']}" if env.get("PYTHONPATH") else "")
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(tmp_path / "out")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["codes 0 0 0", "torch imported: False"], done.stderr
