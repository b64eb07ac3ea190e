"""``mdc rehearse SPEC``: play the compiled job on this machine's CPU with a probe.

The spec is compiled as written except for what a rehearsal must change: the job's
command becomes the probe (``python -m mdc.rehearse.probe``; the user's program is only
reported), ``accelerator = "cpu"`` (gloo, DS_ACCELERATOR=cpu) without ``accelerator_model``
(checked on the spec as written), a free ``master_port``, no
``image``/``workdir`` (and, for slurm, no container or ``module load``). The tree is
written to a temporary directory (or ``--keep DIR``) and every node is started as its own
process group, with the runtime variables its backend would give it, mapped to loopback:
node *k* is host ``127.0.0.(k+1)`` in ``NODE_HOSTS``, node 0 is ``MASTER_ADDR``.

- local, ssh, leaderworkerset: ``launch/<role>.sh`` with ``NODE_RANK``, ``MASTER_ADDR``,
  ``MASTER_PORT``, ``NODE_HOSTS`` (what local/run.sh and ssh/launch.sh pass, and what an LWS
  pod's env plus its node.sh amount to: that node.sh derives NODE_HOSTS from DNS names);
- kubernetes, pytorchjob, trainjob: the pod's own ``k8s/node.sh`` from the ConfigMap as
  mounted, with the pod's variables (``JOB_COMPLETION_INDEX``, the operator's ``RANK`` or
  ``PET_*``) plus ``MASTER_ADDR``, ``MASTER_PORT`` and ``NODE_HOSTS``;
- slurm: the backend's own per-node task, ``slurm/node.sh``, with what srun and
  ``job.sbatch`` give it (``SLURM_NODEID``, ``SLURM_LOCALID=0``, ``SLURM_PROCID``,
  ``SLURM_JOB_NODELIST``, ``SLURM_JOB_NUM_NODES``, ``MDC_OUT``, ``MASTER_ADDR``,
  ``MASTER_PORT``, ``NODE_HOSTS``); node.sh derives ``NODE_RANK`` itself.

Training launchers run the probe once per rank (see :mod:`mdc.rehearse.probe`); serving
launchers (vllm, sglang, sglang_disagg, vllm_disagg) run their server commands against shims
that record argv and environment per node (see :mod:`mdc.rehearse.serving`). This module never
imports torch: only the probe does, in the workers.
"""

from __future__ import annotations

import argparse
from typing import Any

from mdc.errors import ExitCode
from mdc.rehearse.process import FAILURE_GRACE, TOKEN, Node, Progress, run_nodes
from mdc.rehearse.report import Outcome, render, training_findings
from mdc.rehearse.runner import (
    DEFAULT_MAX_RANKS,
    DEFAULT_TIMEOUT,
    PROBE_COMMAND,
    TORCH_HINT,
    UNSUPPORTED,
    NodeEnvHook,
    RehearseError,
    TreeHook,
    free_port,
    loopback,
    nodes_for,
    rehearsal_data,
    rehearse,
)

__all__ = [
    "DEFAULT_MAX_RANKS",
    "DEFAULT_TIMEOUT",
    "FAILURE_GRACE",
    "PROBE_COMMAND",
    "TOKEN",
    "TORCH_HINT",
    "UNSUPPORTED",
    "Node",
    "NodeEnvHook",
    "Outcome",
    "Progress",
    "RehearseError",
    "TreeHook",
    "cmd_rehearse",
    "free_port",
    "loopback",
    "nodes_for",
    "rehearsal_data",
    "rehearse",
    "render",
    "run_nodes",
    "training_findings",
]


def cmd_rehearse(args: argparse.Namespace, compiler: Any, out: Any) -> int:
    """The ``mdc rehearse`` command: exit 0 when every rank (node) checked out, 1 when the
    spec is invalid or the rehearsal found a mismatch, 2 when it cannot run here."""
    keep = getattr(args, "keep", None)
    try:
        outcome = rehearse(
            args.spec,
            compiler,
            max_ranks=getattr(args, "max_ranks", DEFAULT_MAX_RANKS),
            timeout=getattr(args, "timeout", DEFAULT_TIMEOUT),
            keep=keep,
            stderr=out.stderr,
        )
    except RehearseError as exc:
        if out.fmt == "json":
            out.json({"ok": False, "error": str(exc)})
        print(str(exc), file=out.stderr)
        return exc.code
    if out.fmt == "json":
        out.json(outcome.to_json())
    else:
        for warning in outcome.warnings:
            print(warning, file=out.stderr)
        out.stdout.write(render(outcome, kept=keep is not None))
    return ExitCode.OK if outcome.ok else ExitCode.SPEC_INVALID
