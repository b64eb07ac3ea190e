"""The torchtitan launcher's job configs and command lines against TorchTitan 0.2.2 itself.

For every torchtitan example and a spread of written specs, ``launch/worker.sh``'s exec
line goes through torch's torchrun parser, and what torchrun hands the program goes
through TorchTitan's own ``ConfigManager.parse_args`` (``--job.config_file`` plus the
overrides, exactly as emitted), then the file alone and the overrides alone. The degrees
must build a ``ParallelDims`` with the plan's world size, and its device mesh (built with
torch's fake process group, one rank at a time) must hold the plan's rank groups. The
batch, sequence length and pipeline rules are held against TorchTitan's own checks.
Grids of degrees, orders, sequence lengths and pipeline settings check that mdc rejects
exactly what TorchTitan rejects.

Run as a script (under torchrun), this module is the program of
``examples/torchtitan-cpu-2x2.yaml``: it loads its arguments the way ``torchtitan.train``
does and builds TorchTitan's device mesh on gloo; ``test_cpu_example_runs`` runs it.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import io
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import types
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import attrs
import pytest

if importlib.util.find_spec("triton") is None:
    # torchtitan's package __init__ imports its MoE kernels, written in triton, which the
    # CPU build of torch does not ship. Nothing here runs them: stand in for that module.
    _kernels = types.ModuleType("torchtitan.models.moe.kernels")

    def _no_triton(*args: object, **kwargs: object) -> None:
        raise RuntimeError("triton kernels are not available on this machine")

    _kernels.generate_permute_indices = _no_triton  # type: ignore[attr-defined]
    sys.modules.setdefault("torchtitan.models.moe.kernels", _kernels)

with warnings.catch_warnings():
    # torch and torchtitan warn at import about deprecations
    warnings.simplefilter("ignore")
    pytest.importorskip(
        "torchtitan",
        reason="conformance needs torchtitan==0.2.2 and torch==2.13.0: run scripts/test",
    )
    import torch
    import torch.distributed as dist
    import torch.distributed.run as torchrun
    import torchtitan.distributed.parallel_dims as parallel_dims_module
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from torchtitan.config import JobConfig
    from torchtitan.config.manager import ConfigManager
    from torchtitan.distributed import pipeline_parallel
    from torchtitan.distributed.parallel_dims import ParallelDims

from mdc.cli import main

pytestmark = pytest.mark.torch

#: not tests.tools.REPO: this module also runs as a script, where tests/ is not importable
REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(
    p
    for p in (REPO / "examples").glob("torchtitan-*")
    if p.suffix in (".toml", ".yaml", ".yml", ".json")
)
NODE_RANK, MASTER_ADDR = 1, "10.0.0.1"
REPORT_DIR = "MDC_TORCHTITAN_CHECK_DIR"
#: TorchTitan mesh dimension -> the mdc group kind holding the same ranks
MESH_KINDS = {
    "tp": "tp",
    "cp": "cp",
    "pp": "pp",
    "batch": "dp",
    "loss": "dp-cp",
    "ep": "ep",
    "etp": "expert-tp",
    "efsdp": "expert-dp",
}
#: Override keys TorchTitan 0.3.0 also reads (its config/configs.py: TrainingConfig,
#: ParallelismConfig; 0.3.0 has no expert_tensor_parallel_degree and no TOML files).
KEYS_IN_0_3 = {
    "training.local_batch_size",
    "training.global_batch_size",
    "training.seq_len",
    "training.steps",
    "parallelism.data_parallel_replicate_degree",
    "parallelism.data_parallel_shard_degree",
    "parallelism.tensor_parallel_degree",
    "parallelism.pipeline_parallel_degree",
    "parallelism.context_parallel_degree",
    "parallelism.expert_parallel_degree",
}


# ------------------------------------------------------------------ compiling and reading


def compile_spec(spec: Path, out: Path) -> tuple[int, str, dict[str, Any] | None]:
    """``mdc compile`` with only mdc's own plugins; (exit code, stderr, plan.json)."""
    stdout, stderr = io.StringIO(), io.StringIO()
    code = main(
        ["compile", str(spec), "-o", str(out), "--no-plugin-autoload"], stdout=stdout, stderr=stderr
    )
    plan = json.loads((out / "plan.json").read_text(encoding="utf-8")) if code == 0 else None
    return code, stderr.getvalue(), plan


def write_spec(tmp_path: Path, spec: dict[str, Any]) -> Path:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec), encoding="utf-8")
    return path


def read_script(out: Path, port: int) -> tuple[list[str], dict[str, str]]:
    """The argv launch/worker.sh execs (runtime variables put in as a backend and the script
    itself would) and the variables it exports."""
    script = (out / "launch" / "worker.sh").read_text(encoding="utf-8")
    values = {
        "NODE_RANK": str(NODE_RANK),
        "MASTER_ADDR": MASTER_ADDR,
        "MASTER_PORT": str(port),
        "MDC_OUT": str(out),
    }
    expanded = re.sub(r"\$\{(\w+)\}", lambda m: values[m.group(1)], script)
    env = {}
    for line in expanded.splitlines():
        if line.startswith("export ") and "=" in line:
            name, _, value = line[len("export ") :].partition("=")
            env[name] = shlex.split(value)[0]
    _, sep, command = expanded.partition("\nexec ")
    assert sep, script
    return shlex.split(command), env


def spec(
    tp: int,
    pp: int,
    cp: int = 1,
    ep: int = 1,
    etp: int | None = None,
    vpp: int | None = None,
    order: str | None = None,
    nnodes: int = 2,
    nproc: int = 8,
    model: dict[str, Any] | None = None,
    batch: dict[str, int] | None = None,
    torchtitan: dict[str, Any] | None = None,
) -> dict[str, Any]:
    parallelism: dict[str, Any] = {"tp": tp, "pp": pp, "cp": cp, "ep": ep}
    for key, value in (("etp", etp), ("vpp", vpp), ("order", order)):
        if value is not None:
            parallelism[key] = value
    data: dict[str, Any] = {
        "job": {"name": "torchtitan-conformance", "command": ["python", "-m", "torchtitan.train"]},
        "distributed": {
            "launcher": "torchtitan",
            "nnodes": nnodes,
            "nproc_per_node": nproc,
            "accelerator": "nvidia",
        },
        "parallelism": parallelism,
    }
    if torchtitan is None or "model" not in torchtitan:
        # a model the user registers with TorchTitan (not in its registry): [model] gives
        # its shape, free of a registered flavor's
        torchtitan = {"model": "my_llm", "flavor": "custom", **(torchtitan or {})}
    for key, table in (("model", model), ("batch", batch), ("torchtitan", torchtitan)):
        if table is not None:
            data[key] = table
    return data


# ------------------------------------------------------------------ TorchTitan's verdicts


def parse(args: list[str]) -> JobConfig:
    """TorchTitan's ConfigManager, as torchtitan.train runs it on its sys.argv[1:]."""
    return ConfigManager().parse_args(args)


def dims_of(config: JobConfig, world: int) -> ParallelDims:
    p = config.parallelism
    return ParallelDims(
        dp_replicate=p.data_parallel_replicate_degree,
        dp_shard=p.data_parallel_shard_degree,
        cp=p.context_parallel_degree,
        tp=p.tensor_parallel_degree,
        pp=p.pipeline_parallel_degree,
        ep=p.expert_parallel_degree,
        etp=p.expert_tensor_parallel_degree,
        world_size=world,
    )


@contextlib.contextmanager
def fake_rank(rank: int, world: int) -> Iterator[None]:
    """torch.distributed as rank ``rank`` of ``world``, through torch's fake process group."""
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    try:
        # TorchTitan picks "cuda" when torch finds no accelerator; the mesh lives on the CPU
        with mock.patch.object(parallel_dims_module, "device_type", "cpu"):
            yield
    finally:
        dist.destroy_process_group()


def mesh_groups(dims: ParallelDims, rank: int) -> dict[str, list[int]]:
    """Rank ``rank``'s group in each TorchTitan mesh dimension (size-1 dimensions: itself)."""
    with fake_rank(rank, dims.world_size):
        dims.build_mesh()
        groups = {}
        for name in MESH_KINDS:
            mesh = dims.get_optional_mesh(name)
            groups[name] = mesh.mesh.tolist() if mesh is not None else [rank]
        return groups


def titan_verdict(kwargs: dict[str, int], world: int) -> str | None:
    """None if TorchTitan's ParallelDims accepts the degrees and builds its mesh, else why."""
    try:
        dims = ParallelDims(world_size=world, **kwargs)
        mesh_groups(dims, 0)
    except (AssertionError, RuntimeError, ValueError) as exc:
        return str(exc) or type(exc).__name__
    return None


def compare_groups(plan: dict[str, Any], dims: ParallelDims, replicate: int) -> None:
    world = plan["world_size"]
    ranks = sorted({0, world // 2 + 1, world - 1} & set(range(world)))
    for rank in ranks:
        for name, group in mesh_groups(dims, rank).items():
            kind = MESH_KINDS[name]
            if name == "efsdp" and dims.ep == 1:
                continue  # a dense model: TorchTitan builds no expert data-parallel group
            if kind == "expert-dp" and replicate > 1:
                # Megatron's expert dp spans dp_replicate too; TorchTitan's efsdp does not
                mine = next(g for g in plan["groups"][kind]["ranks"] if rank in g)
                assert set(group) <= set(mine) and len(mine) == len(group) * replicate
                continue
            mine = next(g for g in plan["groups"][kind]["ranks"] if rank in g)
            assert sorted(group) == mine, (name, rank)


def resolve_torchrun(args: Any, plan: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """torchrun's own resolution of its parsed flags (config_from_args) matches the plan."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # keep config_from_args off this process's env
    config, _, _ = torchrun.config_from_args(args)
    assert (config.min_nodes, config.max_nodes) == (plan["min_nnodes"], plan["nnodes"])
    assert config.nproc_per_node == plan["nproc_per_node"]
    if plan["nnodes"] > 1:
        assert config.rdzv_endpoint == f"{MASTER_ADDR}:{plan['rendezvous']['master_port']}"


# ------------------------------------------------------------------ one compiled job


def check_job(out: Path, plan: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> JobConfig:
    """launch/worker.sh and launch/torchtitan.toml against plan.json and TorchTitan."""
    argv, env = read_script(out, plan["rendezvous"]["master_port"])
    assert argv[0] == "torchrun"
    for name in [k for k in os.environ if k.startswith("PET_")]:
        monkeypatch.delenv(name)  # torchrun's parser takes its defaults from PET_*
    args = torchrun.get_args_parser().parse_args(argv[1:])
    assert args.nproc_per_node == str(plan["nproc_per_node"])
    assert args.nnodes == str(plan["nnodes"])
    resolve_torchrun(args, plan, monkeypatch)
    command = plan["job"]["command"]
    if command[:2] == ["python", "-m"]:
        assert args.module and args.training_script == command[2]
    # the command's own arguments (its overrides), then mdc's: the config file and the
    # overrides of the keys mdc owns
    script_args = list(args.training_script_args)
    own = command[3:] if command[:2] == ["python", "-m"] else command[2:]
    assert script_args[: len(own)] == own
    mdc_args = script_args[len(own) :]
    toml = out / "launch" / "torchtitan.toml"
    assert mdc_args[:2] == ["--job.config_file", str(toml)]

    config = parse(script_args)
    from_file = parse(mdc_args[:2])
    from_overrides = parse(mdc_args[2:])
    options = plan["options"].get("torchtitan") or {}
    p, world = plan["parallelism"], plan["world_size"]
    replicate = options.get("dp_replicate") or 1
    for loaded in (config, from_file, from_overrides):
        q = loaded.parallelism
        assert (
            q.tensor_parallel_degree,
            q.pipeline_parallel_degree,
            q.context_parallel_degree,
            q.expert_parallel_degree,
        ) == (p["tp"], p["pp"], p["cp"], p["ep"])
        assert q.data_parallel_replicate_degree == replicate
        assert q.data_parallel_shard_degree == p["dp"] // replicate
        if plan["batch"] is not None:
            assert loaded.training.local_batch_size == plan["batch"]["micro_batch_size"]
            assert loaded.training.global_batch_size == plan["batch"]["global_batch_size"]
    if p["ep"] > 1:
        assert from_overrides.parallelism.expert_tensor_parallel_degree == p["etp"]
    assert config.parallelism.expert_tensor_parallel_degree == p["etp"]
    overrides = [w[2:] for w in mdc_args[2:] if w.startswith("--")]
    assert set(overrides) <= KEYS_IN_0_3 | {"parallelism.expert_tensor_parallel_degree"}
    if p["ep"] == 1:
        assert "parallelism.expert_tensor_parallel_degree" not in overrides

    assert config.job.description == plan["job"]["name"]
    assert config.job.dump_folder == (options.get("dump_folder") or "./outputs")
    assert config.model.name == (options.get("model") or "llama3")
    assert config.model.flavor == (options.get("flavor") or "debugmodel")
    model = plan["model"] or {}
    seq = options.get("seq_len") or model.get("seq_length") or 2048
    assert config.training.seq_len == seq
    if options.get("steps"):
        assert config.training.steps == options["steps"]
    for section, values in (options.get("config") or {}).items():  # the command's own win
        loaded_section = getattr(from_file, section)
        for key, value in values.items():
            got = getattr(loaded_section, key)
            if isinstance(value, dict):
                for inner, inner_value in value.items():
                    assert getattr(got, inner) == inner_value, (section, key, inner)
            else:
                assert got == value, (section, key)

    # ParallelDims with torchrun's WORLD_SIZE, and its mesh
    dims = dims_of(config, world)
    assert (dims.dp_replicate * dims.dp_shard * dims.cp * dims.tp * dims.pp) == world
    compare_groups(plan, dims, replicate)
    assert config.training.seq_len % dims.seq_len_divisor == 0
    if plan["batch"] is not None:  # Trainer.__init__'s batch arithmetic
        batch_degree = dims.dp_replicate * dims.dp_shard
        local, total = config.training.local_batch_size, config.training.global_batch_size
        assert total % (local * batch_degree) == 0
        assert total // (local * batch_degree) == plan["batch"]["grad_accum_steps"]
    if p["pp"] > 1:
        check_pipeline(config, plan)

    # madengine's runner env (as torchrun's): torchrun's words up to the program, and sizes
    runner = env.pop("MAD_MULTI_NODE_RUNNER").split(" ")
    assert runner == argv[: len(runner)] and args.training_script not in runner
    assert (env.pop("NNODES"), env.pop("NPROC_PER_NODE")) == (
        str(plan["nnodes"]),
        str(plan["nproc_per_node"]),
    )
    assert env == {
        "TORCHTITAN_TENSOR_PARALLEL_SIZE": str(dims.tp),
        "TORCHTITAN_PIPELINE_PARALLEL_SIZE": str(dims.pp),
        "TORCHTITAN_FSDP_ENABLED": "1" if dims.fsdp_enabled else "0",
        "TORCHTITAN_CONTEXT_PARALLEL_SIZE": str(dims.cp),
        **dict(plan["job"]["env"].items()),
    }
    return config


class _Split(Exception):
    """Raised instead of splitting the model: TorchTitan has decided its stages."""


def pipeline_stages(config: JobConfig, layers: int) -> int:
    """How many pipeline stages TorchTitan's pipeline_llm makes for ``layers`` layers."""
    captured: list[int] = []

    def split(
        model: object,
        pp_mesh: object,
        schedule: str,
        device: object,
        module_names_per_stage: list[list[str]],
    ) -> None:
        captured.append(len(module_names_per_stage))
        raise _Split

    dims = types.SimpleNamespace(
        pp=config.parallelism.pipeline_parallel_degree, get_mesh=lambda name: None
    )
    with (
        mock.patch.object(pipeline_parallel, "pipeline_module_split", split),
        pytest.raises(_Split),
    ):
        pipeline_parallel.pipeline_llm(
            None, dims, config, None, types.SimpleNamespace(n_layers=layers), None, None
        )
    return captured[0]


@functools.cache
def stages_for(args: tuple[str, ...], layers: int) -> int | None:
    """TorchTitan's stage count for its command line ``args`` and ``layers`` layers (None:
    TorchTitan refuses them). Kept per arguments: the pipeline cases ask the same question
    again for every vpp and schedule spelling that TorchTitan runs alike, and each question
    parses a fresh config."""
    try:
        return pipeline_stages(parse(list(args)), layers)
    except ValueError:
        return None


def microbatch_verdict(config: JobConfig) -> str | None:
    """TorchTitan's own check of local batch vs pipeline microbatch size (None: it passes)."""
    try:
        pipeline_parallel.build_pipeline_schedule(config, [], None)
    except ValueError as exc:
        if "must be divisible by microbatch_size" in str(exc):
            return str(exc)
    except (TypeError, IndexError, AttributeError, RuntimeError):
        return None  # past the check: building a schedule from no stages fails
    return None


def check_pipeline(config: JobConfig, plan: dict[str, Any]) -> None:
    assert microbatch_verdict(config) is None
    layers = (plan["model"] or {}).get("num_layers")
    if layers:
        vpp = plan["parallelism"]["vpp"] or 1
        assert pipeline_stages(config, layers) == plan["parallelism"]["pp"] * vpp


# ------------------------------------------------------------------ the tests


def test_there_are_examples() -> None:
    assert len(EXAMPLES) >= 2


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_loads_in_torchtitan(
    example: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)
    code, stderr, plan = compile_spec(example, tmp_path / "out")
    assert code == 0 and plan is not None, stderr
    check_job(tmp_path / "out", plan, monkeypatch)


LLAMA = {"num_layers": 16, "num_attention_heads": 16, "seq_length": 4096}
SPECS: dict[str, dict[str, Any]] = {
    "fsdp-only": spec(1, 1, batch={"global_batch_size": 64, "micro_batch_size": 4}),
    "tp8-pp2": spec(8, 2, model=LLAMA),
    "tp2-cp2-pp2-hsdp": spec(
        2,
        2,
        cp=2,
        model=LLAMA,
        torchtitan={"dp_replicate": 2},
        batch={"global_batch_size": 32, "micro_batch_size": 4},
    ),
    "moe-etp-tp": spec(
        2,
        1,
        ep=4,
        model={"seq_length": 4096},  # the rest, 64 experts included, from the flavor
        torchtitan={"model": "deepseek_v3", "flavor": "16B"},
    ),
    "moe-etp1-cp": spec(2, 1, cp=2, ep=2, etp=1, model={**LLAMA, "num_experts": 4}),
    "vpp2-looped": spec(
        2, 4, vpp=2, model=LLAMA, batch={"global_batch_size": 64, "micro_batch_size": 8}
    ),
    "vpp4-layers-per-stage": spec(
        2,
        2,
        vpp=4,
        model={**LLAMA, "num_layers": 48},
        batch={"global_batch_size": 32, "micro_batch_size": 8},
        torchtitan={"pipeline_microbatch_size": 2},
    ),
    "zbv": spec(2, 2, vpp=2, model=LLAMA, torchtitan={"pipeline_schedule": "ZBVZeroBubble"}),
    "gpipe-seq-option": spec(
        4, 2, torchtitan={"pipeline_schedule": "GPipe", "seq_len": 1024, "steps": 50}
    ),
    "fp8-and-config": spec(
        4,
        1,
        model={**LLAMA, "dtype": "fp8"},
        torchtitan={
            "dump_folder": "/tmp/run",
            "config": {
                "training": {"dataset": "c4", "dataloader": {"num_workers": 2}},
                "activation_checkpoint": {"mode": "selective", "selective_ac_option": "op"},
                "optimizer": {"lr": 0.0003},
                "compile": {"enable": True},
                "lr_scheduler": {"warmup_steps": 100},
            },
        },
    ),
    "short-order": spec(2, 2, order="tp-dp-pp", model=LLAMA),
    "memory-keys": spec(
        2,
        1,
        model=LLAMA,
        torchtitan={
            "config": {
                "activation_checkpoint": {"mode": "selective", "selective_ac_option": "3"},
                "training": {"enable_cpu_offload": True},
                "parallelism": {"fsdp_reshard_after_forward": "never"},
            }
        },
    ),
}


@pytest.mark.parametrize("case", sorted(SPECS))
def test_written_spec_loads_in_torchtitan(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code, stderr, plan = compile_spec(write_spec(tmp_path, SPECS[case]), tmp_path / "out")
    assert code == 0 and plan is not None, stderr
    config = check_job(tmp_path / "out", plan, monkeypatch)
    if case == "fp8-and-config":
        assert config.model.converters == ["quantize.linear.float8"]
        assert config.training.mixed_precision_param == "bfloat16"
    if case == "vpp2-looped":
        assert config.parallelism.pipeline_parallel_schedule == "Interleaved1F1B"
        assert config.parallelism.pipeline_parallel_layers_per_stage is None
    if case == "memory-keys":  # what the estimate reads is what TorchTitan reads
        from mdc_builtin.launchers.torchtitan import TorchtitanOptions, training

        setup = training(TorchtitanOptions(config=SPECS[case]["torchtitan"]["config"]))
        assert config.activation_checkpoint.selective_ac_option == "3"
        assert setup.recompute_every == 3 and setup.recompute == "full"
        assert config.training.enable_cpu_offload and setup.param_offload
        assert config.parallelism.fsdp_reshard_after_forward == "never"
        assert setup.zero_stage == 2
    if case == "vpp4-layers-per-stage":
        assert config.parallelism.pipeline_parallel_layers_per_stage is not None


def _per_op_decisions(
    model: Any, tokens: Any, forced: list[str]
) -> list[tuple[str, str, list[tuple[int, ...]]]]:
    """(op, TorchTitan's policy decision, argument shapes) of every op the blocks run
    forward under TorchTitan's per-op selective checkpointing."""
    import torch.utils.checkpoint as checkpoint
    from torchtitan.config.job_config import ActivationCheckpoint
    from torchtitan.distributed.activation_checkpoint import apply_ac
    from torchtitan.models.llama3.infra.parallelize import _op_sac_save_list

    decisions = []
    contexts = checkpoint.create_selective_checkpoint_contexts

    def recording(policy: Any, *args: Any, **kwargs: Any) -> Any:
        def decide(ctx: Any, func: Any, *op_args: Any, **op_kwargs: Any) -> Any:
            decision = policy(ctx, func, *op_args, **op_kwargs)
            if not ctx.is_recompute:
                shapes = [tuple(a.shape) for a in op_args if isinstance(a, torch.Tensor)]
                decisions.append((str(func), decision.name, shapes))
            return decision

        return contexts(decide, *args, **kwargs)

    config = ActivationCheckpoint(
        mode="selective",
        selective_ac_option="op",
        per_op_sac_force_recompute_mm_shapes_by_fqns=forced,
    )
    with mock.patch.object(checkpoint, "create_selective_checkpoint_contexts", recording):
        apply_ac(model, config, op_sac_save_list=_op_sac_save_list)
        model(tokens)
    return decisions


@pytest.mark.parametrize(
    "forced",
    [
        ["moe.router.gate"],  # TorchTitan's default: no Llama matmul
        ["feed_forward.w1"],
        ["attention.wk"],  # wv has wk's shape: TorchTitan forces both
    ],
)
def test_per_op_recompute_keeps_what_torchtitans_policy_saves(forced: list[str]) -> None:
    """The per-op estimate (mdc.plan.per_op) of a grouped-query Llama block against the
    decisions TorchTitan's own policy makes while the block runs: the kept matmul outputs,
    and the recomputed share of the matmul FLOPs, with the matmuls the config forces."""
    from torchtitan.models.llama3 import Transformer, TransformerModelArgs
    from torchtitan.models.llama3.infra.parallelize import _op_sac_save_list

    from mdc.convert import structure
    from mdc.plan import per_op
    from mdc.plan.architecture import Parts
    from mdc.plan.memory import resolve_shape
    from mdc.spec import ModelTable

    layers, dim, heads, kv_heads, batch, seq = 2, 256, 8, 2, 2, 32
    args = TransformerModelArgs(
        dim=dim, n_layers=layers, n_heads=heads, n_kv_heads=kv_heads, vocab_size=512
    )
    torch.manual_seed(0)
    model = Transformer(args)
    ffn = model.layers["0"].feed_forward.w1.weight.shape[0]
    decisions = _per_op_decisions(model, torch.randint(0, 512, (batch, seq)), forced)
    mms = [(choice, shapes) for op, choice, shapes in decisions if op == "aten.mm.default"]
    assert len(mms) == 7 * layers  # wq, wk, wv, wo, w1, w3, w2 in each block
    kept = sum(a[0] * w[1] for choice, (a, w) in mms if choice == "MUST_SAVE")
    again = sum(a[1] * w[1] for choice, (a, w) in mms if choice != "MUST_SAVE")
    flops = sum(a[1] * w[1] for _, (a, w) in mms)
    # the attention kernel: the CPU one runs here, the GPU ones are on the policy's list
    kernels = [op for op, _, _ in decisions if "scaled_dot_product" in op]
    assert kernels == ["aten._scaled_dot_product_flash_attention_for_cpu.default"] * layers
    assert torch.ops.aten._scaled_dot_product_flash_attention.default in _op_sac_save_list
    assert torch.ops.aten._scaled_dot_product_efficient_attention.default in _op_sac_save_list
    tokens = batch * seq
    kernel_output = tokens * dim
    block_input = tokens * dim  # the checkpoint keeps its input

    table = {
        "num_layers": layers, "hidden_size": dim, "num_attention_heads": heads,
        "num_query_groups": kv_heads, "ffn_hidden_size": ffn, "gated_mlp": True,
        "vocab_size": 512, "seq_length": seq, "normalization": "rmsnorm",
    }  # fmt: skip
    shape = resolve_shape(structure(table, ModelTable))
    assert shape is not None
    each = sum(
        per_op.kept_per_token(shape, kind, 1, 1, 1, tuple(forced)) for kind in ("attention", "mlp")
    )
    assert each * tokens * layers == kept + layers * (kernel_output + block_input)
    parts = Parts(attention=layers, mlp=layers)
    assert per_op.recomputed_gemm_share(shape, parts, tuple(forced)) == pytest.approx(again / flops)


def test_eager_mlp_keeps_what_torchtitans_autograd_saves() -> None:
    """Without checkpointing, TorchTitan's uncompiled FeedForward, w2(silu(w1(x)) * w3(x)),
    keeps its input and four MLP-wide tensors per token (w1's and w3's outputs, silu's
    output, the product), and no dropout mask: the estimate's MLP part for TorchTitan
    (eager_gated_mlp, no dropout_masks) past the norm's own input."""
    from torchtitan.models.llama3 import Transformer, TransformerModelArgs

    from mdc.convert import structure
    from mdc.plan.memory import resolve_shape
    from mdc.plan.memory.activations import part_activations
    from mdc.spec import ModelTable

    dim, batch, seq = 256, 2, 32
    args = TransformerModelArgs(dim=dim, n_layers=1, n_heads=8, n_kv_heads=2, vocab_size=512)
    torch.manual_seed(0)
    feed_forward = Transformer(args).layers["0"].feed_forward.to(torch.bfloat16)
    ffn = feed_forward.w1.weight.shape[0]
    saved: dict[int, int] = {}

    def keep(tensor: Any) -> Any:
        storage = tensor.untyped_storage()
        saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    weights = {p.untyped_storage().data_ptr() for p in feed_forward.parameters()}
    x = torch.randn(batch, seq, dim, dtype=torch.bfloat16, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(keep, lambda tensor: tensor):
        feed_forward(x)
    kept = sum(n for ptr, n in saved.items() if ptr not in weights)

    table = {
        "num_layers": 1, "hidden_size": dim, "num_attention_heads": 8, "num_query_groups": 2,
        "ffn_hidden_size": ffn, "gated_mlp": True, "vocab_size": 512, "seq_length": seq,
    }  # fmt: skip
    shape = resolve_shape(structure(table, ModelTable))
    assert shape is not None
    mlp = part_activations(shape, 1, 1, 1, batch, None, None, masks=False, eager_mlp=True)["mlp"]
    norm_input = 2 * batch * seq * dim  # the norm keeps it; the FeedForward starts after
    assert mlp.full(1) - norm_input == kept == batch * seq * 2 * (dim + 4 * ffn)


#: (the config table's memory keys, the job command's overrides of them)
OVERRIDES: dict[str, tuple[dict[str, Any], list[str]]] = {
    "full-over-none": (
        {"activation_checkpoint": {"mode": "none"}}, ["--activation-checkpoint.mode", "full"]
    ),
    "every-3rd": ({}, ["--activation_checkpoint.selective_ac_option", "3"]),
    "per-op-forced": (
        {"activation_checkpoint": {"mode": "selective", "selective_ac_option": "op"}},
        ["--activation_checkpoint.per_op_sac_force_recompute_mm_shapes_by_fqns",
         "moe.router.gate,feed_forward.w1"],
    ),
    "compile-on": ({}, ["--compile.enable"]),
    "compile-off-over-table": ({"compile": {"enable": True}}, ["--compile.no-enable"]),
    "compile-loss-only": ({"compile": {"enable": True}}, ["--compile.components", "loss"]),
    "offload-and-reshard": (
        {}, ["--training.enable-cpu-offload", "--parallelism.fsdp_reshard_after_forward", "never"]
    ),
    "last-wins": ({}, ["--activation_checkpoint.mode", "none",
                       "--activation_checkpoint.mode", "full"]),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(OVERRIDES))
def test_memory_overrides_in_the_command_are_read_as_torchtitan_reads_them(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The estimate's training setup from the table and the command's overrides equals the
    one from the values TorchTitan's own ConfigManager ends up with (the compiled job's
    config file, then the command)."""
    from mdc.plugin_manager import load_plugins
    from mdc_builtin.launchers.torchtitan import MEMORY_KEYS, TorchtitanOptions, training

    table, overrides = OVERRIDES[case]
    written = spec(2, 1, torchtitan={"config": table})
    written["job"]["command"] = [*written["job"]["command"], *overrides]
    code, stderr, plan = compile_spec(write_spec(tmp_path, written), tmp_path / "out")
    assert code == 0 and plan is not None, stderr
    config = check_job(tmp_path / "out", plan, monkeypatch)
    titan: dict[str, dict[str, Any]] = {}
    for section, key in MEMORY_KEYS:
        titan.setdefault(section, {})[key] = getattr(getattr(config, section), key)
    options = TorchtitanOptions(**{k: v for k, v in written["torchtitan"].items() if k != "config"})
    theirs = training(attrs.evolve(options, config=titan))
    spec_options = attrs.evolve(options, config=table)
    launcher = load_plugins(autoload=False).launcher("torchtitan")
    assert launcher.read_command is not None
    mine = training(launcher.read_command(spec_options, written["job"]["command"]))
    assert mine == theirs
    assert mine != training(spec_options)  # the overrides changed what the estimate reads


@pytest.mark.parametrize(
    "words",
    [["--activation_checkpoint.mode", "bogus"], ["--parallelism.fsdp-reshard-after-forward", "x"]],
)
def test_a_memory_override_torchtitan_refuses_is_refused(words: list[str], tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        parse(words)
    written = spec(2, 1)
    written["job"]["command"] = [*written["job"]["command"], *words]
    code, stderr, _ = compile_spec(write_spec(tmp_path, written), tmp_path / "out")
    assert code == 1 and "error[MDC359]" in stderr and "(at /job/command/3)" in stderr, stderr


def test_an_unknown_config_key_compiles_but_torchtitan_refuses_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pass-through keys are not checked at compile time (mdc does not import TorchTitan)."""
    code, stderr, plan = compile_spec(
        write_spec(tmp_path, spec(2, 1, torchtitan={"config": {"training": {"no_such_key": 1}}})),
        tmp_path / "out",
    )
    assert code == 0 and plan is not None, stderr
    with pytest.raises(ValueError, match="Invalid field names"):
        parse(["--job.config_file", str(tmp_path / "out" / "launch" / "torchtitan.toml")])


def degree_cases() -> Iterator[tuple[int, int, int, int, int, int, int]]:
    """(world, tp, cp, pp, ep, etp, dp_replicate) where the core plan is valid."""
    for world in (8, 16):
        for tp in (1, 2, 4):
            for cp in (1, 2):
                for pp in (1, 2):
                    if world % (tp * cp * pp):
                        continue
                    dp = world // (tp * cp * pp)
                    for ep in (1, 2, 4, 8):
                        for etp in sorted({1, 2, tp}):
                            if world % (etp * ep * pp):
                                continue
                            for replicate in (1, 2, 3):
                                if replicate <= dp:
                                    yield world, tp, cp, pp, ep, etp, replicate


#: every third case of the grid (each rule stays covered: see the test below)
DEGREES = list(degree_cases())[::3]


def test_degree_grid_covers_each_rule() -> None:
    kinds = set()
    for world, tp, cp, pp, ep, etp, replicate in DEGREES:
        dp = world // (tp * cp * pp)
        if dp % replicate:
            kinds.add("replicate does not divide dp")
        elif ep > 1 and etp not in (1, tp):
            kinds.add("etp neither tp nor 1")
        elif ep > 1 and (dp // replicate * cp * tp) % (ep * etp):
            kinds.add("ep * etp does not divide dp_shard * cp * tp")
        else:
            kinds.add("valid")
    assert len(kinds) == 4, kinds


@pytest.mark.parametrize("case", DEGREES, ids=["-".join(map(str, c)) for c in DEGREES])
def test_degrees_rejected_exactly_when_torchtitan_rejects_them(
    case: tuple[int, ...], tmp_path: Path
) -> None:
    world, tp, cp, pp, ep, etp, replicate = case
    dp = world // (tp * cp * pp)
    data = spec(
        tp,
        pp,
        cp=cp,
        ep=ep,
        etp=etp,
        nnodes=world // 8,
        nproc=8,
        model={"num_experts": 8} if ep > 1 else None,
        torchtitan={"dp_replicate": replicate, "seq_len": 64},
    )
    code, stderr, _ = compile_spec(write_spec(tmp_path, data), tmp_path / "out")
    codes = set(re.findall(r"error\[(MDC\d+)\]", stderr))
    # what a user would hand TorchTitan for these sizes: the shard degree mdc writes, or,
    # when dp_replicate does not divide dp, TorchTitan's own default (-1, "the rest")
    shard = dp // replicate if dp % replicate == 0 else -1
    error = titan_verdict(
        {
            "dp_replicate": replicate,
            "dp_shard": shard,
            "cp": cp,
            "tp": tp,
            "pp": pp,
            "ep": ep,
            "etp": etp,
        },
        world,
    )
    assert codes <= {"MDC331", "MDC332", "MDC333"}, stderr
    assert (code == 0) == (error is None), (stderr, error)


ORDERS = (
    "tp-cp-ep-dp-pp",
    "tp-cp-ep-pp-dp",
    "tp-dp-pp",
    "tp-pp-dp",
    "cp-tp-ep-dp-pp",
    "tp-ep-cp-dp-pp",
    "dp-tp-cp-ep-pp",
)
ORDER_SIZES = ((2, 1, 2, 1, 2), (2, 2, 1, 1, 2), (1, 2, 2, 2, 1), (2, 2, 1, 2, 1))


@pytest.mark.parametrize(
    ("order", "sizes"),
    [(o, s) for o in ORDERS for s in ORDER_SIZES],
    ids=[f"{o}-{'.'.join(map(str, s))}" for o in ORDERS for s in ORDER_SIZES],
)
def test_order_accepted_exactly_when_torchtitan_mesh_has_its_groups(
    order: str, sizes: tuple[int, int, int, int, int], tmp_path: Path
) -> None:
    tp, cp, pp, ep, etp = sizes
    world = 16
    data = spec(
        tp,
        pp,
        cp=cp,
        ep=ep,
        etp=etp,
        order=order,
        nnodes=2,
        nproc=8,
        model={"num_experts": 8} if ep > 1 else None,
        torchtitan={"seq_len": 64},
    )
    code, stderr, _ = compile_spec(write_spec(tmp_path, data), tmp_path / "out")
    if code != 0 and "MDC330" not in stderr:
        assert re.search(r"error\[MDC20[45]\]", stderr), stderr  # the core's order rules
        return
    plan_data = spec(
        tp,
        pp,
        cp=cp,
        ep=ep,
        etp=etp,
        order=order,
        nnodes=2,
        nproc=8,
        model={"num_experts": 8} if ep > 1 else None,
    )
    plan_data["distributed"]["launcher"] = "torchrun"  # the same plan, without TorchTitan's rule
    torchrun_code, torchrun_err, layout = compile_spec(
        write_spec(tmp_path, plan_data), tmp_path / "plain"
    )
    assert torchrun_code == 0 and layout is not None, torchrun_err
    dp = world // (tp * cp * pp)
    dims = ParallelDims(
        dp_replicate=1, dp_shard=dp, cp=cp, tp=tp, pp=pp, ep=ep, etp=etp, world_size=world
    )
    same = True
    for rank in range(world):
        for name, group in mesh_groups(dims, rank).items():
            if name == "efsdp" and ep == 1:
                continue  # a dense model: TorchTitan builds no expert data-parallel group
            mine = next(g for g in layout["groups"][MESH_KINDS[name]]["ranks"] if rank in g)
            same = same and sorted(group) == mine
    assert (code == 0) == same, stderr


@pytest.mark.parametrize("seq", [64, 96, 100, 128, 192, 4097])
@pytest.mark.parametrize(("tp", "cp"), [(1, 1), (2, 1), (4, 2), (2, 4)])
def test_seq_len_rejected_exactly_when_torchtitan_divisor_rejects_it(
    seq: int, tp: int, cp: int, tmp_path: Path
) -> None:
    code, stderr, _ = compile_spec(
        write_spec(tmp_path, spec(tp, 1, cp=cp, torchtitan={"seq_len": seq})), tmp_path / "out"
    )
    dims = ParallelDims(
        dp_replicate=1, dp_shard=16 // (tp * cp), cp=cp, tp=tp, pp=1, ep=1, etp=1, world_size=16
    )
    assert (code == 0) == (seq % dims.seq_len_divisor == 0), stderr
    if code:
        assert "MDC334" in stderr


@pytest.mark.parametrize(("local", "size"), [(8, 1), (8, 2), (8, 3), (6, 4), (6, 3), (1, 2)])
def test_pipeline_microbatch_rejected_exactly_when_torchtitan_rejects_it(
    local: int, size: int, tmp_path: Path
) -> None:
    code, stderr, _ = compile_spec(
        write_spec(
            tmp_path,
            spec(
                2,
                2,
                batch={"global_batch_size": local * 4, "micro_batch_size": local},
                torchtitan={"pipeline_microbatch_size": size},
            ),
        ),
        tmp_path / "out",
    )
    config = parse(
        [
            "--parallelism.pipeline_parallel_degree",
            "2",
            "--training.local_batch_size",
            str(local),
            "--parallelism.pipeline_parallel_microbatch_size",
            str(size),
        ]
    )
    assert (code == 0) == (microbatch_verdict(config) is None), stderr


STAGE_CASES = [
    (layers, pp, vpp, schedule)
    for layers in (5, 30, 32)
    for pp in (2, 3, 4)
    for vpp in (None, 2, 3, 4)
    for schedule in (None, "1F1B", "Interleaved1F1B", "DualPipeV")
]


@pytest.mark.parametrize(
    ("layers", "pp", "vpp", "schedule"),
    STAGE_CASES,
    ids=[f"{a}-{b}-{c}-{d}" for a, b, c, d in STAGE_CASES],
)
def test_pipeline_stages_are_what_torchtitan_makes(
    layers: int, pp: int, vpp: int | None, schedule: str | None, tmp_path: Path
) -> None:
    """mdc compiles iff TorchTitan's pipeline_llm makes exactly pp * vpp stages."""
    options = {"pipeline_schedule": schedule} if schedule else {}
    code, stderr, plan = compile_spec(
        write_spec(
            tmp_path,
            spec(2, pp, vpp=vpp, nnodes=pp, model={"num_layers": layers}, torchtitan=options),
        ),
        tmp_path / "out",
    )
    if code != 0:
        assert "MDC336" in stderr or "MDC390" in stderr, stderr
    name = schedule or ("Interleaved1F1B" if vpp else "1F1B")
    looped = name != "1F1B"
    # without vpp a looped schedule makes TorchTitan's default of 2 stages per rank
    vpp = vpp or (2 if looped else None)
    wanted = pp * (vpp or 1)
    # TorchTitan, given what mdc would write: the schedule, and the layers per stage when
    # mdc found one (else none: TorchTitan's default of 1 or 2 stages per rank)
    args = [
        "--parallelism.pipeline_parallel_degree",
        str(pp),
        "--parallelism.pipeline_parallel_schedule",
        name,
    ]
    if code == 0 and plan is not None:
        toml = (tmp_path / "out" / "launch" / "torchtitan.toml").read_text(encoding="utf-8")
        found = re.search(r"pipeline_parallel_layers_per_stage = (\d+)", toml)
        if found:
            args += ["--parallelism.pipeline_parallel_layers_per_stage", found.group(1)]
    stages = stages_for(tuple(args), layers)
    v_shaped_ok = name != "DualPipeV" or stages == 2 * pp
    works = stages == wanted and v_shaped_ok and (looped == bool(vpp))
    if code == 0:
        assert works, (stages, wanted)
    elif vpp and vpp > 2 and name not in ("1F1B", "DualPipeV"):
        # no layers_per_stage gives pp * vpp stages: check every value TorchTitan could take
        per_stage = "--parallelism.pipeline_parallel_layers_per_stage"
        reachable = {
            stages_for((*args, per_stage, str(n)), layers) for n in range(1, layers + 3)
        } - {None}
        assert wanted not in reachable
    else:
        assert not works


def test_fp16_is_refused(tmp_path: Path) -> None:
    code, stderr, _ = compile_spec(
        write_spec(tmp_path, spec(2, 1, model={"dtype": "fp16"})), tmp_path / "out"
    )
    assert code == 1 and "MDC337" in stderr
    # TorchTitan's mixed precision has no float16
    with pytest.raises(SystemExit), contextlib.redirect_stderr(io.StringIO()):
        parse(["--training.mixed_precision_param", "float16"])


@pytest.mark.parametrize(
    ("config", "pointer"),
    [
        ({"parallelism": {"tensor_parallel_degree": 2}}, "parallelism/tensor_parallel_degree"),
        ({"training": {"seq_len": 128}}, "training/seq_len"),
        ({"job": {"config_file": "x.toml"}}, "job/config_file"),
        ({"training": {"dataloader": {"num_workers": None}}}, "training/dataloader/num_workers"),
    ],
)
def test_pass_through_keys_mdc_owns_are_errors(
    config: dict[str, Any], pointer: str, tmp_path: Path
) -> None:
    code, stderr, _ = compile_spec(
        write_spec(tmp_path, spec(2, 1, torchtitan={"config": config})), tmp_path / "out"
    )
    assert code == 1 and "MDC338" in stderr and f"/torchtitan/config/{pointer}" in stderr


@pytest.mark.parametrize(("local", "size"), [(2, 1), (4, 1), (8, 2), (8, 4)])
def test_too_few_pipeline_microbatches_is_a_warning(local: int, size: int, tmp_path: Path) -> None:
    """TorchTitan warns when a step has fewer pipeline microbatches than stages (bubbles)."""
    code, stderr, _ = compile_spec(
        write_spec(
            tmp_path,
            spec(
                2,
                4,
                nnodes=4,
                batch={"global_batch_size": local * 4, "micro_batch_size": local},
                torchtitan={"pipeline_microbatch_size": size},
            ),
        ),
        tmp_path / "out",
    )
    assert code == 0, stderr
    config = parse(
        [
            "--training.local_batch_size",
            str(local),
            "--parallelism.pipeline_parallel_microbatch_size",
            str(size),
        ]
    )
    microbatches = (
        config.training.local_batch_size // config.parallelism.pipeline_parallel_microbatch_size
    )
    assert ("warning[MDC335]" in stderr) == (microbatches < 4)


# ------------------------------------------------------------------ a real run on the CPU


def worker() -> None:
    """The program of examples/torchtitan-cpu-2x2.yaml: TorchTitan's config and mesh on gloo."""
    config = parse(sys.argv[1:])
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    dims = dims_of(config, int(os.environ["WORLD_SIZE"]))
    with mock.patch.object(parallel_dims_module, "device_type", "cpu"):
        dims.build_mesh()
    groups = {}
    for name in MESH_KINDS:
        mesh = dims.get_optional_mesh(name)
        groups[name] = mesh.mesh.tolist() if mesh is not None else [rank]
    total = torch.tensor([float(rank)])
    tp_mesh = dims.get_optional_mesh("tp")
    if tp_mesh is not None:
        dist.all_reduce(total, group=tp_mesh.get_group())
    report = {
        "rank": rank,
        "world": world,
        "groups": groups,
        "tp_sum": total.item(),
        "seq_len": config.training.seq_len,
        "steps": config.training.steps,
        "local_batch_size": config.training.local_batch_size,
        "env": {k: v for k, v in os.environ.items() if k.startswith("TORCHTITAN_")},
    }
    Path(os.environ[REPORT_DIR], f"rank-{rank}.json").write_text(json.dumps(report) + "\n")
    # every rank is done before any closes its gloo connections: a peer still tearing
    # down when another's sockets close aborts ("terminate called without an active exception")
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.xdist_group("loopback")  # a real CPU run on loopback ports
def test_cpu_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The 2 x 2 CPU example under the local backend: TorchTitan's mesh holds the plan's groups."""
    monkeypatch.chdir(REPO)
    out = tmp_path / "out"
    code, stderr, plan = compile_spec(REPO / "examples" / "torchtitan-cpu-2x2.yaml", out)
    assert code == 0 and plan is not None, stderr
    reports = tmp_path / "reports"
    reports.mkdir()
    env = {
        **os.environ,
        REPORT_DIR: str(reports),
        "PYTHONWARNINGS": "ignore",
        "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""),
    }
    process = subprocess.Popen(
        ["bash", str(out / "local" / "run.sh")],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        _, err = process.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        _, err = process.communicate()
        pytest.fail(f"the job did not finish in 300 s:\n{err[-3000:]}")
    assert process.returncode == 0, err[-5000:]
    found = sorted(reports.glob("rank-*.json"))
    assert len(found) == plan["world_size"]
    for path in found:
        report = json.loads(path.read_text(encoding="utf-8"))
        rank = report["rank"]
        assert report["world"] == plan["world_size"]
        for name, group in report["groups"].items():
            if name == "efsdp":
                continue  # a dense model: TorchTitan builds no expert data-parallel group
            mine = next(g for g in plan["groups"][MESH_KINDS[name]]["ranks"] if rank in g)
            assert sorted(group) == mine, (name, rank)
        tp_group = next(g for g in plan["groups"]["tp"]["ranks"] if rank in g)
        assert report["tp_sum"] == sum(tp_group)
        assert (report["seq_len"], report["steps"], report["local_batch_size"]) == (256, 10, 2)
        assert report["env"] == {
            "TORCHTITAN_TENSOR_PARALLEL_SIZE": "2",
            "TORCHTITAN_PIPELINE_PARALLEL_SIZE": "1",
            "TORCHTITAN_FSDP_ENABLED": "1",
            "TORCHTITAN_CONTEXT_PARALLEL_SIZE": "1",
        }


if __name__ == "__main__":
    worker()
