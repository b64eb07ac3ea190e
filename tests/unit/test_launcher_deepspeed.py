"""The deepspeed launcher: runner choice, hostfile, environment, ds_config.json and findings.

Specs are compiled in-process through mdc's own pipeline (only mdc's own plugins, the
other launchers and backends blocked so their work in progress cannot change these
results). DeepSpeed's and torch's own readings of the output are in
tests/conformance/test_deepspeed.py; here nothing imports torch or deepspeed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import attrs
import pytest

from mdc.api import Concat, Ref, TrainingSetup
from mdc.errors import Diagnostic, Severity, SpecError
from mdc.pipeline import Compiled, Compiler
from mdc.plugin_manager import load_plugins
from mdc_builtin.launchers import deepspeed as plugin

OTHERS = ("basic", "megatron", "primus", "torchtitan", "slurm", "ssh")
COMPILER = Compiler(load_plugins(autoload=False, blocked=OTHERS))
CONFIG = Concat((Ref("MDC_OUT"), "/launch/ds_config.json"))
HOSTFILE = Concat((Ref("MDC_OUT"), "/launch/hostfile"))


def spec(
    deepspeed: dict[str, Any] | None = None,
    *,
    nnodes: int = 2,
    nproc: int = 4,
    command: Any = ("python", "train.py", "--epochs", "2"),
    **tables: Any,
) -> dict[str, Any]:
    data: dict[str, Any] = {
        "job": {
            "name": "ds-unit",
            "command": command if isinstance(command, str) else list(command),
        },
        "distributed": {
            "launcher": "deepspeed",
            "backend": "local",
            "nnodes": nnodes,
            "nproc_per_node": nproc,
            "accelerator": "cpu",
            "master_port": 29660,
        },
    }
    if deepspeed is not None:
        data["deepspeed"] = deepspeed
    for table, value in tables.items():
        data.setdefault(table, {}).update(value)
    return data


def compile_(
    tmp_path: Path, data: dict[str, Any], suffix: str = ".json", text: str | None = None
) -> Compiled:
    path = tmp_path / f"spec{suffix}"
    path.write_text(text if text is not None else json.dumps(data), encoding="utf-8")
    return COMPILER.compile(path)


def findings(
    tmp_path: Path, data: dict[str, Any], suffix: str = ".json", text: str | None = None
) -> list[Diagnostic]:
    """Every finding of a spec, errors and warnings (a spec without errors compiles)."""
    try:
        return list(compile_(tmp_path, data, suffix, text).diagnostics)
    except SpecError as caught:
        return list(caught.diagnostics)


def file_of(compiled: Compiled, path: str) -> str:
    return next(a for a in compiled.tree if a.path == path).data.decode("utf-8")


def ds_config(compiled: Compiled) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(file_of(compiled, "launch/ds_config.json"))
    return loaded


# ---------------------------------------------------------------- runners


def test_one_node_runs_the_deepspeed_command_without_ssh(tmp_path: Path) -> None:
    compiled = compile_(tmp_path, spec(nnodes=1, nproc=2))
    (role,) = compiled.launch.roles
    assert role.argv == (
        "deepspeed",
        "--hostfile",
        HOSTFILE,
        "--no_ssh",
        "--node_rank",
        Ref("NODE_RANK"),
        "--master_addr",
        Ref("MASTER_ADDR"),
        "--master_port",
        Ref("MASTER_PORT"),
        "--num_nodes",
        "1",
        "--num_gpus",
        "2",
        "train.py",
        "--epochs",
        "2",
        "--deepspeed",
        "--deepspeed_config",
        CONFIG,
    )


def test_several_nodes_without_host_names_run_torchrun_with_static_rendezvous(
    tmp_path: Path,
) -> None:
    compiled = compile_(tmp_path, spec(nnodes=3, nproc=4))
    (role,) = compiled.launch.roles
    assert role.argv == (
        "torchrun",
        "--nnodes",
        "3",
        "--rdzv-backend",
        "static",
        "--node-rank",
        Ref("NODE_RANK"),
        "--master-addr",
        Ref("MASTER_ADDR"),
        "--master-port",
        Ref("MASTER_PORT"),
        "--nproc-per-node",
        "4",
        "--max-restarts",
        "0",
        "train.py",
        "--epochs",
        "2",
        "--deepspeed",
        "--deepspeed_config",
        CONFIG,
    )
    assert "launch/hostfile" not in [a.path for a in compiled.tree]
    env = dict(role.env)
    assert (env["LOCAL_SIZE"], env["CROSS_SIZE"], env["CROSS_RANK"]) == ("4", "3", Ref("NODE_RANK"))


def test_hosts_the_backend_knows_go_into_the_hostfile_and_pick_the_deepspeed_command(
    tmp_path: Path,
) -> None:
    plan = attrs.evolve(
        compile_(tmp_path, spec(nnodes=3, nproc=8)).plan, hosts=("gpu-a", "gpu-b", "gpu-c")
    )
    launch = plugin.emit(plan, None)
    assert launch.roles[0].argv[0] == "deepspeed"
    hostfile = next(f for f in launch.files if f.path == "launch/hostfile").data.decode()
    assert [line for line in hostfile.splitlines() if not line.startswith("#")] == [
        "gpu-a slots=8",
        "gpu-b slots=8",
        "gpu-c slots=8",
    ]


@pytest.mark.parametrize("hosts", [("n1", "n1"), ("a b", "c")])
def test_host_names_that_cannot_key_a_hostfile_become_labels(
    tmp_path: Path, hosts: tuple[str, str]
) -> None:
    plan = attrs.evolve(compile_(tmp_path, spec(nnodes=2, nproc=2)).plan, hosts=hosts)
    text = plugin.hostfile(plan)
    assert text.splitlines()[-2:] == ["node-0 slots=2", "node-1 slots=2"]
    assert "repeat or are not single words" in text


def test_runner_and_rendezvous_can_be_chosen(tmp_path: Path) -> None:
    forced = compile_(tmp_path, spec({"runner": "deepspeed"}, nnodes=2))
    assert forced.launch.roles[0].argv[0] == "deepspeed"
    assert file_of(forced, "launch/hostfile").splitlines()[-2:] == [
        "node-0 slots=4",
        "node-1 slots=4",
    ]
    c10d = compile_(tmp_path, spec(nnodes=2, torchrun={"rdzv_backend": "c10d"}))
    argv = c10d.launch.roles[0].argv
    assert argv[argv.index("--rdzv-backend") + 1] == "c10d"
    # under c10d a node's rank follows join order: mdc cannot say what CROSS_RANK is
    assert "CROSS_RANK" not in c10d.launch.roles[0].env
    assert "CROSS_RANK" not in c10d.launch.worker_env


@pytest.mark.parametrize(
    ("command", "program"),
    [
        (["python", "-m", "pkg.train", "--x"], ["--module", "pkg.train", "--x"]),
        (["./run.sh", "a b"], ["--no_python", "./run.sh", "a b"]),
        ("python3 -u train.py 'two words'", ["train.py", "two words"]),
    ],
)
def test_the_program_takes_the_deepspeed_runners_own_flags(
    tmp_path: Path, command: Any, program: list[str]
) -> None:
    compiled = compile_(tmp_path, spec({"runner": "deepspeed"}, command=command))
    argv = list(compiled.launch.roles[0].argv)
    assert argv[argv.index("--num_gpus") + 2 : -3] == program


def test_config_and_local_rank_arguments_can_be_turned_off(tmp_path: Path) -> None:
    compiled = compile_(
        tmp_path, spec({"config_argument": False, "local_rank_argument": False}, nnodes=1)
    )
    (role,) = compiled.launch.roles
    assert list(role.argv[-6:]) == [
        "--num_gpus",
        "4",
        "--no_local_rank",
        "train.py",
        "--epochs",
        "2",
    ]
    assert "--deepspeed_config" not in role.argv
    assert role.env["MDC_DEEPSPEED_CONFIG"] == CONFIG  # the path still reaches the workers


# ---------------------------------------------------------------- environment


def test_each_runner_also_gives_the_other_runners_names(tmp_path: Path) -> None:
    deepspeed = compile_(tmp_path, spec(nnodes=1, nproc=2)).launch
    assert deepspeed.roles[0].env["GROUP_RANK"] == Ref("NODE_RANK")
    assert deepspeed.roles[0].env["LOCAL_WORLD_SIZE"] == "2"
    torchrun = compile_(tmp_path, spec(nnodes=2, nproc=2)).launch
    documented = set(torchrun.worker_env)
    for names in (
        {"RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"},
        {"LOCAL_WORLD_SIZE", "GROUP_RANK"},
        {"LOCAL_SIZE", "CROSS_RANK", "CROSS_SIZE"},
        {"MDC_DEEPSPEED_CONFIG", "MAD_MULTI_NODE_RUNNER", "DS_ACCELERATOR"},
    ):
        assert names <= documented
        assert names <= set(deepspeed.worker_env)


@pytest.mark.parametrize(
    ("accelerator", "name"), [("cpu", "cpu"), ("nvidia", "cuda"), ("amd", "cuda")]
)
def test_deepspeed_is_told_its_accelerator(tmp_path: Path, accelerator: str, name: str) -> None:
    data = spec(nnodes=1)
    data["distributed"]["accelerator"] = accelerator
    assert compile_(tmp_path, data).launch.roles[0].env["DS_ACCELERATOR"] == name


@pytest.mark.parametrize("runner", ["deepspeed", "torchrun"])
def test_the_madengine_runner_prefix_evaluates_to_the_launch_command(
    tmp_path: Path, runner: str
) -> None:
    """A script doing ``eval "$MAD_MULTI_NODE_RUNNER script.py"`` runs what mdc runs.

    Literal words are shell-quoted; run-time values (the out directory, node rank, master)
    are put in as they are, so an out directory with spaces would split (documented). The
    hostile log_dir (torchrun) is also a warning: unquoted expansion cannot carry it.
    """
    hostile = '/tmp/logs it\'s $(touch CANARY) `touch CANARY` "q" ${HOME}'
    command = ["python", "train.py", "--name", hostile]
    data = spec({"runner": runner}, nnodes=2, nproc=2, command=command)
    if runner == "torchrun":
        data["torchrun"] = {"log_dir": hostile}
    compiled = compile_(tmp_path, data)
    out = tmp_path / "out"
    for artifact in compiled.tree:
        target = out / artifact.path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(artifact.data)
    stub = tmp_path / "bin"
    stub.mkdir()
    record = f"{sys.executable} -c 'import json,sys; print(json.dumps(sys.argv[1:]))'"
    (stub / runner).write_text(
        "#!/usr/bin/env bash\n"
        f'{record} "$@" > "$RECORD_DIR/argv.json"\n'
        f'eval "{record} $MAD_MULTI_NODE_RUNNER" > "$RECORD_DIR/prefix.json"\n',
        encoding="utf-8",
    )
    (stub / runner).chmod(0o755)
    done = subprocess.run(
        ["bash", str(out / "launch" / "worker.sh")],
        cwd=tmp_path,
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        env={
            "PATH": f"{stub}:/usr/bin:/bin",
            "NODE_RANK": "1",
            "MASTER_ADDR": "10.0.0.9",
            "MASTER_PORT": "29660",
            "RECORD_DIR": str(tmp_path),
        },
    )
    assert done.returncode == 0, done.stderr
    argv = json.loads((tmp_path / "argv.json").read_text())
    prefix = json.loads((tmp_path / "prefix.json").read_text())
    # the prefix is exactly the launcher and its words before the program
    assert prefix[0] == runner
    assert argv[: len(prefix) - 1] == prefix[1:]
    assert argv[len(prefix) - 1 :] == [
        "train.py",
        "--name",
        hostile,
        "--deepspeed",
        "--deepspeed_config",
        f"{out}/launch/ds_config.json",
    ]
    assert not (tmp_path / "CANARY").exists()
    if runner == "torchrun":
        assert hostile in prefix and hostile in argv
        assert [
            (d.code, d.location.pointer) for d in compiled.diagnostics if d.code == "MDC303"
        ] == [("MDC303", "/torchrun/log_dir")]
    assert "10.0.0.9" in argv
    # madengine's NNODES and NPROC_PER_NODE (§4.1 deepspeed): nodes, and GPUs per node
    env = compiled.launch.roles[0].env
    assert (env["NNODES"], env["NPROC_PER_NODE"]) == ("2", "2")
    assert argv[argv.index("--nnodes" if runner == "torchrun" else "--num_nodes") + 1] == "2"


# ---------------------------------------------------------------- ds_config.json


def test_the_batch_triad_is_consistent_by_construction(tmp_path: Path) -> None:
    compiled = compile_(
        tmp_path, spec(nnodes=2, nproc=4, batch={"global_batch_size": 96, "micro_batch_size": 3})
    )
    config = ds_config(compiled)
    dp = 2 * 4
    assert config["train_batch_size"] == 96
    assert config["train_micro_batch_size_per_gpu"] == 3
    assert config["gradient_accumulation_steps"] == 96 // (3 * dp) == 4
    assert config["train_batch_size"] == 3 * 4 * dp


def test_without_a_batch_table_each_rank_takes_one_sample_per_step(tmp_path: Path) -> None:
    config = ds_config(compile_(tmp_path, spec(nnodes=3, nproc=2)))
    assert (
        config["train_batch_size"],
        config["train_micro_batch_size_per_gpu"],
        config["gradient_accumulation_steps"],
    ) == (6, 1, 1)
    assert config["zero_optimization"] == {"stage": 0}
    assert (config["bf16"], config["fp16"]) == ({"enabled": False}, {"enabled": False})


@pytest.mark.parametrize(
    ("options", "model", "bf16", "fp16"),
    [
        ({"precision": "fp16"}, None, False, True),
        ({}, {"dtype": "bf16"}, True, False),
        ({"precision": "fp32"}, {"dtype": "bf16"}, False, False),
        ({}, {"dtype": "fp16"}, False, True),
    ],
)
def test_precision_comes_from_the_table_or_else_the_model(
    tmp_path: Path, options: dict[str, Any], model: dict[str, Any] | None, bf16: bool, fp16: bool
) -> None:
    tables: dict[str, Any] = {"model": model} if model else {}
    config = ds_config(compile_(tmp_path, spec(options, nnodes=1, **tables)))
    assert (config["bf16"]["enabled"], config["fp16"]["enabled"]) == (bf16, fp16)


def test_passed_through_keys_merge_under_mdcs_own(tmp_path: Path) -> None:
    compiled = compile_(
        tmp_path,
        spec(
            {
                "zero_stage": 2,
                "precision": "bf16",
                "config": {
                    "zero_optimization": {"overlap_comm": True},
                    "bf16": {"immediate_grad_update": True},
                    "optimizer": {"type": "AdamW", "params": {"lr": 0.001}},
                },
            },
            nnodes=1,
        ),
    )
    config = ds_config(compiled)
    assert config["zero_optimization"] == {"stage": 2, "overlap_comm": True}
    assert config["bf16"] == {"enabled": True, "immediate_grad_update": True}
    assert config["optimizer"] == {"type": "AdamW", "params": {"lr": 0.001}}


@pytest.mark.parametrize(
    ("options", "stage", "grad_bytes"),
    [(None, 0, 2), ({"zero_stage": 3}, 3, 2), ({"zero_stage": 1, "precision": "fp32"}, 1, 4)],
)
def test_training_setup_for_the_memory_estimate(
    options: dict[str, Any] | None, stage: int, grad_bytes: int
) -> None:
    opts = None if options is None else plugin.DeepSpeedOptions(**options)
    # DeepSpeedZeroConfig turns overlap_comm on by default at stage 3 only, and stage 3
    # prefetches the weights it gathers
    assert plugin.training(opts) == TrainingSetup(
        zero_stage=stage,
        grad_bytes=grad_bytes,
        overlap_grad_reduce=stage == 3,
        overlap_param_gather=stage == 3,
        levers=plugin.LEVERS,
    )


def test_overlap_comm_as_written_is_the_gradient_overlap() -> None:
    for stage, written in ((1, True), (2, True), (3, False)):
        opts = plugin.DeepSpeedOptions(
            zero_stage=stage, config={"zero_optimization": {"overlap_comm": written}}
        )
        assert plugin.training(opts).overlap_grad_reduce is written


# ---------------------------------------------------------------- findings


def by_code(found: list[Diagnostic]) -> dict[str, list[Diagnostic]]:
    result: dict[str, list[Diagnostic]] = {}
    for diagnostic in found:
        result.setdefault(diagnostic.code, []).append(diagnostic)
    return result


@pytest.mark.parametrize(
    ("stage", "pp", "refused"), [(1, 2, False), (2, 2, True), (3, 4, True), (3, 1, False)]
)
def test_zero_2_and_3_are_refused_with_pipeline_parallelism(
    tmp_path: Path, stage: int, pp: int, refused: bool
) -> None:
    found = by_code(
        findings(tmp_path, spec({"zero_stage": stage}, nnodes=4, nproc=2, parallelism={"pp": pp}))
    )
    assert ("MDC310" in found) is refused
    if refused:
        assert f"ZeRO stage {stage}" in found["MDC310"][0].message
        assert f"pp = {pp}" in found["MDC310"][0].message


def test_config_values_json_cannot_hold_are_findings(tmp_path: Path) -> None:
    text = (
        '[job]\nname = "x"\ncommand = ["python", "t.py"]\n'
        '[distributed]\nlauncher = "deepspeed"\nnnodes = 1\nnproc_per_node = 2\n'
        'accelerator = "cpu"\n'
        "[deepspeed.config]\nloss_scale_window = nan\nscheduler = { params = { x = inf } }\n"
    )
    # no spec holds them (MDC020, from the loader, for every number in the spec): both are
    # reported at once, located, before DeepSpeed's own check (MDC312) could see them
    found = by_code(findings(tmp_path, {}, ".toml", text))
    pointers = sorted(d.location.pointer for d in found["MDC020"])
    assert pointers == [
        "/deepspeed/config/loss_scale_window",
        "/deepspeed/config/scheduler/params/x",
    ]
    assert all(d.location.line is not None for d in found["MDC020"])


def test_a_clash_on_a_derived_key_is_reported_not_overridden(tmp_path: Path) -> None:
    found = by_code(
        findings(
            tmp_path,
            spec(
                {
                    "precision": "bf16",
                    "config": {"gradient_accumulation_steps": 8, "fp16": {"enabled": True}},
                },
                nnodes=1,
                batch={"global_batch_size": 16, "micro_batch_size": 2},
            ),
        )
    )
    messages = [d.message for d in found["MDC311"]]
    assert len(messages) == 2
    assert any("gradient_accumulation_steps = 8" in m and "(2)" in m for m in messages)
    assert any("fp16.enabled = true" in m and "now bf16" in m for m in messages)


def test_a_string_command_is_pointed_at_as_a_whole(tmp_path: Path) -> None:
    found = by_code(
        findings(tmp_path, spec(nnodes=1, command="python train.py --deepspeed_config mine.json"))
    )
    assert [d.location.pointer for d in found["MDC317"]] == ["/job/command"]


def test_local_rank_argument_false_is_fine_under_torchrun(tmp_path: Path) -> None:
    assert findings(tmp_path, spec({"runner": "torchrun", "local_rank_argument": False})) == []


def test_the_torchrun_tables_own_checks_apply_on_the_torchrun_path(tmp_path: Path) -> None:
    found = by_code(
        findings(
            tmp_path, spec({"runner": "torchrun"}, torchrun={"rdzv_conf": {"join_timeout": "a,b"}})
        )
    )
    assert "MDC302" in found


def test_job_env_cannot_override_the_config_path(tmp_path: Path) -> None:
    data = spec(nnodes=1)
    data["job"]["env"] = {"MDC_DEEPSPEED_CONFIG": "/elsewhere.json"}
    found = findings(tmp_path, data)
    assert [d.code for d in found] == ["MDC240"]


def test_an_unknown_zero_key_is_an_error_as_deepspeed_refuses_it(tmp_path: Path) -> None:
    (error,) = findings(
        tmp_path, spec({"config": {"zero_optimization": {"overlap_com": True}}}, nnodes=1)
    )
    assert (error.code, error.severity) == ("MDC314", Severity.ERROR)
    assert error.hint == "did you mean 'overlap_comm'?"


def test_warnings_do_not_stop_the_compile(tmp_path: Path) -> None:
    # DeepSpeed drops a zero_optimization key whose value is "auto" before reading it
    compiled = compile_(
        tmp_path, spec({"config": {"zero_optimization": {"overlap_com": "auto"}}}, nnodes=1)
    )
    (warning,) = compiled.diagnostics
    assert (warning.code, warning.severity) == ("MDC314", Severity.WARNING)
    assert warning.location.pointer == "/deepspeed/config/zero_optimization/overlap_com"


def test_repeating_a_derived_value_is_only_a_warning(tmp_path: Path) -> None:
    compiled = compile_(
        tmp_path,
        spec(
            {
                "zero_stage": 2,
                "config": {"zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": 1},
            },
            nnodes=1,
        ),
    )
    assert sorted((d.code, d.severity, d.location.pointer) for d in compiled.diagnostics) == [
        ("MDC311", Severity.WARNING, "/deepspeed/config/train_micro_batch_size_per_gpu"),
        ("MDC311", Severity.WARNING, "/deepspeed/config/zero_optimization/stage"),
    ]
    assert ds_config(compiled)["zero_optimization"] == {"stage": 2}
    # true is not 1: a boolean stage is still a clash
    found = findings(
        tmp_path,
        spec({"zero_stage": 1, "config": {"zero_optimization": {"stage": True}}}, nnodes=1),
    )
    assert [(d.code, d.severity) for d in found] == [("MDC311", Severity.ERROR)]
