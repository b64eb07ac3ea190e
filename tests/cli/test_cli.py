"""The command line: exit codes, which stream gets what, JSON output, and the output directory."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator
from tests.tools import REPO

import mdc
from mdc.cli import main

SPEC_SUFFIXES = (".toml", ".yaml", ".json")
QUICKSTART = "examples/quickstart.toml"
DIAGNOSTIC_SPECS = sorted((REPO / "golden" / "diagnostics").glob("*/spec.*"))

pytestmark = pytest.mark.usefixtures("no_ambient_plugins")

VALID = """\
[job]
name = "demo"
command = ["python", "train.py"]

[distributed]
launcher = "torchrun"
nnodes = 2
nproc_per_node = 4
accelerator = "cpu"
"""

INVALID = """\
[job]
name = "demo"
command = ["python", "train.py"]

[distributed]
launcher = "torchrun"
nnodes = 2
nproc_per_node = 4

[parallelism]
tp = 3
"""


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def snapshot(root: Path) -> dict[str, tuple[bytes, int]]:
    return {
        p.relative_to(root).as_posix(): (p.read_bytes(), p.stat().st_mode & 0o777)
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(autouse=True)
def at_repo_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)


@pytest.fixture
def specs(tmp_path: Path) -> Path:
    folder = tmp_path / "specs"
    folder.mkdir()
    (folder / "good.toml").write_text(VALID)
    (folder / "bad.toml").write_text(INVALID)
    (folder / "broken.yaml").write_text("job: [unclosed\n")
    return folder


# ---------------------------------------------------------------- each command


def test_compile_ok(tmp_path: Path) -> None:
    target = tmp_path / "out"
    code, out, err = run("compile", QUICKSTART, "-o", str(target))
    assert (code, err) == (0, "")
    written = sorted(p.relative_to(target).as_posix() for p in target.rglob("*") if p.is_file())
    assert written == ["launch/worker.sh", "local/run.sh", "manifest.json", "plan.json"]
    assert out == (
        "compiled quickstart: torchrun on local: 1 node x 2 = 2 ranks, dp 2\n"
        f"wrote {target}/: {' '.join(written)}\n"
        f"next: bash {target}/local/run.sh\n"
    )


def test_compile_quiet(tmp_path: Path) -> None:
    assert run("compile", "-q", QUICKSTART, "-o", str(tmp_path / "out")) == (0, "", "")
    assert (tmp_path / "out" / "manifest.json").is_file()


def test_compile_invalid_spec(tmp_path: Path, specs: Path) -> None:
    code, out, err = run("compile", str(specs / "bad.toml"), "-o", str(tmp_path / "out"))
    assert code == 1 and out == ""
    assert "error[MDC201]" in err
    assert not (tmp_path / "out").exists()


def test_validate_ok() -> None:
    assert run("validate", QUICKSTART) == (0, "1 spec ok, 0 warnings\n", "")
    assert run("validate", "-q", QUICKSTART) == (0, "", "")


def test_validate_invalid(specs: Path) -> None:
    code, out, err = run("validate", str(specs / "bad.toml"))
    assert code == 1 and out == "0 specs ok, 1 invalid (1 error), 0 warnings\n"
    assert err.startswith(f"{specs / 'bad.toml'}:11:6: error[MDC201]: ")


def test_validate_warning_only_exits_0(tmp_path: Path) -> None:
    spec = tmp_path / "warn.toml"
    spec.write_text(VALID + "\n[parallelism]\ntp = 8\n")
    code, out, err = run("validate", str(spec))
    assert code == 0 and out == "1 spec ok, 1 warning\n"
    assert "warning[MDC250]" in err


def test_explain() -> None:
    code, out, err = run("explain", QUICKSTART)
    assert code == 0 and err == ""
    assert "quickstart" in out


def test_explain_invalid(specs: Path) -> None:
    code, out, err = run("explain", str(specs / "bad.toml"))
    assert code == 1 and out == ""
    assert "error[MDC201]" in err


def test_schema_prints_a_valid_json_schema() -> None:
    code, out, err = run("schema")
    assert code == 0 and err == ""
    Draft202012Validator.check_schema(json.loads(out))


def test_plugins_lists_the_builtins(declared_builtins: dict[str, list[str]]) -> None:
    code, out, err = run("plugins")
    assert code == 0 and err == ""
    lines = out.splitlines()
    declared = declared_builtins
    listed = {line.split()[0]: line for line in lines}
    assert sorted(listed) == sorted(declared["launchers"] + declared["backends"])
    assert all("launcher" in listed[name] for name in declared["launchers"])
    assert all("backend" in listed[name] for name in declared["backends"])


# ---------------------------------------------------------------- --format json


def test_json_compile(tmp_path: Path) -> None:
    code, out, err = run("compile", QUICKSTART, "-o", str(tmp_path / "out"), "--format", "json")
    assert code == 0 and err == ""
    report = json.loads(out)
    assert report["ok"] is True
    assert sorted(report["files"]) == sorted(snapshot(tmp_path / "out"))


def test_json_compile_invalid(tmp_path: Path, specs: Path) -> None:
    code, out, err = run(
        "compile", str(specs / "bad.toml"), "-o", str(tmp_path / "out"), "--format", "json"
    )
    assert code == 1 and err == ""
    report = json.loads(out)
    assert report["ok"] is False
    assert [d["code"] for d in report["diagnostics"]] == ["MDC201"]


def test_json_validate(specs: Path) -> None:
    code, out, err = run(
        "validate", "--format", "json", str(specs / "good.toml"), str(specs / "bad.toml")
    )
    assert code == 1 and err == ""
    report = json.loads(out)
    assert report["ok"] is False
    (diag,) = report["diagnostics"]
    assert diag | {"hint": None} == {
        "severity": "error",
        "code": "MDC201",
        "message": diag["message"],
        "hint": None,
        "path": str(specs / "bad.toml"),
        "pointer": "/parallelism/tp",
        "line": 11,
        "column": 6,
    }


def test_json_validate_ok() -> None:
    code, out, err = run("validate", "--format", "json", QUICKSTART)
    assert code == 0 and err == ""
    assert json.loads(out) == {"ok": True, "diagnostics": []}


def test_json_explain() -> None:
    code, out, err = run("explain", "--format", "json", QUICKSTART)
    assert code == 0 and err == ""
    plan = json.loads(out)
    assert plan["job"]["name"] == "quickstart" and plan["world_size"] == 2


def test_json_plugins(declared_builtins: dict[str, list[str]]) -> None:
    code, out, err = run("plugins", "--format", "json")
    assert code == 0 and err == ""
    rows = json.loads(out)
    expected = sorted(
        (name, kind) for kind in ("backend", "launcher") for name in declared_builtins[kind + "s"]
    )
    assert [(r["name"], r["kind"]) for r in rows] == expected
    assert {r["distribution"] for r in rows} == {"mdc-compiler"}


def test_json_schema() -> None:
    code, out, _ = run("schema", "--format", "json")
    assert code == 0
    assert json.loads(out)["title"]


# ---------------------------------------------------------------- compile --check and out/


def test_check_passes_on_fresh_output_and_names_an_edited_file(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert run("compile", QUICKSTART, "-o", str(out))[0] == 0
    before = snapshot(out)
    assert run("compile", QUICKSTART, "-o", str(out), "--check") == (0, "", "")
    script = out / "launch" / "worker.sh"
    script.write_text(script.read_text() + "echo edited\n")
    code, stdout, stderr = run("compile", QUICKSTART, "-o", str(out), "--check")
    assert code == 1 and stdout == ""
    assert "launch/worker.sh" in stderr and "changed" in stderr
    assert snapshot(out)["launch/worker.sh"] != before["launch/worker.sh"], "--check wrote"


def test_check_reports_mode_extra_and_missing_files(tmp_path: Path) -> None:
    """extra: a file the manifest on disk lists and the spec no longer writes. A file mdc
    did not write (notes.txt) is no drift: a compile would leave it as it is."""
    out = tmp_path / "out"
    run("compile", "examples/slurm-torchrun-2x8.toml", "-o", str(out))
    (out / "launch" / "worker.sh").chmod(0o644)
    (out / "notes.txt").write_text("mine\n")
    (out / "plan.json").unlink()
    code, _, stderr = run("compile", QUICKSTART, "-o", str(out), "--check")
    assert code == 1
    lines = [line.removeprefix(f"{out}: ") for line in stderr.splitlines()[:-1]]
    assert lines == [
        "changed: launch/worker.sh",
        "missing: local/run.sh",
        "changed: manifest.json",
        "missing: plan.json",
        "extra: slurm/job.sbatch",
        "extra: slurm/node.sh",
    ]


def test_check_on_missing_output_fails(tmp_path: Path) -> None:
    code, _, stderr = run("compile", QUICKSTART, "-o", str(tmp_path / "nowhere"), "--check")
    assert code == 1 and "manifest.json" in stderr
    assert not (tmp_path / "nowhere").exists()


def test_json_check(tmp_path: Path) -> None:
    out = tmp_path / "out"
    run("compile", QUICKSTART, "-o", str(out))
    (out / "plan.json").write_text("{}\n")
    code, stdout, _ = run("compile", QUICKSTART, "-o", str(out), "--check", "--format", "json")
    assert code == 1
    report = json.loads(stdout)
    assert report["ok"] is False and any("plan.json" in line for line in report["drift"])


def test_failed_compile_leaves_previous_output_untouched(tmp_path: Path, specs: Path) -> None:
    out = tmp_path / "out"
    assert run("compile", str(specs / "good.toml"), "-o", str(out))[0] == 0
    before = snapshot(out)
    for bad in ("bad.toml", "broken.yaml"):
        assert run("compile", str(specs / bad), "-o", str(out))[0] == 1
        assert snapshot(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "specs"], "no staging left"


def test_recompile_replaces_earlier_output_and_prunes(tmp_path: Path) -> None:
    """The files the earlier manifest lists that the new spec does not write go, and their
    folders with them; the folder of a file mdc did not write stays."""
    out = tmp_path / "out"
    run("compile", "examples/slurm-torchrun-2x8.toml", "-o", str(out))
    (out / "launch" / "notes.txt").write_text("mine\n")
    assert run("compile", QUICKSTART, "-o", str(out))[0] == 0
    assert not (out / "slurm").exists()
    assert (out / "launch" / "notes.txt").read_text() == "mine\n"
    assert run("compile", QUICKSTART, "-o", str(out), "--check")[0] == 0


def test_compile_refuses_a_foreign_non_empty_directory(tmp_path: Path) -> None:
    out = tmp_path / "mine"
    out.mkdir()
    (out / "thesis.tex").write_text("precious\n")
    before = snapshot(out)
    code, stdout, stderr = run("compile", QUICKSTART, "-o", str(out))
    assert code == 2 and stdout == ""
    assert "refusing" in stderr and "manifest.json" in stderr
    assert snapshot(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]


def test_compile_refuses_a_file_as_output(tmp_path: Path) -> None:
    target = tmp_path / "file"
    target.write_text("x\n")
    code, _, stderr = run("compile", QUICKSTART, "-o", str(target))
    assert code == 2 and "refusing" in stderr
    assert target.read_text() == "x\n"


def test_compile_into_an_empty_directory(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    assert run("compile", QUICKSTART, "-o", str(tmp_path / "out"))[0] == 0


# ---------------------------------------------------------------- validate: many files


def test_validate_reports_every_file_in_one_process(
    specs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import mdc.plugin_manager as manager

    calls = []
    real = manager.load_plugins

    def counting(**kwargs: object) -> manager.PluginSet:
        calls.append(kwargs)
        return real(**kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(manager, "load_plugins", counting)
    files = [str(specs / n) for n in ("good.toml", "bad.toml", "broken.yaml")]
    files.append(str(specs / "absent.json"))
    code, out, err = run("validate", *files, QUICKSTART)
    assert code == 1 and out.startswith("2 specs ok, 3 invalid (")
    assert len(calls) == 1, "plugins are loaded once per process, not per file"
    for name, code_ in (
        ("bad.toml", "MDC201"),
        ("broken.yaml", "MDC001"),
        ("absent.json", "MDC003"),
    ):
        assert f"{specs / name}" in err and f"error[{code_}]" in err
    assert "good.toml" not in err and QUICKSTART not in err


# ---------------------------------------------------------------- usage errors


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["frobnicate"],
        ["compile", QUICKSTART],
        ["compile", "-o", "out"],
        ["validate"],
        ["explain"],
        ["validate", "--format", "xml", QUICKSTART],
        ["schema", "extra"],
        ["validate", "-p", "torchrun", QUICKSTART],
        ["--no-such-flag"],
        # a rehearsal's time limit: a positive, finite number of seconds
        *(["rehearse", "--timeout", t, QUICKSTART] for t in ("nan", "inf", "-1", "0", "soon")),
    ],
    ids=lambda a: " ".join(a) or "no-arguments",
)
def test_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    out, err = io.StringIO(), io.StringIO()
    code = main(argv, stdout=out, stderr=err)
    captured = capsys.readouterr()
    assert code == 2
    stderr = err.getvalue() + captured.err
    assert "usage: mdc" in stderr and "Traceback" not in stderr
    assert out.getvalue() == "" and captured.out == ""


def test_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    assert "compile" in capsys.readouterr().out


def test_version_in_process(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"mdc {mdc.__version__}\n"


@pytest.mark.slow
def test_python_m_mdc_version(clean_env: Callable[..., dict[str, str]]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mdc", "--version"],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=60,
        check=False,
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, f"mdc {mdc.__version__}\n", "")


@pytest.mark.slow
def test_python_m_mdc_usage_error(clean_env: Callable[..., dict[str, str]]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mdc"],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=60,
        check=False,
    )
    assert done.returncode == 2 and "usage: mdc" in done.stderr and done.stdout == ""


@pytest.mark.slow
def test_validate_imports_only_what_it_uses(clean_env: Callable[..., dict[str, str]]) -> None:
    """validate reads paths with os.path (pathlib is the writer's) and builds the parser of
    its own subcommand only (tune's arguments live in mdc.tune.cli)."""
    specs = [str(p) for p in sorted((REPO / "examples").iterdir()) if p.suffix in SPEC_SUFFIXES]
    code = (
        "import sys; from mdc.cli import main\n"
        "assert main(['validate', '-q', *sys.argv[1:]]) == 0\n"
        "print(sorted(m for m in ('pathlib', 'mdc.tune.cli') if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, *specs],
        cwd=REPO,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert len(specs) > 30 and done.stdout == "[]\n"


def test_compile_imports_the_flag_reading_only_for_a_launcher_that_reads_flags(
    tmp_path: Path, clean_env: Callable[..., dict[str, str]]
) -> None:
    """torchrun's arguments set no spec key: its compile never imports the flag tables."""
    code = (
        "import sys; from mdc.cli import main\n"
        "assert main(['compile', '-q', sys.argv[1], '-o', sys.argv[2]]) == 0\n"
        "print(sorted(m for m in ('mdc.api.flags', 'mdc.passes.flags') if m in sys.modules))"
    )
    quickstart = str(REPO / "examples" / "quickstart.toml")
    done = subprocess.run(
        [sys.executable, "-c", code, quickstart, str(tmp_path / "out")],
        cwd=REPO,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert done.stdout == "[]\n"


def test_a_path_with_a_trailing_slash_is_named(tmp_path: Path) -> None:
    stderr = io.StringIO()
    assert main(["compile", f"{tmp_path}/", "-o", str(tmp_path / "out")], stderr=stderr) == 1
    assert f"cannot tell the format of {tmp_path.name!r}" in stderr.getvalue()


# ---------------------------------------------------------------- no tracebacks, ever


def bad_inputs(folder: Path) -> list[Path]:
    """Files a user might hand to mdc by mistake, each a different way to be wrong."""
    made = {
        "empty.toml": b"",
        "empty.yaml": b"",
        "empty.json": b"",
        "whitespace.yaml": b"   \n\n",
        "not-utf8.toml": b"\xff\xfe\x00[job]\n",
        "bom.json": "\ufeff[1]".encode(),
        "list.json": b"[1, 2]\n",
        "string.yaml": b"hello\n",
        "null.json": b"null\n",
        "nan.json": b'{"job": NaN}\n',
        "two-docs.yaml": b"---\na: 1\n---\nb: 2\n",
        "python-tag.yaml": b"x: !!python/object/apply:os.system {args: [true]}\n",
        "custom-tag.yaml": b"x: !foo {a: 1}\n",
        "alias-loop.yaml": b"a: &a [*a]\n",
        "int-keys.yaml": b"1: 2\n",
        "deep.json": b"[" * 5000 + b"]" * 5000,
        "deep.toml": b"a = " + b"[" * 5000 + b"]" * 5000,
        # deeper YAML is rejected too, but ruamel takes seconds to get there
        "deep.yaml": b"a: " + b"[" * 500 + b"]" * 500,
        "nested.yaml": b"a: " + b"[" * 100 + b"]" * 100,
        "date.toml": b"x = 1979-05-27T07:32:00Z\n",
        "huge-int.toml": VALID.encode() + b"master_port = 99999999999999999999999999\n",
        "unknown-suffix.ini": b"[job]\n",
        "job-is-list.toml": b'job = [1]\n[distributed]\nlauncher = "torchrun"\n',
        "env-not-string.yaml": b"job: {name: a, command: x, env: {A: 1}}\n"
        b"distributed: {launcher: torchrun}\n",
        "bad-env-name.yaml": b"job: {name: a, command: x, env: {1A: x}}\n"
        b"distributed: {launcher: torchrun}\n",
        "empty-command.json": b'{"job": {"name": "a", "command": []},'
        b' "distributed": {"launcher": "torchrun"}}',
        "bool-for-int.json": b'{"job": {"name": "a", "command": "x"},'
        b' "distributed": {"launcher": "torchrun", "nnodes": true}}',
    }
    for name, data in made.items():
        (folder / name).write_bytes(data)
    (folder / "directory.toml").mkdir()
    return [
        *(folder / n for n in sorted(made)),
        folder / "directory.toml",
        folder / "missing.yaml",
        *DIAGNOSTIC_SPECS,
    ]


@pytest.mark.slow
def test_bad_inputs_never_print_a_traceback(tmp_path: Path) -> None:
    problems = []
    for path in bad_inputs(tmp_path):
        for argv in (
            ["validate", str(path)],
            ["explain", str(path)],
            ["compile", str(path), "-o", str(tmp_path / "out")],
        ):
            code, _, err = run(*argv)
            if code not in (0, 1) or "Traceback" in err or (code == 1 and not err):
                problems.append(f"mdc {' '.join(argv)} -> exit {code}:\n{err}")
    assert not problems, "\n".join(problems)


@pytest.mark.slow
def test_bad_inputs_in_a_real_process(
    tmp_path: Path, clean_env: Callable[..., dict[str, str]]
) -> None:
    files = [str(p) for p in bad_inputs(tmp_path)]
    done = subprocess.run(
        [sys.executable, "-m", "mdc", "validate", *files],
        cwd=REPO,
        env=clean_env(MDC_DISABLE_PLUGIN_AUTOLOAD="1"),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    # the closing summary counts every file once, ok or invalid
    summary = re.fullmatch(
        r"(\d+) specs? ok, (\d+) invalid \(\d+ errors\), \d+ warnings?\n", done.stdout
    )
    assert summary is not None, done.stdout
    assert int(summary[1]) + int(summary[2]) == len(files)
    for name in ("empty.json", "not-utf8.toml", "deep.yaml", "missing.yaml", "directory.toml"):
        assert name in done.stderr


# ---------------------------------------------------------------- regressions


def test_integer_valued_float_is_not_an_internal_error(tmp_path: Path) -> None:
    spec = tmp_path / "float.toml"
    spec.write_text(VALID.replace("nproc_per_node = 4", "nproc_per_node = 4.0"))
    code, _, err = run("validate", str(spec))
    assert code == 1 and "MDC102" in err and "nproc_per_node" in err, err


@pytest.mark.parametrize(
    "text", ["x: !foo [1]\n", "x: !!omap [a: 1]\n"], ids=["custom-tag", "omap"]
)
def test_tagged_yaml_sequence_is_not_an_internal_error(text: str, tmp_path: Path) -> None:
    spec = tmp_path / "tagged.yaml"
    spec.write_text(text)
    code, _, err = run("validate", str(spec))
    assert code == 1, err


@pytest.mark.parametrize("variable", ["MASTER_PORT", "NODE_RANK"])
def test_job_env_cannot_override_runtime_variables(variable: str, tmp_path: Path) -> None:
    spec = tmp_path / "env.toml"
    command = 'command = ["python", "train.py"]'
    spec.write_text(VALID.replace(command, f'{command}\nenv = {{ {variable} = "1" }}'))
    code, _, err = run("validate", str(spec))
    assert code == 1 and variable in err


def test_a_spec_may_name_its_schema_for_editors(tmp_path: Path) -> None:
    """JSON (and Taplo's TOML) editors read the schema from a top-level "$schema" key."""
    data = json.loads((REPO / "examples" / "torchrun-2x2-static.json").read_text())
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"$schema": "./mdc.schema.json", **data}))
    assert run("validate", "-q", str(spec)) == (0, "", "")
    spec.write_text(json.dumps({"$schema": 3, **data}))
    code, _, err = run("validate", str(spec))
    assert code == 1 and "error[MDC102]: expected a string" in err and "/$schema" in err


@pytest.mark.slow
def test_a_closed_stdout_is_not_an_error(clean_env: Callable[..., dict[str, str]]) -> None:
    """`mdc schema | head -1`: the reader stops early; mdc exits quietly."""
    result = subprocess.run(
        f"{sys.executable} -m mdc schema | head -c 1",
        shell=True,
        capture_output=True,
        text=True,
        env=clean_env(),
        check=False,
    )
    assert result.stdout == "{"
    assert result.stderr == ""
