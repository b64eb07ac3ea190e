"""DeepSpeed's own code reads what the deepspeed launcher emits as mdc means it.

For every deepspeed example and a grid of specs written here (1-4 nodes, 1-8 processes,
batch variants, both runners, precisions, ZeRO stages, command forms), the spec is
compiled and then, with the backend's runtime variables put in (node rank, master
address and port, the out directory):

* runner "deepspeed": the ``exec deepspeed ...`` line of ``launch/worker.sh`` goes
  through DeepSpeed's real runner (``deepspeed.launcher.runner.main``) with only its
  process start replaced by a recorder, so any ssh or pdsh use fails the test; the
  command it would start goes through ``deepspeed.launcher.launch.main`` the same way,
  which yields every local worker's argv and environment. The emitted hostfile is
  read with DeepSpeed's own parser.
* runner "torchrun": the ``exec torchrun ...`` line goes through torch's parser and
  ``config_from_args``.
* ``launch/ds_config.json`` goes through DeepSpeed's ``DeepSpeedConfig`` with the plan's
  world size (a one-process "fake" process group of that size, the path
  ``deepspeed.initialize`` takes for a plain model) or, with model parallelism, an mpu
  whose data-parallel size is the plan's dp.

Expected values are computed here from the spec, not read from plan.json.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import itertools
import json
import os
import re
import shlex
import sys
import tempfile
import types
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.integration import test_local_run
from tests.tools import REPO, spec_data

from mdc.loaders import load_file
from mdc.pipeline import Compiler
from mdc.plugin_manager import load_plugins

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # third-party import-time deprecations
    pytest.importorskip(
        "deepspeed",
        reason="conformance needs deepspeed==0.19.8 and torch==2.13.0 (the venv of scripts/test)",
    )
    import deepspeed
    import deepspeed.comm.comm as ds_comm
    import hjson
    import torch.distributed
    import torch.distributed.run as torchrun
    from deepspeed.launcher import launch as ds_launch
    from deepspeed.launcher import runner as ds_runner
    from deepspeed.runtime.config import DeepSpeedConfig
    from deepspeed.runtime.config_utils import dict_raise_error_on_duplicate_keys
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
    from torch.testing._internal.distributed.fake_pg import FakeStore

pytestmark = pytest.mark.torch
#: deepspeed.comm's own ``torch`` name hides this submodule from ``import ... as``
ds_comm_torch = importlib.import_module("deepspeed.comm.torch")

SPECS = sorted(p for p in (REPO / "examples").iterdir() if p.suffix in (".toml", ".yaml", ".json"))
#: every example that uses the deepspeed launcher, whatever its backend
EXAMPLES = [p for p in SPECS if spec_data(load_file(p))["distributed"]["launcher"] == "deepspeed"]
MASTER_ADDR = "10.0.0.1"
PYTHON = re.compile(r"python(\d+(\.\d+)?)?")


#: the other launchers, blocked so their work in progress cannot change these results
OTHERS = ("basic", "megatron", "primus", "torchtitan")


@pytest.fixture(scope="module")
def compiler() -> Compiler:
    return Compiler(load_plugins(autoload=False, blocked=OTHERS))


def compile_to(compiler: Compiler, spec: Path, out: Path) -> dict[str, Any]:
    """Compile ``spec`` and write its tree to ``out``; returns plan.json, plus the host
    names the backend knew at compile time under ``"hosts"`` (plan.json leaves them out)."""
    compiled = compiler.compile(spec)
    for artifact in compiled.tree:
        path = out / artifact.path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(artifact.data)
        path.chmod(0o755 if artifact.executable else 0o644)
    plan: dict[str, Any] = json.loads((out / "plan.json").read_text(encoding="utf-8"))
    plan["hosts"] = list(compiled.plan.hosts) if compiled.plan.hosts is not None else None
    return plan


# ---------------------------------------------------------------- reading launch/worker.sh


def substituted(text: str, values: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}", lambda m: values[m.group(1)], text)


def read_script(out: Path, values: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """The exec line's argv and the exported variables, runtime values put in."""
    script = (out / "launch" / "worker.sh").read_text(encoding="utf-8")
    head, sep, command = script.partition("\nexec ")
    assert sep, script
    guarded = set(re.findall(r'^: "\$\{(\w+):\?', head, flags=re.MULTILINE))
    assert guarded == {"NODE_RANK", "MASTER_ADDR", "MASTER_PORT"} & set(
        re.findall(r"\$\{(\w+)\}", script)
    ), "every runtime variable is guarded"
    exported = {}
    for line in head.splitlines():
        if line.startswith("export ") and "=" in line:
            words = shlex.split(substituted(line, values))
            name, _, value = words[1].partition("=")
            exported[name] = value
    return shlex.split(substituted(command, values)), exported


# ---------------------------------------------------------------- what the spec means


def expectations(spec: dict[str, Any], hosts: list[str] | None = None) -> dict[str, Any]:
    """Everything the compiled job must do, derived from the spec (and the backend's hosts)."""
    dist = spec["distributed"]
    nnodes, nproc = dist.get("nnodes", 1), dist.get("nproc_per_node", 1)
    par = spec.get("parallelism", {})
    tp, pp, cp = par.get("tp", 1), par.get("pp", 1), par.get("cp", 1)
    world = nnodes * nproc
    dp = world // (tp * pp * cp)
    batch = spec.get("batch")
    if batch is None:
        micro, total = 1, dp
    else:
        micro = batch.get("micro_batch_size", 1)
        total = batch.get("global_batch_size", micro * dp)
    options = spec.get("deepspeed", {})
    dtype = spec.get("model", {}).get("dtype")
    precision = options.get("precision") or dtype or "fp32"
    runner = options.get("runner") or ("torchrun" if nnodes > 1 and not hosts else "deepspeed")
    command = spec["job"]["command"]
    words = shlex.split(command) if isinstance(command, str) else list(command)
    return {
        "nnodes": nnodes,
        "nproc": nproc,
        "world": world,
        "dp": dp,
        "mp": tp * pp * cp,
        "micro": micro,
        "total": total,
        "gas": total // (micro * dp),
        "zero": options.get("zero_stage", 0),
        "precision": precision,
        "runner": runner,
        "config_argument": options.get("config_argument", True),
        "local_rank_argument": options.get("local_rank_argument", True),
        "passthrough": options.get("config", {}),
        "words": words,
        "port": dist.get("master_port"),
        "accelerator": dist.get("accelerator", "nvidia"),
    }


def python_program(words: list[str]) -> tuple[str, list[str]] | None:
    """("-m" or "", program words) for a python command; None when it runs as it is."""
    if PYTHON.fullmatch(Path(words[0]).name) and len(words) > 1:
        rest = words[1:]
        while rest and rest[0] == "-u":
            rest = rest[1:]
        if len(rest) >= 2 and rest[0] == "-m":
            return "-m", rest[1:]
        if rest and not rest[0].startswith("-"):
            return "", rest
    if words[0].endswith(".py"):
        return "", words
    return None


def worker_head(words: list[str]) -> tuple[list[str], list[str]]:
    """What a worker's argv starts with for the job's command, and the user's own arguments."""
    program = python_program(words)
    if program is None:
        return words[:1], words[1:]
    flag, rest = program
    return [sys.executable, "-u", *(["-m"] if flag else []), rest[0]], rest[1:]


def check_script_arguments(args: list[str], want: dict[str, Any], out: Path) -> list[str]:
    """The user's arguments end with the config flags (or not); the rest is theirs."""
    config = str(out / "launch" / "ds_config.json")
    if not want["config_argument"]:
        assert "--deepspeed_config" not in args
        return args
    assert args[-3:] == ["--deepspeed", "--deepspeed_config", config], args
    # what a script built on deepspeed.add_config_arguments reads
    parser = deepspeed.add_config_arguments(argparse.ArgumentParser())
    parser.add_argument("--local_rank", type=int, default=None)
    known, _ = parser.parse_known_args(args)
    assert known.deepspeed is True and known.deepspeed_config == config
    return args[:-3]


# ---------------------------------------------------------------- DeepSpeed's runner, for real


class Recorder:
    """Stands in for subprocess.Popen: records the command and environment, exits 0."""

    started: list[tuple[list[str], dict[str, str]]]

    def __init__(self, cmd: list[str], env: dict[str, str] | None = None, **_: Any) -> None:
        self.cmd, self.env = list(cmd), dict(env or {})
        self.returncode = 0
        self.pid = 4242
        Recorder.started.append((self.cmd, self.env))

    def poll(self) -> int:
        return 0

    def wait(self) -> int:
        return 0


def no_remote(*args: Any, **kwargs: Any) -> None:
    raise AssertionError(f"the deepspeed runner tried to reach a host: {args}")


def run_deepspeed(
    argv: list[str], exported: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> tuple[list[str], list[tuple[list[str], dict[str, str]]]]:
    """deepspeed's runner, then its per-node launcher, with processes recorded, not started.

    Returns the launcher command the runner starts and each local worker's (argv, env).
    """
    for name in ("CUDA_VISIBLE_DEVICES", "LOCAL_SIZE"):
        monkeypatch.delenv(name, raising=False)  # the runner and CPU accelerator read them
    for name, value in exported.items():
        monkeypatch.setenv(name, value)
    fake_subprocess = types.SimpleNamespace(
        Popen=Recorder,
        check_call=no_remote,
        check_output=no_remote,
        CalledProcessError=RuntimeError,
        DEVNULL=None,
    )
    monkeypatch.setattr(ds_runner, "subprocess", fake_subprocess)
    Recorder.started = []
    ds_runner.main(argv[1:])
    assert len(Recorder.started) == 1, Recorder.started
    node_cmd, node_env = Recorder.started[0]
    assert node_cmd[:4] == [sys.executable, "-u", "-m", "deepspeed.launcher.launch"], node_cmd

    # deepspeed.launcher.launch on this node, with the environment the runner gave it
    monkeypatch.setattr(ds_launch, "subprocess", types.SimpleNamespace(Popen=Recorder))
    monkeypatch.setattr(ds_launch, "time", types.SimpleNamespace(sleep=lambda _: None))
    monkeypatch.setattr(
        ds_launch, "signal", types.SimpleNamespace(signal=lambda *_: None, SIGINT=2, SIGTERM=15)
    )
    monkeypatch.setattr(sys, "argv", ["deepspeed.launcher.launch", *node_cmd[4:]])
    for name in list(node_env):
        monkeypatch.setenv(name, node_env[name])
    Recorder.started = []
    ds_launch.main()
    return node_cmd, list(Recorder.started)


def check_deepspeed_runner(
    argv: list[str],
    exported: dict[str, str],
    want: dict[str, Any],
    out: Path,
    node: int,
    hosts: list[str] | None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    nnodes, nproc = want["nnodes"], want["nproc"]
    hostfile = str(out / "launch" / "hostfile")
    args = ds_runner.parse_args(argv[1:])
    assert (args.hostfile, args.no_ssh, args.node_rank) == (hostfile, True, node)
    assert (args.master_addr, args.master_port) == (MASTER_ADDR, want["port"])
    assert (args.num_nodes, args.num_gpus) == (nnodes, nproc)
    assert (args.include, args.exclude, args.launcher) == ("", "", "pdsh")  # never fans out
    assert args.no_local_rank is (not want["local_rank_argument"])

    pool = ds_runner.fetch_hostfile(hostfile)
    assert list(pool.values()) == [nproc] * nnodes
    # the backend's host names when it knew them, else labels; in node order
    assert list(pool) == (hosts or [f"node-{i}" for i in range(nnodes)])

    words = want["words"]
    program = python_program(words)
    user_words = words if program is None else program[1]
    assert args.no_python is (program is None)
    assert args.module is (program is not None and program[0] == "-m")
    assert [args.user_script, *args.user_args][: len(user_words)] == user_words

    node_cmd, workers = run_deepspeed(argv, exported, monkeypatch)
    assert f"--node_rank={node}" in node_cmd and f"--master_addr={MASTER_ADDR}" in node_cmd
    assert f"--master_port={want['port']}" in node_cmd
    assert len(workers) == nproc
    for local, (cmd, env) in enumerate(workers):
        rank = node * nproc + local
        assert (env["RANK"], env["LOCAL_RANK"]) == (str(rank), str(local))
        assert (env["WORLD_SIZE"], env["LOCAL_SIZE"]) == (str(want["world"]), str(nproc))
        assert (env["CROSS_RANK"], env["CROSS_SIZE"]) == (str(node), str(nnodes))
        assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == (MASTER_ADDR, str(want["port"]))
        # what mdc adds so torchrun-style scripts read the same names
        assert (env["GROUP_RANK"], env["LOCAL_WORLD_SIZE"]) == (str(node), str(nproc))
        assert env["MDC_DEEPSPEED_CONFIG"] == str(out / "launch" / "ds_config.json")
        local_flag = [f"--local_rank={local}"] if want["local_rank_argument"] else []
        head, own = worker_head(words)
        assert cmd[: len(head)] == head, cmd
        # the deepspeed launcher puts --local_rank=<i> right after the program
        assert cmd[len(head) : len(head) + len(local_flag)] == local_flag, cmd
        assert check_script_arguments(cmd[len(head) + len(local_flag) :], want, out) == own


# ---------------------------------------------------------------- torchrun


def check_torchrun_runner(
    argv: list[str],
    exported: dict[str, str],
    want: dict[str, Any],
    out: Path,
    node: int,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    nnodes, nproc = want["nnodes"], want["nproc"]
    for name in [k for k in os.environ if k.startswith("PET_")]:
        monkeypatch.delenv(name)
    args = torchrun.get_args_parser().parse_args(argv[1:])
    assert args.nproc_per_node == str(nproc)
    if nnodes == 1:
        assert args.standalone
    else:
        assert (args.rdzv_backend, args.node_rank) == ("static", node)
        assert (args.master_addr, args.master_port) == (MASTER_ADDR, want["port"])
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    config, cmd, cmd_args = torchrun.config_from_args(args)
    assert (config.min_nodes, config.max_nodes, config.nproc_per_node) == (nnodes, nnodes, nproc)
    if nnodes > 1:
        assert config.rdzv_backend == "static" and config.rdzv_configs["rank"] == node
    worker = [cmd, *cmd_args]
    head, own = worker_head(want["words"])
    assert worker[: len(head)] == head, worker
    assert check_script_arguments(worker[len(head) :], want, out) == own
    # what the deepspeed launcher would have given, set by mdc
    assert (exported["LOCAL_SIZE"], exported["CROSS_SIZE"]) == (str(nproc), str(nnodes))
    assert exported["CROSS_RANK"] == str(node)


# ---------------------------------------------------------------- ds_config.json


class Mpu:
    """The part of a model-parallel unit DeepSpeedConfig asks for."""

    def __init__(self, dp: int) -> None:
        self.dp = dp

    def get_data_parallel_world_size(self) -> int:
        return self.dp


@pytest.fixture(scope="module")
def fake_world() -> Iterator[Any]:
    """A one-process process group that reports any world size, and DeepSpeed's comm on it."""
    saved = ds_comm.cdb
    patch = pytest.MonkeyPatch()
    # DeepSpeed's CPU comm backend JIT-builds a shared-memory kernel (a minute and a half on
    # two cores) that nothing here uses; config validation is the same without it
    patch.setattr(ds_comm_torch, "build_shm_op", lambda: None)

    def world(size: int) -> None:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
        torch.distributed.init_process_group("fake", store=FakeStore(), rank=0, world_size=size)
        if ds_comm.cdb is None:
            deepspeed.init_distributed(dist_backend="fake", dist_init_required=False, verbose=False)
        assert ds_comm.get_world_size() == size

    yield world
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    ds_comm.cdb = saved
    patch.undo()


def check_ds_config(out: Path, want: dict[str, Any], fake_world: Any) -> None:
    path = out / "launch" / "ds_config.json"
    fake_world(want["world"])
    mpu = Mpu(want["dp"]) if want["mp"] > 1 else None
    # what deepspeed.initialize does with a path (load_ds_config), minus its unclosed file
    with path.open(encoding="utf-8") as handle:
        loaded = hjson.load(handle, object_pairs_hook=dict_raise_error_on_duplicate_keys)
    config = DeepSpeedConfig(loaded, mpu)
    assert config.world_size == want["dp"]
    assert config.train_batch_size == want["total"]
    assert config.train_micro_batch_size_per_gpu == want["micro"]
    assert config.gradient_accumulation_steps == want["gas"]
    assert config.zero_optimization_stage == want["zero"]
    assert config.bfloat16_config.enabled is (want["precision"] == "bf16")
    assert config.float16_config.enabled is (want["precision"] == "fp16")
    written = json.loads(path.read_text(encoding="utf-8"))
    for key, value in want["passthrough"].items():  # the user's keys arrive as written
        if isinstance(value, dict):
            assert {k: written[key][k] for k in value} == value
        else:
            assert written[key] == value


# ---------------------------------------------------------------- the whole check


def check_compiled(
    spec: dict[str, Any],
    out: Path,
    hosts: list[str] | None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    fake_world: Any,
) -> None:
    want = expectations(spec, hosts)
    node = want["nnodes"] - 1  # the last node: its ranks are not the first ones
    values = {
        "NODE_RANK": str(node),
        "MASTER_ADDR": MASTER_ADDR,
        "MASTER_PORT": str(want["port"]),
        "MDC_OUT": str(out),
    }
    argv, exported = read_script(out, values)
    assert argv[0] == want["runner"], argv
    assert exported["MDC_DEEPSPEED_CONFIG"] == str(out / "launch" / "ds_config.json")
    assert exported["DS_ACCELERATOR"] == {"cpu": "cpu"}.get(want["accelerator"], "cuda")
    # madengine's runner prefix: the command up to the program, as words after eval
    prefix = shlex.split(exported["MAD_MULTI_NODE_RUNNER"])
    assert argv[: len(prefix)] == prefix and argv[0] == prefix[0]
    rest = argv[len(prefix) :]
    assert rest[0] not in ("--hostfile", "--nnodes", "--no_ssh", "--nproc-per-node")
    if want["runner"] == "deepspeed":
        check_deepspeed_runner(argv, exported, want, out, node, hosts, monkeypatch)
    else:
        assert not (out / "launch" / "hostfile").exists()
        check_torchrun_runner(argv, exported, want, out, node, tmp_path, monkeypatch)
    check_ds_config(out, want, fake_world)


def load_spec(path: Path) -> dict[str, Any]:
    return spec_data(load_file(path))


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_is_read_by_deepspeed_as_planned(
    example: Path,
    compiler: Compiler,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    fake_world: Any,
) -> None:
    out = tmp_path / "out"
    plan = compile_to(compiler, example, out)
    spec = load_spec(example)
    # a port derived from the job name (a hash): the plan's, as the backend would set it
    spec["distributed"].setdefault("master_port", plan["rendezvous"]["master_port"])
    check_compiled(spec, out, plan["hosts"], tmp_path, monkeypatch, fake_world)


def test_there_are_deepspeed_examples() -> None:
    names = [p.name for p in EXAMPLES]
    assert any("cpu" in n for n in names) and any("zero2" in n for n in names), names


COMMANDS = [
    ["python", "train.py", "--epochs", "3"],
    "python -u -m pkg.train --lr 0.1",
    ["./run.sh", "--flag", "two words"],
    ["train.py", "--data=/d"],
    ["python3", "examples/ds_check.py"],
]


def grid() -> Iterator[Any]:
    combos = itertools.product(
        (1, 2, 3, 4), (1, 2, 8), ("none", "global+micro", "micro"), (None, "deepspeed", "torchrun")
    )
    for index, (nnodes, nproc, batch, runner) in enumerate(combos):
        world = nnodes * nproc
        spec: dict[str, Any] = {
            "job": {"name": f"grid-{index}", "command": COMMANDS[index % len(COMMANDS)]},
            "distributed": {
                "launcher": "deepspeed",
                "backend": "local",
                "nnodes": nnodes,
                "nproc_per_node": nproc,
                "accelerator": "cpu",
                "master_port": 21000 + index,
            },
        }
        if batch == "global+micro":
            spec["batch"] = {
                "micro_batch_size": 1 + index % 3,
                "global_batch_size": (1 + index % 3) * world * (1 + index % 4),
            }
        elif batch == "micro":
            spec["batch"] = {"micro_batch_size": 1 + index % 4}
        options: dict[str, Any] = {"zero_stage": index % 4}
        if runner is not None:
            options["runner"] = runner
        precision = (None, "bf16", "fp16", "fp32", None)[index % 5]
        if precision is not None:
            options["precision"] = precision
        elif index % 2:
            spec["model"] = {"dtype": "bf16"}
        if index % 7 == 3:
            options["config_argument"] = False
        if (
            index % 5 == 2
            and (runner or ("torchrun" if nnodes > 1 else "deepspeed")) == "deepspeed"
        ):
            options["local_rank_argument"] = False
        if index % 3 == 1:
            options["config"] = {
                "steps_per_print": 5,
                "gradient_clipping": 1.0,
                "zero_optimization": {"overlap_comm": True},
            }
        spec["deepspeed"] = options
        yield pytest.param(spec, id=f"{nnodes}x{nproc}-{batch}-{runner or 'default'}")
    # model parallelism: DeepSpeed gets the data-parallel size from an mpu
    for tp, pp, stage in ((2, 1, 2), (1, 2, 1), (2, 2, 0)):
        yield pytest.param(
            {
                "job": {"name": f"mp-{tp}-{pp}", "command": ["python", "train.py"]},
                "distributed": {
                    "launcher": "deepspeed",
                    "nnodes": 2,
                    "nproc_per_node": 8,
                    "accelerator": "cpu",
                    "master_port": 22000 + tp * 10 + pp,
                },
                "parallelism": {"tp": tp, "pp": pp},
                "batch": {"global_batch_size": 64, "micro_batch_size": 2},
                "deepspeed": {"zero_stage": stage, "runner": "deepspeed"},
            },
            id=f"tp{tp}-pp{pp}-zero{stage}",
        )


@pytest.mark.parametrize("spec", list(grid()))
def test_generated_spec_is_read_by_deepspeed_as_planned(
    spec: dict[str, Any],
    compiler: Compiler,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    fake_world: Any,
) -> None:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec), encoding="utf-8")
    out = tmp_path / "out"
    plan = compile_to(compiler, path, out)
    check_compiled(spec, out, plan["hosts"], tmp_path, monkeypatch, fake_world)


# ---------------------------------------------------------------- the facts mdc keeps


def test_zero_keys_are_deepspeeds() -> None:
    """mdc's list of zero_optimization keys is DeepSpeedZeroConfig's fields and aliases."""
    from mdc_builtin.launchers.deepspeed import ZERO_KEYS

    fields = DeepSpeedZeroConfig.model_fields
    accepted = set(fields) | {f.alias for f in fields.values() if f.alias}
    assert set(ZERO_KEYS) == accepted


def test_removed_keys_are_refused_by_deepspeed(fake_world: Any) -> None:
    """Every key mdc calls removed makes DeepSpeedConfig raise; a known key does not."""
    from deepspeed.runtime.config import DeepSpeedConfigError

    from mdc_builtin.launchers.deepspeed import REMOVED_KEYS, REMOVED_ZERO_KEYS

    fake_world(2)
    base = {
        "train_batch_size": 2,
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
    }
    DeepSpeedConfig({**base, "zero_optimization": {"stage": 1, "overlap_comm": True}})
    for key in REMOVED_KEYS:
        with pytest.raises(DeepSpeedConfigError):
            DeepSpeedConfig({**base, key: {}})
    for key in REMOVED_ZERO_KEYS:
        with pytest.raises(DeepSpeedConfigError):
            DeepSpeedConfig({**base, "zero_optimization": {key: 1}})
    with pytest.raises(Exception, match="Extra inputs are not permitted"):
        DeepSpeedConfig({**base, "zero_optimization": {"overlap_com": True}})


#: zero_optimization sections: known keys, a typo, a removed key, each also as "auto"
ZERO_SECTIONS = [
    {"stage": 1, "overlap_comm": True},
    {"overlap_com": True},
    {"overlap_com": None},
    {"overlap_com": "AUTO"},
    {"overlap_com": "auto"},
    {"mics_shard_size": 8},
    {"mics_shard_size": "auto"},
    {"stage": 1, "overlap_comm": "auto"},
]


@pytest.mark.parametrize("zero", ZERO_SECTIONS, ids=json.dumps)
def test_zero_keys_are_refused_exactly_when_deepspeed_refuses_them(
    fake_world: Any, tmp_path: Path, zero: dict[str, Any]
) -> None:
    """mdc's errors on a zero_optimization section are DeepSpeed's refusals, no more, no
    fewer: DeepSpeedConfig raises on the section iff mdc reports an error on one of its keys."""
    fake_world(2)
    base = {
        "train_batch_size": 2,
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
    }
    try:
        DeepSpeedConfig({**base, "zero_optimization": zero})
        refused = False
    except Exception:  # DeepSpeedConfigError or pydantic's ValidationError
        refused = True
    from mdc_builtin.launchers.deepspeed import _zero_key_findings

    errors = [f for f in _zero_key_findings(zero) if f.severity.value == "error"]
    assert bool(errors) == refused, (zero, refused, errors)


def test_zero_with_pipeline_rule_is_deepspeeds() -> None:
    """MDC310 quotes the assertion of DeepSpeed's pipeline engine, which uses stage >= 2."""
    source = Path(deepspeed.__file__).parent / "runtime" / "pipe" / "engine.py"
    text = source.read_text(encoding="utf-8")
    assert (
        '< ZeroStageEnum.gradients, "ZeRO-2 and ZeRO-3 are incompatible with pipeline '
        'parallelism"' in text.replace("\n        ) ", " ").replace("(\n        )", "()")
    )


# ---------------------------------------------------------------- real runs on this CPU


#: how real runs start local/run.sh and clean up
LOCAL_RUN = test_local_run
#: the fixture that marks every process a run starts and kills what a failed run leaves
token = LOCAL_RUN.token
#: the first DeepSpeed run on a machine JIT-builds its CPU comm kernel (about 90 s on 2 cores)
DS_RUN_TIMEOUT = 480

RUNS = [
    # (example, overrides of the [deepspeed] table, runner the workers are started by)
    pytest.param("deepspeed-1x2-cpu.toml", {}, "deepspeed", id="1x2-deepspeed-runner"),
    pytest.param("deepspeed-2x2-cpu.json", {}, "torchrun", id="2x2-torchrun-runner"),
    pytest.param(
        "deepspeed-2x2-cpu.json", {"runner": "deepspeed"}, "deepspeed", id="2x2-deepspeed-runner"
    ),
]


@pytest.mark.slow
@pytest.mark.xdist_group("loopback")  # a real CPU run on loopback ports
@pytest.mark.parametrize(("example", "overrides", "runner"), RUNS)
def test_deepspeed_trains_one_step_on_every_rank(
    example: str,
    overrides: dict[str, Any],
    runner: str,
    compiler: Compiler,
    tmp_path: Path,
    token: str,
) -> None:
    """examples/ds_check.py: deepspeed.initialize with the emitted config, one step, gloo."""
    spec = load_spec(REPO / "examples" / example)
    spec["deepspeed"] = {**spec.get("deepspeed", {}), **overrides}
    if overrides:  # a port of its own: the example's may still be in TIME_WAIT
        spec["distributed"]["master_port"] = 29731
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec), encoding="utf-8")
    out, reports = tmp_path / "out", tmp_path / "reports"
    reports.mkdir()
    compile_to(compiler, path, out)
    want = expectations(spec)
    argv, _ = read_script(
        out, {"NODE_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "0", "MDC_OUT": str(out)}
    )
    assert argv[0] == runner == want["runner"]

    code, output, seconds = LOCAL_RUN.run_job(out, reports, token, timeout=DS_RUN_TIMEOUT)
    assert code == 0, f"run.sh exited {code} after {seconds:.1f} s:\n{LOCAL_RUN.excerpt(output)}"
    assert not LOCAL_RUN.leftovers(token), "processes left behind after a successful run"

    world, nproc, nnodes = want["world"], want["nproc"], want["nnodes"]
    files = sorted(p.name for p in reports.iterdir())
    assert files == sorted(f"rank-{r}.json" for r in range(world)), (files, output[-3000:])
    config = str(out / "launch" / "ds_config.json")
    seen = set()
    for rank in range(world):
        report = json.loads((reports / f"rank-{rank}.json").read_text(encoding="utf-8"))
        node, local = divmod(rank, nproc)  # ranks are contiguous per node, in node order
        assert (report["RANK"], report["dist_rank"], report["LOCAL_RANK"]) == (rank, rank, local), (
            report
        )
        assert report["WORLD_SIZE"] == report["dist_world_size"] == world, report
        # both runners' names, whichever started the workers
        assert (report["LOCAL_SIZE"], report["LOCAL_WORLD_SIZE"]) == (nproc, nproc), report
        assert (report["CROSS_RANK"], report["GROUP_RANK"]) == (node, node), report
        assert report["CROSS_SIZE"] == nnodes, report
        assert report["local_rank_argument"] == (local if runner == "deepspeed" else None)
        assert report["config_argument"] == report["config_variable"] == config, report
        assert report["deepspeed_flag"] is True
        # what DeepSpeed made of ds_config.json with the real world
        assert (
            report["train_batch_size"],
            report["micro_batch_size"],
            report["grad_accum_steps"],
        ) == (want["total"], want["micro"], want["gas"])
        assert report["dp_world_size"] == want["dp"]
        assert report["zero_stage"] == want["zero"]
        assert (report["bf16"], report["fp16"]) == (
            want["precision"] == "bf16",
            want["precision"] == "fp16",
        )
        assert report["global_steps"] == 1
        assert report["allreduce"] == world * (world - 1) / 2
        seen.add((node, local))
    assert len(seen) == world


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_offload_the_estimate_reads_is_what_deepspeed_reads(
    stage: int, compiler: Compiler, tmp_path: Path, fake_world: Any
) -> None:
    """ds_config's offload tables, as the memory estimate reads them, are DeepSpeed's: the
    compiled config loads, and DeepSpeed offloads exactly what the estimate leaves off."""
    from mdc_builtin.launchers.deepspeed import DeepSpeedOptions, training

    offload = {"device": "cpu", "pin_memory": True}
    zero = {"offload_optimizer": offload, **({"offload_param": offload} if stage == 3 else {})}
    spec = {
        "job": {"name": f"offload-{stage}", "command": ["python", "train.py"]},
        "distributed": {"launcher": "deepspeed", "nnodes": 1, "nproc_per_node": 2},
        "batch": {"global_batch_size": 4, "micro_batch_size": 1},
        "deepspeed": {
            "zero_stage": stage,
            "precision": "bf16",
            "config": {"zero_optimization": zero},
        },
    }
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec), encoding="utf-8")
    compile_to(compiler, path, tmp_path / "out")
    fake_world(2)
    loaded = json.loads((tmp_path / "out" / "launch" / "ds_config.json").read_text("utf-8"))
    config = DeepSpeedConfig(loaded).zero_config
    setup = training(DeepSpeedOptions(zero_stage=stage, config={"zero_optimization": zero}))
    assert config.stage == stage
    assert (config.offload_optimizer.device == "cpu") == (setup.optimizer_offload == 1.0)
    assert (config.offload_param is not None and config.offload_param.device == "cpu") == (
        setup.param_offload
    )
