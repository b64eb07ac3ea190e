"""What the command line says besides the diagnostics, and how it helps when a spec is wrong.

compile's summary and its next command (which must name a file the backend wrote), -q,
validate's closing count and folders, --check's refresh command, colour, shell completion,
``mdc init`` for every supported launcher x backend pair, did-you-mean, a plugin that is not
installed, YAML indentation hints, and explain's located warnings.
"""

from __future__ import annotations

import io
import json
import os
import shlex
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from tests.tools import REPO

from mdc.cli import main
from mdc.cli.specs import EXCLUDE, find_specs
from mdc.loaders import load_file
from mdc.plugin_manager import load_plugins

QUICKSTART = str(REPO / "examples" / "quickstart.toml")
PLUGINS = load_plugins(autoload=False)
PAIRS = REPO / "tests" / "golden" / "pairs"


def run(*argv: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    saved = {k: os.environ.get(k) for k in ("NO_COLOR", "FORCE_COLOR")}
    try:
        for key in saved:
            os.environ.pop(key, None)
        os.environ.update(env or {})
        code = main(list(argv), stdout=out, stderr=err)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return code, out.getvalue(), err.getvalue()


def supported_pairs() -> list[tuple[str, str]]:
    pairs = []
    for backend in sorted(PLUGINS.backends):
        runs = PLUGINS.backend(backend).launchers
        for launcher in sorted(PLUGINS.launchers):
            if runs is None or launcher in runs:
                pairs.append((launcher, backend))
    return pairs


# ---------------------------------------------------------------- compile's summary


@pytest.mark.parametrize("backend", sorted(PLUGINS.backends))
def test_every_backend_names_a_next_command_for_a_file_it_wrote(
    backend: str, tmp_path: Path
) -> None:
    """The next command runs a file of the tree, from where the summary says to run it."""
    record = PLUGINS.backend(backend)
    assert record.run_command and "{out}" in record.run_command
    launcher = next(launcher for launcher, b in supported_pairs() if b == backend)
    spec = tmp_path / "spec.toml"
    assert run("init", "-q", "--launcher", launcher, "--backend", backend, "-o", str(spec))[0] == 0
    out = tmp_path / "my out"
    code, stdout, stderr = run("compile", str(spec), "-o", str(out))
    assert code == 0, stderr
    last = stdout.splitlines()[-1]
    assert last.startswith("next: ")
    words = shlex.split(last.removeprefix("next: "))
    # "cd OUT && sbatch FILE" runs FILE inside OUT; "bash OUT/FILE" and "kubectl apply -f
    # OUT/FILE" name it from here
    if words[0] == "cd":
        assert Path(words[1]) == out and words[2] == "&&"
        named = out / words[-1]
    else:
        named = Path(words[-1])
    assert named.is_file() and named.is_relative_to(out), last


def test_summary_lists_the_files_and_layout(tmp_path: Path) -> None:
    target = tmp_path / "out"
    code, stdout, _ = run(
        "compile", str(REPO / "examples" / "megatron-llama70b-16x8.toml"), "-o", str(target)
    )
    assert code == 0
    plan = tomllib.loads((REPO / "examples" / "megatron-llama70b-16x8.toml").read_text())
    par = plan["parallelism"]
    first, files, _ = stdout.splitlines()
    assert first.startswith(f"compiled {plan['job']['name']}: megatron on ")
    assert f"tp {par['tp']}" in first and f"pp {par['pp']}" in first
    written = sorted(p.relative_to(target).as_posix() for p in target.rglob("*") if p.is_file())
    assert files == f"wrote {target}/: {' '.join(written)}"


def test_disaggregated_serving_shows_its_roles(tmp_path: Path) -> None:
    spec = REPO / "examples" / "sglang-disagg-7-custom.yaml"
    code, stdout, _ = run("compile", str(spec), "-o", str(tmp_path / "out"))
    assert code == 0
    roles = {
        r["name"]: r["count"]
        for r in json.loads((tmp_path / "out" / "plan.json").read_text())["roles"]
    }
    assert "proxy" not in roles  # the router runs beside node 0's prefill server
    shown = f"{roles['prefill']} prefill, {roles['decode']} decode, router on node 0"
    assert stdout.splitlines()[0].endswith(f": 7 nodes x 8: {shown}")


def test_json_output_has_no_summary(tmp_path: Path) -> None:
    code, stdout, _ = run("compile", QUICKSTART, "-o", str(tmp_path / "o"), "--format", "json")
    assert code == 0 and json.loads(stdout)["ok"] is True


def test_check_drift_says_how_to_refresh(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert run("compile", "-q", QUICKSTART, "-o", str(out))[0] == 0
    (out / "plan.json").write_text("{}\n")
    code, stdout, stderr = run("compile", QUICKSTART, "-o", str(out), "--check")
    assert code == 1 and stdout == ""
    refresh = stderr.splitlines()[-1].split("refresh it with: ")[1]
    assert shlex.split(refresh) == ["mdc", "compile", QUICKSTART, "-o", str(out)]
    # the command it names does refresh the tree
    assert run(*shlex.split(refresh)[1:], "-q")[0] == 0
    assert run("compile", QUICKSTART, "-o", str(out), "--check") == (0, "", "")


# ---------------------------------------------------------------- validate


def test_validate_a_folder_finds_the_specs_and_skips_compiled_trees(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs"
    (jobs / "team").mkdir(parents=True)
    (jobs / "a.toml").write_text((REPO / "examples" / "quickstart.toml").read_text())
    (jobs / "team" / "b.yaml").write_text(
        (REPO / "examples" / "torchrun-2x2-c10d.yaml").read_text()
    )
    (jobs / "notes.txt").write_text("not a spec\n")
    assert run("compile", "-q", str(jobs / "a.toml"), "-o", str(jobs / "out"))[0] == 0
    assert run("compile", "-q", str(jobs / "a.toml"), "-o", str(jobs / "build"))[0] == 0
    code, stdout, stderr = run("validate", str(jobs))
    assert (code, stdout, stderr) == (0, "2 specs ok, 0 warnings\n", "")


def test_validate_a_folder_skips_files_that_are_never_specs(tmp_path: Path) -> None:
    """A plugin's project in the folder: its pyproject.toml and JSON Schema are not specs."""
    plugin = tmp_path / "plugin"
    (plugin / "src").mkdir(parents=True)
    shutil.copy(REPO / "examples" / "quickstart.toml", plugin / "job.toml")
    (plugin / "pyproject.toml").write_text('[project]\nname = "p"\n')
    (plugin / "src" / "p.v1.schema.json").write_text('{"type": "object"}\n')
    assert run("validate", str(plugin)) == (0, "1 spec ok, 0 warnings\n", "")


def test_folder_specs_are_picked_as_the_pre_commit_hook_picks_them() -> None:
    hook = next(
        h
        for h in yaml.safe_load((REPO / ".pre-commit-hooks.yaml").read_text())
        if h["id"] == "mdc-validate"
    )
    assert hook["exclude"] == EXCLUDE.pattern
    # this repository's examples: every file found is a job spec, the example plugin's
    # project files are not among them
    found = find_specs(REPO / "examples")
    assert REPO / "examples" / "quickstart.toml" in found
    for path in found:
        doc = load_file(path).data
        assert isinstance(doc, dict) and ("job" in doc or "distributed" in doc), path


def test_validate_an_empty_folder(tmp_path: Path) -> None:
    code, stdout, stderr = run("validate", str(tmp_path))
    assert code == 1
    assert stderr.startswith(f"{tmp_path}: error[MDC005]: no spec in this folder")
    assert stdout == "0 specs ok, 1 invalid (1 error), 0 warnings\n"


# ---------------------------------------------------------------- colour


def test_colour_follows_force_color_and_no_color(specs_dir: Path) -> None:
    bad = str(specs_dir / "bad.toml")
    plain = run("validate", bad)
    forced = run("validate", bad, env={"FORCE_COLOR": "1"})
    assert "\033[" not in plain[1] + plain[2]
    assert "\033[1;31merror[MDC201]\033[0m" in forced[2] and "\033[36mhint:\033[0m" in forced[2]
    assert run("validate", bad, env={"FORCE_COLOR": "1", "NO_COLOR": "1"}) == plain
    # the words are the same with and without colour
    assert (
        forced[2].replace("\033[1;31m", "").replace("\033[36m", "").replace("\033[0m", "")
        == plain[2]
    )


@pytest.fixture
def specs_dir(tmp_path: Path) -> Path:
    (tmp_path / "bad.toml").write_text(
        '[job]\nname = "x"\ncommand = ["python", "a.py"]\n[distributed]\n'
        'launcher = "torchrun"\nnnodes = 2\nnproc_per_node = 4\n[parallelism]\ntp = 3\n'
    )
    return tmp_path


# ---------------------------------------------------------------- completion


def test_bash_completion_registers_and_completes(
    tmp_path: Path, clean_env: Callable[..., dict[str, str]]
) -> None:
    code, script, _ = run("completion", "bash")
    assert code == 0 and "mdc" in script
    registered = subprocess.run(
        ["bash", "-c", f"{script}\ncomplete -p mdc"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert registered.returncode == 0 and registered.stdout.rstrip().endswith(" mdc")
    # what the registered function asks mdc for, as bash would ask it
    answer = tmp_path / "answer"
    line = "mdc comp"
    done = subprocess.run(
        [sys.executable, "-m", "mdc"],
        env=clean_env(
            _ARGCOMPLETE="1",
            _ARGCOMPLETE_IFS="\n",
            COMP_LINE=line,
            COMP_POINT=str(len(line)),
            _ARGCOMPLETE_STDOUT_FILENAME=str(answer),
        ),
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert sorted(answer.read_text().split()) == ["compile", "completion"]


@pytest.mark.parametrize("shell", ["zsh", "fish"])
def test_zsh_and_fish_completion_scripts(shell: str) -> None:
    code, script, _ = run("completion", shell)
    assert code == 0 and "mdc" in script and "_ARGCOMPLETE" in script


# ---------------------------------------------------------------- init


@pytest.mark.parametrize(("launcher", "backend"), supported_pairs(), ids="--".join)
def test_init_writes_a_starter_that_compiles_clean(
    launcher: str, backend: str, tmp_path: Path
) -> None:
    spec = tmp_path / "job.toml"
    code, stdout, stderr = run(
        "init", "--launcher", launcher, "--backend", backend, "-o", str(spec)
    )
    assert (code, stderr) == (0, ""), stderr
    assert stdout.startswith(f"wrote {spec}: a starter spec, {launcher} on {backend}")
    text = spec.read_text()
    assert "EDIT" in text and f"mdc validate {spec}" in text
    table = tomllib.loads(text)
    assert table["distributed"]["launcher"] == launcher
    assert table["distributed"]["backend"] == backend
    code, stdout, stderr = run("compile", str(spec), "-o", str(tmp_path / "out"))
    assert (code, stderr) == (0, ""), f"the starter does not compile clean:\n{stderr}"


def test_init_refuses_an_unsupported_pair_and_an_existing_file(tmp_path: Path) -> None:
    code, _, stderr = run(
        "init",
        "--launcher",
        "torchrun",
        "--backend",
        "leaderworkerset",
        "-o",
        str(tmp_path / "a.toml"),
    )
    assert code == 2 and "does not run the torchrun launcher" in stderr
    target = tmp_path / "b.toml"
    target.write_text("mine\n")
    code, _, stderr = run("init", "--launcher", "torchrun", "-o", str(target))
    assert code == 2 and "--force" in stderr and target.read_text() == "mine\n"
    assert run("init", "--launcher", "torchrun", "-o", str(target), "--force")[0] == 0


def test_init_makes_the_folder_and_reports_what_it_cannot_write(tmp_path: Path) -> None:
    nested = tmp_path / "jobs" / "team" / "job.toml"
    assert run("init", "-q", "--launcher", "torchrun", "-o", str(nested))[0] == 0
    assert nested.is_file()
    blocker = tmp_path / "file"
    blocker.write_text("x\n")
    code, _, stderr = run("init", "--launcher", "torchrun", "-o", str(blocker / "job.toml"))
    assert code == 2 and stderr.startswith(f"mdc: cannot write {blocker / 'job.toml'}: ")


def test_init_to_stdout() -> None:
    code, stdout, stderr = run("init", "--launcher", "basic", "--backend", "ssh", "-o", "-")
    assert (code, stderr) == (0, "") and tomllib.loads(stdout)["ssh"]["hosts"]


def test_init_names_an_unknown_launcher() -> None:
    code, _, stderr = run("init", "--launcher", "Megatron-LM", "-o", "-")
    assert code == 2 and "did you mean 'megatron'?" in stderr and "mdc plugins" in stderr


# ---------------------------------------------------------------- did-you-mean, plugins


def _spec(tmp_path: Path, distributed: str, extra: str = "") -> str:
    path = tmp_path / "spec.toml"
    path.write_text(
        f'[job]\nname = "x"\ncommand = ["python", "a.py"]\n[distributed]\n{distributed}\n{extra}'
    )
    return str(path)


@pytest.mark.parametrize(
    ("written", "meant", "where"),
    [
        ('backend = "SLURM"', "slurm", "distributed"),
        ('backend = "k8s"', "kubernetes", "distributed"),
        ('backend = "LWS"', "leaderworkerset", "distributed"),
        ('launcher = "megatron-lm"', "megatron", "distributed"),
        ('launcher = "Torchrun"', "torchrun", "distributed"),
        ('accelerator = "ROCm"', "amd", "distributed"),
        ('dtype = "bfloat16"', "bf16", "model"),
        ('dtype = "float32"', "fp32", "model"),
    ],
)
def test_did_you_mean_knows_case_and_other_names(
    written: str, meant: str, where: str, tmp_path: Path
) -> None:
    key = written.split(" ")[0]
    distributed = 'launcher = "torchrun"' if key != "launcher" else written
    if where == "distributed" and key != "launcher":
        distributed += "\n" + written
    extra = f"[model]\n{written}\n" if where == "model" else ""
    code, _, stderr = run("validate", _spec(tmp_path, distributed, extra))
    assert code == 1
    assert "error[MDC104]" in stderr and f"hint: did you mean '{meant}'?" in stderr


def test_unknown_key_in_another_case(tmp_path: Path) -> None:
    code, _, stderr = run("validate", _spec(tmp_path, 'launcher = "torchrun"\nNnodes = 2'))
    assert code == 1 and "hint: did you mean 'nnodes'?" in stderr


def test_a_launcher_that_is_not_installed(tmp_path: Path) -> None:
    """mpirun is the example plugin's: without it (-p no:mpirun) the spec says so."""
    spec = _spec(tmp_path, 'launcher = "mpirun"')
    code, _, stderr = run("validate", "-p", "no:mpirun", spec)
    assert code == 1
    assert "error[MDC107]: no launcher named 'mpirun' is installed (installed: basic," in stderr
    assert "(at /distributed/launcher)" in stderr and "`mdc plugins`" in stderr
    code, _, stderr = run("validate", _spec(tmp_path, 'launcher = "torchrun"\nbackend = "nomad"'))
    assert "error[MDC107]: no backend named 'nomad' is installed" in stderr


# ---------------------------------------------------------------- YAML indentation


@pytest.mark.parametrize(
    ("text", "hint"),
    [
        (
            "job:\n  name: x\n  command: [python]\ndistributed:\n  launcher: torchrun\n"
            "   nnodes: 2\n",
            "indented deeper than the key above it",
        ),
        (
            "job:\n  name: x\n command: [python]\ndistributed:\n  launcher: torchrun\n",
            "indented differently from the keys of its table",
        ),
        ("job:\n  name: x\ndistributed:\n\tlauncher: torchrun\n", "replace the tab"),
    ],
    ids=["deeper", "shallower", "tab"],
)
def test_yaml_indentation_errors_get_a_hint(text: str, hint: str, tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(text)
    code, _, stderr = run("validate", str(spec))
    assert code == 1 and "error[MDC001]: YAML: " in stderr
    assert stderr.splitlines()[1].startswith("  hint: ") and hint in stderr


# ---------------------------------------------------------------- explain


def test_explain_warnings_keep_their_location() -> None:
    """explain prints each warning exactly as validate does: file:line:col, pointer, hint."""
    spec = REPO / "golden" / "diagnostics" / "warning-tp-spans-nodes" / "spec.toml"
    _, _, warnings = run("validate", "-q", str(spec))
    code, explained, _ = run("explain", str(spec))
    assert code == 0 and warnings.startswith(f"{spec}:")
    assert explained.endswith(warnings)
