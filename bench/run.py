"""mdc benchmarks: whole-process times of validate/compile and the million-rank plan.

    python bench/run.py [--runs N]

Whole-process numbers come from /usr/bin/time (wall seconds and peak RSS) over
N runs, median reported. The big plan runs in a fresh subprocess so its peak
RSS is its own. Results go to stdout as a Markdown table.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = "examples/torchrun-hybrid-16x8.toml"

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


def timed(argv: list[str]) -> tuple[float, float]:
    """(wall seconds, peak RSS MiB) of one whole process, from /usr/bin/time."""
    with tempfile.NamedTemporaryFile("r") as report:
        subprocess.run(["/usr/bin/time", "-f", "%e %M", "-o", report.name, *argv], cwd=ROOT,
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wall, rss_kb = report.read().split()
    return float(wall), int(rss_kb) / 1024


def median_of(argv: list[str], runs: int) -> tuple[float, float]:
    samples = [timed(argv) for _ in range(runs)]
    return (statistics.median(s[0] for s in samples), statistics.median(s[1] for s in samples))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    mdc = [sys.executable, "-m", "mdc"]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for label, argv in (
            (f"mdc validate {EXAMPLE}", [*mdc, "validate", EXAMPLE]),
            (f"mdc compile {EXAMPLE}", [*mdc, "compile", EXAMPLE, "-o", f"{tmp}/out"]),
            ("python -c pass (interpreter floor)", [sys.executable, "-c", "pass"]),
        ):
            wall, rss = median_of(argv, args.runs)
            rows.append((label, f"{wall:.3f} s", f"{rss:.0f} MiB"))
    plans = [subprocess.run([sys.executable, "-c", BIG_PLAN], check=True, capture_output=True,
                            text=True, cwd=ROOT).stdout.split() for _ in range(args.runs)]
    plan_s = statistics.median(float(p[0]) for p in plans)
    peak = statistics.median(float(p[2]) for p in plans)
    rows.append(("plan 131,072 nodes x 8 (tp 8, pp 16, cp 2; imports excluded)",
                 f"{plan_s:.4f} s", f"{peak:.0f} MiB peak RSS (whole process)"))
    print(f"median of {args.runs} runs, {sys.version.split()[0]}\n")
    print("| what | time | memory |\n|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
