"""The loop that watches a node's processes (``mdc.api.shell.wait_for_first_failure``), run by
bash in both scripts that use it: the disaggregated serving launchers' node script
(``_supervise.py``) and the backends' ``supervise`` (local/run.sh, ssh/launch.sh, the basic
launcher's spawn.sh).

Each case's body starts real processes in the background, as those scripts do, and the
script must end as the node should: with the first failure's own status (the others
stopped), or 0 when all have ended well.

The lost status: bash drops a background job killed by a signal from its jobs table when it
reports it (bash 5.2's ``notify_of_job_status``, called after a foreground command and when
``wait -n`` returns another job), and no later ``wait -n`` returns it. A loop that counts on
``wait -n`` alone then waited for the others and ended with 127 ("no child left").
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from mdc.api.shell import supervise
from mdc_builtin.launchers._supervise import supervising_script


def backend_script(body: str) -> str:
    """The backends' script around ``body``: ``supervise`` with the body as its start lines."""
    lines = supervise(body.splitlines(), children="process", failed="a process", owner="node")
    return "\n".join(["#!/usr/bin/env bash", "set -euo pipefail", *lines]) + "\n"


def node_script(body: str) -> str:
    return supervising_script("# a test node", body)


#: how each script says that a process failed with status N (the node script says nothing)
SAYS: dict[Callable[[str], str], str] = {
    node_script: "",
    backend_script: "mdc: a process exited with status {}; stopping the others",
}


@pytest.fixture(params=[node_script, backend_script], ids=["node_script", "supervise"])
def script_of(request: pytest.FixtureRequest) -> Callable[[str], str]:
    return request.param  # type: ignore[no-any-return]


def started(*commands: str) -> str:
    """Body lines that start each command in the background, as a launcher's body does."""
    return "\n".join(f'{command} &\npids+=("$!")' for command in commands)


def run(
    body: str, tmp_path: Path, script_of: Callable[[str], str] = node_script, timeout: float = 20
) -> tuple[int, float, str]:
    """The script's exit status, how long it ran and what it wrote on stderr."""
    script = tmp_path / "node.sh"
    script.write_text(script_of(body), encoding="utf-8")
    began = time.monotonic()
    done = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=timeout)
    return done.returncode, time.monotonic() - began, done.stderr


def sleeper(pid_file: Path) -> str:
    """A process that writes its pid, then runs a minute unless stopped."""
    return f"sh -c 'echo $$ > {pid_file}; exec sleep 60'"


def after(pid_file: Path, command: str) -> str:
    """``command`` once the sleeper has written its pid (so it runs, and can be stopped)."""
    return f"sh -c 'until [ -s {pid_file} ]; do sleep 0.01; done; {command}'"


def assert_stopped(pid_file: Path) -> None:
    """The process whose pid the file holds stops (gone, or a zombie) within 5 s of the
    script's end: the EXIT trap's TERM is sent, not waited for."""
    status = Path(f"/proc/{int(pid_file.read_text())}/status")
    deadline = time.monotonic() + 5
    while True:
        try:
            state = status.read_text(encoding="utf-8")
        except FileNotFoundError:
            state = "State:\tX"
        if "\nState:\tZ" in state or "State:\tX" in state or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert "\nState:\tZ" in state or "State:\tX" in state, state.splitlines()[:3]


def assert_failed(
    script_of: Callable[[str], str], ran: tuple[int, float, str], code: int, within: float
) -> None:
    """The script ended with ``code`` within ``within`` seconds, saying so as it does."""
    status, took, stderr = ran
    assert (status, took < within) == (code, True), (took, stderr)
    assert SAYS[script_of].format(code) in stderr


@pytest.mark.slow
@pytest.mark.parametrize("others", [("true",), ()], ids=["another-ends", "none-other-ends"])
def test_a_process_killed_while_bash_is_busy_fails_the_node_at_once(
    tmp_path: Path, script_of: Callable[[str], str], others: tuple[str, ...]
) -> None:
    """Killed during a foreground command (trtllm's body runs mktemp after its servers):
    bash reports it then and drops it; the node still ends at once with its 137. With no
    other process to end, the first wait -n would wait for the sleeper (a minute): the
    ended ones are looked for before it too."""
    pid_file = tmp_path / "sleeper"
    body = started(*others, after(pid_file, "kill -9 $$"), sleeper(pid_file))
    assert_failed(script_of, run(body + "\nsleep 1", tmp_path, script_of), 137, 10)
    assert_stopped(pid_file)


@pytest.mark.slow
def test_a_process_killed_while_another_is_returned_fails_the_node(
    tmp_path: Path, script_of: Callable[[str], str]
) -> None:
    """Both ended before the loop (no foreground command: a builtin loop keeps bash busy):
    wait -n returns the first, and bash drops the killed one then."""
    pid_file = tmp_path / "sleeper"
    body = started("true", after(pid_file, "kill -9 $$"), sleeper(pid_file))
    busy = "\nSECONDS=0\nwhile ((SECONDS < 2)); do :; done"
    assert_failed(script_of, run(body + busy, tmp_path, script_of), 137, 12)
    assert_stopped(pid_file)


@pytest.mark.slow
def test_the_first_failure_is_the_nodes_status(
    tmp_path: Path, script_of: Callable[[str], str]
) -> None:
    """A process that exits 3 (or 127, a command not found) stops the one still running."""
    for code in (3, 127):
        pid_file = tmp_path / f"sleeper-{code}"
        body = started(sleeper(pid_file), after(pid_file, f"exit {code}"))
        assert_failed(script_of, run(body, tmp_path, script_of), code, 10)
        assert_stopped(pid_file)


def test_processes_that_all_end_well_end_the_node_with_0(
    tmp_path: Path, script_of: Callable[[str], str]
) -> None:
    assert run(started("true", "sh -c 'exit 0'", "true"), tmp_path, script_of)[:3:2] == (0, "")
    assert run("", tmp_path, script_of)[:3:2] == (0, "")  # a node with no process of its own
