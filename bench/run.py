"""mdc benchmarks: mdc against its peers on the same work, the million-rank plan, artifact
sizes and where `mdc validate` spends its imports.

    .venv/bin/python -m bench.run [--runs N]

Run it with the project's venv (``scripts/test`` creates it). The first run creates
``bench/.venv`` and pip-installs the peers there (check-jsonschema and torchx, pinned
below; neither pulls torch). Every whole-process number is the median of N (default 11)
runs taken alternately (mdc, peer, mdc, peer, ...) after one untimed warm-up of each, so
load on the machine hits both sides alike: wall time, CPU time (user + system) and peak
RSS of the process, from ``os.wait4``. Both sides run with bytecode caching on (into
``bench/.venv/pycache``), as an installed tool does.

What is compared:

- ``mdc validate`` of 1 spec and of 100 specs (the examples, in their own formats: TOML,
  YAML, JSON) against ``check-jsonschema --schemafile`` with the schema ``mdc schema``
  prints, on the same files. check-jsonschema checks the schema only; mdc also plans
  every spec and runs the launcher's and backend's checks.
- ``mdc compile`` of a 2x8 torchrun SLURM spec against
  ``torchx run --dryrun -s slurm dist.ddp -j 2x8 --script train.py``. mdc writes the tree
  to disk; torchx prints its sbatch script.
- Each piece mdc writes itself instead of using a library (the quick schema check, the
  YAML fast path, the entry-point scan, the structurer) against that library: the same
  three mdc commands, whole process, as shipped and with the piece swapped for the
  library. A piece stays only where it saves at least 10 % of one of them.

The report is Markdown on stdout, also written to ``bench/results/latest.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import tomllib
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
VENV = BENCH / ".venv"
PEERS = ("check-jsonschema==0.39.0", "torchx==0.7.0")
SPEC_SUFFIXES = (".toml", ".yaml", ".json")

DDP_SPEC = textwrap.dedent("""\
    # The work of `torchx run -s slurm dist.ddp -j 2x8 --script train.py`.
    [job]
    name = "train"
    command = ["python", "train.py"]

    [distributed]
    launcher = "torchrun"
    backend = "slurm"
    nnodes = 2
    nproc_per_node = 8
""")

#: the artifact trees' sizes: the largest is the most an Indexed Job runs at once (the
#: apiserver refuses a parallelism above 100,000, MDC443)
SIZED_NODES = (2, 1024, 65536)

SIZED_SPEC = textwrap.dedent("""\
    [job]
    name = "sized"
    image = "nvcr.io/nvidia/pytorch:25.01-py3"
    command = ["python", "train.py"]

    [distributed]
    launcher = "torchrun"
    backend = "{backend}"
    nnodes = {nnodes}
    nproc_per_node = 8
""")

BIG_PLAN = textwrap.dedent("""
    import resource, time
    t0 = time.perf_counter()
    from mdc.convert import structure_spec
    from mdc.errors import SourceLocation
    from mdc.plan import build_plan
    t1 = time.perf_counter()
    spec = structure_spec({
        "job": {"name": "big", "command": ["python", "pretrain.py"]},
        "distributed": {"launcher": "megatron", "nnodes": 131072, "nproc_per_node": 8},
        "parallelism": {"tp": 8, "pp": 16, "cp": 2},
        "batch": {"global_batch_size": 65536, "micro_batch_size": 1},
    }, {})
    plan, found = build_plan(spec, parallelism="model", disaggregated=False,
                             locate=lambda p: SourceLocation(path="big", pointer=p))
    groups = [plan.layout.groups(k) for k in ("tp", "cp", "dp", "pp", "dp-cp", "tp-pp")]
    assert plan.world_size == 1048576 and all(g.index_of(1048575) >= 0 for g in groups)
    t2 = time.perf_counter()
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{t2 - t1:.4f} {t1 - t0:.4f} {peak_mb:.1f}")
""")

IN_PROCESS = textwrap.dedent("""
    import json, sys, time
    T = time.process_time  # CPU time: what load on the machine changes least
    t0 = T()
    from mdc.pipeline import Compiler
    from mdc.plugin_manager import load_plugins
    t1 = T()
    plugins = load_plugins()
    t2 = T()
    compiler = Compiler(plugins)
    t3 = T()
    files = sys.argv[1:]
    for path in files:  # every plugin the specs need is imported in this round
        compiler.compile(path, tree=False)
    t4 = T()
    from mdc.importers import translate
    from mdc.loaders import load_file
    checked, built, load, schema = [], 0.0, 0.0, 0.0
    for path in files:
        s = T()
        compiler.compile(path, tree=False)  # what validate does
        checked.append(T() - s)
        s = T()
        compiler.compile(path)  # what compile does before writing
        built += T() - s
        s = T()
        doc = translate(load_file(path))[0]
        load += T() - s
        s = T()
        compiler.checker.check(doc)
        schema += T() - s
    checked.sort()
    print(json.dumps({"import": t1 - t0, "load_plugins": t2 - t1, "compiler": t3 - t2,
                      "first": t4 - t3, "median": checked[len(checked) // 2],
                      "total": sum(checked), "built": built, "load": load, "schema": schema}))
""")

SIZES = textwrap.dedent("""
    import sys
    from mdc.pipeline import Compiler
    from mdc.plugin_manager import load_plugins
    compiler = Compiler(load_plugins())
    for path in sys.argv[1:]:
        tree = compiler.compile(path).tree
        print(path, sum(len(a.data) for a in tree), len(tree))
""")


def snippet(code: str, *argv: str) -> str:
    """What ``python -c code argv...`` prints, in a fresh process of the project's venv."""
    return subprocess.run(
        [sys.executable, "-c", code, *argv],
        check=True,
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=bench_env(),
    ).stdout


def bench_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(VENV / "pycache")
    # torchx's dry run asks `sinfo` for the partition's memory. Where SLURM's client is
    # installed but no controller answers (this machine, after the SLURM tests), sinfo
    # retries for about 9 s; this one fails at once, as where no SLURM is installed.
    env["PATH"] = f"{VENV / 'stub-bin'}{os.pathsep}{env.get('PATH', '')}"
    return env


def stub_sinfo() -> None:
    stub = VENV / "stub-bin" / "sinfo"
    stub.parent.mkdir(exist_ok=True)
    stub.write_text("#!/bin/sh\necho 'sinfo: no controller (bench stub)' >&2\nexit 1\n")
    stub.chmod(0o755)


def ensure_peers() -> Path:
    """bench/.venv with the peers installed; created on first use."""
    bin_dir = VENV / "bin"
    wanted = [bin_dir / "check-jsonschema", bin_dir / "torchx"]
    if not all(p.exists() for p in wanted):
        print(f"creating {VENV.relative_to(ROOT)} with {', '.join(PEERS)} ...", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        subprocess.run(
            [
                str(bin_dir / "python"),
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                *PEERS,
            ],
            check=True,
        )
    has_torch = subprocess.run(
        [
            str(bin_dir / "python"),
            "-c",
            ("import importlib.util as u; raise SystemExit(u.find_spec('torch') is not None)"),
        ],
        check=False,
    ).returncode
    if has_torch:
        raise SystemExit(f"{VENV}: torch is installed there; the peers must run without it")
    return bin_dir


class Sample:
    def __init__(self, wall: float, cpu: float, rss_mib: float) -> None:
        self.wall, self.cpu, self.rss = wall, cpu, rss_mib


def run_once(argv: Sequence[str], cwd: Path) -> Sample:
    """One whole process: wall time, CPU time and peak RSS, from wait4."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        argv, cwd=cwd, env=bench_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    assert proc.stderr is not None
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({proc.returncode}):\n{err.decode()}")
    return Sample(wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024)


def alternate(
    pairs: Sequence[tuple[Sequence[str], Sequence[str]]], runs: int, cwd: Path
) -> list[tuple[list[Sample], list[Sample]]]:
    """Each pair's (mdc samples, peer samples); runs interleaved mdc, peer, mdc, peer."""
    for mdc, peer in pairs:  # warm-up: bytecode caches, page cache
        run_once(mdc, cwd)
        run_once(peer, cwd)
    results: list[tuple[list[Sample], list[Sample]]] = [([], []) for _ in pairs]
    for _ in range(runs):
        for (mdc, peer), (ours, theirs) in zip(pairs, results, strict=False):
            ours.append(run_once(mdc, cwd))
            theirs.append(run_once(peer, cwd))
    return results


def med(samples: Sequence[Sample], key: Callable[[Sample], float]) -> float:
    return statistics.median(key(s) for s in samples)


def spec_files(count: int, into: Path) -> list[str]:
    """``count`` copies of the example specs, cycling through them, in their own formats."""
    examples = sorted(p for p in (ROOT / "examples").iterdir() if p.suffix in SPEC_SUFFIXES)
    into.mkdir()
    names = []
    for i in range(count):
        source = examples[i % len(examples)]
        target = into / f"{i:03d}-{source.name}"
        shutil.copyfile(source, target)
        names.append(str(target))
    return names


def whole_process(tmp: Path, runs: int, peers: Path) -> list[str]:
    mdc = [sys.executable, "-m", "mdc"]
    schema = tmp / "schema.json"
    schema.write_text(
        subprocess.run(
            [*mdc, "schema"], check=True, capture_output=True, text=True, cwd=ROOT, env=bench_env()
        ).stdout
    )
    one = [str(ROOT / "examples" / "quickstart.toml")]
    hundred = spec_files(100, tmp / "specs")
    (tmp / "train.py").write_text("print('train')\n")
    (tmp / "ddp.toml").write_text(DDP_SPEC)
    dry = subprocess.run(
        [
            str(peers / "torchx"),
            "run",
            "--dryrun",
            "-s",
            "slurm",
            "dist.ddp",
            "-j",
            "2x8",
            "--script",
            "train.py",
        ],
        cwd=tmp,
        env=bench_env(),
        capture_output=True,
        text=True,
        check=True,
    )
    assert "--nnodes 2 --nproc_per_node 8" in dry.stdout and "#SBATCH" in dry.stdout, dry.stdout
    check = [str(peers / "check-jsonschema"), "--schemafile", str(schema)]
    torchx = [
        str(peers / "torchx"),
        "run",
        "--dryrun",
        "-s",
        "slurm",
        "dist.ddp",
        "-j",
        "2x8",
        "--script",
        "train.py",
    ]
    rows = [
        (
            "`mdc validate` 1 spec",
            "check-jsonschema, 1 spec",
            [*mdc, "validate", *one],
            [*check, *one],
        ),
        (
            "`mdc validate` 100 specs",
            "check-jsonschema, 100 specs",
            [*mdc, "validate", *hundred],
            [*check, *hundred],
        ),
        (
            "`mdc compile` 2x8 torchrun on SLURM",
            "`torchx run --dryrun -s slurm dist.ddp -j 2x8`",
            [*mdc, "compile", "ddp.toml", "-o", "out"],
            torchx,
        ),
    ]
    results = alternate([(r[2], r[3]) for r in rows], runs, tmp)
    lines = [
        (
            "| work | mdc wall | peer wall | ratio | mdc CPU | peer CPU | ratio | "
            "mdc RSS | peer RSS |"
        ),
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for (label, peer_label, _, _), (ours, theirs) in zip(rows, results, strict=False):
        wall = (med(ours, lambda s: s.wall), med(theirs, lambda s: s.wall))
        cpu = (med(ours, lambda s: s.cpu), med(theirs, lambda s: s.cpu))
        rss = (med(ours, lambda s: s.rss), med(theirs, lambda s: s.rss))
        lines.append(
            f"| {label} vs {peer_label} | {wall[0]:.3f} s | {wall[1]:.3f} s | "
            f"{wall[0] / wall[1]:.2f} | {cpu[0]:.3f} s | {cpu[1]:.3f} s | "
            f"{cpu[0] / cpu[1]:.2f} | {rss[0]:.0f} MiB | {rss[1]:.0f} MiB |"
        )
    floor = [run_once([sys.executable, "-c", "pass"], ROOT) for _ in range(runs)]
    jsonschema = [run_once([sys.executable, "-c", "import jsonschema"], ROOT) for _ in range(runs)]
    lines += [
        "",
        (
            f"Floors (median CPU): `python -c pass` {med(floor, lambda s: s.cpu):.3f} s, "
            f"`python -c 'import jsonschema'` {med(jsonschema, lambda s: s.cpu):.3f} s."
        ),
    ]
    return lines


def in_process(tmp: Path, runs: int) -> list[str]:
    files = [str(p) for p in sorted((tmp / "specs").iterdir())]
    samples = [json.loads(snippet(IN_PROCESS, *files)) for _ in range(runs)]

    def m(key: str) -> float:
        return float(statistics.median(s[key] for s in samples)) * 1000

    return [
        "| in one process, CPU time (median of runs) | ms |",
        "|---|---|",
        f"| import mdc.pipeline + mdc.plugin_manager | {m('import'):.1f} |",
        f"| load_plugins() (entry points; built-ins deferred) | {m('load_plugins'):.1f} |",
        f"| Compiler(plugins) | {m('compiler'):.1f} |",
        (
            f"| first round over the 100 specs (imports the plugins they need, builds the "
            f"validator) | {m('first'):.1f} |"
        ),
        f"| validate's work per spec once warm, median of the 100 | {m('median'):.2f} |",
        f"| validate's work, the 100 specs once warm | {m('total'):.1f} |",
        f"| of which reading the files (loaders) | {m('load'):.1f} |",
        f"| of which the schema check | {m('schema'):.1f} |",
        (
            f"| of which planning, plugin checks and plugin emits (by difference) | "
            f"{m('total') - m('load') - m('schema'):.1f} |"
        ),
        (
            f"| compile's work for the same 100 (the tree too: plan.json, manifest), before "
            f"writing | {m('built'):.1f} |"
        ),
    ]


#: ``python -c SWAPPED PIECE mdc-args...``: the mdc command with one hand-written piece
#: swapped for the library it stands in for ("none": as shipped). The piece's module is
#: patched as it is first imported, so neither side imports anything the other does not.
SWAPPED = """
import importlib.machinery, sys
piece = sys.argv.pop(1)
PATCHES = {
    "schema": ("mdc.schema", "surely_valid", lambda m: lambda instance, schema: False),
    "yaml": ("mdc.loaders.yaml", "CParser", lambda m: None),
    "entry points": ("mdc.plugin_manager", "_scan", lambda m: lambda group: None),
    "structurer": (
        "mdc.convert", "structure",
        lambda m: lambda value, tp: m.cattrs_converter().structure(value, tp),
    ),
}
class Swap:
    def find_spec(self, name, path, target=None):
        if piece not in PATCHES or name != PATCHES[piece][0]:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        run = spec.loader.exec_module
        def exec_module(module):
            run(module)
            _, attr, make = PATCHES[piece]
            setattr(module, attr, make(module))
        spec.loader.exec_module = exec_module
        return spec
sys.meta_path.insert(0, Swap())
from mdc.__main__ import main
main()
"""

#: each hand-written piece mdc keeps, and the library it stands in for
PIECES = {
    "schema": "the quick schema check (vs jsonschema for every spec)",
    "yaml": "the YAML fast path, libyaml's events (vs ruamel.yaml for every file)",
    "entry points": "the entry-point scan (vs importlib.metadata)",
    "structurer": "the structurer (vs cattrs for every table)",
}


def hand_written_vs_library(tmp: Path, runs: int) -> list[str]:
    """Whole-process CPU time of the compared commands with each piece mdc writes itself,
    against the same command with that piece swapped for its library: a piece stays only
    where it saves at least 10 % of one of them."""
    works = {
        "validate 1 spec": ["validate", str(ROOT / "examples" / "quickstart.toml")],
        "validate 100 specs": ["validate", *(str(p) for p in sorted((tmp / "specs").iterdir()))],
        "compile 2x8 torchrun": ["compile", "ddp.toml", "-o", "out"],
    }
    swapped = [sys.executable, "-c", SWAPPED]
    pairs = [
        ([*swapped, "none", *argv], [*swapped, piece, *argv])
        for piece in PIECES
        for argv in works.values()
    ]
    results = iter(alternate(pairs, runs, tmp))
    lines = [
        "| hand-written piece (library) | work | mdc CPU | with the library | saved |",
        "|---|---|---|---|---|",
    ]
    for label in PIECES.values():
        for work in works:
            ours, theirs = (med(s, lambda s: s.cpu) for s in next(results))
            lines.append(
                f"| {label} | {work} | {ours * 1000:.0f} ms | {theirs * 1000:.0f} ms | "
                f"{(theirs - ours) / theirs * 100:.0f} % |"
            )
    return lines


def big_plan(runs: int) -> list[str]:
    plans = [snippet(BIG_PLAN).split() for _ in range(runs)]
    plan_s = statistics.median(float(p[0]) for p in plans)
    peak = statistics.median(float(p[2]) for p in plans)
    return [
        (
            f"| plan for 131,072 nodes x 8 GPUs (1,048,576 ranks; megatron tp 8, pp 16, cp 2), "
            f"imports excluded | {plan_s * 1000:.1f} ms | {peak:.0f} MiB peak RSS, whole "
            "process |"
        )
    ]


#: the schema's maximum world: 1,048,576 nodes x 1,024 ranks, every rank in one dp group
BIGGEST = {
    "job": {"name": "biggest", "command": ["python", "train.py"]},
    "distributed": {"launcher": "torchrun", "nnodes": 1048576, "nproc_per_node": 1024},
}


def biggest_explain(tmp: Path, runs: int) -> list[str]:
    """``mdc explain`` (text, JSON, --svg) of the largest spec validate accepts, next to
    ``mdc validate`` of it: explain computes only the ranks it shows."""
    spec = tmp / "biggest.json"
    spec.write_text(json.dumps(BIGGEST), encoding="utf-8")
    mdc = [sys.executable, "-m", "mdc"]
    commands = {
        "validate": [*mdc, "validate", str(spec)],
        "explain": [*mdc, "explain", str(spec)],
        "explain --format json": [*mdc, "explain", "--format", "json", str(spec)],
        "explain --svg": [*mdc, "explain", str(spec), "--svg", str(tmp / "biggest.svg"), "--force"],
    }
    rows = []
    for what, argv in commands.items():
        run_once(argv, tmp)  # warm-up
        samples = [run_once(argv, tmp) for _ in range(runs)]
        rows.append(
            f"| mdc {what}, 2^30 ranks (the schema's maximum), whole process "
            f"| {med(samples, lambda s: s.wall) * 1000:.0f} ms "
            f"| {med(samples, lambda s: s.rss):.0f} MiB peak RSS |"
        )
    return rows


#: mdc tune's whole search (generate, rank, estimate memory down the ranking, compile the
#: best five) for Llama-3-70B on 2,048 nodes x 8 H100s, imports and the spec load included
TUNE = """
import sys, time, resource
start = time.process_time()
from mdc.loaders import load_file
from mdc.pipeline import Compiler
from mdc.plugin_manager import load_plugins
from mdc.tune.search import Tuner
tuner = Tuner(Compiler(load_plugins(autoload=False)), load_file(sys.argv[1]))
result = tuner.run(top=5)
print(time.process_time() - start, result.generated, len(result.rows),
      resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
"""


def tune_search(tmp: Path, runs: int) -> list[str]:
    """The whole search on 2,048 nodes x 8 H100s for dense Llama-3-70B and for the MoE
    Qwen3-235B-A22B (its ep x etp choices multiply the layouts), and the MoE one on 8 nodes
    and on 4 (where none fits)."""
    spec = (ROOT / "examples" / "tune-llama70b-64xh100.toml").read_text(encoding="utf-8")
    spec = spec.replace("nnodes = 8\n", "nnodes = 2048\n").replace(
        "global_batch_size = 512\n", "global_batch_size = 16384\n"
    )
    models = tomllib.loads((ROOT / "compiler" / "mdc" / "plan" / "models.toml").read_text("utf-8"))
    qwen = models["qwen3-235b-a22b"]["model"]
    moe = (
        spec.split("[model]")[0]
        + "[model]\n"
        + "".join(f"{k} = {json.dumps(v)}\n" for k, v in {**qwen, "dtype": "bf16"}.items())
        # as its recipes run it (Megatron-LM's default allgather gathers every token)
        + '\n[megatron]\nmoe_token_dispatcher_type = "alltoall"\n'
    )
    # a small cluster, where the memory estimates down the ranking dominate the search
    small = moe.replace("nnodes = 2048\n", "nnodes = 8\n").replace(
        "global_batch_size = 16384\n", "global_batch_size = 512\n"
    )
    # four nodes, where no layout's weights, gradients and optimizer state fit: the answer
    # (no layout, with the least state) without walking the ranking
    none_fits = small.replace("nnodes = 8\n", "nnodes = 4\n")
    lines = []
    cases = (
        ("Llama-3-70B", "16,384", spec),
        ("Qwen3-235B-A22B (MoE)", "16,384", moe),
        ("Qwen3-235B-A22B (MoE)", "64", small),
        ("Qwen3-235B-A22B (MoE), where no layout fits,", "32", none_fits),
    )
    for name, gpus, text in cases:
        path = tmp / "tune.toml"
        path.write_text(text, encoding="utf-8")
        samples = [snippet(TUNE, str(path)).split() for _ in range(runs)]
        cpu_s = statistics.median(float(p[0]) for p in samples)
        peak = statistics.median(float(p[3]) for p in samples)
        lines.append(
            f"| mdc tune: {name} on {gpus} H100s, the whole search ({samples[0][1]} "
            f"layouts, the best {samples[0][2]} compiled), CPU time with imports | "
            f"{cpu_s:.2f} s | {peak:.0f} MiB peak RSS |"
        )
    return lines


#: mdc tune's serving search (every deployment predicted, the best five compiled and
#: predicted again from their servers), imports and the spec load included
TUNE_SERVING = """
import sys, time, resource
start = time.process_time()
from mdc.loaders import load_file
from mdc.pipeline import Compiler
from mdc.plugin_manager import load_plugins
from mdc.tune.serving_search import ServingTuner
tuner = ServingTuner(Compiler(load_plugins(autoload=False)), load_file(sys.argv[1]))
result = tuner.run(top=5)
print(time.process_time() - start, result.generated, len(result.rows),
      resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
"""


def serving_tune_search(tmp: Path, runs: int) -> list[str]:
    """The serving search for DeepSeek-R1 behind TensorRT-LLM on 125 nodes x 8 H200s (1,000
    GPUs: aggregated servers and prefill/decode splits) and on the example's 2 nodes."""
    spec = (ROOT / "examples" / "tune-serving-r1-16xh200.toml").read_text(encoding="utf-8")
    lines = []
    for nodes in (125, 2):
        path = tmp / "tune-serving.toml"
        path.write_text(spec.replace("nnodes = 2\n", f"nnodes = {nodes}\n"), encoding="utf-8")
        samples = [snippet(TUNE_SERVING, str(path)).split() for _ in range(runs)]
        cpu_s = statistics.median(float(p[0]) for p in samples)
        peak = statistics.median(float(p[3]) for p in samples)
        lines.append(
            f"| mdc tune (serving): DeepSeek-R1 on {nodes * 8:,} H200s, the whole search "
            f"({samples[0][1]} deployments searched, the best {samples[0][2]} compiled), CPU "
            f"time with imports | {cpu_s:.2f} s | {peak:.0f} MiB peak RSS |"
        )
    return lines


def artifact_sizes(tmp: Path) -> list[str]:
    paths = []
    for backend in ("slurm", "kubernetes"):
        for nnodes in SIZED_NODES:
            path = tmp / f"{backend}-{nnodes}.toml"
            path.write_text(SIZED_SPEC.format(backend=backend, nnodes=nnodes))
            paths.append(str(path))
    out = snippet(SIZES, *paths).split("\n")
    sizes = {
        Path(line.split()[0]).stem: (int(line.split()[1]), int(line.split()[2]))
        for line in out
        if line
    }
    lines = [
        "| backend | " + " | ".join(f"nnodes {n}" for n in SIZED_NODES) + " | grows with nnodes? |",
        "|---|---|---|---|---|",
    ]
    for backend in ("slurm", "kubernetes"):
        row = [sizes[f"{backend}-{n}"] for n in SIZED_NODES]
        grows = "**yes**" if row[2][0] > row[0][0] + 64 else "no"
        cells = " | ".join(f"{b:,} bytes ({files} files)" for b, files in row)
        lines.append(f"| {backend} | {cells} | {grows} |")
    return lines


def import_breakdown(tmp: Path) -> list[str]:
    """Cumulative import time of `mdc validate`'s heaviest modules, from -X importtime."""
    spec = str(ROOT / "examples" / "quickstart.toml")
    runs = [
        subprocess.run(
            [sys.executable, "-X", "importtime", "-m", "mdc", "validate", spec],
            check=True,
            capture_output=True,
            text=True,
            cwd=ROOT,
            env=bench_env(),
        ).stderr
        for _ in range(5)
    ]
    per_module: dict[str, list[int]] = {}
    totals = []
    for text in runs:
        total = 0
        for line in text.splitlines():
            parts = line.split("|")
            if not line.startswith("import time:") or len(parts) != 3 or "self" in parts[0]:
                continue
            cumulative, name = int(parts[1]), parts[2].strip()
            depth = (len(parts[2]) - len(parts[2].lstrip()) - 1) // 2
            total += cumulative if depth == 0 else 0
            if depth <= 2:
                per_module.setdefault(name, []).append(cumulative)
        totals.append(total)
    top = sorted(
        ((statistics.median(v), k) for k, v in per_module.items() if len(v) == 5), reverse=True
    )[:16]
    lines = [
        (
            f"Imports of `mdc validate examples/quickstart.toml`: "
            f"{statistics.median(totals) / 1000:.0f} ms in all (median of 5; modules "
            "imported by `importlib.import_module`, as plugins are, are counted only "
            "through what they import)."
        ),
        "",
        "| module (nesting <= 2) | cumulative ms |",
        "|---|---|",
    ]
    lines += [f"| {name} | {us / 1000:.1f} |" for us, name in top]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=11, help="runs per measurement (>= 1)")
    args = parser.parse_args()
    peers = ensure_peers()
    stub_sinfo()
    report = [
        (
            f"Python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average "
            f"{os.getloadavg()[0]:.1f}; median of {args.runs} alternating runs."
        ),
        "",
    ]
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        report += whole_process(tmp, args.runs, peers) + [""]
        report += in_process(tmp, args.runs) + [""]
        report += ["| what | time | memory |", "|---|---|---|", *big_plan(args.runs)]
        report += biggest_explain(tmp, args.runs)
        report += [*tune_search(tmp, args.runs), *serving_tune_search(tmp, args.runs), ""]
        report += hand_written_vs_library(tmp, args.runs) + [""]
        report += ["Artifact tree size (bytes of every file, torchrun, 8 per node):", ""]
        report += artifact_sizes(tmp) + [""]
        report += import_breakdown(tmp)
    text = "\n".join(report) + "\n"
    (BENCH / "results").mkdir(exist_ok=True)
    (BENCH / "results" / "latest.md").write_text(text, encoding="utf-8")
    print(text, end="")


if __name__ == "__main__":
    main()
