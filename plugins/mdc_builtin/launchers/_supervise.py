"""The script the disaggregated serving launchers share: a node's processes started in the
background and supervised together.

A node's part ends when one of its processes fails (the others are then stopped, through the
EXIT trap) or when all have ended; TERM and INT from the backend stop them all too.

The wait itself is :func:`mdc.api.shell.wait_for_first_failure`, the backends' loop too.
"""

from __future__ import annotations

from mdc.api.shell import wait_for_first_failure

#: bash lines that wait for the processes in ``pids`` until one fails (its status is the
#: script's) or all have ended (0); ``pids`` keeps the running ones, so the EXIT trap stops
#: only those.
WAIT_FOR_FIRST_FAILURE = "\n".join(
    [
        "# until one fails (its status is the node's) or all have ended",
        *wait_for_first_failure(),
        'exit "$status"',
        "",
    ]
)


def leaving_traps(leaving: tuple[str, str] | None = None) -> list[str]:
    """Bash lines: the empty ``pids`` and the traps that stop what it holds when the script
    leaves. ``leaving``: what else the script does then, in words and as a command."""
    why, also = (f", {leaving[0]}", f"; {leaving[1]}") if leaving else ("", "")
    return [
        "pids=()",
        f"# leaving (a process failed, or TERM/INT from the backend): stop the others{why}",
        f"trap 'if ((${{#pids[@]}})); then kill \"${{pids[@]}}\" 2>/dev/null || true; fi{also}' EXIT",
        "trap 'exit 143' TERM",
        "trap 'exit 130' INT",
    ]


def supervising_script(comment: str, body: str, leaving: tuple[str, str] | None = None) -> str:
    """The bash script: ``comment`` (its lines, already ``# ``-prefixed) under the shebang,
    then ``body``, which starts each process with ``... &`` and ``pids+=("$!")``.
    ``leaving``: what else the script does when it leaves, in words and as a command."""
    head = "\n".join(["#!/usr/bin/env bash", comment, "set -euo pipefail", *leaving_traps(leaving)])
    return f"{head}\n{body}\n{WAIT_FOR_FIRST_FAILURE}"
