"""The slurm backend: one batch script, one ``srun`` task per node.

``slurm/job.sbatch`` holds the ``#SBATCH`` directives (from the plan and the
``[slurm]`` table), finds the compiled tree, sets ``MASTER_ADDR`` to the first
host of the allocation, ``MDC_LAUNCH_ID`` to ``SLURM_JOB_ID`` and ``MASTER_PORT`` to the
spec's port, else to one derived from the job id (free on node 0, where the script runs),
and runs
``srun --kill-on-bad-exit=1`` with one task per node. Each task runs
``slurm/node.sh``, which takes ``NODE_RANK`` from ``SLURM_NODEID`` and runs
that node's role, ``launch/<role>.sh`` (in a container when asked: pyxis or
apptainer). Nothing about the cluster is looked up at compile time.

Without ``cpus_per_task`` the job takes whole nodes (``--exclusive``), so the one
task per node, which runs all the node's ranks, gets every CPU of its node rather than
SLURM's default of one; a CPU job asks one CPU per rank instead (an exclusive job gets
the node's GPUs too). An elastic job (``--nodes=MIN-MAX``) writes no
``--ntasks-per-node`` directive: with it sbatch sizes the job from the minimum and
allocates MIN nodes even when MAX are idle; srun still runs one task per node. ``[slurm]
setup`` and ``teardown`` commands run in the batch script before srun and when it exits.

``#SBATCH`` lines are read by sbatch itself, not by a shell, so their values
cannot be quoted: they are checked instead (no whitespace, quotes, ``#`` or
backslashes). Everything on a shell line is quoted.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence

import attrs

import mdc
from mdc.api import Artifact, BackendSpec, Concat, Finding, Launch, Plan, Ref, Severity, Word
from mdc.api.files import read_schema, script_path
from mdc.api.shell import around_launch, launch_id_lines, port_lines, shell_join, shell_word

from .slurm_time import time_minutes

#: Directives mdc writes itself, by ``[slurm]`` key (None: from the plan, not a key).
DIRECTIVES: dict[str, str | None] = {
    "job-name": None,
    "nodes": None,
    "ntasks-per-node": None,
    "gpus-per-node": "gpus_per_node",
    "cpus-per-task": "cpus_per_task",
    "mem": "mem",
    "time": "time",
    "partition": "partition",
    "account": "account",
    "qos": "qos",
    "constraint": "constraint",
    "exclusive": "exclusive",
    "nodelist": "nodelist",
    "exclude": "exclude",
    "output": "output",
    "error": "error",
}
#: Options that would contradict a directive mdc writes (other spellings of the same request).
CONFLICTS = {
    "ntasks": "--nodes and --ntasks-per-node",
    "tasks-per-node": "--ntasks-per-node",
    "gpus": "--gpus-per-node",
    "gres": "--gpus-per-node",
    "mem-per-cpu": "--mem",
    "mem-per-gpu": "--mem",
    "cpus-per-gpu": "--cpus-per-task",
    "wrap": "the batch script",
}
#: The [slurm] key that sets what a conflicting option asks for.
CONFLICT_KEYS = {
    "gpus": "gpus_per_node",
    "gres": "gpus_per_node",
    "mem-per-cpu": "mem",
    "mem-per-gpu": "mem",
    "cpus-per-gpu": "cpus_per_task",
}
#: srun options mdc writes, and what they would contradict.
SRUN_OWN = {
    "kill-on-bad-exit": "kill-on-bad-exit",
    "nodes": "nodes",
    "ntasks": "ntasks",
    "ntasks-per-node": "ntasks-per-node",
    "tasks-per-node": "ntasks-per-node",
    "cpus-per-task": "cpus-per-task",
    "container-image": "container-image",
    "container-mounts": "container-mounts",
}
#: Characters an #SBATCH value cannot hold: sbatch splits on whitespace, strips quotes,
#: and treats "#" as the start of a comment; nothing on that line is a shell.
UNSAFE = re.compile(r"[\s\"'#\\]|[\x00-\x1f\x7f]")
LONG_OPTION = re.compile(r"--([a-z][a-z0-9-]*)(=(.+))?", re.DOTALL)
#: sbatch --mem: an integer (ASCII digits: SLURM reads it with strtoll) with an optional K,
#: M, G or T suffix, B allowed after it (default MB); 0 = all of each node's memory
MEMORY = re.compile(r"[0-9]+([KMGT]B?)?", re.IGNORECASE)
#: --gpus-per-node: [type:]count
GPUS = re.compile(r"(?:([A-Za-z0-9_.-]+):)?([0-9]+)")
#: a container mount: SRC[:DST[:FLAGS]], no commas (pyxis and apptainer split on them)
MOUNT = re.compile(r"/[^,:\s]*(:/[^,:\s]*(:[A-Za-z0-9_+-]+)?)?")
IMAGE_SCHEME = re.compile(r"[a-z][a-z0-9+.-]*://")

OUT = Ref("out")


@attrs.frozen(kw_only=True, repr=False)  # options are read, never shown
class ContainerOptions:
    """``[slurm.container]``: run each node's task in ``[job] image``."""

    runtime: str
    mounts: tuple[str, ...] = ()


@attrs.frozen(kw_only=True, repr=False)  # options are read, never shown
class SlurmOptions:
    """The ``[slurm]`` table."""

    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time: str | int | None = None
    constraint: str | None = None
    exclusive: bool | None = None
    nodelist: str | None = None
    exclude: str | None = None
    mem: str | int | None = None
    cpus_per_task: int | None = None
    gpus_per_node: str | int | None = None
    output: str | None = None
    error: str | None = None
    sbatch_args: tuple[str, ...] = ()
    srun_args: tuple[str, ...] = ()
    modules: tuple[str, ...] = ()
    container: ContainerOptions | None = None
    #: commands (argv lists) the batch script runs before srun, and when it exits
    setup: tuple[tuple[str, ...], ...] = ()
    teardown: tuple[tuple[str, ...], ...] = ()


def _opts(options: SlurmOptions | None) -> SlurmOptions:
    return options if options is not None else SlurmOptions()


def gpus_per_node(plan: Plan, opts: SlurmOptions) -> str | None:
    """The ``--gpus-per-node`` value: the table's, else nproc_per_node on GPU nodes."""
    if opts.gpus_per_node is not None:
        text = str(opts.gpus_per_node)
        return None if text == "0" else text
    return None if plan.accelerator == "cpu" else str(plan.nproc_per_node)


def nodes_value(plan: Plan) -> str:
    return f"{plan.min_nnodes}-{plan.nnodes}" if plan.elastic else str(plan.nnodes)


def with_cpu_default(plan: Plan, opts: SlurmOptions) -> SlurmOptions:
    """A CPU job that sizes neither asks one CPU per rank (``--cpus-per-task=nproc_per_node``)
    instead of whole nodes: SLURM hands an exclusive job every GPU of its nodes as well
    (measured on the test SLURM: all 8 of a node's GPUs)."""
    if plan.accelerator == "cpu" and opts.cpus_per_task is None and opts.exclusive is None:
        return attrs.evolve(opts, cpus_per_task=plan.nproc_per_node)
    return opts


def exclusive(opts: SlurmOptions) -> bool:
    """Whether the job asks for whole nodes: as the table says, else when it does not size
    the node's task (cpus_per_task), so that the one task running all of a node's ranks gets
    every CPU of the node rather than SLURM's default of one."""
    return opts.exclusive if opts.exclusive is not None else opts.cpus_per_task is None


def directives(plan: Plan, opts: SlurmOptions) -> list[str]:
    """Every ``#SBATCH`` option, in a fixed order: mdc's own, then the pass-through list."""
    found: list[tuple[str, str | None]] = [
        ("job-name", plan.job.name),
        ("nodes", nodes_value(plan)),
        # an elastic job leaves it to srun: with it, sbatch --nodes=1-3 counts the job's tasks
        # from the minimum and allocates 1 node on an idle cluster (plain --nodes=1-3: 3)
        ("ntasks-per-node", None if plan.elastic else "1"),
        ("gpus-per-node", gpus_per_node(plan, opts)),
        ("cpus-per-task", None if opts.cpus_per_task is None else str(opts.cpus_per_task)),
        ("mem", None if opts.mem is None else str(opts.mem)),
        ("time", None if opts.time is None else str(opts.time)),
        ("partition", opts.partition),
        ("account", opts.account),
        ("qos", opts.qos),
        ("constraint", opts.constraint),
        ("nodelist", opts.nodelist),
        ("exclude", opts.exclude),
        ("output", opts.output),
        ("error", opts.error),
    ]
    lines = [f"--{name}={value}" for name, value in found if value is not None]
    if exclusive(opts):
        lines.append("--exclusive")
    return [*lines, *opts.sbatch_args]


def pyxis_image(image: str) -> str:
    """An image reference as enroot reads it: ``REGISTRY#NAME:TAG`` for a registry host."""
    image = image.removeprefix("docker://")
    if image.startswith(("/", ".")) or "#" in image or "/" not in image:
        return image
    first, rest = image.split("/", 1)
    if "." in first or ":" in first or first == "localhost":
        return f"{first}#{rest}"
    return image


def apptainer_image(image: str) -> str:
    """A registry reference gets ``docker://``; files and other schemes stay as written."""
    if IMAGE_SCHEME.match(image) or image.startswith(("/", ".")) or image.endswith(".sif"):
        return image
    return f"docker://{image}"


def _mount_words(mounts: Sequence[str]) -> str:
    return "".join("," + m for m in mounts)


def _out_mount_check(what: str) -> list[str]:
    return [
        'case "$out" in',
        (
            f"  *[,:]*) echo \"mdc: the compiled tree's path $out holds ',' or ':', which {what} "
            'cannot mount; move it" >&2; exit 2 ;;'
        ),
        "esac",
    ]


def batch_script(plan: Plan, opts: SlurmOptions) -> str:
    lines = ["#!/bin/bash", *(f"#SBATCH {d}" for d in directives(plan, opts))]
    lines += [
        (
            f"# Job {plan.job.name!r} on SLURM: {nodes_value(plan)} node(s) x "
            f"{plan.nproc_per_node} process(es), launcher {plan.launcher}; one srun task per node "
            "runs slurm/node.sh."
        ),
        "# Submit from inside the compiled tree (on a filesystem every node sees):",
        "#   cd OUT && sbatch slurm/job.sbatch",
        "# or from anywhere: MDC_OUT=/absolute/path/to/OUT sbatch OUT/slurm/job.sbatch",
        "# SLURM runs a copy of this script, so the tree is found through MDC_OUT or the",
        "# submit directory, never through the script's own path.",
    ]
    lines += _shell_options(opts)
    lines += [
        'out="${MDC_OUT:-${SLURM_SUBMIT_DIR:-}}"',
        'if [[ -z "$out" || ! -f "$out/slurm/node.sh" || ! -d "$out/launch" ]]; then',
        (
            "  echo \"mdc: no compiled tree at '$out' (no slurm/node.sh and launch/ there): submit "
            'from inside it (cd OUT && sbatch slurm/job.sbatch) or set MDC_OUT=/path/to/OUT" >&2'
        ),
        "  exit 2",
        "fi",
        'out="$(cd "$out" && pwd)"',
        'if [[ -z "${SLURM_JOB_NODELIST:-}" ]]; then',
        '  echo "mdc: not inside a SLURM job: submit this script with sbatch" >&2',
        "  exit 2",
        "fi",
        'nodes="${SLURM_JOB_NUM_NODES:-0}"',
        *_node_count_check(plan),
        "# Node 0 is the first host of the allocation; srun gives it SLURM_NODEID 0.",
        'mapfile -t hosts < <(scontrol show hostnames "$SLURM_JOB_NODELIST")',
        "if ((${#hosts[@]} != nodes)); then",
        '  echo "mdc: scontrol show hostnames gave ${#hosts[@]} host(s) for $nodes node(s)" >&2',
        "  exit 2",
        "fi",
        'export MASTER_ADDR="${hosts[0]}"',
        'export NODE_HOSTS="${hosts[*]}"',
        *launch_id_lines("SLURM_JOB_ID", "SLURM"),
        # SLURM runs this script on the first node of the allocation, node 0: it probes
        # there, and srun gives every node the port it chose
        *port_lines(
            plan.rendezvous.master_port,
            plan.rendezvous.derived,
            probe='[[ "${SLURMD_NODENAME:-}" == "${hosts[0]}" ]]',
        ),
        'export MDC_OUT="$out"',
        *around_launch(opts.setup, opts.teardown, "slurm"),
    ]
    srun: list[Word] = ["srun", "--kill-on-bad-exit=1"]
    count: Word = Concat(("--nodes=", Ref("nodes"))) if plan.elastic else f"--nodes={plan.nnodes}"
    tasks: Word = Concat(("--ntasks=", Ref("nodes"))) if plan.elastic else f"--ntasks={plan.nnodes}"
    srun += [count, tasks, "--ntasks-per-node=1"]
    if opts.cpus_per_task is not None:  # srun does not take it from the job (SLURM 22.05+)
        srun.append(f"--cpus-per-task={opts.cpus_per_task}")
    container = opts.container
    if container is not None and container.runtime == "pyxis" and plan.job.image:
        lines += _out_mount_check("pyxis")
        srun += [
            f"--container-image={pyxis_image(plan.job.image)}",
            Concat(("--container-mounts=", OUT, ":", OUT, _mount_words(container.mounts))),
        ]
    srun += [*opts.srun_args, "bash", Concat((OUT, "/slurm/node.sh"))]
    # with a teardown the shell stays, to run it when srun ends
    lines.append(("" if opts.teardown else "exec ") + " \\\n  ".join(_grouped(srun)))
    return "\n".join(lines)


def _shell_options(opts: SlurmOptions) -> list[str]:
    """The batch shell's options, with the job's modules loaded first (``set -u`` after
    them: module scripts read unset variables)."""
    if opts.modules:
        return [
            "# A batch shell is not a login shell: set up the module command if it is missing.",
            "if ! command -v module >/dev/null 2>&1 && [[ -r /etc/profile ]]; then",
            "  # shellcheck source=/dev/null",
            "  . /etc/profile",
            "fi",
            "set -eo pipefail",
            *(f"module load {shell_word(m)}" for m in opts.modules),
            "set -u",
        ]
    return ["set -euo pipefail"]


def _node_count_check(plan: Plan) -> list[str]:
    """Bash lines stopping a job of another node count than the plan's (an elastic plan's
    range)."""
    if plan.elastic:
        wrong = f"nodes < {plan.min_nnodes} || nodes > {plan.nnodes}"
        said = f"the plan runs on {plan.min_nnodes} to {plan.nnodes}"
    else:
        wrong = f"nodes != {plan.nnodes}"
        said = f"the plan needs exactly {plan.nnodes} (was --nodes given to sbatch?)"
    return [
        f"if (({wrong})); then",
        f'  echo "mdc: the job has $nodes node(s); {said}" >&2',
        "  exit 2",
        "fi",
    ]


def _grouped(words: Sequence[Word]) -> list[str]:
    """Shell words, one option per line: an option stays on the line of the word before it
    unless it starts with "--"."""
    lines: list[str] = []
    for word in words:
        text = shell_word(word)
        starts_option = (
            isinstance(word, str)
            and word.startswith("--")
            or isinstance(word, Concat)
            and str(word.parts[0]).startswith("--")
        )
        if lines and not starts_option and word != "bash":
            lines[-1] += " " + text
        else:
            lines.append(text)
    return lines


def _role_dispatch(plan: Plan) -> list[str]:
    """``script=launch/<role>.sh`` for this node's role (roles are consecutive node ranges)."""

    def assign(name: str) -> str:
        return f"script={shell_word(script_path(name))}"

    if len(plan.roles) == 1:
        return [assign(plan.roles[0].name)]
    lines = []
    for index, role in enumerate(plan.roles):
        if index == len(plan.roles) - 1:
            lines.append(f"else {assign(role.name)}")
        else:
            keyword = "if" if index == 0 else "elif"
            last = role.first_node + role.count
            lines.append(f"{keyword} ((NODE_RANK < {last})); then {assign(role.name)}")
    lines.append("fi")
    return lines


def node_script(plan: Plan, opts: SlurmOptions) -> str:
    lines = [
        "#!/usr/bin/env bash",
        (
            f"# One srun task per node of job {plan.job.name!r}: NODE_RANK is SLURM_NODEID "
            "(0 on the first host, MASTER_ADDR),"
        ),
        "# then the node's role runs: launch/<role>.sh. Started by slurm/job.sbatch.",
        "set -euo pipefail",
        'if [[ -z "${SLURM_NODEID:-}" || -z "${MASTER_ADDR:-}" || -z "${MASTER_PORT:-}" ]]; then',
        '  echo "mdc: slurm/node.sh is run by slurm/job.sbatch through srun" >&2',
        "  exit 2",
        "fi",
        'if [[ "${SLURM_LOCALID:-0}" != 0 ]]; then',
        '  echo "mdc: more than one task on node $SLURM_NODEID; the plan runs one per node" >&2',
        "  exit 2",
        "fi",
        'out="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"',
        'export NODE_RANK="$SLURM_NODEID"',
        *_role_dispatch(plan),
    ]
    run: list[Word] = []
    container = opts.container
    if container is not None and container.runtime == "apptainer" and plan.job.image:
        lines += _out_mount_check("apptainer")
        run += ["apptainer", "exec"]
        if plan.accelerator in ("nvidia", "amd"):
            run.append("--nv" if plan.accelerator == "nvidia" else "--rocm")
        run += ["--bind", Concat((OUT, _mount_words(container.mounts)))]
        run.append(apptainer_image(plan.job.image))
    run += ["bash", Concat((OUT, "/", Ref("script")))]
    lines.append(f"exec {shell_join(run)}")
    return "\n".join(lines)


def emit(plan: Plan, launch: Launch, options: SlurmOptions | None) -> list[Artifact]:
    opts = with_cpu_default(plan, _opts(options))
    return [
        Artifact.text("slurm/job.sbatch", batch_script(plan, opts), executable=True),
        Artifact.text("slurm/node.sh", node_script(plan, opts), executable=True),
    ]


# ---------------------------------------------------------------- checks


def _unsafe(value: str) -> str | None:
    """Why ``value`` cannot stand on an #SBATCH line, or None."""
    found = UNSAFE.search(value)
    if found is None:
        return None
    char = found.group()
    names = {
        " ": "a space",
        "\t": "a tab",
        "\n": "a line break",
        "#": "'#'",
        '"': "a quote",
        "'": "a quote",
        "\\": "a backslash",
    }
    return names.get(char, f"the character {char!r}")


def _value_findings(opts: SlurmOptions) -> Iterator[Finding]:
    hint = (
        "sbatch reads #SBATCH lines itself and cannot take shell quoting: use a value "
        "without whitespace, quotes, '#' or backslashes"
    )
    for key in (
        "partition",
        "account",
        "qos",
        "constraint",
        "nodelist",
        "exclude",
        "output",
        "error",
        "time",
        "mem",
        "gpus_per_node",
    ):
        value = getattr(opts, key)
        if value is None:
            continue
        why = _unsafe(str(value))
        if why is not None:
            yield Finding(
                code="MDC412",
                pointer=f"/slurm/{key}",
                hint=hint,
                message=f"[slurm] {key} {str(value)!r} holds {why}, which an #SBATCH "
                "line cannot carry",
            )
        elif key == "time" and time_minutes(str(value)) is None:
            yield Finding(
                code="MDC415",
                pointer="/slurm/time",
                message=f"[slurm] time {str(value)!r} is not a SLURM time limit",
                hint='write minutes (90), "HH:MM:SS" ("12:00:00") or "D-HH:MM:SS" '
                '("2-00:00:00"), or MM:SS, D-HH, D-HH:MM, in ASCII digits',
            )
        elif key == "mem" and not MEMORY.fullmatch(str(value)):
            yield Finding(
                code="MDC416",
                pointer="/slurm/mem",
                message=f"[slurm] mem {str(value)!r} is not a SLURM memory size",
                hint="write megabytes (64000) or a number with K, M, G or T "
                '("480G"); 0 asks for all of each node\'s memory',
            )
        elif key == "gpus_per_node" and isinstance(value, str) and not GPUS.fullmatch(value):
            yield Finding(
                code="MDC417",
                pointer="/slurm/gpus_per_node",
                message=f"[slurm] gpus_per_node {value!r} is not a GPU count",
                hint='write a count (8) or "TYPE:COUNT" ("h100:8")',
            )


def _pass_through_findings(
    args: Sequence[str], key: str, code: str, own: dict[str, str]
) -> Iterator[Finding]:
    tool = "sbatch" if key == "sbatch_args" else "srun"
    for index, arg in enumerate(args):
        pointer = f"/slurm/{key}/{index}"
        shape = LONG_OPTION.fullmatch(arg)
        if shape is None:
            yield Finding(
                code=code,
                pointer=pointer,
                message=f"[slurm] {key} entry {arg!r} is not a long {tool} option "
                "(--name or --name=value)",
                hint="write one option per entry, as --name=value "
                '("--reservation=big"); short options (-x) are not accepted',
            )
            continue
        name, value = shape.group(1), shape.group(3)
        if name in own:
            yield Finding(
                code=code,
                pointer=pointer,
                message=f"[slurm] {key} entry {arg!r} repeats --{own[name]}, "
                "which mdc writes itself",
                hint=_own_hint(name, key),
            )
        elif key == "sbatch_args" and name in CONFLICTS:
            yield Finding(
                code=code,
                pointer=pointer,
                message=f"[slurm] {key} entry {arg!r} contradicts "
                f"{CONFLICTS[name]}, which mdc writes",
                hint=_own_hint(name, key),
            )
        elif abbreviated := sorted(d for d in own if d.startswith(name)):
            yield Finding(
                code=code,
                pointer=pointer,
                message=f"[slurm] {key} entry {arg!r} abbreviates "
                f"--{abbreviated[0]}, which mdc writes itself",
                hint=_own_hint(abbreviated[0], key),
            )
        elif key == "sbatch_args" and value is not None and (why := _unsafe(value)):
            yield Finding(
                code=code,
                pointer=pointer,
                message=f"[slurm] sbatch_args entry {arg!r} holds {why}, which an "
                "#SBATCH line cannot carry",
                hint="sbatch reads #SBATCH lines itself and cannot take shell "
                "quoting: use a value without whitespace, quotes, '#' or "
                "backslashes",
            )


def _own_hint(name: str, key: str) -> str:
    if key == "srun_args":
        return "remove it: mdc's srun runs one task per node with the plan's counts"
    table_key = DIRECTIVES.get(name) or CONFLICT_KEYS.get(name)
    if table_key:
        return f"remove it and set [slurm] {table_key} instead"
    return "remove it: the plan decides it (nnodes, one task per node)"


def check(plan: Plan, options: SlurmOptions | None) -> Iterator[Finding]:
    opts = _opts(options)
    yield from _value_findings(opts)
    yield from _pass_through_findings(
        opts.sbatch_args, "sbatch_args", "MDC413", {name: name for name in DIRECTIVES}
    )
    yield from _pass_through_findings(opts.srun_args, "srun_args", "MDC414", SRUN_OWN)
    container = opts.container
    if container is not None and not plan.job.image:
        yield Finding(
            code="MDC410",
            pointer="/slurm/container",
            message=f"[slurm] container runs {container.runtime} but [job] image is not set",
            hint='set [job] image (for example "nvcr.io/nvidia/pytorch:25.01-py3"), '
            "or remove [slurm] container",
        )
    if container is None and plan.job.image:
        yield Finding(
            code="MDC411",
            pointer="/job/image",
            severity=Severity.WARNING,
            message="[job] image is not used: the slurm backend runs on the nodes' "
            "own software unless [slurm] container is set",
            hint='add [slurm] container = { runtime = "pyxis" } (or "apptainer")',
        )
    if container is not None:
        for index, mount in enumerate(container.mounts):
            if not MOUNT.fullmatch(mount):
                yield Finding(
                    code="MDC418",
                    pointer=f"/slurm/container/mounts/{index}",
                    message=f"[slurm] container mount {mount!r} is not /SRC[:/DST[:FLAGS]]",
                    hint="write absolute paths without ',' ':' or spaces in them, "
                    'as "/data:/data:ro"',
                )
    gpus = gpus_per_node(plan, opts)
    count = GPUS.fullmatch(gpus) if gpus is not None else None
    if (
        plan.accelerator != "cpu"
        and count is not None
        and len(count.group(2).lstrip("0")) < 8  # a count past any node's GPUs is no warning
        and int(count.group(2)) < plan.nproc_per_node
    ):
        yield Finding(
            code="MDC419",
            pointer="/slurm/gpus_per_node",
            severity=Severity.WARNING,
            message=f"each node asks for {count.group(2)} GPU(s) but runs "
            f"{plan.nproc_per_node} process(es): some processes share a GPU",
            hint=f"set gpus_per_node = {plan.nproc_per_node}, or lower nproc_per_node",
        )
    if plan.accelerator != "cpu" and gpus is None:
        yield Finding(
            code="MDC419",
            pointer="/slurm/gpus_per_node",
            severity=Severity.WARNING,
            message=f"gpus_per_node = 0 asks for no GPUs, but the job runs "
            f"{plan.nproc_per_node} {plan.accelerator} process(es) per node",
            hint=f"remove gpus_per_node (it defaults to {plan.nproc_per_node}), or "
            'set accelerator = "cpu"',
        )
    yield from _cpu_findings(plan, with_cpu_default(plan, opts))


def _cpu_findings(plan: Plan, opts: SlurmOptions) -> Iterator[Finding]:
    """MDC420: the node's one task, which runs all nproc_per_node ranks, is pinned to fewer
    CPUs than ranks (under cgroup enforcement they share them)."""
    if exclusive(opts):
        return  # whole nodes: the task gets every CPU of its node
    cpus = opts.cpus_per_task if opts.cpus_per_task is not None else 1
    if cpus >= plan.nproc_per_node:
        return
    given = "cpus_per_task" if opts.cpus_per_task is not None else "exclusive"
    yield Finding(
        code="MDC420",
        pointer=f"/slurm/{given}",
        severity=Severity.WARNING,
        message=f"each node's task runs {plan.nproc_per_node} process(es) on "
        f"{cpus} CPU(s)"
        + ("" if opts.cpus_per_task is not None else " (SLURM's default without cpus_per_task)")
        + ": under cgroup enforcement (task/cgroup) they share them, and data loading "
        "and the launcher's own threads starve",
        hint=f"set cpus_per_task to at least {plan.nproc_per_node} (the node's CPUs, for "
        "example), or remove exclusive = false to get whole nodes",
    )


@mdc.hookimpl
def mdc_register_backends() -> list[BackendSpec]:
    return [
        BackendSpec(
            name="slurm",
            description="SLURM: slurm/job.sbatch, one srun task per node (pyxis or apptainer "
            "optional)",
            emit=emit,
            check=check,
            schema=read_schema("mdc_schemas", "plugins/slurm.v1.schema.json"),
            options_type=SlurmOptions,
            run_command="cd {out} && sbatch slurm/job.sbatch",  # sbatch runs a spooled copy
        )
    ]
