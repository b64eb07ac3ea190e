"""``mdc rehearse SPEC``: play the compiled job on this machine's CPU with a probe.

The spec is compiled as written except for what a rehearsal must change: the job's
command becomes the probe (``python -m mdc.rehearse.probe``; the user's program is only
reported), ``accelerator = "cpu"`` (gloo, DS_ACCELERATOR=cpu), a free ``master_port``, no
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
launchers (vllm, sglang, sglang_disagg) run their server commands against shims that record
argv and environment per node (see :mod:`mdc.rehearse.serving`). This module never imports
torch: only the probe does, in the workers.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib.util
import json
import os
import re
import shlex
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TextIO

import attrs

from mdc import emit
from mdc.errors import ExitCode

#: refuse worlds above this many ranks (``--max-ranks``) rather than fork hundreds of processes
DEFAULT_MAX_RANKS = 64
#: seconds before every process is stopped (``--timeout``)
DEFAULT_TIMEOUT = 180.0
#: after the first node fails, how long the others get to finish and report
FAILURE_GRACE = 5.0
PROBE_COMMAND = ["python", "-m", "mdc.rehearse.probe"]
TORCH_HINT = "pip install 'mdc-compiler[torch]'"
#: launchers whose program starts torchrun itself: the probe cannot stand in for it
UNSUPPORTED = {
    "primus": "primus runs its own launch script once per node, which starts "
    "torchrun itself; rehearse cannot stand a probe in for it"
}
#: variables of the calling shell that would confuse the nodes (the backend sets its own)
SCRUBBED = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "NODE_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "NODE_HOSTS",
    "MDC_OUT",
    "JOB_COMPLETION_INDEX",
    "CUDA_VISIBLE_DEVICES",
)
SCRUBBED_PREFIXES = ("SLURM_", "TORCHELASTIC_", "PET_", "OMPI_", "PMI_", "MDC_REHEARSE_")
#: marks every process of one rehearsal, so that none is left behind
TOKEN = "MDC_REHEARSE_TOKEN"

#: a test-only hook: (node index, env) -> env, to inject a mapping bug
NodeEnvHook = Callable[[int, dict[str, str]], dict[str, str]]
#: a test-only hook: called with the written tree before any node starts
TreeHook = Callable[[Path], None]


class RehearseError(Exception):
    """A rehearsal that cannot start (too large, torch missing, unsupported launcher)."""

    def __init__(self, message: str, code: int = ExitCode.USAGE) -> None:
        super().__init__(message)
        self.code = code


@attrs.frozen(kw_only=True)
class Node:
    index: int
    host: str
    role: str
    argv: tuple[str, ...]
    env: Mapping[str, str]
    log: Path


@attrs.frozen(kw_only=True)
class Outcome:
    """What a rehearsal found."""

    ok: bool
    serving: bool
    launcher: str
    backend: str
    nnodes: int
    world_size: int
    seconds: float
    #: the kept tree (--keep), None when it was a temporary directory
    tree: str | None
    #: rank (or a label) -> its mismatches
    problems: dict[str, list[str]]
    missing: list[int]
    #: node index -> exit status (None: still running when stopped)
    exits: dict[int, int | None]
    timed_out: bool
    #: cross-rank findings (node ranks, roles, URLs)
    findings: list[str]
    groups_built: int
    kinds: list[str]
    logs: dict[int, str]
    #: the compile's warnings, rendered
    warnings: list[str] = attrs.field(factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            **attrs.asdict(self),
            "exits": {str(k): v for k, v in self.exits.items()},
            "logs": {str(k): v for k, v in self.logs.items()},
        }


def loopback(index: int) -> str:
    """Node ``index``'s address: 127.0.0.1, 127.0.0.2, ... (all of 127/8 is loopback)."""
    return f"127.{(index + 1) >> 16 & 255}.{(index + 1) >> 8 & 255}.{(index + 1) & 255}"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def rehearsal_data(data: dict[str, Any], port: int, *, serving: bool) -> dict[str, Any]:
    """The spec as rehearse compiles it (see the module docstring)."""
    new = copy.deepcopy(data)
    job, dist = new.get("job"), new.get("distributed")
    if not isinstance(job, dict) or not isinstance(dist, dict):
        return new  # the schema's errors say what is wrong
    job.pop("workdir", None)
    if dist.get("backend", "local") in ("local", "slurm"):  # pod backends need their image
        job.pop("image", None)
    env = job.get("env")
    if isinstance(env, dict) and "GLOO_SOCKET_IFNAME" in env:
        env["GLOO_SOCKET_IFNAME"] = "lo"
    if not serving:  # servers are shims: they use no device, so the accelerator stays
        job["command"] = list(PROBE_COMMAND)
        dist["accelerator"] = "cpu"
    dist["master_port"] = port
    slurm = new.get("slurm")
    if isinstance(slurm, dict):
        for key in ("container", "modules"):
            slurm.pop(key, None)
    return new


def _base_env(shims: Path, results: Path, token: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in SCRUBBED and not k.startswith(SCRUBBED_PREFIXES)
    }
    interpreter_bin = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join([str(shims), interpreter_bin, env.get("PATH", "")])
    package_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    env.setdefault("TP_SOCKET_IFNAME", "lo")
    env["OMP_NUM_THREADS"] = "1"
    env["MDC_REHEARSE_RESULTS"] = str(results)
    env["MDC_REHEARSE_PLAN"] = str(results / "plan.json")
    env[TOKEN] = token
    return env


def nodes_for(
    plan: Any, backend: str, tree: Path, results: Path, base: dict[str, str]
) -> list[Node]:
    """One process per node, with what its backend would give it, on loopback."""
    hosts = [loopback(i) for i in range(plan.nnodes)]
    runtime = {
        "MASTER_ADDR": hosts[0],
        "MASTER_PORT": str(plan.rendezvous.master_port),
        "NODE_HOSTS": " ".join(hosts),
    }
    nodes = []
    for role in plan.roles:
        for index in range(role.first_node, role.first_node + role.count):
            env = {
                **base,
                **runtime,
                "MDC_REHEARSE_NODE": str(index),
                "MDC_REHEARSE_HOST": hosts[index],
                "MDC_REHEARSE_ROLE": role.name,
            }
            pod = _pod_entry(tree, backend, results)
            if pod is not None:  # the pod's own entry, with what the pod's env would hold
                script, reads = pod
                env.update(runtime)
                wanted = {"NODE_RANK": str(index), "MASTER_ADDR": hosts[0]}
                env.update({source: wanted[target] for target, source in reads.items()})
                argv: tuple[str, ...] = ("bash", str(script))
            elif backend == "slurm":
                env.update(
                    SLURM_NODEID=str(index),
                    SLURM_LOCALID="0",
                    SLURM_PROCID=str(index),
                    SLURM_JOB_NODELIST=",".join(hosts),
                    SLURM_JOB_NUM_NODES=str(plan.nnodes),
                    SLURM_NNODES=str(plan.nnodes),
                    SLURM_JOB_ID="1",
                    SLURM_SUBMIT_DIR=str(tree),
                    MDC_OUT=str(tree),
                )
                argv = ("bash", str(tree / "slurm" / "node.sh"))
            else:
                env["NODE_RANK"] = str(index)
                argv = ("bash", str(tree / "launch" / f"{role.name}.sh"))
            nodes.append(
                Node(
                    index=index,
                    host=hosts[index],
                    role=role.name,
                    argv=argv,
                    env=env,
                    log=results / f"node-{index}.log",
                )
            )
    return sorted(nodes, key=lambda n: n.index)


#: pod backends whose node.sh reads the node's index and node 0's address from the pod's
#: env (leaderworkerset derives NODE_HOSTS from DNS names, so it runs launch/<role>.sh)
POD_BACKENDS = ("kubernetes", "pytorchjob", "trainjob")
POD_EXPORT = re.compile(
    r'^export (NODE_RANK|MASTER_ADDR)="\$\{?([A-Z_][A-Z0-9_]*)(:-)?\}?"', re.MULTILINE
)


def _pod_entry(tree: Path, backend: str, results: Path) -> tuple[Path, dict[str, str]] | None:
    """The pod's files (its ConfigMap, as mounted) under ``results/pod``, its node.sh and the
    pod variables node.sh reads NODE_RANK and MASTER_ADDR from; None for other backends."""
    if backend not in POD_BACKENDS:
        return None
    pod = results / "pod"
    script = pod / "k8s" / "node.sh"
    if not script.is_file():
        from ruamel.yaml import YAML

        documents = []
        for path in sorted((tree / backend).glob("*.yaml")):
            documents += [d for d in YAML(typ="safe").load_all(path.read_text("utf-8")) if d]
        data: dict[str, str] = {}
        for doc in documents:
            if doc.get("kind") == "ConfigMap":
                data.update(doc.get("data") or {})
        for key, path_in_pod in _items(documents):
            if key in data:
                target = pod / path_in_pod
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(data[key], encoding="utf-8")
        if not script.is_file():
            return None
    reads = {m[1]: m[2] for m in POD_EXPORT.finditer(script.read_text(encoding="utf-8"))}
    return script, reads


def _items(value: object) -> list[tuple[str, str]]:
    """Every ConfigMap volume item (key, path) anywhere in the documents."""
    if isinstance(value, dict):
        found = []
        if isinstance(value.get("key"), str) and isinstance(value.get("path"), str):
            found.append((value["key"], value["path"]))
        for item in value.values():
            found += _items(item)
        return found
    if isinstance(value, list):
        return [pair for item in value for pair in _items(item)]
    return []


def _processes_with(token: str) -> list[int]:
    """Live processes of this rehearsal (their environment holds ``TOKEN=token``)."""
    needle = f"{TOKEN}={token}".encode()
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
        any(p.poll() is None for p in procs.values()) or _processes_with(token)
    ):
        time.sleep(0.1)
    for pid in _processes_with(token):  # torchrun's workers live in sessions of their own
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for proc in procs.values():
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _script(path: Path, body: str) -> None:
    path.write_text(f"#!/usr/bin/env bash\n{body}\n", encoding="utf-8")
    path.chmod(0o755)


def _tail(path: Path, lines: int = 12) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.rstrip().splitlines()[-lines:])


def training_findings(plan: dict[str, Any], reports: dict[int, dict[str, Any]]) -> list[str]:
    """Cross-rank checks: ranks per node, and a join-order rendezvous' node ranks."""
    found = []
    nproc = plan["nproc_per_node"]
    by_node: dict[int, list[int]] = {}
    for rank, report in reports.items():
        by_node.setdefault(int(report.get("node", -1)), []).append(rank)
    for node, ranks in sorted(by_node.items()):
        if len(ranks) != nproc:
            found.append(
                f"node {node} ran {len(ranks)} rank(s) {sorted(ranks)}, "
                f"plan.json says {nproc} per node"
            )
    if "join order" in str(plan.get("worker_env", {}).get("GROUP_RANK", "")):
        group_of: dict[int, set[str]] = {}
        for report in reports.values():
            group = report.get("env", {}).get("GROUP_RANK")
            group_of.setdefault(int(report.get("node", -1)), set()).add(str(group))
        seen = sorted(g for groups in group_of.values() for g in groups)
        for node, groups in sorted(group_of.items()):
            if len(groups) != 1:
                found.append(f"node {node}'s ranks have GROUP_RANKs {sorted(groups)}")
        if len(reports) == plan["world_size"] and seen != [str(i) for i in range(plan["nnodes"])]:
            found.append(f"the nodes' GROUP_RANKs are {seen}, not 0..{plan['nnodes'] - 1}")
    return found


def rehearse(
    spec: str | Path,
    compiler: Any,
    *,
    max_ranks: int = DEFAULT_MAX_RANKS,
    timeout: float = DEFAULT_TIMEOUT,
    keep: str | Path | None = None,
    stderr: TextIO | None = None,
    cwd: str | Path | None = None,
    node_env_hook: NodeEnvHook | None = None,
    tree_hook: TreeHook | None = None,
) -> Outcome:
    """Compile ``spec`` for a rehearsal and run it; raises SpecError or RehearseError."""
    from mdc.importers import translate
    from mdc.loaders import load_file

    stderr = stderr if stderr is not None else sys.stderr
    doc, notes = translate(load_file(spec))
    data = doc.data if isinstance(doc.data, dict) else {}
    distributed = data.get("distributed")
    launcher_name = str(distributed.get("launcher", "")) if isinstance(distributed, dict) else ""
    launchers = compiler.plugins.launchers
    serving = (
        launcher_name in launchers
        and getattr(compiler.plugins.launcher(launcher_name), "workload", "") == "serving"
    )
    if launcher_name in UNSUPPORTED:
        raise RehearseError(
            f"mdc rehearse: launcher {launcher_name!r}: {UNSUPPORTED[launcher_name]}"
        )
    compiler.compile_document(doc, notes=notes)  # the spec as written: compile's own errors
    port = free_port()
    edited = attrs.evolve(doc, data=rehearsal_data(data, port, serving=serving))
    compiled = compiler.compile_document(edited, notes=notes)
    plan = compiled.plan
    processes = plan.nnodes if serving else plan.world_size
    if processes > max_ranks:
        what = "nodes" if serving else "ranks"
        raise RehearseError(
            f"mdc rehearse: the job has {processes} {what} ({plan.nnodes} nodes x "
            f"{plan.nproc_per_node}); this rehearsal is bounded to {max_ranks} processes on "
            f"this machine: nothing was started. Rehearse a smaller world with the same "
            f"layout, or raise the bound with --max-ranks {processes}"
        )
    if not serving and importlib.util.find_spec("torch") is None:
        raise RehearseError(
            f"mdc rehearse: the probe needs torch, which is not installed "
            f"for {sys.executable}: {TORCH_HINT}"
        )
    scratch = None
    if keep is None:
        scratch = Path(tempfile.mkdtemp(prefix="mdc-rehearse-"))
        tree = scratch / "out"
    else:
        tree = Path(keep).resolve()
        if not emit.is_replaceable(tree):
            raise RehearseError(
                f"mdc rehearse: refusing to replace {tree}: it is not empty and "
                f"holds no {emit.MANIFEST} from an earlier compile"
            )
    try:
        emit.write_tree(tree, compiled.tree)
        outcome = _play(
            compiled,
            tree,
            serving=serving,
            timeout=timeout,
            stderr=stderr,
            cwd=Path(cwd) if cwd is not None else Path.cwd(),
            node_env_hook=node_env_hook,
            tree_hook=tree_hook,
        )
        return outcome if scratch is None else attrs.evolve(outcome, tree=None)
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


def _play(
    compiled: Any,
    tree: Path,
    *,
    serving: bool,
    timeout: float,
    stderr: TextIO,
    cwd: Path,
    node_env_hook: NodeEnvHook | None,
    tree_hook: TreeHook | None,
) -> Outcome:
    plan = compiled.plan
    results = tree / "rehearse"
    shutil.rmtree(results, ignore_errors=True)
    shims = results / "bin"
    (results / "up").mkdir(parents=True)
    shims.mkdir()
    for name in ("python", "python3"):  # a symlink would lose the venv (pyvenv.cfg lookup)
        _script(shims / name, f'exec {shlex.quote(sys.executable)} "$@"')
    shutil.copyfile(tree / "plan.json", results / "plan.json")
    token = f"{os.getpid()}-{time.monotonic_ns()}"
    base = _base_env(shims, results, token)
    if serving:
        from mdc.rehearse import serving as serving_mod

        serving_mod.install_shims(shims, sys.executable)
    nodes = nodes_for(plan, plan.backend, tree, results, base)
    if node_env_hook is not None:
        nodes = [attrs.evolve(n, env=node_env_hook(n.index, dict(n.env))) for n in nodes]
    if tree_hook is not None:
        tree_hook(tree)
    total = plan.nnodes if serving else plan.world_size
    kind = "nodes" if serving else "ranks"
    print(
        f"rehearse: {plan.launcher} on {plan.backend}: {plan.nnodes} node(s) x "
        f"{plan.nproc_per_node} = {plan.world_size} rank(s), nodes on {nodes[0].host}.."
        f"{nodes[-1].host}, master port {plan.rendezvous.master_port}",
        file=stderr,
    )
    progress = Progress(stderr, total, kind)

    def count_up() -> int:
        return sum(1 for _ in (results / "up").iterdir())

    exits, timed_out, seconds = run_nodes(
        nodes, cwd=cwd, token=token, timeout=timeout, count_up=count_up, progress=progress
    )
    plan_data = json.loads((results / "plan.json").read_text(encoding="utf-8"))
    problems: dict[str, list[str]] = {}
    findings: list[str] = []
    built, kinds, missing = 0, sorted(plan_data.get("groups", {})), []
    explained: set[int] = set()
    if serving:
        from mdc.rehearse import serving as serving_mod

        records = serving_mod.read_records(results)
        findings = serving_mod.check(plan_data, records, [n.host for n in nodes])
        missing = [n.index for n in nodes if n.index not in records]
        kinds = []
    else:
        reports: dict[int, dict[str, Any]] = {}
        for path in sorted(results.glob("rank-*.json")):
            report = json.loads(path.read_text(encoding="utf-8"))
            label = str(report.get("rank"))
            if report.get("problems"):
                problems[label] = list(report["problems"])
                explained.add(int(report.get("node", -1)))
            if label.isdigit():
                reports[int(label)] = report
                built = max(built, int(report.get("groups", {}).get("built", 0)))
        missing = [r for r in range(plan.world_size) if r not in reports]
        findings = training_findings(plan_data, reports)
    failed = {i for i, code in exits.items() if code != 0}
    # a node whose ranks reported their mismatches failed because of them: no log needed
    logs = {i: _tail(results / f"node-{i}.log") for i in sorted(failed - explained)}
    ok = not (problems or missing or failed or timed_out or findings)
    return Outcome(
        ok=ok,
        serving=serving,
        launcher=plan.launcher,
        backend=plan.backend,
        nnodes=plan.nnodes,
        world_size=plan.world_size,
        seconds=round(seconds, 1),
        tree=str(tree),
        problems=problems,
        missing=missing,
        exits=exits,
        timed_out=timed_out,
        findings=findings,
        groups_built=built,
        kinds=kinds,
        logs=logs,
        warnings=[d.render() for d in compiled.diagnostics],
    )


def render(outcome: Outcome, *, kept: bool) -> str:
    serving = outcome.serving
    lines = []
    for label, found in sorted(
        outcome.problems.items(),
        key=lambda kv: (not kv[0].isdigit(), int(kv[0]) if kv[0].isdigit() else 0, kv[0]),
    ):
        lines.append(f"rank {label}: " + found[0])
        lines += [f"rank {label}: {p}" for p in found[1:]]
    lines += [f"rehearse: {f}" for f in outcome.findings]
    for index, text in outcome.logs.items():
        code = outcome.exits.get(index)
        status = "was stopped" if code is None or code < 0 else f"exited {code}"
        lines.append(f"node {index} {status}; the end of its log:")
        lines += [f"  | {line}" for line in text.splitlines()]
    what = "nodes" if serving else "ranks"
    if outcome.timed_out:
        lines.append(f"rehearse: timed out after {outcome.seconds} s: every process was stopped")
    if outcome.missing:
        lines.append(
            f"rehearse: {what} that never reported: " + ", ".join(str(m) for m in outcome.missing)
        )
    where = f"; tree and logs kept in {outcome.tree}" if kept else ""
    nodes = f"{outcome.nnodes} node{'s' if outcome.nnodes != 1 else ''}"
    size = nodes if serving else f"{outcome.world_size} ranks on {nodes}"
    if outcome.ok:
        checked = (
            "roles, argv and every address handed to a node"
            if serving
            else f"ranks, env and arguments; {outcome.groups_built} groups of "
            f"{len(outcome.kinds)} kinds ({', '.join(outcome.kinds)}) built and "
            "all-reduced"
        )
        lines.append(
            f"rehearse: OK: {outcome.launcher} on {outcome.backend}, {size}: "
            f"{checked} ({outcome.seconds} s){where}"
        )
    else:
        bad = len(outcome.problems)
        lines.append(
            f"rehearse: FAILED: {outcome.launcher} on {outcome.backend}, {size}: "
            f"{bad} {what[:-1]}(s) with mismatches, {len(outcome.missing)} missing, "
            f"{sum(1 for c in outcome.exits.values() if c != 0)} node(s) failed "
            f"({outcome.seconds} s){where}"
        )
    return "\n".join(lines) + "\n"


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
