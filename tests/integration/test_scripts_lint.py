"""Every emitted shell script parses, passes shellcheck, and quotes hostile values.

No torch here: the hostile-strings test puts a stub ``torchrun`` on PATH that
only records the argv, working directory and environment it was started with,
so the test can check that values from the spec arrive verbatim and that no
command hidden in them ran.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tests.tools import REPO, shellcheck

#: the compile_spec fixture (tests/integration/conftest.py)
Compile = Callable[..., dict[str, Any]]
EXAMPLES = sorted(
    p for p in (REPO / "examples").iterdir() if p.suffix in (".toml", ".yaml", ".yml", ".json")
)


def hostile_spec(tmp_path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """A spec whose strings try to run ``touch CANARY/...``; and what must arrive."""
    canary = tmp_path / "canary"
    canary.mkdir(exist_ok=True)

    def attacks(tag: str) -> str:
        return (
            f"$(touch {canary}/{tag}1)`touch {canary}/{tag}2`; touch {canary}/{tag}3 "
            f"' ; touch {canary}/{tag}4 ; ' \" ; touch {canary}/{tag}5 ; \"\n"
            f"touch {canary}/{tag}6 && touch {canary}/{tag}7 | tee {canary}/{tag}8 & "
            "${HOME} $HOME \\$x \\ ünïcødé ✓ 日本語 🚀 * ~ ! # %"
        )

    args = [
        f"$(touch {canary}/a1)",
        f"`touch {canary}/a2`",
        f"x; touch {canary}/a3",
        "it's",
        'say "hi"',
        "line1\nline2",
        "naïve ✓ 日本語 🚀",
        "${HOME}",
        "$HOME",
        "\\",
        "",
        "--",
        "-x",
        "a b\tc",
        "*",
        "~",
        "!",
        "#",
        attacks("c"),
    ]
    workdir = tmp_path / "work dir" / f"$(touch {canary}/w1)`touch {canary}/w2`;'\"\nü*"
    workdir = Path(str(workdir))
    log_dir = f"{tmp_path}/logs $(touch {canary}/l1)`touch {canary}/l2`;\"'"
    env = {
        "HOSTILE": attacks("e"),
        "EMPTY": "",
        "UNICODE": "ü ✓ 日本語",
        "GLOB": "*",
        "NEWLINES": "\n\nx\n",
    }
    spec = {
        "job": {
            "name": "hostile-strings",
            "image": attacks("i"),
            "command": ["python", "train.py", *args],
            "workdir": str(workdir),
            "env": env,
        },
        "distributed": {
            "launcher": "torchrun",
            "backend": "local",
            "nnodes": 2,
            "nproc_per_node": 1,
            "accelerator": "cpu",
            "master_port": 29761,
        },
        "torchrun": {"rdzv_backend": "static", "log_dir": log_dir},
    }
    expected = {
        "canary": canary,
        "tail": ["train.py", *args],
        "workdir": workdir,
        "log_dir": log_dir,
        "env": env,
    }
    return spec, expected


CASES = [*[pytest.param(p, id=p.name) for p in EXAMPLES], pytest.param(None, id="hostile-strings")]


@pytest.mark.parametrize("example", CASES)
def test_emitted_scripts_pass_bash_n_and_shellcheck(
    compile_spec: Compile, example: Path | None, tmp_path: Path
) -> None:
    if example is None:
        spec = tmp_path / "hostile.json"
        spec.write_text(json.dumps(hostile_spec(tmp_path)[0], ensure_ascii=False), encoding="utf-8")
    else:
        spec = example
    out = tmp_path / "out"
    compile_spec(spec, out)
    scripts = sorted(out.rglob("*.sh"))
    assert scripts, f"no *.sh emitted for {spec}"
    checker = shellcheck()
    for script in scripts:
        parsed = subprocess.run(
            ["bash", "-n", str(script)], capture_output=True, text=True, check=False
        )
        assert parsed.returncode == 0, f"bash -n {script.name}:\n{parsed.stderr}"
        linted = subprocess.run(
            [checker, "--norc", "-S", "warning", str(script)],
            capture_output=True,
            text=True,
            check=False,
        )
        assert linted.returncode == 0, (
            f"shellcheck {script.relative_to(out)}:\n{linted.stdout}{linted.stderr}"
        )


STUB_TORCHRUN = """\
#!{python}
# Not torchrun: a stub that only records how it was started, one JSON file per node.
import json, os, sys
from pathlib import Path
record = {{"argv": sys.argv[1:], "cwd": os.getcwd(),
          "env": {{k: os.environ.get(k) for k in {names!r}}}}}
node = os.environ.get("NODE_RANK", "unset")
Path(os.environ["STUB_CAPTURE_DIR"], f"node-{{node}}.json").write_text(
    json.dumps(record, ensure_ascii=False), encoding="utf-8")
"""


def test_hostile_strings_reach_stub_torchrun_argv_verbatim(
    compile_spec: Compile, tmp_path: Path
) -> None:
    """run.sh -> launch/worker.sh -> a stub torchrun that captures its argv; nothing runs."""
    spec_data, expected = hostile_spec(tmp_path)
    spec = tmp_path / "hostile.json"
    spec.write_text(json.dumps(spec_data, ensure_ascii=False), encoding="utf-8")
    out = tmp_path / "out"
    plan = compile_spec(spec, out)
    expected["workdir"].mkdir(parents=True)

    stub_bin, capture = tmp_path / "stub-bin", tmp_path / "capture"
    stub_bin.mkdir()
    capture.mkdir()
    names = [*expected["env"], "NODE_RANK", "MASTER_ADDR", "MASTER_PORT"]
    stub = stub_bin / "torchrun"
    stub.write_text(STUB_TORCHRUN.format(python=sys.executable, names=names), encoding="utf-8")
    stub.chmod(0o755)

    env = {k: v for k, v in os.environ.items() if k not in names}
    env.update(PATH=f"{stub_bin}{os.pathsep}{env.get('PATH', '')}", STUB_CAPTURE_DIR=str(capture))
    done = subprocess.run(
        ["bash", str(out / "local" / "run.sh")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, f"run.sh exited {done.returncode}:\n{done.stderr}"

    assert sorted(os.listdir(expected["canary"])) == [], "a command hidden in the spec ran"
    port = plan["rendezvous"]["master_port"]
    records = sorted(p.name for p in capture.iterdir())
    assert records == ["node-0.json", "node-1.json"], records
    tail = expected["tail"]
    for node in (0, 1):
        record = json.loads((capture / f"node-{node}.json").read_text(encoding="utf-8"))
        argv = record["argv"]
        assert argv[-len(tail) :] == tail, "the program's arguments changed on the way"
        assert argv[argv.index("--log-dir") + 1] == expected["log_dir"]
        assert argv[argv.index("--node-rank") + 1] == str(node)
        assert argv[argv.index("--master-port") + 1] == str(port)
        assert os.path.realpath(record["cwd"]) == os.path.realpath(expected["workdir"])
        assert record["env"] == {
            **expected["env"],
            "NODE_RANK": str(node),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
        }
    assert sorted(os.listdir(expected["canary"])) == []
