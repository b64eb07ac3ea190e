"""The documentation site builds with ``mkdocs build --strict``.

Strict mode (and ``validation`` in ``mkdocs.yml``) turns every warning into a failure: a link
to a page or an anchor that does not exist, a link that leaves the site, a page named in
``nav`` that is missing. The build goes to a temporary folder, never to ``site/``.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from tests.tools import REPO


@pytest.mark.slow
def test_mkdocs_build_strict(tmp_path: Path) -> None:
    if importlib.util.find_spec("mkdocs") is None:
        pytest.skip("mkdocs is not installed (pip install -e '.[docs]')")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "--config-file",
            str(REPO / "mkdocs.yml"),
            "--site-dir",
            str(tmp_path / "site"),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stderr}"
    assert (tmp_path / "site" / "index.html").is_file()


def test_readme_links_exist() -> None:
    """Every relative link in README.md and CONTRIBUTING.md names a file of the repository."""
    import re

    for name in ("README.md", "CONTRIBUTING.md"):
        text = (REPO / name).read_text(encoding="utf-8")
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
            if "://" in target:
                continue
            assert (REPO / target).exists(), f"{name} links to {target}, which does not exist"


def test_readme_links_every_page() -> None:
    """README.md, the front door, links each page of the site (the generated reference
    pages are reached from docs/diagnostics.md and docs/spec.md)."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    linked = set(re.findall(r"\]\((docs/[^)#\s]+)", text))
    pages = {p.relative_to(REPO).as_posix() for p in (REPO / "docs").glob("*.md")}
    assert not pages - linked, f"README.md links none of {sorted(pages - linked)}"


#: the folders of the repository a page names paths under
ROOTED = re.compile(
    r"(?<![\w./<>{}$-])"
    r"((?:compiler|plugins|schemas|examples|golden|tests|bench|scripts|docs|\.ci)/[\w./-]*)"
)
#: paths the pages name that are not the repository's, by whose they are
ELSEWHERE = {
    "bench/.venv": "made by `python -m bench.run`",
    "bench/results/": "written by `python -m bench.run`",
    "examples/run_pretrain.sh": "Primus's repository",
    "examples/megatron/configs/": "Primus's repository",
    "examples/torchtitan/configs/": "Primus's repository",
    "examples/sc21/": "Megatron-LM's repository",
    "tests/v1/kv_connector/nixl_integration/": "vLLM's repository",
}
#: paths the plugin guide names inside the example plugin's package, where they are
IN_PACKAGE = {"schemas/mpirun.v1.schema.json": "examples/mdc-mpi/src/mdc_mpi"}
PAGES = ["README.md", "CONTRIBUTING.md"] + sorted(
    p.relative_to(REPO).as_posix() for p in (REPO / "docs").rglob("*.md")
)


def _line(text: str, start: int) -> int:
    return text.count("\n", 0, start) + 1


def test_paths_named_exist() -> None:
    """Every repository path a page names (`compiler/...`, `examples/...`, ...) exists."""
    missing = []
    for page in PAGES:
        text = (REPO / page).read_text(encoding="utf-8")
        for match in ROOTED.finditer(text):
            path = match.group(1).rstrip(".")
            if text[match.end() : match.end() + 1] in "<{*" or (REPO / path).exists():
                continue
            if path in IN_PACKAGE and (REPO / IN_PACKAGE[path] / path).exists():
                continue
            if not any(path.startswith(other) for other in ELSEWHERE):
                missing.append(f"{page}:{_line(text, match.start())}: {path}")
    assert not missing, "pages name paths that do not exist:\n" + "\n".join(missing)


def _repository_names() -> set[str]:
    """Every file and folder of the checkout, as a path from its root."""
    names: set[str] = set()
    skip = {"site", "__pycache__", "node_modules", "out"}
    for root, dirs, files in os.walk(REPO):
        dirs[:] = [
            d
            for d in dirs
            if d not in skip and not d.endswith(".egg-info") and (d == ".ci" or d[0] != ".")
        ]
        here = Path(root).relative_to(REPO).as_posix()
        names.update(n if here == "." else f"{here}/{n}" for n in dirs + files)
    return names


#: words of CONTRIBUTING.md shaped like paths that are no file of the repository
NOT_FILES = {"out/": "what `mdc compile` writes", "ruamel.yaml": "a library"}
SHAPED = (".py", ".toml", ".json", ".md", ".sh", ".yaml", ".yml")


def test_contributing_map_names_what_is_there() -> None:
    """Each file or folder CONTRIBUTING.md's map and tables name (`pipeline.py`, `plan/`,
    `tune/terms.py`, ...; relative to the package they sit in) is one the repository has."""
    names = _repository_names()
    text = (REPO / "CONTRIBUTING.md").read_text(encoding="utf-8")
    text = re.sub(r"\]\(([^)]*)\)", r" \1 ", text)  # a link's target, as a word of its own
    missing = []
    for number, line in enumerate(text.splitlines(), 1):
        for word in line.split():
            word = word.strip("(),:;`'\"|")
            if word in NOT_FILES or not word.strip("/") or any(c in word for c in "<>*{}$=[]"):
                continue
            if not (word.endswith("/") or word.endswith(SHAPED)):
                continue
            tail = word.rstrip("/").removeprefix("./")
            if tail not in names and not any(n.endswith("/" + tail) for n in names):
                missing.append(f"CONTRIBUTING.md:{number}: {word}")
    assert not missing, "CONTRIBUTING.md names what is not there:\n" + "\n".join(missing)


def _map_entries() -> dict[str, str]:
    """CONTRIBUTING.md's map of compiler/mdc/: each folder's entry (its lines together),
    and under "" every line, where the top-level modules are named."""
    text = (REPO / "CONTRIBUTING.md").read_text(encoding="utf-8")
    block = text.split("\ncompiler/mdc/\n", 1)[1]
    entries: dict[str, str] = {"": ""}
    folder = ""
    for line in block.splitlines():
        if not line.startswith("  "):  # the next top-level folder: the map of mdc ends
            break
        if not line.startswith("   "):
            folder = line.split()[0].rstrip("/") if line.split()[0].endswith("/") else ""
        entries[folder] = entries.get(folder, "") + " " + line
        entries[""] += " " + line
    return entries


def test_contributing_map_names_every_module() -> None:
    """Each module of compiler/mdc/ is in CONTRIBUTING.md's map: a top-level one by its file
    name, one in a folder by its name in the folder's entry (or the entry says "one module
    per ...", as loaders/ does)."""
    entries = _map_entries()
    package = REPO / "compiler" / "mdc"
    unnamed = []
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package).parts
        if path.name == "__init__.py":
            continue
        folder = "/".join(parts[:-1])
        entry = next((entries[f] for f in (folder, parts[0]) if f in entries), None)
        if not folder:
            named = path.name in entries[""].split()
        else:
            named = entry is not None and (
                "one module per" in entry or re.search(rf"\b{path.stem}\b", entry) is not None
            )
        if not named:
            unnamed.append(path.relative_to(package).as_posix())
    assert not unnamed, "CONTRIBUTING.md's map does not name:\n" + "\n".join(unnamed)


def test_module_names_exist() -> None:
    """Every `mdc.` dotted name a page gives (a module, or a name in one) is importable."""
    dotted = re.compile(r"\bmdc(?:_builtin)?(?:\.[A-Za-z_]\w*)+")
    missing = []
    for page in PAGES:
        text = (REPO / page).read_text(encoding="utf-8")
        for match in dotted.finditer(text):
            name = match.group(0)
            if name.endswith((".json", ".toml", ".yaml")):  # a file, as mdc.schema.json
                continue
            if not _resolves(name):
                missing.append(f"{page}:{_line(text, match.start())}: {name}")
    assert not missing, "pages name modules or names that do not exist:\n" + "\n".join(missing)


def _resolves(name: str) -> bool:
    """`a.b.c` is a module, or a module's attribute path."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attribute in parts[cut:]:
            if not hasattr(found, attribute):
                return False
            found = getattr(found, attribute)
        return True
    return False


def test_readme_is_the_front_door() -> None:
    """README.md stays short; the rest of the documentation lives in docs/."""
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; move detail into docs/"


def test_readme_compile_sessions_are_real(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each `$ mdc compile` in README.md prints what the README shows and writes its tree."""
    import io
    import re

    from mdc.cli import main

    text = (REPO / "README.md").read_text(encoding="utf-8")
    sessions = re.findall(r"```console\n(.*?)```", text, re.DOTALL)
    compiled = [s for s in sessions if s.startswith("$ mdc compile ")]
    assert len(compiled) >= 2, "README.md shows a SLURM and a Kubernetes compile"
    for index, session in enumerate(compiled):
        here = tmp_path / str(index)
        here.mkdir()
        monkeypatch.chdir(here)
        command, *rest = session.splitlines()
        shown = rest[: next(i for i, line in enumerate(rest) if line.startswith("$ "))]
        argv = command.removeprefix("$ mdc ").split()
        argv = [str(REPO / a) if a.startswith("examples/") else a for a in argv]
        out = io.StringIO()
        assert main(argv, stdout=out, stderr=io.StringIO()) == 0, command
        assert out.getvalue().splitlines() == shown, command
        listing = session.split("$ find out -type f | sort\n")[1].split("\n$ ")[0]
        files = [line.split()[0] for line in listing.splitlines()]
        written = sorted(p.as_posix() for p in Path("out").rglob("*") if p.is_file())
        assert files == written, command


@pytest.mark.slow
def test_tune_worked_example_is_real() -> None:
    """docs/tune.md's worked example prints what `mdc tune` prints for its spec today."""
    import io
    import re

    from mdc.cli import main

    text = (REPO / "docs" / "tune.md").read_text(encoding="utf-8")
    session = re.search(r"```\n(\$ mdc tune examples/\S+)\n(.*?)```", text, re.DOTALL)
    assert session, "docs/tune.md shows an `mdc tune` session"
    argv = session.group(1).removeprefix("$ mdc ").split()
    argv = [str(REPO / a) if a.startswith("examples/") else a for a in argv]
    out = io.StringIO()
    assert main(argv, stdout=out, stderr=io.StringIO()) == 0
    assert out.getvalue() == session.group(2)
