"""The compiler pipeline: load -> schema -> structure -> plan -> launcher -> backend -> tree.

Data flows one way. The plugin set is loaded once and the composed schema is
built once per process, then reused for every file.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import attrs

from mdc import emit
from mdc.api import (
    OUT_DIR,
    RUNTIME_VARIABLES,
    Artifact,
    Finding,
    Launch,
    LauncherSpec,
    Role,
    Severity,
    TrainingSetup,
    _reporting,
    _writing_files,
)
from mdc.convert import structure_spec
from mdc.errors import Diagnostic, PluginError, SpecError, escape_pointer_token
from mdc.flags import read_document
from mdc.hardware import Accelerator, with_network
from mdc.importers import translate
from mdc.launch_scripts import SET_BY_MDC, render_launch
from mdc.loaders import LoadedDocument, load_file
from mdc.plan import Plan, build_plan
from mdc.plan.build import DEFAULT_BACKEND, auto_split, disagg_roles
from mdc.plan.named_models import name_model
from mdc.plugin_manager import DISTRIBUTION, PluginSet, Registered
from mdc.schema import ComposedChecker
from mdc.spec import EnvValue, JobSpec, WorkloadTable

if TYPE_CHECKING:
    from os import PathLike

T = TypeVar("T")

#: The plan as JSON, in every tree.
PLAN = "plan.json"
#: [distributed] network without accelerator_model: no prediction to give it to
NETWORK_UNUSED = Finding(
    code="MDC603",
    pointer="/distributed/network",
    message="[distributed] network changes only mdc tune's and explain's predictions, which "
    "need accelerator_model",
    hint="set accelerator_model, or remove network",
    severity=Severity.WARNING,
)
#: Tables the plan's arithmetic reads.
PLANNED_TABLES = ("distributed", "parallelism", "batch", "model")


def _without(data: object, pointers: set[str], here: str = "") -> object:
    """A copy of ``data`` without the members at ``pointers``."""
    if isinstance(data, dict):
        return {
            k: _without(v, pointers, f"{here}/{escape_pointer_token(k)}")
            for k, v in data.items()
            if f"{here}/{escape_pointer_token(k)}" not in pointers
        }
    if isinstance(data, list):
        return [
            _without(v, pointers, f"{here}/{i}")
            for i, v in enumerate(data)
            if f"{here}/{i}" not in pointers
        ]
    return data


@attrs.frozen(kw_only=True)
class Compiled:
    plan: Plan
    launch: Launch
    #: the complete output tree, manifest included, sorted by path; empty when compiled with
    #: ``tree=False`` (validate and explain, which write nothing)
    tree: tuple[Artifact, ...]
    #: what translating a foreign config (e.g. madengine's) dropped or reinterpreted
    notes: tuple[Diagnostic, ...] = ()

    @property
    def diagnostics(self) -> tuple[Diagnostic, ...]:
        """The warnings (a compiled spec has no errors)."""
        return (*self.notes, *self.plan.warnings)


class Compiler:
    def __init__(self, plugins: PluginSet) -> None:
        self.plugins = plugins
        # A plugin is imported when a spec needs it: its table, launcher or backend.
        self.checker = ComposedChecker(
            [*plugins.launchers, *plugins.backends],
            lambda name: plugins.table(name).record.schema,
            plugins.launchers,
            plugins.backends,
        )
        self.option_types = plugins.option_types()

    @property
    def schema(self) -> dict[str, Any]:
        """The composed JSON Schema: every plugin's table (imports every plugin)."""
        return self.checker.schema

    def compile(self, path: str | PathLike[str], *, tree: bool = True) -> Compiled:
        """Compile one spec file in memory; raises SpecError or PluginError.

        A foreign config (madengine's) is translated first; what the translation dropped
        or reinterpreted comes back with the result's diagnostics. ``tree=False`` runs every
        check and every plugin hook but renders neither plan.json nor the manifest, and the
        backend's emit runs with :func:`mdc.api.files_written` False.
        """
        doc, notes = translate(load_file(path))
        try:
            return self.compile_document(doc, notes=notes, tree=tree)
        except SpecError as exc:
            raise SpecError([*notes, *exc.diagnostics]) from None

    def compile_document(
        self, doc: LoadedDocument, notes: Sequence[Diagnostic] = (), *, tree: bool = True
    ) -> Compiled:
        """Compile a loaded document (e.g. one a tool has edited) in memory."""
        doc, unnamed = name_model(doc)
        written = doc
        doc, read = self.read_arguments(doc)
        found = [*unnamed, *self.checker.check(doc)]
        if found:
            raise SpecError([*read, *found, *self._plan_despite(doc, found)])
        if any(d.is_error for d in read):  # the spec as written: its other findings too
            said = {(d.code, d.location.pointer) for d in read}  # (each flag's once)
            others = [d for d in self._findings_of(doc) if (d.code, d.location.pointer) not in said]
            raise SpecError([*read, *others])
        compiled = self._compile(doc, tree=tree, written=written, read=read)
        return attrs.evolve(compiled, notes=tuple(notes))

    def _findings_of(self, doc: LoadedDocument) -> list[Diagnostic]:
        """The plan's and the plugins' findings on a schema-valid document."""
        try:
            self._compile(doc, tree=False)
        except SpecError as exc:
            return list(exc.diagnostics)
        return []

    def read_arguments(self, doc: LoadedDocument) -> tuple[LoadedDocument, list[Diagnostic]]:
        """The document with the flags its launcher reads as keys read in (the launcher's
        ``arguments``), located where they were written, and the findings on them."""
        data = doc.data
        section = data.get("distributed") if isinstance(data, dict) else None
        name = section.get("launcher") if isinstance(section, dict) else None
        if not isinstance(name, str) or name not in self.plugins.launchers:
            return doc, []
        reading = self.plugins.launcher(name).arguments
        if reading is None:
            return doc, []
        read, found = read_document(doc, reading)
        return read, [self._diag(doc, f) for f in found]  # where they are written

    def _plan_despite(self, doc: LoadedDocument, found: list[Diagnostic]) -> list[Diagnostic]:
        """Plan findings for a spec whose schema errors lie outside what the plan reads.

        The invalid values are dropped; if none of them feeds the arithmetic, the
        plan's own findings are as real as on a valid spec, so report them too. A plugin
        whose own table was damaged is not asked to check it: its schema errors say it.
        """
        pointers = {d.location.pointer for d in found}
        if any(p == "" or p.split("/")[1] in PLANNED_TABLES for p in pointers):
            return []
        repaired = attrs.evolve(doc, data=_without(doc.data, pointers))
        if self.checker.check(repaired):
            return []
        try:
            self._compile(
                repaired, damaged=frozenset(p.split("/")[1] for p in pointers), tree=False
            )
        except SpecError as exc:
            return list(exc.diagnostics)
        return []

    def _compile(
        self,
        doc: LoadedDocument,
        damaged: frozenset[str] = frozenset(),
        *,
        tree: bool,
        written: LoadedDocument | None = None,
        read: Sequence[Diagnostic] = (),
    ) -> Compiled:
        """Compile a schema-valid document.

        ``damaged``: the tables a repaired document lost (see :meth:`_plan_despite`); their
        plugins' checks are skipped, and the document is only planned, never emitted.
        ``written``: the document before its flags were read as keys (the manifest's hash
        is of it); ``read``: the warnings reading them gave.
        """
        spec = structure_spec(doc.data, self.option_types)  # type: ignore[arg-type]
        launcher_reg = self.plugins.launchers[spec.distributed.launcher]
        backend_name = spec.distributed.backend or DEFAULT_BACKEND
        if backend_name not in self.plugins.backends:  # the default, when blocked or absent
            raise SpecError(
                [
                    self._diag(
                        doc,
                        Finding(
                            code="MDC104",
                            pointer="/distributed",
                            message=f"the default backend {backend_name!r} is not available",
                            hint="set backend to one of: "
                            f"{', '.join(self.plugins.backends) or '(none)'}",
                        ),
                    )
                ]
            )
        backend_reg = self.plugins.backends[backend_name]
        launcher = self.plugins.launcher(spec.distributed.launcher)
        backend = self.plugins.backend(backend_name)
        findings: list[Diagnostic] = list(read)
        runs = backend.launchers
        unsupported = runs is not None and launcher.name not in runs
        if runs is not None and unsupported:
            findings.append(
                self._diag(
                    doc,
                    Finding(
                        code="MDC231",
                        pointer="/distributed/backend",
                        message=f"backend {backend.name!r} does not run launcher {launcher.name!r}",
                        hint=f"it runs: {', '.join(sorted(runs))}",
                    ),
                )
            )
        spec, hardware, named = self._accelerator_model(spec, launcher.workload == "serving")
        findings += [self._diag(doc, f) for f in named]
        launcher_options = spec.plugin_tables.get(launcher.name)
        backend_options = spec.plugin_tables.get(backend.name)
        training = TrainingSetup()
        if launcher.training is not None:
            training_of, read_command = launcher.training, launcher.read_command
            trained = launcher_options
            if read_command is not None:  # the command's overrides, as the framework reads them
                argv = spec.job.argv
                trained = _call(launcher_reg, "read_command",
                                lambda: read_command(launcher_options, argv))  # fmt: skip
            training = _call(launcher_reg, "training", lambda: training_of(trained))
        plan, planned = build_plan(
            spec,
            parallelism=launcher.parallelism,
            disaggregated=launcher.disaggregated,
            locate=doc.locate,
            serving=launcher.workload == "serving",
            training=training,
            scale_up_domain=hardware.scale_up_domain if hardware is not None else None,
        )
        findings += planned
        if plan is not None and launcher.server_units is not None:
            plan = _whole_servers(plan, launcher, launcher_reg)
        if plan is not None and hardware is not None:
            network = spec.distributed.network
            plan = attrs.evolve(plan, hardware=with_network(hardware, network, plan.nproc_per_node))
            if launcher.workload == "training":
                known = self.plugins.accelerators()
                refused = _tensor_cores(spec, training, hardware, known)
                findings += [self._diag(doc, f) for f in refused]
        if plan is not None and launcher.workload == "serving":
            plan, serving_found = _serving_memory(plan, launcher, spec, launcher_reg)
            findings += [self._diag(doc, f) for f in serving_found]
        if plan is not None and spec.workload is not None:
            plan = attrs.evolve(plan, workload=spec.workload)
            # a damaged [workload] lost the value its schema error names: no second finding
            found = [] if "workload" in damaged else workload_findings(launcher, spec.workload)
            findings += [self._diag(doc, f) for f in found]
        if plan is not None and backend.hosts is not None:
            nnodes, hosts_of = plan.nnodes, backend.hosts
            hosts = _call(backend_reg, "hosts", lambda: hosts_of(nnodes, backend_options))
            if hosts is not None and len(hosts) == nnodes:
                plan = attrs.evolve(plan, hosts=tuple(hosts))
        if plan is not None:
            for reg, check in ((launcher_reg, launcher.check), (backend_reg, backend.check)):
                # a backend checks only the launchers it runs
                skip = reg.record.name in damaged or (reg is backend_reg and unsupported)
                if check is not None and not skip:
                    # list() inside _call: a generator's errors surface while it is consumed
                    results = _call(
                        reg,
                        "check",
                        functools.partial(_listed, check, plan, plan.options.get(reg.record.name)),
                    )
                    findings += [self._diag(doc, f) for f in _findings(reg, results)]
        findings += [
            self._diag(doc, f) for f in self._unread_tables(doc, (launcher_reg, backend_reg))
        ]
        findings += [self._diag(doc, f) for f in env_findings(spec.job.env)]
        failed = any(d.is_error for d in findings)
        if plan is None or failed or damaged:
            raise SpecError(findings if plan is None or failed else [])
        plan = attrs.evolve(plan, warnings=tuple(sorted(findings, key=Diagnostic.sort_key)))
        launch = _call(
            launcher_reg, "emit", lambda: launcher.emit(plan, plan.options.get(launcher.name))
        )
        self._check_launch(launcher_reg, plan, launch, doc)
        _call(launcher_reg, "emit", lambda: emit.check_paths(launch.files))
        # the backend sees every file a node needs: the role scripts, then the launcher's
        # (a launcher file that takes a role script's path, or a word that is not one, is
        # the launcher's fault, found before the backend runs)
        launched = attrs.evolve(
            launch,
            files=_call(
                launcher_reg, "emit", lambda: (*render_launch(plan, launch), *launch.files)
            ),
        )
        _call(launcher_reg, "emit", lambda: emit.check_paths(launched.files))
        # without a tree the backend's files are dropped; what it reports joins the findings
        with _writing_files(tree), _reporting() as reported:
            scheduler = _call(
                backend_reg,
                "emit",
                lambda: list(backend.emit(plan, launched, plan.options.get(backend.name))),
            )
        final = self._with_reported(doc, plan, reported)
        own = [*launched.files]
        if tree:
            from mdc.describe import plan_json  # only a command that writes the tree

            own.append(Artifact.json(PLAN, plan_json(final, launch)))
        # without the tree, plan.json's path is still taken
        reserved = (emit.MANIFEST,) if tree else (emit.MANIFEST, PLAN)
        _call(backend_reg, "emit", lambda: emit.check_paths([*own, *scheduler], reserved=reserved))
        if not tree:
            return Compiled(plan=final, launch=launch, tree=())
        plugins = {
            name: reg.origin.distribution
            for name, reg in ((launcher.name, launcher_reg), (backend.name, backend_reg))
        }
        files = emit.finish(
            [*own, *scheduler],
            spec_sha256=emit.canonical_sha256((written or doc).data),
            plugins=plugins,
        )
        return Compiled(plan=final, launch=launch, tree=tuple(files))

    def _accelerator_model(
        self, spec: JobSpec, serving: bool
    ) -> tuple[JobSpec, Accelerator | None, list[Finding]]:
        """The catalogue entry ``accelerator_model`` names, and the defaults it sets.

        Its memory becomes ``accelerator_memory_gib`` unless that is written (model-less
        specs get no memory check, so none is set for them), and its vendor the
        ``accelerator`` kind unless that is written.
        """
        dist = spec.distributed
        if dist.accelerator_model is None:
            return spec, None, [] if dist.network is None else [NETWORK_UNUSED]
        known = self.plugins.accelerators()
        entry = known.get(dist.accelerator_model)
        if entry is None:
            return (
                spec,
                None,
                [
                    Finding(
                        code="MDC600",
                        pointer="/distributed/accelerator_model",
                        message=f"accelerator_model {dist.accelerator_model!r} is not in "
                        "mdc's hardware catalogue",
                        hint=f"use one of: {', '.join(known)} (a plugin can add more "
                        "through mdc_register_hardware)",
                    )
                ],
            )
        if dist.accelerator is not None and dist.accelerator != entry.vendor:
            return (
                spec,
                None,
                [
                    Finding(
                        code="MDC601",
                        pointer="/distributed/accelerator",
                        message=f"accelerator = {dist.accelerator!r} but accelerator_model "
                        f"{entry.id!r} is {entry.vendor!r} hardware ({entry.name})",
                        hint=f'set accelerator = "{entry.vendor}", or remove it (the model '
                        "sets it)",
                    )
                ],
            )
        memory = dist.accelerator_memory_gib
        if memory is None and spec.model is not None:
            memory = entry.memory_gib
        dist = attrs.evolve(dist, accelerator=entry.vendor, accelerator_memory_gib=memory)
        return attrs.evolve(spec, distributed=dist), entry, []

    def _check_launch(
        self, reg: Registered, plan: Plan, launch: Launch, doc: LoadedDocument
    ) -> None:
        if not isinstance(launch, Launch):
            raise PluginError(
                reg.origin, "emit", f"returned {type(launch).__name__}, expected mdc.api.Launch"
            )
        if not (
            isinstance(launch.roles, (tuple, list))
            and isinstance(launch.files, (tuple, list))
            and all(isinstance(r, Role) for r in launch.roles)
            and all(isinstance(f, Artifact) for f in launch.files)
        ):
            raise PluginError(
                reg.origin,
                "emit",
                "returned a Launch whose roles are not all "
                "mdc.api.Role or whose files are not all mdc.api.Artifact",
            )
        wanted = sorted(r.name for r in plan.roles)
        given = sorted(r.name for r in launch.roles)
        if wanted != given:
            raise PluginError(reg.origin, "emit", f"returned roles {given}; the plan has {wanted}")
        if any(not f.path.startswith("launch/") for f in launch.files):
            raise PluginError(reg.origin, "emit", "launcher files must lie under launch/")
        managed = {name for role in launch.roles for name in role.env}
        managed |= set(launch.worker_env) | {*RUNTIME_VARIABLES, OUT_DIR.name}
        clashes = sorted(managed & set(plan.job.env))
        if clashes:
            raise SpecError(
                [
                    self._diag(
                        doc,
                        Finding(
                            code="MDC240",
                            pointer=f"/job/env/{name}",
                            message=f"{name} is set by the {plan.launcher} launcher or the "
                            f"{plan.backend} backend; [job] env cannot override it",
                            hint="remove it from [job] env; the plan sets it",
                        ),
                    )
                    for name in clashes
                ]
            )

    def _unread_tables(
        self, doc: LoadedDocument, chosen: tuple[Registered, Registered]
    ) -> Iterator[Finding]:
        """MDC253 for each plugin table in the spec that neither the chosen launcher nor the
        backend reads: it would change nothing, silently."""
        data = doc.data if isinstance(doc.data, dict) else {}
        read = {reg.record.name for reg in chosen}
        for reg in chosen:
            read.update(reg.record.reads)
        launcher, backend = (reg.record.name for reg in chosen)
        for table in sorted(data):
            kind = (
                "launcher"
                if table in self.plugins.launchers
                else "backend"
                if table in self.plugins.backends
                else None
            )
            if kind is None or table in read:
                continue
            origin = self.plugins.plugins.get(table)
            where = (
                f" (plugin {origin.distribution})"
                if origin is not None and origin.distribution != DISTRIBUTION
                else ""
            )
            yield Finding(
                code="MDC253",
                pointer=f"/{table}",
                severity=Severity.WARNING,
                message=f"[{table}] is not read: it holds the options of the {kind} "
                f"{table!r}{where}, and this job runs launcher {launcher!r} on backend "
                f"{backend!r}",
                hint=f'remove [{table}], or set {kind} = "{table}" in [distributed]',
            )

    def _with_reported(self, doc: LoadedDocument, plan: Plan, reported: list[Finding]) -> Plan:
        """The plan with the warnings a backend's emit reported (mdc.api.report); SpecError
        when it reported an error."""
        found = [self._diag(doc, f) for f in reported]
        if any(d.is_error for d in found):
            raise SpecError([*plan.warnings, *found])
        warnings = sorted((*plan.warnings, *found), key=Diagnostic.sort_key)
        return attrs.evolve(plan, warnings=tuple(warnings))

    @staticmethod
    def _diag(doc: LoadedDocument, finding: Finding) -> Diagnostic:
        return Diagnostic(
            severity=finding.severity,
            code=finding.code,
            message=finding.message,
            hint=finding.hint,
            location=doc.locate(finding.pointer),
        )


def _call(reg: Registered, hook: str, function: Callable[[], T]) -> T:
    """Run plugin code, attributing any failure to the plugin."""
    try:
        return function()
    except (SpecError, PluginError):
        raise
    except Exception as exc:
        raise PluginError(
            reg.origin, f"{reg.kind} {reg.record.name!r} {hook}", f"{type(exc).__name__}: {exc}"
        ) from exc


def _listed(
    function: Callable[[Plan, Any], Iterable[Finding]], plan: Plan, options: Any
) -> list[Finding]:
    return list(function(plan, options))


def _findings(reg: Registered, results: Iterable[Any]) -> list[Finding]:
    items = list(results)
    if not all(isinstance(f, Finding) for f in items):
        raise PluginError(
            reg.origin,
            f"{reg.kind} {reg.record.name!r} check",
            "returned something other than mdc.api.Finding records",
        )
    return items


#: what a shell would expand in a literal value: $NAME or ${NAME...}
REFERENCE = re.compile(r"\$(\{[A-Za-z_][A-Za-z0-9_]*[^}]*\}|[A-Za-z_][A-Za-z0-9_]*)")


def env_findings(env: Mapping[str, object]) -> Iterator[Finding]:
    """MDC254: a literal [job] env value that looks like a reference to a variable (it stays
    literal); MDC255: a ``ref`` to a variable mdc does not set; MDC256: an explicit form
    that is not exactly one of prepend, append and ref."""
    for name, value in sorted(env.items()):
        if isinstance(value, str):
            match = REFERENCE.search(value)
            if match is None:
                continue
            ref = match.group(1).strip("{}").split(":")[0].split("-")[0]
            own = ref == name
            yield Finding(
                code="MDC254",
                pointer=f"/job/env/{escape_pointer_token(name)}",
                severity=Severity.WARNING,
                message=f"{name} = {value!r} is passed literally: mdc quotes every value, so "
                f"{match.group(0)} is not expanded"
                + (f" and {name}'s own value is replaced" if own else ""),
                hint=(
                    f'to add to {name}\'s value write {name} = {{ prepend = "..." }} or '
                    '{ append = "..." }'
                    if own
                    else f'to take {ref}\'s value at run time write {name} = {{ ref = "{ref}" }}'
                )
                + "; to keep the text, ignore this",
            )
        elif (
            isinstance(value, EnvValue)
            and sum(v is not None for v in (value.prepend, value.append, value.ref)) != 1
        ):
            yield Finding(
                code="MDC256",
                pointer=f"/job/env/{escape_pointer_token(name)}",
                message=f"[job] env {name} needs exactly one of prepend, append and ref",
                hint=f'for example {name} = {{ prepend = "/opt/tool/bin" }}',
            )
        elif isinstance(value, EnvValue) and value.ref is not None and value.ref not in SET_BY_MDC:
            yield Finding(
                code="MDC255",
                pointer=f"/job/env/{escape_pointer_token(name)}/ref",
                severity=Severity.WARNING,
                message=f"{name} takes {value.ref}, which mdc does not set: it comes from "
                "the node's environment when the launch script runs (empty if unset)",
                hint=f"mdc sets {', '.join(SET_BY_MDC)}",
            )


#: GEMM precisions that need the chip's own tensor cores: without them the frameworks'
#: kernels refuse to start (Transformer Engine needs compute capability 8.9 for FP8 and 10.0
#: for FP4, torch._scaled_mm likewise)
QUANTIZED = ("fp8", "fp4")


def _tensor_cores(
    spec: JobSpec, training: TrainingSetup, hardware: Accelerator, known: Mapping[str, Accelerator]
) -> Iterator[Finding]:
    """A training job whose GEMMs run in a precision its accelerator has no peak for."""
    dtype = spec.model.dtype if spec.model is not None else None
    precision = training.gemms_in(dtype)
    if precision not in QUANTIZED or precision in hardware.dense_tflops:
        return
    having = ", ".join(k for k, a in known.items() if precision in a.dense_tflops)
    written = dtype == precision
    source = f'[model] dtype = "{dtype}"' if written else "the launcher's quantization"
    yield Finding(
        code="MDC602",
        pointer="/model/dtype" if written else "/distributed/accelerator_model",
        message=f"the GEMMs run in {precision} ({source}), and {hardware.name} has no "
        f"{precision} tensor cores: the {precision} kernels refuse to run on it",
        hint=f"train in bf16, or use an accelerator_model with {precision}: {having}",
    )


def _whole_servers(plan: Plan, launcher: LauncherSpec, reg: Registered) -> Plan:
    """The automatic prefill/decode split redone so that each role holds whole servers."""
    split, units_of = plan.disagg, launcher.server_units
    if split is None or split.origin != "auto" or units_of is None:
        return plan
    prefill_unit, decode_unit = _call(
        reg, "server_units", lambda: units_of(plan, plan.options.get(launcher.name))
    )
    units = (max(1, prefill_unit), max(1, decode_unit))
    prefill, decode = auto_split(split.prefill + split.decode, units)
    whole = attrs.evolve(split, prefill=prefill, decode=decode)
    return attrs.evolve(plan, disagg=whole, roles=disagg_roles(whole, plan.nnodes))


def workload_findings(launcher: LauncherSpec, workload: WorkloadTable) -> list[Finding]:
    """[workload] describes serving traffic: a training launcher does not read it; its load
    is one of the requests in flight and their arrival rate."""
    given = [k for k in ("concurrency", "request_rate") if getattr(workload, k) is not None]
    found = []
    if len(given) != 1:
        found.append(
            Finding(
                code="MDC623",
                pointer="/workload/request_rate" if given else "/workload",
                message="[workload] gives both concurrency and request_rate"
                if given
                else "[workload] gives neither concurrency nor request_rate",
                hint="keep one: concurrency (requests in flight, a closed loop) or "
                "request_rate (requests per second, Poisson arrivals)",
            )
        )
    if launcher.workload == "serving":
        return found
    return [
        *found,
        Finding(
            code="MDC620",
            pointer="/workload",
            severity=Severity.WARNING,
            message=f"[workload] describes serving traffic; the training launcher "
            f"{launcher.name!r} does not read it",
            hint="remove [workload], or use a serving launcher (vllm, sglang, trtllm, ...)",
        ),
    ]


def _serving_memory(
    plan: Plan, launcher: LauncherSpec, spec: JobSpec, reg: Registered
) -> tuple[Plan, list[Finding]]:
    """The serving memory estimate from the launcher's setup; MDC261 when none is made."""
    capacity = spec.distributed.accelerator_memory_gib
    if capacity is None or plan.model is None:
        return plan, []
    from mdc.plan import serving_memory  # imported only for a spec that asks for the check
    from mdc.plan.memory import missing_keys, resolve_shape

    shape = resolve_shape(plan.model)
    serving_of = launcher.serving
    setup = (
        None
        if serving_of is None or shape is None
        else _call(reg, "serving", lambda: serving_of(plan, plan.options.get(launcher.name)))
    )
    if shape is None or setup is None:
        why = (
            f"[model] lacks {', '.join(missing_keys(plan.model))}"
            if shape is None
            else f"{launcher.name!r} gives no serving setup"
        )
        return plan, [
            Finding(
                code="MDC261",
                pointer="/distributed/accelerator_memory_gib",
                severity=Severity.WARNING,
                message=f"accelerator_memory_gib = {capacity:g} is set but no serving memory "
                f"estimate is made: {why}",
                hint="complete [model], or remove accelerator_memory_gib",
            )
        ]
    memory = serving_memory.estimate(shape, setup, capacity)
    return attrs.evolve(plan, serving_memory=memory), serving_memory.findings(memory)
