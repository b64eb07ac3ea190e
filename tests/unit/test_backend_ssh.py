"""The ssh backend: hostfile, launch.sh, its checks, and launch.sh run against a stand-in ssh.

The stand-in ``ssh`` on PATH parses the options the real client gets, then
runs the remote command string with ``/bin/sh -c`` (dash on Debian), as a
remote POSIX login shell would: that proves the double quoting without a
server. ``tests/integration/test_ssh_run.py`` runs the same scripts over a
real sshd.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

import mdc
from mdc import emit
from mdc.api import Launch, LauncherSpec, Plan, Role
from mdc.errors import Diagnostic, PluginOrigin, SpecError
from mdc.pipeline import Compiled, Compiler
from mdc.plugin_manager import load_plugins


def roles_launch(plan: Plan, options: object) -> Launch:
    """Each role records where it ran: role, node rank, rendezvous, host and directory.

    One file per node: bash's stdout is line buffered, so a value with a line break is
    written in two parts, and nodes sharing a file could interleave between them."""

    def line(role: str) -> str:
        return (
            f'echo "{role} $NODE_RANK $MASTER_ADDR:$MASTER_PORT $FAKE_HOST $PWD '
            '${FORWARDED-unset}" >> "$ROLE_LOG.$NODE_RANK"; exit "${EXIT_STATUS:-0}"'
        )

    return Launch(
        roles=tuple(Role(name=r.name, argv=("bash", "-c", line(r.name))) for r in plan.roles)
    )


class RolesPlugin:
    @mdc.hookimpl
    def mdc_register_launchers(self) -> list[LauncherSpec]:
        return [
            LauncherSpec(
                name="roles",
                description="records each node's role",
                parallelism="data",
                disaggregated=True,
                emit=roles_launch,
            )
        ]


@pytest.fixture(scope="module")
def compiler() -> Compiler:
    origin = PluginOrigin(entry_point="roles = tests", distribution="tests", version="0")
    return Compiler(load_plugins(autoload=False, extra=[("roles", RolesPlugin(), origin)]))


def spec(hosts: list[str] | None = None, **ssh: Any) -> dict[str, Any]:
    """A 2 x 8 torchrun job over ssh to gpu1, gpu2 (or ``hosts``)."""
    table = {"hosts": hosts if hosts is not None else ["gpu1", "gpu2"], **ssh}
    nnodes = len(table["hosts"]) or 2
    return {
        "job": {"name": "unit", "command": ["python", "train.py"]},
        "distributed": {
            "launcher": "torchrun",
            "backend": "ssh",
            "nnodes": nnodes,
            "nproc_per_node": 8,
            "accelerator": "nvidia",
            "master_port": 29400,
        },
        "ssh": table,
    }


def write_spec(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def compiled_of(compiler: Compiler, tmp_path: Path, data: dict[str, Any]) -> Compiled:
    return compiler.compile(write_spec(tmp_path, data))


def files(compiled: Compiled) -> dict[str, str]:
    return {a.path: a.data.decode() for a in compiled.tree}


def errors(compiler: Compiler, tmp_path: Path, data: dict[str, Any]) -> list[Diagnostic]:
    with pytest.raises(SpecError) as raised:
        compiler.compile(write_spec(tmp_path, data))
    return list(raised.value.diagnostics)


def located(found: tuple[Diagnostic, ...] | list[Diagnostic]) -> list[tuple[str, str]]:
    return [(d.code, d.location.pointer) for d in found]


# ---------------------------------------------------------------- output


def test_hostfile_lists_the_hosts_in_node_order(compiler: Compiler, tmp_path: Path) -> None:
    compiled = compiled_of(compiler, tmp_path, spec(["gpu2", "gpu1", "10.0.0.7", "gpu3"]))
    out = files(compiled)
    assert out["ssh/hostfile"] == "gpu2\ngpu1\n10.0.0.7\ngpu3\n"
    assert compiled.plan.hosts == ("gpu2", "gpu1", "10.0.0.7", "gpu3")
    assert "hosts=(gpu2 gpu1 10.0.0.7 gpu3)\n" in out["ssh/launch.sh"]
    assert "export MASTER_ADDR=gpu2\n" in out["ssh/launch.sh"]
    assert "export MASTER_PORT=29400\n" in out["ssh/launch.sh"]  # the spec's, as written
    assert {a.path: a.executable for a in compiled.tree}["ssh/launch.sh"]
    assert compiled.diagnostics == ()


def test_ssh_options_come_before_mdcs_own_so_they_win(compiler: Compiler, tmp_path: Path) -> None:
    data = spec(
        user="train",
        port=2222,
        master_addr="10.1.0.1",
        ssh_options=["BatchMode=no", "IdentityFile=/keys/id ed25519"],
    )
    out = files(compiled_of(compiler, tmp_path, data))["ssh/launch.sh"]
    assert (
        "ssh_command=(ssh -o BatchMode=no -o 'IdentityFile=/keys/id ed25519' "
        "-o BatchMode=yes -o LogLevel=ERROR -tt -p 2222 -l train)\n"
    ) in out
    assert "export MASTER_ADDR=10.1.0.1\n" in out


def test_remote_dir_replaces_the_local_path(compiler: Compiler, tmp_path: Path) -> None:
    default = files(compiled_of(compiler, tmp_path, spec()))["ssh/launch.sh"]
    assert 'dir="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"\n' in default
    given = files(compiled_of(compiler, tmp_path, spec(remote_dir="/shared/jobs/o'k")))
    assert "dir='/shared/jobs/o'\"'\"'k'\n" in given["ssh/launch.sh"]


# ---------------------------------------------------------------- checks


def test_hosts_must_name_every_node(compiler: Compiler, tmp_path: Path) -> None:
    data = spec(["gpu1"])
    data["distributed"]["nnodes"] = 3
    found = errors(compiler, tmp_path, data)
    assert located(found) == [("MDC430", "/ssh/hosts")]
    assert found[0].message == "[ssh] hosts names 1 host(s), but nnodes is 3"
    assert found[0].hint == 'list exactly 3 host(s), node 0 first: hosts = ["gpu1", "gpu2", "gpu3"]'


def test_the_ssh_table_is_needed(compiler: Compiler, tmp_path: Path) -> None:
    data = spec()
    del data["ssh"]
    assert located(errors(compiler, tmp_path, data)) == [("MDC430", "/distributed/backend")]
    data["ssh"] = {"user": "x"}  # hosts missing: the schema says so, once (no second MDC430)
    assert located(errors(compiler, tmp_path, data)) == [("MDC103", "/ssh")]


@pytest.mark.parametrize(
    "host", ["-oProxyCommand=touch x", "root@gpu1", "gpu 1", "gpu1;ls", "gpu1\n"]
)
def test_hosts_are_names_or_addresses(compiler: Compiler, tmp_path: Path, host: str) -> None:
    found = errors(compiler, tmp_path, spec(["gpu1", host]))
    assert located(found) == [("MDC431", "/ssh/hosts/1")]


@pytest.mark.parametrize("host", ["::1", "::ffff:10.0.0.7", "fe80::1%eth0", "gpu1", "10.0.0.7"])
def test_ipv6_addresses_are_hosts_as_ssh_reads_them(
    compiler: Compiler, tmp_path: Path, host: str
) -> None:
    """An address ssh itself takes as the host name (``ssh -G`` resolves nothing) is a host."""
    compiled = compiled_of(compiler, tmp_path, spec(["gpu0", host]))
    assert compiled.plan.hosts == ("gpu0", host)
    if shutil.which("ssh"):
        shown = subprocess.run(["ssh", "-G", host], capture_output=True, text=True, check=True)
        assert f"hostname {host}\n" in shown.stdout


def test_a_repeated_host_is_a_warning(compiler: Compiler, tmp_path: Path) -> None:
    compiled = compiled_of(compiler, tmp_path, spec(["gpu1", "gpu2", "gpu1"]))
    assert located(compiled.diagnostics) == [("MDC432", "/ssh/hosts/2")]
    assert "node 0 and node 2" in compiled.diagnostics[0].message


@pytest.mark.parametrize(
    ("table", "code", "pointer"),
    [
        ({"user": "-oProxyCommand=x"}, "MDC438", "/ssh/user"),
        ({"ssh_options": ["-v"]}, "MDC433", "/ssh/ssh_options/0"),
        ({"ssh_options": ["BatchMode"]}, "MDC433", "/ssh/ssh_options/0"),
        ({"remote_dir": "jobs/out"}, "MDC434", "/ssh/remote_dir"),
        ({"forward_env": ["PATH", "NODE_RANK"]}, "MDC435", "/ssh/forward_env/1"),
        ({"forward_env": ["MDC_OUT"]}, "MDC435", "/ssh/forward_env/0"),
        ({"forward_env": ["A-B"]}, "MDC106", "/ssh/forward_env/0"),
        ({"master_addr": "--x"}, "MDC437", "/ssh/master_addr"),
        ({"port": 0}, "MDC105", "/ssh/port"),
    ],
)
def test_table_values_are_checked(
    compiler: Compiler, tmp_path: Path, table: dict[str, Any], code: str, pointer: str
) -> None:
    assert located(errors(compiler, tmp_path, spec(**table))) == [(code, pointer)]


def test_a_loopback_master_other_hosts_cannot_reach_is_a_warning(
    compiler: Compiler, tmp_path: Path
) -> None:
    found = compiled_of(compiler, tmp_path, spec(["localhost", "gpu2"])).diagnostics
    assert located(found) == [("MDC437", "/ssh/hosts/0")]
    found = compiled_of(
        compiler, tmp_path, spec(["gpu1", "gpu2"], master_addr="127.0.0.1")
    ).diagnostics
    assert located(found) == [("MDC437", "/ssh/master_addr")]
    # every node on this machine: loopback is right
    assert compiled_of(compiler, tmp_path, spec(["127.0.0.1", "localhost"])).diagnostics == ()


def test_an_image_is_a_warning(compiler: Compiler, tmp_path: Path) -> None:
    data = spec()
    data["job"]["image"] = "nvcr.io/nvidia/pytorch:25.01-py3"
    assert located(compiled_of(compiler, tmp_path, data).diagnostics) == [("MDC436", "/job/image")]


# ---------------------------------------------------------------- launch.sh, stand-in ssh

FAKE_SSH = """#!/usr/bin/env bash
# Stand-in for ssh: options as the real client takes them, then HOST COMMAND, which a
# POSIX remote shell runs: here /bin/sh -c, with only HOME and PATH from this side.
args=("$@")
while (($#)); do
  case "$1" in
    -o|-p|-l) shift 2 ;;
    -tt) shift ;;
    -*) echo "fake ssh: unexpected option $1" >&2; exit 255 ;;
    *) break ;;
  esac
done
host="$1" command="$2"
printf '%s\\n' "${args[@]}" > "$FAKE_LOG/ssh-$host.args"
exec env -i HOME="$HOME" PATH="$PATH" FAKE_HOST="$host" ROLE_LOG="$ROLE_LOG" /bin/sh -c "$command"
"""


@pytest.fixture
def fake_ssh(tmp_path: Path) -> dict[str, str]:
    bin_dir, log = tmp_path / "fake-bin", tmp_path / "fake-log"
    bin_dir.mkdir()
    log.mkdir()
    (bin_dir / "ssh").write_text(FAKE_SSH, encoding="utf-8")
    (bin_dir / "ssh").chmod(0o755)
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "FORWARDED")
    }
    env.update(
        PATH=f"{bin_dir}{os.pathsep}{env['PATH']}", FAKE_LOG=str(log), ROLE_LOG=str(log / "roles")
    )
    return env


def roles_spec(hosts: list[str], **ssh: Any) -> dict[str, Any]:
    data = spec(hosts, **ssh)
    data["distributed"].update(launcher="roles", accelerator="cpu")
    return data


def role_log(tmp_path: Path) -> str:
    """What the roles recorded, in node-rank order."""
    files = (tmp_path / "fake-log").glob("roles.*")
    return "".join(f.read_text() for f in sorted(files, key=lambda f: int(f.suffix[1:])))


def run_launch(
    out: Path, env: dict[str, str], timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(out / "ssh" / "launch.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.mark.slow
def test_every_host_runs_its_role_with_its_rank(
    compiler: Compiler, tmp_path: Path, fake_ssh: dict[str, str]
) -> None:
    hosts = ["h0", "h1", "h2", "h3"]
    out = tmp_path / "out"
    emit.write_tree(out, compiled_of(compiler, tmp_path, roles_spec(hosts)).tree)
    done = run_launch(out, {**fake_ssh, "FORWARDED": "not forwarded"})
    assert done.returncode == 0, done.stderr
    lines = role_log(tmp_path).splitlines()
    # 4 nodes: max(1, 4 * 2 // 5) = 1 prefill node (node 0, also the router's), 3 decode
    assert lines == [
        f"{role} {node} h0:29400 h{node} {out} unset"
        for node, role in enumerate(["prefill", "decode", "decode", "decode"])
    ]
    args = (tmp_path / "fake-log" / "ssh-h2.args").read_text().splitlines()
    assert args[:6] == ["-o", "BatchMode=yes", "-o", "LogLevel=ERROR", "-tt", "h2"]
    command = re.fullmatch(
        re.escape(
            f"stty -onlcr 2>/dev/null; cd '{out}' && exec env NODE_RANK=2 "
            "'MASTER_ADDR=h0' MASTER_PORT=29400 'MDC_LAUNCH_ID="
        )
        + r"([^']+)"
        + re.escape("' 'NODE_HOSTS=h0 h1 h2 h3' bash 'launch/decode.sh'"),
        args[6],
    )
    assert command is not None, args[6]
    # one launch id, given to every host
    ids = {
        re.search(
            r"'MDC_LAUNCH_ID=([^']+)'", (tmp_path / "fake-log" / f"ssh-{h}.args").read_text()
        ).group(1)  # type: ignore[union-attr]
        for h in hosts
    }
    assert ids == {command.group(1)}


@pytest.mark.slow
def test_hostile_paths_and_values_survive_two_shells(
    compiler: Compiler, tmp_path: Path, fake_ssh: dict[str, str]
) -> None:
    canary = tmp_path / "canary"
    canary.mkdir()
    hostile = (
        f"$(touch {canary}/a)`touch {canary}/b`; touch {canary}/c ' \" \\ * '\"'\"' $HOME ü\nline"
    )
    out = tmp_path / f"out {hostile}".replace("\n", " ")
    emit.write_tree(
        out,
        compiled_of(
            compiler, tmp_path, roles_spec(["h0", "h1", "h2"], forward_env=["FORWARDED"])
        ).tree,
    )
    done = run_launch(out, {**fake_ssh, "FORWARDED": hostile})
    assert done.returncode == 0, done.stderr
    assert os.listdir(canary) == []
    text = role_log(tmp_path)
    for node in range(3):
        assert f" {node} h0:29400 h{node} {out} {hostile}\n" in text


@pytest.mark.slow
def test_the_first_failure_is_the_status_and_stops_the_others(
    compiler: Compiler, tmp_path: Path, fake_ssh: dict[str, str]
) -> None:
    data = roles_spec(["h0", "h1", "h2"], forward_env=["EXIT_STATUS", "SLEEP"])
    out = tmp_path / "out"
    compiled = compiled_of(compiler, tmp_path, data)
    emit.write_tree(out, compiled.tree)
    # node 1 exits 7 at once; the other nodes would sleep for 10 minutes
    for script in (out / "launch").iterdir():
        script.write_text(
            script.read_text().replace(
                "\nexec ", '\nif [[ "$NODE_RANK" != 1 ]]; then exec sleep 600; fi\nexec '
            )
        )
    started = time.monotonic()
    done = run_launch(out, {**fake_ssh, "EXIT_STATUS": "7"}, timeout=120)
    assert done.returncode == 7, done.stderr
    assert "mdc: a node exited with status 7; stopping the others" in done.stderr
    assert time.monotonic() - started < 60
