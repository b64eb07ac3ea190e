"""Running a rehearsal: the spec as rehearse compiles it, one process per node with what
its backend would give it on loopback, and the ranks' reports read back."""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import re
import shlex
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

import attrs

from mdc import emit
from mdc.errors import ExitCode
from mdc.rehearse.probe import RANK_VARIABLES
from mdc.rehearse.process import TOKEN, Node, Progress, run_nodes
from mdc.rehearse.report import Outcome, log_tail, training_findings
from mdc.runtime import OUT_DIR, RUNTIME_VARIABLES

#: refuse worlds above this many ranks (``--max-ranks``) rather than fork hundreds of processes
DEFAULT_MAX_RANKS = 64
#: seconds before every process is stopped (``--timeout``)
DEFAULT_TIMEOUT = 180.0
PROBE_COMMAND = ["python", "-m", "mdc.rehearse.probe"]
TORCH_HINT = "pip install 'mdc-compiler[torch]'"
#: launchers whose program starts torchrun itself: the probe cannot stand in for it
UNSUPPORTED = {
    "primus": "primus runs its own launch script once per node, which starts "
    "torchrun itself; rehearse cannot stand a probe in for it"
}
#: variables of the calling shell that would confuse the nodes (the backend sets its own)
SCRUBBED = (
    *RANK_VARIABLES,
    *RUNTIME_VARIABLES,
    OUT_DIR.name,
    "JOB_COMPLETION_INDEX",
    "CUDA_VISIBLE_DEVICES",
)
SCRUBBED_PREFIXES = ("SLURM_", "TORCHELASTIC_", "PET_", "OMPI_", "PMI_", "MDC_REHEARSE_")
#: a test-only hook: (node index, env) -> env, to inject a mapping bug
NodeEnvHook = Callable[[int, dict[str, str]], dict[str, str]]
#: a test-only hook: called with the written tree before any node starts
TreeHook = Callable[[Path], None]


class RehearseError(Exception):
    """A rehearsal that cannot start (too large, torch missing, unsupported launcher)."""

    def __init__(self, message: str, code: int = ExitCode.USAGE) -> None:
        super().__init__(message)
        self.code = code


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
        # the hardware model is not what the rehearsal runs on (its vendor would contradict
        # "cpu"); the spec as written was checked against it before
        dist.pop("accelerator_model", None)
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
                env.update(_group_env(tree, backend, index, hosts[index]))
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
POD_BACKENDS = ("kubernetes", "pytorchjob", "trainjob", "jobset", "kuberay")
#: backends whose pods differ by the template they come from, not by an index: the key of
#: node 0's template and of the other nodes' (a list of groups) in the manifest's spec
POD_GROUPS = {"kuberay": ("headGroupSpec", "workerGroupSpecs")}
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
        documents = _documents(tree, backend)
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


def _documents(tree: Path, backend: str) -> list[dict[str, Any]]:
    from ruamel.yaml import YAML

    documents = []
    for path in sorted((tree / backend).glob("*.yaml")):
        documents += [d for d in YAML(typ="safe").load_all(path.read_text("utf-8")) if d]
    return documents


def _group_env(tree: Path, backend: str, index: int, host: str) -> dict[str, str]:
    """What the pod template of node ``index``'s group sets (POD_GROUPS: the head's on node
    0, the first worker group's on the others): its literal values (not those the kubelet
    expands, as on the other pod backends), and the pod's IP (downward API
    ``status.podIP``) as the node's loopback address; {} for other backends."""
    if backend not in POD_GROUPS:
        return {}
    head, workers = POD_GROUPS[backend]
    env: dict[str, str] = {}
    for doc in _documents(tree, backend):
        spec = doc.get("spec") or {}
        group = spec.get(head) if index == 0 else (spec.get(workers) or [None])[0]
        if not isinstance(group, dict):
            continue
        for container in group["template"]["spec"]["containers"]:
            for item in container.get("env") or []:
                field = ((item.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath")
                if "value" in item and "$(" not in str(item["value"]):  # kubelet-expanded
                    env[item["name"]] = str(item["value"])
                elif field == "status.podIP":
                    env[item["name"]] = host
    return env


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


def _script(path: Path, body: str) -> None:
    path.write_text(f"#!/usr/bin/env bash\n{body}\n", encoding="utf-8")
    path.chmod(0o755)


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


def _results_folder(tree: Path) -> tuple[Path, Path]:
    """``tree/rehearse`` made anew (what the nodes write: ``up/``, the stand-ins in
    ``bin/``, a copy of plan.json): it and its ``bin``."""
    results = tree / "rehearse"
    shutil.rmtree(results, ignore_errors=True)
    shims = results / "bin"
    (results / "up").mkdir(parents=True)
    shims.mkdir()
    for name in ("python", "python3"):  # a symlink would lose the venv (pyvenv.cfg lookup)
        _script(shims / name, f'exec {shlex.quote(sys.executable)} "$@"')
    shutil.copyfile(tree / "plan.json", results / "plan.json")
    return results, shims


def _rank_reports(
    results: Path,
) -> tuple[dict[int, dict[str, Any]], dict[str, list[str]], set[int], int]:
    """The ranks' reports by rank, their problems by label, the nodes whose ranks reported
    problems (their failure is explained), and the most process groups a rank built."""
    reports: dict[int, dict[str, Any]] = {}
    problems: dict[str, list[str]] = {}
    explained: set[int] = set()
    built = 0
    for path in sorted(results.glob("rank-*.json")):
        report = json.loads(path.read_text(encoding="utf-8"))
        label = str(report.get("rank"))
        if report.get("problems"):
            problems[label] = list(report["problems"])
            explained.add(int(report.get("node", -1)))
        if label.isdigit():
            reports[int(label)] = report
            built = max(built, int(report.get("groups", {}).get("built", 0)))
    return reports, problems, explained, built


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
    results, shims = _results_folder(tree)
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
    built, kinds = 0, sorted(plan_data.get("groups", {}))
    explained: set[int] = set()
    if serving:
        from mdc.rehearse import serving as serving_mod

        records = serving_mod.read_records(results)
        findings = serving_mod.check(plan_data, records, [n.host for n in nodes])
        missing = serving_mod.missing_nodes(plan_data, records, [n.host for n in nodes])
        kinds = []
    else:
        reports, problems, explained, built = _rank_reports(results)
        missing = [r for r in range(plan.world_size) if r not in reports]
        findings = training_findings(plan_data, reports)
    failed = {i for i, code in exits.items() if code != 0}
    # a node whose ranks reported their mismatches failed because of them: no log needed
    logs = {i: log_tail(results / f"node-{i}.log") for i in sorted(failed - explained)}
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
