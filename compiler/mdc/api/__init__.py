"""The plugin contract: what a launcher or backend plugin registers, receives and returns.

A plugin implements the hooks of :mod:`mdc.hookspecs` with ``@mdc.hookimpl`` and imports
only ``mdc`` and this package. The hooks return :class:`LauncherSpec` and
:class:`BackendSpec` records (and :class:`Accelerator` entries). A launcher's ``emit`` turns
the :class:`Plan` into a :class:`Launch`: per-role command lines of run-time words
(:data:`Word`) and environment, plus launcher config files. mdc renders each role as
``launch/<role>.sh``. A backend's ``emit`` turns the plan and the launch into scheduler
files (:class:`Artifact`) that start ``launch/<role>.sh`` on every node of that role, with
the :data:`RUNTIME_VARIABLES` set. Problems are :class:`Finding` records, returned by a
``check`` or given to :func:`report`; never exceptions.

Helpers a plugin may use live beside the contract, each documented in its module:
:mod:`mdc.api.shell` (run-time words as bash, the scripts' supervision, launch id and port
lines), :mod:`mdc.api.torchrun` (torchrun and madengine runner commands),
:mod:`mdc.api.flags` (a framework's flags, read as spec keys: :class:`~mdc.api.flags.FlagReading`),
:mod:`mdc.api.files` (schema fragments, launch-script paths, whether files are written) and
:mod:`mdc.api.stages` (the pipeline-split rules).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Literal

import attrs

from mdc.errors import Diagnostic, Finding, Severity
from mdc.hardware import Accelerator
from mdc.plan.model import ONE_NODE_ROLE, Plan, TrainingSetup
from mdc.plan.stages import PipelineSplit
from mdc.runtime import (
    LAUNCH_ID,
    MASTER_ADDR,
    MASTER_PORT,
    NODE_HOSTS,
    NODE_RANK,
    OUT_DIR,
    RUNTIME_VARIABLES,
    Concat,
    Ref,
    Word,
)
from mdc.spec import JobTable, ModelTable

if TYPE_CHECKING:
    from mdc.api.flags import FlagReading
    from mdc.plan.serving_memory import ServingSetup, SglangServer, StepLimits


def __getattr__(name: str) -> Any:
    """``ServingSetup``, ``StepLimits`` and ``SglangServer`` load their module when first
    used: the serving memory estimate (and the fractions arithmetic behind it) costs a
    training spec nothing."""
    if name not in ("ServingSetup", "StepLimits", "SglangServer"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from mdc.plan import serving_memory

    found = getattr(serving_memory, name)
    globals()[name] = found
    return found


@attrs.frozen(kw_only=True)
class Artifact:
    """One output file: a relative POSIX path under ``out/``, its bytes, and whether it runs."""

    path: str
    data: bytes
    executable: bool = False

    @classmethod
    def text(cls, path: str, text: str, *, executable: bool = False) -> Artifact:
        if not text.endswith("\n"):
            text += "\n"
        return cls(path=path, data=text.encode("utf-8"), executable=executable)

    @classmethod
    def json(cls, path: str, value: object) -> Artifact:
        """Sorted keys, two-space indent; lists of integers (rank groups) on one line."""
        text = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)
        return cls.text(path, _NUMBER_LIST.sub(_one_line, text))


_NUMBER_LIST = re.compile(r"\[\n\s+(-?\d+(?:,\n\s+-?\d+)*)\n\s*\]")


def _one_line(match: re.Match[str]) -> str:
    return "[" + ", ".join(n.strip() for n in match.group(1).split(",")) + "]"


@attrs.frozen(kw_only=True)
class Role:
    """What the nodes of one role run: ``argv`` under ``env`` (launcher's, then the job's)."""

    name: str
    argv: tuple[Word, ...]
    env: Mapping[str, Word] = attrs.field(factory=dict)


@attrs.frozen(kw_only=True)
class Endpoint:
    """Where a serving job answers clients, for a backend's Service and readiness probe."""

    port: int
    #: GET this path answers 200 once the model is loaded (vLLM, SGLang and its router)
    health_path: str = "/health"
    #: True: every node serves its own copy (replicas); False: node 0 only
    every_node: bool = False


@attrs.frozen(kw_only=True)
class Server:
    """One server of a serving job, as ``mdc explain`` and plan.json describe it."""

    #: "server", "replica", "router", "prefill" or "decode"
    role: str
    nodes: tuple[int, ...]
    #: GPUs the server uses (0: the router)
    gpus: int
    tp: int = 1
    pp: int = 1
    #: data-parallel engines (vLLM) or DP attention groups (SGLang) inside the server
    dp: int = 1
    ep: int = 1
    #: the port its first node serves HTTP on
    port: int
    #: its first GPU on each of its nodes (several servers share a node: --base-gpu-id)
    first_gpu: int = 0


@attrs.frozen(kw_only=True)
class Launch:
    """A launcher's output: one :class:`Role` per plan role, files, and the worker env contract.

    A backend's ``emit`` receives it with ``files`` led by the rendered ``launch/<role>.sh``
    scripts, so ``files`` is everything a node needs from the tree (e.g. for a ConfigMap).
    """

    roles: tuple[Role, ...]
    #: launcher config files (hostfiles, JSON/TOML configs), paths under ``launch/``
    files: tuple[Artifact, ...] = ()
    #: variables every worker process sees, and what each holds (documented in plan.json)
    worker_env: Mapping[str, str] = attrs.field(factory=dict)
    #: a serving launcher's client endpoint (None: the job serves nothing)
    endpoint: Endpoint | None = None
    #: a serving launcher's servers, in node order (empty: the job serves nothing)
    servers: tuple[Server, ...] = ()

    def role(self, name: str) -> Role:
        for role in self.roles:
            if role.name == name:
                return role
        raise KeyError(name)


@attrs.frozen(kw_only=True)
class SearchSpace:
    """The training switches ``mdc tune`` may set in a launcher's table (``LauncherSpec.search``).

    mdc searches the parallel sizes, the micro batch and the virtual stages itself; the
    launcher names the rest. mdc leaves out every key the spec holds (written in the table
    or read from its pass-through arguments), reads each setting through the launcher's
    ``training`` hook, and compiles the best as ``mdc compile`` does."""

    #: (tp, layers of one model chunk, the keys the spec holds) -> the switch settings to
    #: try, each a mapping of option names to values (a dotted name, "config.a.b", sets a
    #: key of a nested table)
    switches: Callable[[int, int, Mapping[str, Any]], Iterable[Mapping[str, Any]]]
    #: option names that place layers on pipeline stages: a spec holding one keeps its split
    split_keys: tuple[str, ...] = ()
    #: (layers, pp) -> the splits to try where the layers do not divide by pp, each a
    #: mapping of option names to values; the plan's own split rules check each. None: only
    #: even splits
    uneven_splits: Callable[[int, int], Iterable[Mapping[str, Any]]] | None = None
    #: (pp, vpp, the keys held and the split's) -> whether the launcher's framework runs
    #: pp stages vpp deep (the rest are not compiled). None: every one the split allows
    interleaves: Callable[[int, int, Mapping[str, Any]], bool] | None = None
    #: the [batch] micro_batch_size values to try (those dividing the batch per replica)
    micro_batches: tuple[int, ...] = (1, 2, 4, 8)


@attrs.frozen(kw_only=True)
class LauncherSpec:
    """A launcher, as a plugin registers it."""

    name: str
    description: str
    #: "model": tp defaults to nproc_per_node and pp to nnodes; "data": both default to 1
    parallelism: Literal["model", "data"]
    #: (plan, options) -> Launch; options is the structured [<name>] table or None
    emit: Callable[[Plan, Any], Launch]
    #: JSON Schema for this launcher's own top-level table ``[<name>]``
    schema: Mapping[str, Any] | None = None
    #: attrs class the ``[<name>]`` table is structured into (None: a plain dict)
    options_type: type | None = None
    #: splits nodes into prefill and decode roles (node 0 also runs the router)
    disaggregated: bool = False
    #: "serving" launchers get no training memory estimate
    workload: Literal["training", "serving"] = "training"
    #: (plan, options) -> findings, run before emit
    check: Callable[[Plan, Any], Iterable[Finding]] | None = None
    #: disaggregated launchers: (plan, options) -> the (prefill, decode) nodes one server
    #: spans, or its GPUs when the split is of one node's GPUs (``plan.disagg.unit``); the
    #: automatic split gives each role whole servers. None: one node (GPU) per server
    server_units: Callable[[Plan, Any], tuple[int, int]] | None = None
    #: options -> how this launcher trains (optimizer sharding, sequence parallel,
    #: recompute), for the memory estimate; None: plain data parallel, nothing sharded
    training: Callable[[Any], TrainingSetup] | None = None
    #: options -> the same options with what its pass-through arguments set read in, where
    #: a flag is no key's own (Megatron-LM's deprecated ``--moe-layer-recompute``; a flag
    #: that is a key's is read by ``arguments``); mdc tune holds those keys as it holds the
    #: table's own. None: the arguments set no key
    read_args: Callable[[Any], Any] | None = None
    #: the framework's flags that stand for spec keys, and where the user may pass them:
    #: mdc reads each into its key before checking the spec (as if the key were written),
    #: emits it once, and refuses only a flag that disagrees with its key. None: none read
    arguments: FlagReading | None = None
    #: (options, the job command's words) -> the options with the keys the command's
    #: overrides set read in, as the launcher's framework applies them (TorchTitan's
    #: command-line overrides win over its config file): the ``training`` hook gets these,
    #: and mdc tune holds those keys. None: the command sets no key
    read_command: Callable[[Any, Sequence[str]], Any] | None = None
    #: what mdc tune may set in the table besides the sizes (:class:`SearchSpace`); None:
    #: mdc tune does not search this launcher's layouts
    search: SearchSpace | None = None
    #: (plan, options) -> one server's sizes and its engine's memory settings, for the
    #: serving memory check; None: no serving estimate
    serving: Callable[[Plan, Any], ServingSetup | None] | None = None
    #: other plugins' tables this launcher reads besides its own (e.g. ``("torchrun",)``),
    #: so that a spec giving them gets no "table not read" warning (MDC253)
    reads: tuple[str, ...] = ()


@attrs.frozen(kw_only=True)
class BackendSpec:
    """A backend, as a plugin registers it."""

    name: str
    description: str
    #: (plan, launch, options) -> artifacts (paths under ``<name>/`` by convention)
    emit: Callable[[Plan, Launch, Any], Iterable[Artifact]]
    schema: Mapping[str, Any] | None = None
    options_type: type | None = None
    #: launchers this backend supports (None: all)
    launchers: Sequence[str] | None = None
    check: Callable[[Plan, Any], Iterable[Finding]] | None = None
    #: (nnodes, options) -> each node's host name, when known before the job runs
    #: (for hostfiles); None, or no function: known only at run time
    hosts: Callable[[int, Any], Sequence[str] | None] | None = None
    #: the shell command that starts the compiled job, ``{out}`` standing for the output
    #: directory (substituted shell-quoted); ``mdc compile`` prints it as the next step
    run_command: str | None = None
    #: other plugins' tables this backend reads besides its own (e.g. ``("torchrun",)``)
    reads: tuple[str, ...] = ()
    #: whether the manifests it renders fix the master port (a container port, a pod env
    #: value): a port the spec leaves out is then the one hashed from the job name, not one
    #: the launch script picks at run time (plan.json's worker env says which)
    fixed_port: bool = False


#: what report() collects while the pipeline runs a backend's emit (None: not running)
_REPORTED: ContextVar[list[Finding] | None] = ContextVar("mdc_reported", default=None)


def report(finding: Finding) -> None:
    """Report, from a backend's ``emit``, a finding that only the files it writes show (a
    Kubernetes ConfigMap larger than the apiserver stores, say). The command reports it
    as it reports a check's: an error stops it (nothing is written), a warning is shown
    with the others. Outside a command (a plugin's own test calling ``emit``) an error is
    raised as ValueError and a warning is dropped.
    """
    if not isinstance(finding, Finding):
        raise TypeError(f"report() takes an mdc.api.Finding, not {type(finding).__name__}")
    reported = _REPORTED.get()
    if reported is not None:
        reported.append(finding)
    elif finding.severity is Severity.ERROR:
        raise ValueError(f"{finding.code}: {finding.message}")


@contextmanager
def _reporting() -> Iterator[list[Finding]]:
    """Collect what :func:`report` is given while the block runs."""
    reported: list[Finding] = []
    token = _REPORTED.set(reported)
    try:
        yield reported
    finally:
        _REPORTED.reset(token)


__all__ = [
    "LAUNCH_ID",
    "MASTER_ADDR",
    "MASTER_PORT",
    "NODE_HOSTS",
    "NODE_RANK",
    "ONE_NODE_ROLE",
    "OUT_DIR",
    "RUNTIME_VARIABLES",
    "Accelerator",
    "Artifact",
    "BackendSpec",
    "Concat",
    "Diagnostic",
    "Endpoint",
    "Finding",
    "JobTable",
    "Launch",
    "LauncherSpec",
    "ModelTable",
    "PipelineSplit",
    "Plan",
    "Ref",
    "Role",
    "SearchSpace",
    "Server",
    "ServingSetup",
    "Severity",
    "SglangServer",
    "StepLimits",
    "TrainingSetup",
    "Word",
    "report",
]
