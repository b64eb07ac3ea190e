"""The script the disaggregated serving launchers share: a node's processes started in the
background and supervised together.

A node's part ends when one of its processes fails (the others are then stopped, through the
EXIT trap) or when all have ended; TERM and INT from the backend stop them all too.
"""

from __future__ import annotations


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
status=0
for _ in "${{pids[@]}}"; do
  wait -n || {{
    status=$?
    break
  }}
done
exit "$status"
"""
