"""Helpers for plugins: run-time words as bash, and the script lines mdc's own backends use.

Not part of the contract (:mod:`mdc.api`): launchers and backends may use them, so that
every script mdc writes quotes, supervises and derives its port the same way.
"""

from __future__ import annotations

import functools
import shlex
from collections.abc import Iterable, Sequence

from mdc.api import LAUNCH_ID, MASTER_ADDR, MASTER_PORT, OUT_DIR, Concat, Ref, Word
from mdc.runtime import PORT_RANGE


def out_file(path: str) -> Concat:
    """The run-time path of ``path`` (relative to ``out/``), e.g. a launcher config file."""
    return Concat((OUT_DIR, "/" + path))


def _in_double_quotes(text: str) -> str:
    for special in ("\\", '"', "$", "`"):
        text = text.replace(special, "\\" + special)
    return text


def shell_word(word: Word) -> str:
    """One shell word: literals quoted, runtime variables expanded (inside double quotes)."""
    if isinstance(word, str):
        return _quoted(word)
    parts = word.parts if isinstance(word, Concat) else (word,)
    inner = "".join(f"${{{p.name}}}" if isinstance(p, Ref) else _in_double_quotes(p) for p in parts)
    return f'"{inner}"'


# Launchers and backends quote the same few words (flags, numbers, paths) for every role
# and every spec.
_quoted = functools.lru_cache(maxsize=4096)(shlex.quote)


def refs_in(words: Iterable[Word]) -> list[str]:
    """Names of the runtime variables the words read, in first-use order."""
    names: list[str] = []
    for word in words:
        parts = word.parts if isinstance(word, Concat) else (word,)
        names += [p.name for p in parts if isinstance(p, Ref) and p.name not in names]
    return names


def shell_join(words: Iterable[Word]) -> str:
    return " ".join(shell_word(w) for w in words)


def supervise(start: list[str], *, children: str, failed: str, owner: str) -> list[str]:
    """Bash lines that run ``start`` and watch what it starts, as one unit.

    Each line of ``start`` starts children in the background and appends each
    ``$!`` to the array ``pids``. The first child to fail stops the others, and
    its exit status becomes ``owner``'s; INT and TERM stop every child and wait
    for it, then exit 130 and 143. ``children`` names them in comments ("node",
    "process"); ``failed`` is the subject of the failure message ("a node").
    """
    return [
        "pids=()",
        'stop() { if ((${#pids[@]})); then kill "${pids[@]}" 2>/dev/null || true; fi; }',
        f"# On Ctrl-C or TERM, stop every {children} and wait for it before exiting.",
        "trap 'stop; wait || true; exit 130' INT",
        "trap 'stop; wait || true; exit 143' TERM",
        *start,
        f"# The first {children} to fail stops the others; its status is the {owner}'s.",
        *wait_for_first_failure(),
        "if ((status != 0)); then",
        f'  echo "mdc: {failed} exited with status $status; stopping the others" >&2',
        "  stop",
        "  wait || true",
        '  exit "$status"',
        "fi",
    ]


def wait_for_first_failure() -> list[str]:
    """Bash lines that wait for the processes in the array ``pids`` until one fails or all
    have ended, leaving its status (or 0) in ``status`` and the ones still running in
    ``pids``.

    Each ended process's status is read by its pid (``wait PID``), before every ``wait -n``
    and after it: bash (4.4, 5.1 and 5.2 alike) can drop a process killed by a signal from its
    jobs table unreported (when it runs a command in the foreground, or when ``wait -n`` returns
    another's status, while that one lies dead), and then no ``wait -n`` returns it: the
    loop would wait on for the others and, once they ended, read 127 ("no child left").
    ``wait PID`` reads the status bash keeps for that pid whatever its jobs table says.
    """
    return [
        "# each ended one's status read by its pid, before and after every wait -n, as bash",
        "# can drop one killed by a signal unreported (and wait -n then never returns it)",
        "status=0",
        "waited=0",
        "while ((${#pids[@]})); do",
        "  running=()",
        '  for pid in "${pids[@]}"; do',
        '    if kill -0 "$pid" 2>/dev/null; then',
        '      running+=("$pid")',
        "    else",
        '      wait "$pid" || status=$?',
        "    fi",
        "  done",
        "  # all ended; or wait -n found no child and none ended (what kill -0 finds is not ours)",
        "  if ((${#running[@]} == 0)) || ((waited == 127 && ${#running[@]} == ${#pids[@]})); then",
        "    pids=()",
        "  else",
        '    pids=("${running[@]}")',
        "  fi",
        "  if ((status != 0 || ${#pids[@]} == 0)); then",
        "    break",
        "  fi",
        "  waited=0",
        "  wait -n || waited=$?",
        "done",
    ]


def around_launch(
    setup: Sequence[Sequence[str]], teardown: Sequence[Sequence[str]], table: str
) -> list[str]:
    """Bash lines that run ``setup`` commands now and ``teardown`` commands when the script
    exits, however it ends (a failure, Ctrl-C), keeping the script's exit status.

    Each command is an argv list, every word quoted. A failing setup command stops the
    script (``set -e``); a failing teardown command is reported and the others still run.
    The teardown is armed first, so a setup that fails half-way is still undone.
    """
    lines: list[str] = []
    if teardown:
        lines += [
            f"# When this script exits, however it ends: [{table}] teardown, in order. The",
            "# script keeps its own exit status; a failing command is reported.",
            "mdc_teardown() {",
            "  local status=$?",
        ]
        for index, argv in enumerate(teardown, 1):
            lines.append(
                f'  {shell_join(argv)} || echo "mdc: [{table}] teardown command {index} '
                'exited with status $?" >&2'
            )
        lines += ['  exit "$status"', "}", "trap mdc_teardown EXIT"]
    if setup:
        lines.append(f"# [{table}] setup, in order: a failing command stops the job.")
        lines += [shell_join(argv) for argv in setup]
    return lines


def launch_id_lines(scheduler_id: str | None, scheduler: str = "") -> list[str]:
    """Bash lines exporting ``MDC_LAUNCH_ID``: ``scheduler_id`` (a variable name such as
    ``SLURM_JOB_ID``), else a fresh id made of the time, this shell's pid and a random number
    (unique among the launches of one host, and across hosts in practice)."""
    if scheduler_id is not None:
        return [
            f"# This launch's id, exported to every process: {scheduler}'s job id.",
            f'export {LAUNCH_ID.name}="${{{scheduler_id}:?{scheduler_id} is not set}}"',
        ]
    return [
        "# This launch's id, exported to every process: fresh for every run of this script.",
        f'{LAUNCH_ID.name}="$(date -u +%Y%m%dT%H%M%SZ)-$$-$RANDOM"',
        f"export {LAUNCH_ID.name}",
    ]


def port_lines(port: int, derived: bool, probe: str | None) -> list[str]:
    """Bash lines exporting ``MASTER_PORT``, after those of :func:`launch_id_lines`.

    A port the spec gives is exported as written. A derived one is computed here, at run
    time, so the script stays the same bytes for every launch: ``cksum`` (POSIX CRC) of the
    launch id picks a start in :data:`PORT_RANGE`, then, when the bash condition ``probe``
    holds (this script runs on node 0; ``"true"`` for always), the first port from there
    that nothing on this host accepts connections on, at 127.0.0.1 or ``MASTER_ADDR`` (as
    Jupyter steps to a free port). Only node 0 probes; the other nodes are given the result.
    """
    if not derived:
        return [f"export {MASTER_PORT.name}={port}"]
    low, high = PORT_RANGE
    span = high - low
    lines = [
        f"# The rendezvous port: a hash of the launch id picks a start in {low}-{high - 1};",
        "# then, on node 0, the first port from there that nothing listens on, so concurrent",
        "# launches on one host never share it. Every node is given the same port.",
        f"port=$(({low} + $(printf '%s' \"${LAUNCH_ID.name}\" | cksum | cut -d ' ' -f 1) % {span}))",
    ]
    step = [
        "for ((try = 0; try < 100; try++)); do",
        '  if ! (: <"/dev/tcp/127.0.0.1/$port") 2>/dev/null &&',
        f'    ! (: <"/dev/tcp/${MASTER_ADDR.name}/$port") 2>/dev/null; then',
        "    break",
        "  fi",
        f"  port=$(({low} + (port - {low} + 1) % {span}))",
        "done",
    ]
    if probe == "true":
        lines += step
    elif probe is not None:
        lines += [f"if {probe}; then", *("  " + line for line in step), "fi"]
    lines.append(f'export {MASTER_PORT.name}="$port"')
    return lines


__all__ = [
    "around_launch",
    "launch_id_lines",
    "out_file",
    "port_lines",
    "refs_in",
    "shell_join",
    "shell_word",
    "supervise",
    "wait_for_first_failure",
]
