"""mpirun: an MPI launcher for mdc, shipped as a third-party plugin (distribution ``mdc-mpi``).

One MPI launcher call on node 0 starts every rank of the job; the other nodes'
``launch/worker.sh`` has nothing to run and exits 0 (the backends' supervisors
treat only a non-zero exit as a failure: local's and ssh's loop, slurm's
``--kill-on-bad-exit``). Two starters:

* ``mpirun`` (Open MPI; the default except on slurm): ``launch/mpirun.sh`` builds
  ``-H host0:G,host1:G,...`` at run time from ``$NODE_HOSTS`` and runs
  ``mpirun -np W -H ... --map-by slot --bind-to none -x MASTER_ADDR -x MASTER_PORT ...``.
  With exactly G slots per host, mapping by slot puts ranks ``n*G .. n*G+G-1`` on node n,
  as ``--map-by ppr:G:node`` would; unlike ppr it also works when several nodes are the
  same machine (the local backend), whose slots Open MPI adds up.
* ``srun`` (the default on the slurm backend): ``srun --overlap --nodes=N --ntasks=W
  --ntasks-per-node=G --cpus-per-task=C --distribution=block --kill-on-bad-exit=1
  [--mpi=TYPE]`` inside the allocation, beside the per-node task that runs it. Measured on
  SLURM here: without whole nodes (``[slurm] exclusive``) or ``cpus_per_task >= G`` the step
  is refused ("More processors requested than permitted", MDC908); srun's default placement
  was cyclic, hence ``--distribution=block`` (ranks as the plan lays them out); Open MPI
  4.1.4's mpirun inside the allocation waits forever for its daemons' srun step (MDC909).

Every rank runs ``launch/mpi_rank.sh PROGRAM...``, which maps the MPI launcher's
variables onto torch's ``env://`` contract (RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE, GROUP_RANK, NODE_RANK) and checks the world size against the plan.

It imports only ``mdc`` and ``mdc.api``, as any third-party plugin should.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping

import attrs

import mdc
from mdc.api import (
    MASTER_ADDR,
    MASTER_PORT,
    NODE_HOSTS,
    NODE_RANK,
    Artifact,
    Finding,
    Launch,
    LauncherSpec,
    Plan,
    Ref,
    Role,
    Severity,
    Word,
)
from mdc.api.files import read_schema
from mdc.api.shell import out_file, shell_word

__version__ = "0.1.0"

NAME = "mpirun"
STARTER_SCRIPT = "launch/mpirun.sh"
RANK_SCRIPT = "launch/mpi_rank.sh"
#: backends whose nodes are pods: no ssh between them, no MPI launcher to start ranks
POD_BACKENDS = ("kubernetes", "leaderworkerset", "pytorchjob", "trainjob")
#: what every rank needs from node 0 besides its own rank variables
FORWARDED = (MASTER_ADDR.name, MASTER_PORT.name)
#: mpirun options mdc writes itself (without leading dashes), and the [mpirun] key to use
MPIRUN_OWN: dict[str, str | None] = {
    "np": None,
    "n": None,
    "c": None,
    "H": None,
    "host": None,
    "hostfile": None,
    "machinefile": None,
    "default-hostfile": None,
    "map-by": None,
    "bind-to": "bind_to",
    "allow-run-as-root": "allow_run_as_root",
    "oversubscribe": "oversubscribe",
    "x": "export",
    "mca": "mca",
}
#: srun options mdc writes itself
SRUN_OWN: dict[str, str | None] = {
    "overlap": None,
    "N": None,
    "nodes": None,
    "n": None,
    "ntasks": None,
    "ntasks-per-node": None,
    "K": None,
    "kill-on-bad-exit": None,
    "mpi": "srun_mpi",
    "c": None,
    "cpus-per-task": None,
    "m": None,
    "distribution": None,
}
#: a command that already is an MPI or torch launcher
LAUNCHERS = ("mpirun", "mpiexec", "orterun", "prterun", "srun", "torchrun")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@attrs.frozen(kw_only=True)
class MpirunOptions:
    """The ``[mpirun]`` table."""

    starter: str | None = None
    mpirun: str | None = None
    bind_to: str | None = None
    allow_run_as_root: bool | None = None
    oversubscribe: bool | None = None
    mca: Mapping[str, str | int] = attrs.field(factory=dict)
    export: tuple[str, ...] = ()
    srun_mpi: str | None = None
    extra_args: tuple[str, ...] = ()


def _opts(options: MpirunOptions | None) -> MpirunOptions:
    return options if options is not None else MpirunOptions()


def starter(plan: Plan, opts: MpirunOptions) -> str:
    """``mpirun`` or ``srun``: the table's, else srun on the slurm backend, else mpirun."""
    if opts.starter is not None:
        return opts.starter
    return "srun" if plan.backend == "slurm" else "mpirun"


def exported(plan: Plan, opts: MpirunOptions) -> list[str]:
    """Variables mpirun forwards to every rank (``-x``), sorted after MASTER_ADDR/PORT."""
    names = set(plan.job.env) | set(opts.export)
    return [*FORWARDED, *sorted(names - set(FORWARDED))]


Line = list[Word]


def mpirun_lines(plan: Plan, opts: MpirunOptions) -> list[Line]:
    """The mpirun command up to the program, one option per line; ``$host_list`` is
    built at run time."""
    lines: list[Line] = [
        [opts.mpirun or "mpirun"],
        ["-np", str(plan.world_size)],
        ["-H", Ref("host_list")],
        ["--map-by", "slot"],
        ["--bind-to", opts.bind_to or "none"],
    ]
    if opts.allow_run_as_root:
        lines.append(["--allow-run-as-root"])
    if opts.oversubscribe:
        lines.append(["--oversubscribe"])
    lines += [["--mca", key, str(value)] for key, value in sorted(opts.mca.items())]
    lines += [["-x", name] for name in exported(plan, opts)]
    return lines + _extra(opts)


def slurm_cpus_per_task(plan: Plan) -> int | None:
    """``[slurm] cpus_per_task``, read by name: the slurm backend's table is not ours to import."""
    value = getattr(plan.options.get("slurm"), "cpus_per_task", None)
    return value if isinstance(value, int) else None


def slurm_exclusive(plan: Plan) -> bool:
    """Whole nodes: ``[slurm] exclusive``, which the slurm backend takes as true when
    ``cpus_per_task`` is not set."""
    given = getattr(plan.options.get("slurm"), "exclusive", None)
    return given if isinstance(given, bool) else slurm_cpus_per_task(plan) is None


def srun_lines(plan: Plan, opts: MpirunOptions) -> list[Line]:
    """srun inside the allocation, beside the per-node task (``--overlap``): ranks in
    blocks of nproc_per_node per node, in node order, as the plan lays them out. The
    per-node task's SLURM_CPUS_PER_TASK would be inherited, so each rank's share is given."""
    nproc = plan.nproc_per_node
    cpus = slurm_cpus_per_task(plan)
    lines: list[Line] = [
        ["srun"],
        ["--overlap"],
        [f"--nodes={plan.nnodes}"],
        [f"--ntasks={plan.world_size}"],
        [f"--ntasks-per-node={nproc}"],
        [f"--cpus-per-task={max(1, (cpus or 1) // nproc)}"],
        ["--distribution=block"],
        ["--kill-on-bad-exit=1"],
    ]
    if opts.srun_mpi is not None:
        lines.append([f"--mpi={opts.srun_mpi}"])
    return lines + _extra(opts)


def _extra(opts: MpirunOptions) -> list[Line]:
    """The pass-through options, one per line."""
    extra: list[Line] = [[arg] for arg in opts.extra_args]
    return extra


def _command(lines: list[Line]) -> str:
    """``exec`` and the command, one group of words per line, then the job's ``"$@"``."""
    shown = [" ".join(shell_word(w) for w in line) for line in lines]
    return "exec " + " \\\n  ".join(shown) + ' "$@"'


def starter_script(plan: Plan, opts: MpirunOptions) -> str:
    """launch/mpirun.sh: on node 0, one MPI launcher call that starts every rank."""
    nnodes, nproc = plan.nnodes, plan.nproc_per_node
    how = starter(plan, opts)
    rank_words: Line = ["bash", out_file(RANK_SCRIPT)]
    lines = [
        "#!/usr/bin/env bash",
        (
            f"# Starts all {plan.world_size} ranks of job {plan.job.name!r} from node 0 with "
            f"{how} ({nnodes} node(s) x {nproc}); each rank runs"
        ),
        "# launch/mpi_rank.sh with the job's command as its arguments. launch/worker.sh runs",
        "# this on every node; the other nodes have nothing to start and exit 0.",
        "set -euo pipefail",
        ': "${NODE_RANK:?NODE_RANK must be set by the backend}"',
        "if (($# == 0)); then",
        '  echo "mdc: launch/mpirun.sh needs the command to run as its arguments" >&2',
        "  exit 2",
        "fi",
        "if ((NODE_RANK != 0)); then",
        (
            f"  echo \"mdc: node $NODE_RANK: node 0 starts this node's {nproc} rank(s) with "
            f'{how}; nothing to run here" >&2'
        ),
        "  exit 0",
        "fi",
    ]
    if how == "srun":
        lines += [
            'if [[ -z "${SLURM_JOB_ID:-}" ]]; then',
            '  echo "mdc: the srun starter runs inside a SLURM allocation (slurm/job.sbatch)" >&2',
            "  exit 2",
            "fi",
            _command([*srun_lines(plan, opts), rank_words]),
        ]
        return "\n".join(lines)
    lines += [
        ': "${NODE_HOSTS:?NODE_HOSTS must be set by the backend}"',
        'read -r -a hosts <<< "$NODE_HOSTS"',
        f"if ((${{#hosts[@]}} != {nnodes})); then",
        (
            f'  echo "mdc: NODE_HOSTS names ${{#hosts[@]}} host(s); the plan has {nnodes} '
            'node(s)" >&2'
        ),
        "  exit 2",
        "fi",
        f"# host0:{nproc},host1:{nproc},... in node order; Open MPI adds up the slots of a host",
        "# named twice (the local backend's nodes are all 127.0.0.1).",
        "host_list=",
        'for host in "${hosts[@]}"; do',
        f'  host_list+="${{host_list:+,}}$host:{nproc}"',
        "done",
        _command([*mpirun_lines(plan, opts), rank_words]),
    ]
    return "\n".join(lines)


def rank_script(plan: Plan) -> str:
    """launch/mpi_rank.sh: one rank; the MPI launcher's variables become torch's."""
    world, nproc = plan.world_size, plan.nproc_per_node
    return "\n".join(
        [
            "#!/usr/bin/env bash",
            f"# One rank of job {plan.job.name!r} ({world} in all, {nproc} per node), started by an MPI",
            "# launcher. Maps its variables onto torch's env:// contract and runs the arguments:",
            "#   Open MPI   OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE",
            "#   MPICH      PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS (Hydra)",
            "#   SLURM      SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NTASKS_PER_NODE,",
            "#              SLURM_NODEID (srun, also srun --mpi=pmix)",
            "#   PMIx       PMIX_RANK (sizes from the plan)",
            "# RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE; GROUP_RANK and NODE_RANK = the",
            "# node's index (SLURM_NODEID, else RANK / LOCAL_WORLD_SIZE: ranks are placed in",
            "# blocks of LOCAL_WORLD_SIZE per node).",
            "set -euo pipefail",
            'node=""',
            'if [[ -n "${OMPI_COMM_WORLD_RANK:-}" ]]; then',
            '  from="Open MPI (OMPI_COMM_WORLD_*)"',
            '  rank="$OMPI_COMM_WORLD_RANK" size="${OMPI_COMM_WORLD_SIZE:-}"',
            '  local_rank="${OMPI_COMM_WORLD_LOCAL_RANK:-}" local_size="${OMPI_COMM_WORLD_LOCAL_SIZE:-}"',
            'elif [[ -n "${PMI_RANK:-}" && -n "${PMI_SIZE:-}" ]]; then',
            '  from="PMI (PMI_RANK, PMI_SIZE)"',
            '  rank="$PMI_RANK" size="$PMI_SIZE"',
            '  local_rank="${MPI_LOCALRANKID:-}" local_size="${MPI_LOCALNRANKS:-}"',
            'elif [[ -n "${SLURM_PROCID:-}" && -n "${SLURM_NTASKS:-}" ]]; then',
            '  from="SLURM (SLURM_PROCID, SLURM_NTASKS)"',
            '  rank="$SLURM_PROCID" size="$SLURM_NTASKS"',
            '  local_rank="${SLURM_LOCALID:-}" local_size="${SLURM_NTASKS_PER_NODE:-}"',
            '  node="${SLURM_NODEID:-}"',
            'elif [[ -n "${PMIX_RANK:-}" ]]; then',
            '  from="PMIx (PMIX_RANK)"',
            '  rank="$PMIX_RANK" size="" local_rank="" local_size=""',
            "else",
            (
                '  echo "mdc: launch/mpi_rank.sh found no MPI rank variables (OMPI_COMM_WORLD_RANK; '
                "PMI_RANK and PMI_SIZE; SLURM_PROCID and SLURM_NTASKS; PMIX_RANK): it runs under "
                'mpirun or srun, started by launch/mpirun.sh" >&2'
            ),
            "  exit 2",
            "fi",
            'for value in "$rank" "$size" "$local_rank" "$local_size" "$node"; do',
            '  if [[ -n "$value" && ! "$value" =~ ^[0-9]+$ ]]; then',
            "    echo \"mdc: $from gave a rank variable that is not a number: '$value'\" >&2",
            "    exit 2",
            "  fi",
            "done",
            f'size="${{size:-{world}}}"',
            f'local_size="${{local_size:-{nproc}}}"',
            "if ((local_size == 0)); then",
            '  echo "mdc: $from says this node runs 0 ranks" >&2',
            "  exit 2",
            "fi",
            'local_rank="${local_rank:-$((rank % local_size))}"',
            'node="${node:-$((rank / local_size))}"',
            f"if ((size != {world})); then",
            (
                f'  echo "mdc: $from started $size ranks; job {plan.job.name!r} has '
                f'{world} ranks ({plan.nnodes} x {nproc})" >&2'
            ),
            "  exit 2",
            "fi",
            (
                'export RANK="$rank" WORLD_SIZE="$size" LOCAL_RANK="$local_rank" '
                'LOCAL_WORLD_SIZE="$local_size"'
            ),
            'export GROUP_RANK="$node" NODE_RANK="$node"',
            'exec "$@"',
        ]
    )


def emit(plan: Plan, options: MpirunOptions | None) -> Launch:
    opts = _opts(options)
    env: dict[str, Word] = {
        "NODE_RANK": NODE_RANK,
        "MASTER_ADDR": MASTER_ADDR,
        "MASTER_PORT": MASTER_PORT,
        "NODE_HOSTS": NODE_HOSTS,
    }
    argv: tuple[Word, ...] = ("bash", out_file(STARTER_SCRIPT), *plan.job.argv)
    nproc, last = plan.nproc_per_node, plan.nnodes - 1
    srun = starter(plan, opts) == "srun"
    source = "srun's SLURM_PROCID" if srun else "Open MPI's OMPI_COMM_WORLD_RANK"
    node = "SLURM_NODEID" if srun else f"RANK / {nproc}"
    worker_env = {
        "RANK": f"0..{plan.world_size - 1}, from {source} (launch/mpi_rank.sh)",
        "WORLD_SIZE": str(plan.world_size),
        "LOCAL_RANK": f"0..{nproc - 1}, the rank's index on its node",
        "LOCAL_WORLD_SIZE": str(nproc),
        "GROUP_RANK": (f"the node's index, 0..{last} ({node})" if last else "0 (the only node)"),
        "NODE_RANK": "the same as GROUP_RANK",
        "MASTER_ADDR": "node 0's address (set by the backend, forwarded by the launcher)",
        "MASTER_PORT": str(plan.rendezvous.master_port),
    }
    files = (
        Artifact.text(STARTER_SCRIPT, starter_script(plan, opts), executable=True),
        Artifact.text(RANK_SCRIPT, rank_script(plan), executable=True),
    )
    return Launch(
        roles=(Role(name="worker", argv=argv, env=env),), files=files, worker_env=worker_env
    )


# ---------------------------------------------------------------- checks


def _option_name(arg: str) -> str | None:
    if not arg.startswith("-") or arg in ("-", "--"):
        return None
    return arg.lstrip("-").split("=", 1)[0]


def check(plan: Plan, options: MpirunOptions | None) -> Iterator[Finding]:
    opts = _opts(options)
    how = starter(plan, opts)
    yield from _placement_findings(plan, how)
    yield from _unused_keys(opts, how)
    yield from _repeated_options(plan, opts, how)
    first = plan.job.argv[0].rsplit("/", 1)[-1] if plan.job.argv else ""
    if first in LAUNCHERS:
        yield Finding(
            code="MDC906",
            pointer="/job/command",
            message=f"the command starts with {first}; the mpirun launcher starts "
            f"the {plan.world_size} ranks itself, so each would start more",
            hint='give the program only, e.g. ["python", "train.py"]',
        )


def _placement_findings(plan: Plan, how: str) -> Iterator[Finding]:
    """Where the job runs against how it starts: the backend, elasticity, the starter."""
    if plan.backend in POD_BACKENDS:
        yield Finding(
            code="MDC900",
            pointer="/distributed/backend",
            message=f"the mpirun launcher starts every rank from node 0 over ssh or "
            f"srun; backend {plan.backend!r} runs each node in its own pod, "
            "with neither between them",
            hint='use backend = "slurm", "ssh" or "local", or launcher = "torchrun" on Kubernetes',
        )
    if plan.elastic:
        yield Finding(
            code="MDC902",
            pointer="/distributed/min_nnodes",
            message=f"an MPI job has a fixed size ({plan.world_size} ranks); it "
            f"cannot run elastically (min_nnodes {plan.min_nnodes} < nnodes "
            f"{plan.nnodes})",
            hint=f"remove min_nnodes, or set it to nnodes ({plan.nnodes})",
        )
    if how == "srun" and plan.backend != "slurm":
        yield Finding(
            code="MDC903",
            pointer="/mpirun/starter",
            message=f'starter "srun" needs a SLURM allocation; backend {plan.backend!r} has none',
            hint='use starter = "mpirun", or backend = "slurm"',
        )
    cpus = slurm_cpus_per_task(plan)
    if (
        how == "srun"
        and plan.backend == "slurm"
        and not slurm_exclusive(plan)
        and (cpus is None or cpus < plan.nproc_per_node)
    ):
        yield Finding(
            code="MDC908",
            pointer="/distributed/nproc_per_node",
            severity=Severity.WARNING,
            message=f"srun starts {plan.nproc_per_node} ranks per node inside an "
            f"allocation of one task per node with "
            f'{cpus or 1} CPU(s): SLURM refuses the step ("More processors '
            'requested than permitted") unless the nodes are whole',
            hint=f"set [slurm] exclusive = true, or [slurm] cpus_per_task to at "
            f"least {plan.nproc_per_node}",
        )
    if how == "mpirun" and plan.backend == "slurm":
        yield Finding(
            code="MDC909",
            pointer="/mpirun/starter",
            severity=Severity.WARNING,
            message="Open MPI's mpirun inside a SLURM allocation starts its daemons "
            "with srun, which waits for the CPUs the per-node tasks hold, "
            "and takes its slots from the allocation (1 task per node), not "
            f"from -H host:{plan.nproc_per_node} (measured with Open MPI "
            "4.1.4)",
            hint="remove starter (srun is the default on slurm), or add "
            'mca = { plm_slurm_args = "--overlap" } and oversubscribe = true',
        )


def _unused_keys(opts: MpirunOptions, how: str) -> Iterator[Finding]:
    """The [mpirun] keys of the starter the job does not use."""
    unused = (
        ["mpirun", "bind_to", "allow_run_as_root", "oversubscribe", "mca", "export"]
        if how == "srun"
        else ["srun_mpi"]
    )
    for key in unused:
        value = getattr(opts, key)
        if value not in (None, (), {}):
            yield Finding(
                code="MDC904",
                pointer=f"/mpirun/{key}",
                severity=Severity.WARNING,
                message=f"[mpirun] {key} is not used: the job starts with {how}",
                hint=f"remove {key}, or set starter to the launcher it is for",
            )


def _repeated_options(plan: Plan, opts: MpirunOptions, how: str) -> Iterator[Finding]:
    """extra_args that repeat what mdc writes, and exports forwarded already."""
    own = SRUN_OWN if how == "srun" else MPIRUN_OWN
    for index, arg in enumerate(opts.extra_args):
        name = _option_name(arg)
        if name is not None and name in own:
            table_key = own[name]
            yield Finding(
                code="MDC901",
                pointer=f"/mpirun/extra_args/{index}",
                message=f"[mpirun] extra_args entry {arg!r} repeats an option mdc "
                f"writes on the {how} line itself",
                hint=(
                    f"set [mpirun] {table_key} instead"
                    if table_key
                    else "remove it: mdc derives it from [distributed]"
                ),
            )
    for index, name in enumerate(opts.export if how == "mpirun" else ()):
        if name in FORWARDED or name in plan.job.env:
            yield Finding(
                code="MDC905",
                pointer=f"/mpirun/export/{index}",
                severity=Severity.WARNING,
                message=f"[mpirun] export {name!r} is forwarded already "
                "(MASTER_ADDR, MASTER_PORT and every [job] env name are)",
                hint=f"remove {name!r} from export",
            )


@mdc.hookimpl
def mdc_register_launchers() -> list[LauncherSpec]:
    return [
        LauncherSpec(
            name=NAME,
            description="MPI: one mpirun (Open MPI) or srun on node 0 starts every rank; "
            "MPI rank variables mapped onto torch's env:// contract",
            parallelism="data",
            emit=emit,
            check=check,
            schema=read_schema("mdc_mpi", "schemas/mpirun.v1.schema.json"),
            options_type=MpirunOptions,
        )
    ]


__all__ = [
    "MpirunOptions",
    "check",
    "emit",
    "mdc_register_launchers",
    "rank_script",
    "starter_script",
]
