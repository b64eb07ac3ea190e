"""Process control for ``mdc rehearse``: every node in its own process group, stopped
together, and none of a rehearsal's processes left behind."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TextIO

import attrs

#: after the first node fails, how long the others get to finish and report
FAILURE_GRACE = 5.0
#: marks every process of one rehearsal, so that none is left behind
TOKEN = "MDC_REHEARSE_TOKEN"


@attrs.frozen(kw_only=True)
class Node:
    index: int
    host: str
    role: str
    argv: tuple[str, ...]
    env: Mapping[str, str]
    log: Path


def processes_with(name: str, value: str) -> list[int]:
    """Live processes other than this one whose environment holds ``name=value`` (a token a
    run gives every process it starts, however deep, and that a test looks for too)."""
    needle = f"{name}={value}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


class Progress:
    """``rehearse: 3/8 ranks up``: rewritten in place on a terminal, once otherwise."""

    def __init__(self, stream: TextIO, total: int, what: str) -> None:
        self.stream, self.total, self.what = stream, total, what
        self.tty = stream.isatty()
        self.shown = -1

    def update(self, up: int, seconds: float) -> None:
        if up == self.shown:
            return
        self.shown = up
        line = f"rehearse: {up}/{self.total} {self.what} up ({seconds:.1f} s)"
        if self.tty:
            self.stream.write("\r" + line + ("\n" if up >= self.total else ""))
            self.stream.flush()
        elif up >= self.total:
            print(line, file=self.stream)

    def finish(self) -> None:
        if self.tty and 0 <= self.shown < self.total:
            self.stream.write("\n")


def run_nodes(
    nodes: list[Node],
    *,
    cwd: Path,
    token: str,
    timeout: float,
    count_up: Callable[[], int],
    progress: Progress,
) -> tuple[dict[int, int | None], bool, float]:
    """Start every node in its own process group; stop them all on timeout or failure."""
    started = time.monotonic()
    procs: dict[int, Any] = {}
    import subprocess

    try:
        for node in nodes:
            with node.log.open("wb") as log:
                procs[node.index] = subprocess.Popen(
                    list(node.argv),
                    env=dict(node.env),
                    cwd=cwd,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
        failed_at: float | None = None
        timed_out = False
        while True:
            now = time.monotonic()
            progress.update(count_up(), now - started)
            codes = {i: p.poll() for i, p in procs.items()}
            if all(c is not None for c in codes.values()):
                break
            if failed_at is None and any(c not in (None, 0) for c in codes.values()):
                failed_at = now
            if failed_at is not None and now - failed_at > FAILURE_GRACE:
                break
            if now - started > timeout:
                timed_out = True
                break
            time.sleep(0.1)
    finally:
        _stop(procs, token)
        progress.finish()
    return {i: p.poll() for i, p in procs.items()}, timed_out, time.monotonic() - started


def _stop(procs: dict[int, Any], token: str) -> None:
    """TERM every node's process group still running, then KILL what remains of the run."""
    for proc in procs.values():
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline and (
        any(p.poll() is None for p in procs.values()) or processes_with(TOKEN, token)
    ):
        time.sleep(0.1)
    for pid in processes_with(TOKEN, token):  # torchrun's workers live in sessions of their own
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for proc in procs.values():
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
