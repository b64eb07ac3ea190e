"""Compiled jobs really run over ssh: ssh/launch.sh against a real sshd on this machine.

A module fixture starts OpenSSH's sshd on a free port of 127.0.0.1, with a
host key, a client key and known_hosts made for the occasion (installing
openssh-server with apt when it is missing), and stops exactly that sshd at
the end. The two "hosts" are ``127.0.0.1`` and ``localhost``: two names, one
machine, as two nodes on loopback. Every process a job starts gets a token
through ``[ssh] forward_env``, so processes left behind on the "remote" side
are found. Without root, or without sshd and apt-get, the tests skip and say
why.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
from tests.tools import REPO

from mdc.rehearse.process import processes_with

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("loopback")]

Compile = Callable[..., dict[str, Any]]
VENV_BIN = Path(sys.executable).parent
TOKEN_VARIABLE = "MDC_TEST_RUN_TOKEN"
SSHD = Path("/usr/sbin/sshd")
SSH = "/usr/bin/ssh"


@attrs.frozen
class Sshd:
    port: int
    identity: Path
    known_hosts: Path
    remote_home: Path

    def options(self) -> list[str]:
        """[ssh] ssh_options that reach this sshd with its own keys only."""
        return [
            f"IdentityFile={self.identity}",
            "IdentitiesOnly=yes",
            f"UserKnownHostsFile={self.known_hosts}",
            "GlobalKnownHostsFile=/dev/null",
            "StrictHostKeyChecking=yes",
            "ConnectTimeout=10",
        ]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _install_openssh() -> None:
    policy = Path("/usr/sbin/policy-rc.d")
    made = not policy.exists()
    if made:  # the package would start a system-wide sshd on port 22
        policy.write_text("#!/bin/sh\nexit 101\n", encoding="utf-8")
        policy.chmod(0o755)
    try:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        done = subprocess.run(
            [
                "apt-get",
                "install",
                "-y",
                "-qq",
                "--no-install-recommends",
                "openssh-server",
                "openssh-client",
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        if done.returncode != 0:
            subprocess.run(
                ["apt-get", "update", "-qq"], env=env, capture_output=True, timeout=600, check=False
            )
            done = subprocess.run(
                [
                    "apt-get",
                    "install",
                    "-y",
                    "-qq",
                    "--no-install-recommends",
                    "openssh-server",
                    "openssh-client",
                ],
                env=env,
                capture_output=True,
                text=True,
                timeout=600,
                check=False,
            )
        assert done.returncode == 0, f"apt-get install openssh-server failed:\n{done.stderr}"
    finally:
        if made:
            policy.unlink()


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    if os.geteuid() != 0:
        pytest.skip("the ssh tests start an sshd on this machine and log in as root: need root")
    if not (SSHD.is_file() and Path(SSH).is_file()):
        if shutil.which("apt-get") is None:
            pytest.skip(
                "sshd and ssh are not installed and there is no apt-get to install openssh-server"
            )
        _install_openssh()
    home = tmp_path_factory.mktemp("sshd")
    for key in ("host_key", "client_key"):
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(home / key)],
            check=True,
            capture_output=True,
            timeout=60,
        )
    shutil.copy(home / "client_key.pub", home / "authorized_keys")
    port = _free_port()
    host_key = (home / "host_key.pub").read_text(encoding="utf-8").strip()
    (home / "known_hosts").write_text(
        "".join(f"[{name}]:{port} {host_key}\n" for name in ("127.0.0.1", "localhost")),
        encoding="utf-8",
    )
    # The remote shells get a home of their own: sshd's bash reads ~/.bashrc, and this
    # machine's (pyenv init, which rehashes under a lock) can stall a login for a minute
    # and print through the node's terminal; the job's PATH comes through forward_env.
    remote_home = home / "remote-home"
    remote_home.mkdir()
    config = home / "sshd_config"
    config.write_text(
        "\n".join(
            [
                f"Port {port}",
                "ListenAddress 127.0.0.1",
                f"HostKey {home}/host_key",
                f"AuthorizedKeysFile {home}/authorized_keys",
                "PubkeyAuthentication yes",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "PermitRootLogin prohibit-password",
                "StrictModes no",
                "UsePAM no",
                f"PidFile {home}/sshd.pid",
                "PrintMotd no",
                "LogLevel ERROR",
                "MaxStartups 64",
                f"SetEnv HOME={remote_home}",
            ]
        )
        + "\n",
        encoding="utf-8",
    )
    # sshd refuses a connection without its privilege separation dir; it stays after the
    # run: another sshd (another pytest worker's, or the system's) may be using it
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    checked = subprocess.run(
        [str(SSHD), "-t", "-f", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert checked.returncode == 0, f"sshd -t refused the config:\n{checked.stderr}"
    log = (home / "sshd.log").open("wb")
    server = subprocess.Popen(
        [str(SSHD), "-D", "-e", "-f", str(config)],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(
                        f"sshd did not listen on 127.0.0.1:{port}:\n"
                        f"{(home / 'sshd.log').read_text(errors='replace')}"
                    )
                time.sleep(0.1)
        yield Sshd(
            port=port,
            identity=home / "client_key",
            known_hosts=home / "known_hosts",
            remote_home=remote_home,
        )
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=20)
        log.close()


# ---------------------------------------------------------------- running launch.sh


def _processes_with(token: str) -> list[int]:
    return processes_with(TOKEN_VARIABLE, token)


def leftovers(token: str, grace: float = 10.0) -> list[str]:
    deadline = time.monotonic() + grace
    while (pids := _processes_with(token)) and time.monotonic() < deadline:
        time.sleep(0.2)
    lines = []
    for pid in pids:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
            lines.append(f"{pid}: {cmdline.decode(errors='replace').strip()}")
        except OSError:
            continue
    return lines


@pytest.fixture
def token() -> Iterator[str]:
    value = uuid.uuid4().hex
    yield value
    for pid in _processes_with(value):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


#: what the "remote" nodes get from the test's environment; TORCH_EXTENSIONS_DIR (set by
#: scripts/test) so DeepSpeed's ranks over ssh load the CPU kernel the local runs built
FORWARDED = [
    "PATH",
    "PROBE_DIR",
    "TMPDIR",
    "PYTHONUNBUFFERED",
    "TORCH_EXTENSIONS_DIR",
    TOKEN_VARIABLE,
]


def ssh_job(sshd: Sshd, name: str, command: list[str], port: int, **tables: Any) -> dict[str, Any]:
    return {
        "job": {"name": name, "command": command, "env": {"GLOO_SOCKET_IFNAME": "lo"}},
        "distributed": {
            "launcher": "torchrun",
            "backend": "ssh",
            "nnodes": 2,
            "nproc_per_node": 2,
            "accelerator": "cpu",
            "master_port": port,
        },
        "torchrun": {"rdzv_backend": "static"},
        "ssh": {
            "hosts": ["127.0.0.1", "localhost"],
            "port": sshd.port,
            "user": "root",
            "ssh_options": sshd.options(),
            "forward_env": FORWARDED,
        },
        **tables,
    }


def launch_env(tmp_path: Path, token: str, **extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PET_", "TORCHELASTIC_"))
        and k not in ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "RANK", "WORLD_SIZE", "LOCAL_RANK")
    }
    scratch = tmp_path / "tmp"
    scratch.mkdir(exist_ok=True)
    env.update(
        PATH=f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}",
        PYTHONUNBUFFERED="1",
        TMPDIR=str(scratch),
        **{TOKEN_VARIABLE: token},
        **extra,
    )
    return env


def start(out: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        ["bash", str(out / "ssh" / "launch.sh")],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )


def finish(proc: subprocess.Popen[bytes], token: str, timeout: float = 240) -> tuple[int, str, str]:
    # a guard against a hang, not a speed check: generous for a loaded machine
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        # launch.sh may end between the timeout and the kill: never leave proc unreaped
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        for pid in _processes_with(token):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        pytest.fail(
            f"launch.sh did not finish within {timeout} s:\n"
            f"{stdout.decode(errors='replace')[-4000:]}"
            f"{stderr.decode(errors='replace')[-4000:]}"
        )
    return proc.returncode, stdout.decode(errors="replace"), stderr.decode(errors="replace")


def needs_torch() -> None:
    """The job's workers import torch (from this venv); the test process does not."""
    if importlib.util.find_spec("torch") is None:
        pytest.skip(
            "real runs need torch==2.13.0: run scripts/test, or pip install "
            "torch==2.13.0 into the venv"
        )


PROBE = """\
import json, os
from pathlib import Path
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
total = torch.tensor([float(rank)])
dist.all_reduce(total)
report = {name: os.environ.get(name) for name in (
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "GROUP_RANK", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT",
    "SSH_CONNECTION", "SSH_TTY", "HOME")}
report.update(dist_rank=rank, allreduce=total.item())
Path(os.environ["PROBE_DIR"], f"rank-{rank}.json").write_text(json.dumps(report))
print(f"probe rank {rank} done", flush=True)
dist.barrier()
dist.destroy_process_group()
os._exit(0)  # torch 2.13's gloo can abort in interpreter finalization (see examples/ddp_check.py)
"""


@pytest.mark.torch
def test_torchrun_2x2_over_ssh(
    sshd: Sshd, compile_spec: Compile, tmp_path: Path, token: str
) -> None:
    needs_torch()
    probe, probes = tmp_path / "probe.py", tmp_path / "probes"
    probe.write_text(PROBE, encoding="utf-8")
    probes.mkdir()
    spec = tmp_path / "spec.json"
    spec.write_text(
        json.dumps(ssh_job(sshd, "ssh-2x2", ["python", str(probe)], 29821)), encoding="utf-8"
    )
    out = tmp_path / "out"
    plan = compile_spec(spec, out)
    assert (out / "ssh" / "hostfile").read_text() == "127.0.0.1\nlocalhost\n"

    code, stdout, stderr = finish(
        start(out, launch_env(tmp_path, token, PROBE_DIR=str(probes))), token
    )
    assert code == 0, f"launch.sh exited {code}:\n{stdout[-4000:]}{stderr[-4000:]}"
    assert not leftovers(token), "processes left behind after a successful run"
    assert "\r" not in stdout, "the remote terminal's CR LF line ends reached the output"
    # two processes of one node share a terminal: their lines may run into each other
    assert sorted(re.findall(r"probe rank \d+ done", stdout)) == [
        f"probe rank {r} done" for r in range(4)
    ]
    world, nproc = plan["world_size"], plan["nproc_per_node"]
    found = {int(r["RANK"]): r for r in (json.loads(p.read_text()) for p in probes.iterdir())}
    assert sorted(found) == list(range(world))
    for rank, report in found.items():
        node = int(report["NODE_RANK"])
        assert report["SSH_CONNECTION"], "the node did not run through sshd"
        assert report["SSH_TTY"], "ssh -tt gave the node no terminal"
        assert report["HOME"] == str(sshd.remote_home), "the node's shell read root's own rc"
        assert int(report["GROUP_RANK"]) == node
        assert rank == report["dist_rank"] == node * nproc + int(report["LOCAL_RANK"])
        assert report["WORLD_SIZE"] == str(world)
        assert (report["MASTER_ADDR"], report["MASTER_PORT"]) == ("127.0.0.1", "29821")
        assert report["allreduce"] == world * (world - 1) / 2


FAIL_ON_NODE_1 = """\
import os, sys, time
print(f"worker rank {os.environ['RANK']} up", flush=True)
if os.environ["GROUP_RANK"] == "1":
    print("node 1 fails on purpose", flush=True)
    sys.exit(3)
time.sleep(600)  # node 0 would wait ten minutes unless launch.sh stops it
"""


@pytest.mark.torch
def test_a_failing_node_stops_the_others_over_ssh(
    sshd: Sshd, compile_spec: Compile, tmp_path: Path, token: str
) -> None:
    needs_torch()
    program = tmp_path / "fail.py"
    program.write_text(FAIL_ON_NODE_1, encoding="utf-8")
    spec = tmp_path / "spec.json"
    spec.write_text(
        json.dumps(ssh_job(sshd, "ssh-fail", ["python", str(program)], 29822)), encoding="utf-8"
    )
    out = tmp_path / "out"
    compile_spec(spec, out)
    started = time.monotonic()
    code, stdout, stderr = finish(start(out, launch_env(tmp_path, token)), token, timeout=150)
    seconds = time.monotonic() - started
    assert code != 0, f"launch.sh exited 0 though node 1 failed:\n{stdout}{stderr}"
    assert "node 1 fails on purpose" in stdout, stdout[-4000:]
    assert f"mdc: a node exited with status {code}; stopping the others" in stderr, stderr
    assert seconds < 90, f"launch.sh took {seconds:.0f} s to give up after a node failed"
    left = leftovers(token)
    assert not left, "remote processes left behind:\n" + "\n".join(left)


@pytest.mark.torch
def test_terminating_launch_sh_ends_the_remote_nodes(
    sshd: Sshd, compile_spec: Compile, tmp_path: Path, token: str
) -> None:
    """Why ssh -tt: the remote side has a terminal, so when launch.sh stops its ssh
    clients, sshd hangs it up and the remote torchrun and its workers get SIGHUP."""
    needs_torch()
    program = tmp_path / "sleep.py"
    program.write_text(
        "import os, time\nprint(f\"worker {os.environ['RANK']} up\", "
        "flush=True)\ntime.sleep(600)\n",
        encoding="utf-8",
    )
    spec = tmp_path / "spec.json"
    spec.write_text(
        json.dumps(ssh_job(sshd, "ssh-term", ["python", str(program)], 29823)), encoding="utf-8"
    )
    out = tmp_path / "out"
    compile_spec(spec, out)
    proc = start(out, launch_env(tmp_path, token))
    deadline = time.monotonic() + 120
    # launch.sh, 2 ssh clients, and on the remote side 2 torchrun agents with 2 workers each
    while len(_processes_with(token)) < 9 and time.monotonic() < deadline:
        time.sleep(0.5)
    time.sleep(2)
    os.kill(proc.pid, signal.SIGTERM)
    code, stdout, stderr = finish(proc, token, timeout=120)
    assert code == 143, f"launch.sh exited {code} on TERM:\n{stdout[-3000:]}{stderr[-3000:]}"
    left = leftovers(token, grace=30)
    assert not left, "remote processes outlived their ssh client:\n" + "\n".join(left)


STUB_TORCHRUN = """\
#!{python}
# Not torchrun: records how it was started, one JSON file per node.
import json, os, sys
from pathlib import Path
Path(os.environ["STUB_CAPTURE_DIR"], "node-" + os.environ["NODE_RANK"] + ".json").write_text(
    json.dumps({{"argv": sys.argv[1:], "cwd": os.getcwd(),
                "env": {{k: os.environ.get(k) for k in {names!r}}}}}, ensure_ascii=False))
"""


def test_hostile_strings_survive_both_shells(
    sshd: Sshd, compile_spec: Compile, tmp_path: Path, token: str
) -> None:
    """The tree's path, [job] values and a forwarded variable full of shell syntax reach the
    remote torchrun verbatim, through launch.sh's quoting and the remote login shell's."""
    canary = tmp_path / "canary"
    canary.mkdir()
    hostile = (
        f"$(touch {canary}/a)`touch {canary}/b`; touch {canary}/c ' \" \\ * ~ "
        f"'\"'\"' $HOME ü ✓ %s\nsecond line"
    )
    stub_bin, capture = tmp_path / "stub-bin", tmp_path / "capture"
    stub_bin.mkdir()
    capture.mkdir()
    names = ["HOSTILE", "FORWARDED", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT"]
    stub = stub_bin / "torchrun"
    stub.write_text(STUB_TORCHRUN.format(python=sys.executable, names=names), encoding="utf-8")
    stub.chmod(0o755)
    data = ssh_job(sshd, "ssh-hostile", ["python", "train.py", hostile, "--", ""], 29824)
    data["job"]["env"] = {"HOSTILE": hostile}
    data["ssh"]["forward_env"] = ["PATH", "FORWARDED", "STUB_CAPTURE_DIR", TOKEN_VARIABLE]
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    out = tmp_path / f"out {hostile}".replace("\n", " ")
    compile_spec(spec, out)

    env = launch_env(tmp_path, token, FORWARDED=hostile, STUB_CAPTURE_DIR=str(capture))
    env["PATH"] = f"{stub_bin}{os.pathsep}{env['PATH']}"
    code, stdout, stderr = finish(start(out, env), token)
    assert code == 0, f"launch.sh exited {code}:\n{stdout}{stderr}"
    assert os.listdir(canary) == [], "a command hidden in a value ran"
    for node in (0, 1):
        record = json.loads((capture / f"node-{node}.json").read_text(encoding="utf-8"))
        assert record["argv"][-4:] == ["train.py", hostile, "--", ""]
        assert record["cwd"] == str(out)
        assert record["env"] == {
            "HOSTILE": hostile,
            "FORWARDED": hostile,
            "NODE_RANK": str(node),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": "29824",
        }


@pytest.mark.torch
def test_deepspeed_runner_over_ssh(
    sshd: Sshd, compile_spec: Compile, tmp_path: Path, token: str
) -> None:
    """The ssh backend names its hosts, so the deepspeed launcher writes them to
    launch/hostfile and each node runs ``deepspeed --no_ssh`` with its node rank. The probe
    checks DeepSpeed's variables and --deepspeed_config, and DeepSpeed starts on gloo."""
    needs_torch()
    probes = tmp_path / "probes"
    probes.mkdir()
    probe = REPO / "tests" / "integration" / "slurm" / "deepspeed_probe.py"
    data = ssh_job(sshd, "ssh-deepspeed", ["python", str(probe)], 29825)
    data["distributed"]["launcher"] = "deepspeed"
    del data["torchrun"]
    data["batch"] = {"global_batch_size": 16, "micro_batch_size": 2}
    data["ssh"]["forward_env"] = [*FORWARDED, "PROBE_PLAN"]
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(data), encoding="utf-8")
    out = tmp_path / "out"
    plan = compile_spec(spec, out)
    hostfile = (out / "launch" / "hostfile").read_text(encoding="utf-8")
    assert [line for line in hostfile.splitlines() if not line.startswith("#")] == [
        "127.0.0.1 slots=2",
        "localhost slots=2",
    ]
    assert "exec deepspeed " in (out / "launch" / "worker.sh").read_text(encoding="utf-8")

    env = launch_env(tmp_path, token, PROBE_DIR=str(probes), PROBE_PLAN=str(out / "plan.json"))
    code, stdout, stderr = finish(start(out, env), token, timeout=300)
    assert code == 0, f"launch.sh exited {code}:\n{stdout[-6000:]}{stderr[-3000:]}"
    assert not leftovers(token), "processes left behind after a successful run"
    found = [json.loads(p.read_text()) for p in sorted(probes.iterdir())]
    assert sorted(r["rank"] for r in found) == list(range(plan["world_size"]))
    for report in found:
        assert report["problems"] == [], report
        assert report["env"]["CROSS_RANK"] == report["env"]["NODE_RANK"]


@pytest.mark.parametrize("fail", [False, True], ids=["ok", "a-node-fails"])
def test_setup_and_teardown_run_around_the_nodes(
    sshd: Sshd, compile_spec: Compile, tmp_path: Path, token: str, fail: bool
) -> None:
    """[ssh] setup runs here before any node starts; teardown when launch.sh exits, also
    after a node failed, and the job keeps the node's status."""
    log, marks = tmp_path / "steps.log", tmp_path / "marks"
    marks.mkdir()
    node = f'touch {marks}/node-"$NODE_RANK"' + (
        '; [[ "$NODE_RANK" != 1 ]] || exit 3' if fail else ""
    )
    data = ssh_job(sshd, "ssh-steps", ["bash", "-c", node], 29829)
    data["distributed"].update(launcher="basic", nproc_per_node=1)
    del data["torchrun"]
    data["ssh"]["setup"] = [["bash", "-c", f"echo setup $(ls {marks} | wc -l) >> {log}"]]
    data["ssh"]["teardown"] = [
        ["false"],
        ["bash", "-c", f"echo teardown $(ls {marks} | wc -l) >> {log}"],
    ]
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(data), encoding="utf-8")
    out = tmp_path / "out"
    compile_spec(spec, out)
    code, stdout, stderr = finish(start(out, launch_env(tmp_path, token)), token)
    assert code == (3 if fail else 0), f"{stdout[-4000:]}{stderr[-4000:]}"
    assert log.read_text().splitlines()[0] == "setup 0"
    assert log.read_text().splitlines()[1].startswith("teardown")
    assert "mdc: [ssh] teardown command 1 exited with status 1" in stderr, stderr
    if not fail:
        assert log.read_text().splitlines() == ["setup 0", "teardown 2"]
