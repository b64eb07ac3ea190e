"""The script the disaggregated serving launchers share: a node's processes started in the
background and supervised together.

A node's part ends when one of its processes fails (the others are then stopped, through the
EXIT trap) or when all have ended; TERM and INT from the backend stop them all too.

Each process's status is read by its pid (``wait PID``), not from ``wait -n``: bash's
``wait -n`` returns when one process ends, but a process killed by a signal can be dropped
from its jobs table unreported (when bash returns another job's status, or runs a command in
the foreground, while it lies dead), and then no ``wait -n`` ever returns it: the node went
on without it and ended with 127 ("no child left") once the others had. ``wait PID`` reads
the status bash keeps for that pid whatever its jobs table says.
"""

from __future__ import annotations

#: bash lines that wait for the processes in ``pids`` until one fails (its status is the
#: script's) or all have ended (0). After each ``wait -n`` the ended ones are found with
#: ``kill -0`` and their statuses read by pid; ``pids`` keeps the running ones, so the EXIT
#: trap stops only those. A 127 from ``wait -n`` with none of them ended means bash has no
#: child left to wait for: what ``kill -0`` still finds is no longer the job's.
WAIT_FOR_FIRST_FAILURE = """# until one fails (its status is the node's) or all have ended; each ended one's status
# read by its pid, as wait -n can lose one killed by a signal (and then say 127)
status=0
while ((${#pids[@]})); do
  waited=0
  wait -n || waited=$?
  running=()
  for pid in "${pids[@]}"; do
    if kill -0 "$pid" 2>/dev/null; then
      running+=("$pid")
    else
      wait "$pid" || status=$?
    fi
  done
  if ((status != 0)); then
    break
  fi
  if ((${#running[@]} == 0)) || ((waited == 127 && ${#running[@]} == ${#pids[@]})); then
    pids=()
    break
  fi
  pids=("${running[@]}")
done
exit "$status"
"""


def supervising_script(comment: str, body: str, leaving: tuple[str, str] | None = None) -> str:
    """The bash script: ``comment`` (its lines, already ``# ``-prefixed) under the shebang,
    then ``body``, which starts each process with ``... &`` and ``pids+=("$!")``.
    ``leaving``: what else the script does when it leaves, in words and as a command."""
    why, also = (f", {leaving[0]}", f"; {leaving[1]}") if leaving else ("", "")
    return f"""#!/usr/bin/env bash
{comment}
set -euo pipefail
pids=()
# leaving (a process failed, or TERM/INT from the backend): stop the others{why}
trap 'if ((${{#pids[@]}})); then kill "${{pids[@]}}" 2>/dev/null || true; fi{also}' EXIT
trap 'exit 143' TERM
trap 'exit 130' INT
{body}
{WAIT_FOR_FIRST_FAILURE}"""
