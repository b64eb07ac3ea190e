"""The primus launcher: BACKEND inference, the env Primus's scripts read, and its findings.

Specs are compiled in-process through mdc's own pipeline (only mdc's own plugins,
the other launchers and backends blocked so their work in progress cannot change
these results). Expected values come from Primus's conventions as its scripts
read them (``examples/run_pretrain.sh`` reads EXP, NNODES, NODE_RANK, GPUS_PER_NODE,
MASTER_ADDR, MASTER_PORT; its configs live under ``examples/<backend>/configs/``)
and from madengine's model-name convention, not from this launcher's output.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mdc.errors import Diagnostic, SpecError
from mdc.pipeline import Compiled, Compiler
from mdc.plugin_manager import load_plugins
from mdc_builtin.launchers.primus import backend_from_config, backend_from_model

OTHERS = ("deepspeed", "megatron", "torchtitan", "slurm", "ssh")
COMPILER = Compiler(load_plugins(autoload=False, blocked=OTHERS))
CONFIG = "examples/torchtitan/configs/MI300X/qwen3_1.7B-pretrain.yaml"


def spec(
    primus: dict[str, Any] | None = None,
    *,
    nnodes: int = 2,
    nproc: int = 8,
    command: Any = ("bash", "examples/run_pretrain.sh"),
    **extra: Any,
) -> dict[str, Any]:
    data: dict[str, Any] = {
        "job": {"name": "primus-unit", "command": list(command)},
        "distributed": {
            "launcher": "primus",
            "backend": "local",
            "nnodes": nnodes,
            "nproc_per_node": nproc,
            "accelerator": "cpu",
            "master_port": 29600,
        },
    }
    if primus is not None:
        data["primus"] = primus
    for table, value in extra.items():
        if table in data:
            data[table].update(value)
        else:
            data[table] = value
    return data


def compile_(tmp_path: Path, data: dict[str, Any]) -> Compiled:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return COMPILER.compile(path)


def errors(tmp_path: Path, data: dict[str, Any]) -> list[Diagnostic]:
    with pytest.raises(SpecError) as caught:
        compile_(tmp_path, data)
    return [d for d in caught.value.diagnostics if d.is_error]


def warnings_of(tmp_path: Path, data: dict[str, Any]) -> dict[str, Diagnostic]:
    found = compile_(tmp_path, data).diagnostics
    by_code = {d.code: d for d in found}
    assert len(by_code) == len(found), [d.render() for d in found]
    return by_code


def worker_env(tmp_path: Path, data: dict[str, Any]) -> dict[str, Any]:
    compiled = compile_(tmp_path, data)
    (role,) = compiled.launch.roles
    return dict(role.env)


# ------------------------------------------------------------ BACKEND inference


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("primus_pretrain/torchtitan_MI300X_qwen3_1.7B-pretrain", "torchtitan"),
        ("primus_pretrain/megatron_MI355X_llama3.1_8B-BF16-pretrain", "megatron"),
        ("primus_pretrain/moe_package_MI355X_deepseek_v2_lite-pretrain-baseline", "moe_package"),
        # JAX: run_pretrain.sh tests "$BACKEND" = "MaxText" literally
        ("primus_pretrain/maxtext_MI300X_llama2_7B-pretrain", "MaxText"),
        ("primus_pretrain/MaxText_MI300X_llama2_7B-pretrain", "MaxText"),
        # longest name first: madengine's split at the first "_" would say "megatron" here
        ("primus_pretrain/megatron_bridge_MI300X_qwen3_32b_sft_posttrain", "megatron_bridge"),
        ("primus_pretrain/torchtitan", "torchtitan"),
        ("primus_pretrain/jax_MI300X_x", None),  # not a known backend
        ("primus_pretrain/torchtitanx_MI300X", None),  # a prefix of a word is not the word
        ("torchtitan_MI300X_qwen3", None),  # not madengine's primus_pretrain/ form
        ("primus_pretrain/", None),
    ],
)
def test_backend_from_model_name(model: str, expected: str | None) -> None:
    assert backend_from_model(model) == expected


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("examples/torchtitan/configs/MI300X/qwen3_1.7B-pretrain.yaml", "torchtitan"),
        ("examples/megatron/configs/MI300X/llama3.1_8B-BF16-pretrain.yaml", "megatron"),
        (
            "examples/megatron_bridge/configs/MI355X/qwen3_32b_lora_posttrain.yaml",
            "megatron_bridge",
        ),
        (
            "examples/moe_package/configs/MI355X/deepseek_v2_lite-pretrain-baseline.yaml",
            "moe_package",
        ),
        ("examples/maxtext/configs/MI300X/llama2_7B-pretrain.yaml", "MaxText"),
        ("/workspace/Primus/examples/torchtitan/configs/MI355X/x.yaml", "torchtitan"),
        ("C:\\Primus\\examples\\megatron\\configs\\x.yaml", "megatron"),
        # the last examples/ counts, as madengine's wrapper reads it (${EXP##*examples/})
        ("/data/examples/megatron/mirror/examples/torchtitan/configs/x.yaml", "torchtitan"),
        ("examples/unknown_framework/configs/x.yaml", None),
        ("examples/x.yaml", None),  # a file directly under examples/ names no backend
        ("configs/torchtitan/x.yaml", None),
        ("my_exp.yaml", None),
    ],
)
def test_backend_from_config_path(path: str, expected: str | None) -> None:
    assert backend_from_config(path) == expected


def test_explicit_backend_wins_and_is_spelled_as_primus_reads_it(tmp_path: Path) -> None:
    env = worker_env(tmp_path, spec({"config_path": "exp.yaml", "backend": "maxtext"}))
    assert env["BACKEND"] == "MaxText"


def test_model_name_comes_before_the_config_path(tmp_path: Path) -> None:
    data = spec({"config_path": CONFIG, "model": "primus_pretrain/megatron_MI300X_x"})
    compiled = compile_(tmp_path, data)
    assert dict(compiled.launch.roles[0].env)["BACKEND"] == "megatron"
    (warning,) = compiled.diagnostics
    assert warning.code == "MDC344" and warning.location.pointer == "/primus/model"
    assert "'megatron'" in warning.message and "'torchtitan'" in warning.message


def test_config_path_gives_the_backend_when_nothing_else_does(tmp_path: Path) -> None:
    assert worker_env(tmp_path, spec({"config_path": CONFIG}))["BACKEND"] == "torchtitan"


def test_no_backend_is_exported_when_nothing_names_one(tmp_path: Path) -> None:
    # Primus then reads the framework from the config (modules.pre_trainer.framework)
    compiled = compile_(tmp_path, spec({"config_path": "/exp/my_run.yaml"}))
    assert "BACKEND" not in dict(compiled.launch.roles[0].env)
    assert "BACKEND" not in compiled.launch.worker_env
    assert compiled.diagnostics == ()


# ------------------------------------------------------------ the env Primus reads


def test_node_contract_and_primus_variables(tmp_path: Path) -> None:
    data = spec(
        {"config_path": CONFIG, "root": "/opt/primus", "cli_extra": "--train_iters 10"},
        nnodes=4,
        nproc=8,
    )
    compiled = compile_(tmp_path, data)
    (role,) = compiled.launch.roles
    assert role.argv == ("bash", "examples/run_pretrain.sh"), "no runner wrapper"
    env = dict(role.env)
    assert {k: v for k, v in env.items() if isinstance(v, str)} == {
        "PRIMUS_ROOT": "/opt/primus",
        "PRIMUS_CONFIG_PATH": CONFIG,
        "EXP": CONFIG,
        "PRIMUS_CLI_EXTRA": "--train_iters 10",
        "BACKEND": "torchtitan",
        "NNODES": "4",
        "GPUS_PER_NODE": "8",
        "MAD_RUNTIME_NGPUS": "8",
    }
    # the per-node values are the backend's, read on the node at run time
    assert {k: getattr(v, "name", None) for k, v in env.items() if not isinstance(v, str)} == {
        "NODE_RANK": "NODE_RANK",
        "MASTER_ADDR": "MASTER_ADDR",
        "MASTER_PORT": "MASTER_PORT",
    }
    documented = compiled.launch.worker_env
    assert set(env) | {"RANK", "LOCAL_RANK", "WORLD_SIZE"} == set(documented)
    assert documented["WORLD_SIZE"].startswith("32 ")
    assert documented["RANK"].startswith("NODE_RANK * 8 + LOCAL_RANK")
    assert documented["MASTER_PORT"] == "29600"


def test_primus_root_is_left_to_the_image_unless_given(tmp_path: Path) -> None:
    data = spec({"config_path": CONFIG}, job={"env": {"PRIMUS_ROOT": "/my/Primus"}})
    compiled = compile_(tmp_path, data)  # [job] env may set it: the launcher does not
    assert "PRIMUS_ROOT" not in dict(compiled.launch.roles[0].env)
    script = next(a for a in compiled.tree if a.path == "launch/worker.sh").data.decode()
    assert "export PRIMUS_ROOT=/my/Primus\n" in script


def test_job_env_cannot_override_what_the_launcher_sets(tmp_path: Path) -> None:
    found = errors(
        tmp_path,
        spec({"config_path": CONFIG}, job={"env": {"GPUS_PER_NODE": "4", "BACKEND": "megatron"}}),
    )
    assert sorted((d.code, d.location.pointer) for d in found) == [
        ("MDC240", "/job/env/BACKEND"),
        ("MDC240", "/job/env/GPUS_PER_NODE"),
    ]


def test_blank_cli_extra_is_not_exported(tmp_path: Path) -> None:
    blanks: list[str | list[str]] = ["", "   ", []]
    for blank in blanks:
        env = worker_env(tmp_path, spec({"config_path": CONFIG, "cli_extra": blank}))
        assert "PRIMUS_CLI_EXTRA" not in env


RECORDER = """\
import json, os, sys
names = {names!r}
json.dump({{"argv": sys.argv[1:], "env": {{n: os.environ.get(n) for n in names}}}},
          open(os.environ["RECORD_TO"], "w"))
"""


@pytest.mark.slow
def test_worker_script_exports_what_a_primus_script_reads(tmp_path: Path) -> None:
    """launch/worker.sh, run as a backend runs it, hands the contract to the command."""
    words = ["--train_iters", "10", "--exp_name", "it's a test", "$HOME", "*"]
    names = [
        "PRIMUS_CONFIG_PATH",
        "EXP",
        "PRIMUS_CLI_EXTRA",
        "BACKEND",
        "NNODES",
        "NODE_RANK",
        "GPUS_PER_NODE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "MAD_RUNTIME_NGPUS",
        "PRIMUS_ROOT",
    ]
    recorder = tmp_path / "record.py"
    recorder.write_text(RECORDER.format(names=names), encoding="utf-8")
    data = spec(
        {"config_path": CONFIG, "model": "primus_pretrain/torchtitan_MI300X_q", "cli_extra": words},
        nnodes=2,
        nproc=4,
        command=[sys.executable, str(recorder), "--stub"],
    )
    compiled = compile_(tmp_path, data)
    out = tmp_path / "out"
    for artifact in compiled.tree:
        target = out / artifact.path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(artifact.data)
    record = tmp_path / "record.json"
    env = {k: v for k, v in os.environ.items() if k not in names}
    env.update(NODE_RANK="1", MASTER_ADDR="10.0.0.1", MASTER_PORT="29600", RECORD_TO=str(record))
    subprocess.run(["bash", str(out / "launch" / "worker.sh")], env=env, check=True, timeout=60)
    seen = json.loads(record.read_text(encoding="utf-8"))
    assert seen["argv"] == ["--stub"]
    got = seen["env"]
    assert got == {
        **got,
        "PRIMUS_CONFIG_PATH": CONFIG,
        "EXP": CONFIG,
        "BACKEND": "torchtitan",
        "NNODES": "2",
        "NODE_RANK": "1",
        "GPUS_PER_NODE": "4",
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29600",
        "MAD_RUNTIME_NGPUS": "4",
        "PRIMUS_ROOT": None,
    }
    # a consumer splitting with shell rules gets the words back, hostile ones included
    assert shlex.split(got["PRIMUS_CLI_EXTRA"]) == words
    split = subprocess.run(
        ["bash", "-c", 'eval "set -- $PRIMUS_CLI_EXTRA"; printf "%s\\0" "$@"'],
        env={"PRIMUS_CLI_EXTRA": got["PRIMUS_CLI_EXTRA"], "HOME": "/nowhere"},
        capture_output=True,
        check=True,
        timeout=30,
    )
    assert split.stdout.decode().split("\0")[:-1] == words


# ------------------------------------------------------------ findings


def test_a_missing_primus_table_is_an_error_at_the_launcher(tmp_path: Path) -> None:
    (found,) = errors(tmp_path, spec(None))
    assert found.code == "MDC340" and found.location.pointer == "/distributed/launcher"
    assert found.location.line is not None


def test_config_path_is_required_by_the_schema(tmp_path: Path) -> None:
    found = errors(tmp_path, spec({"backend": "megatron"}))
    schema = [d for d in found if d.code == "MDC103"]
    assert len(schema) == 1 and "'config_path'" in schema[0].message
    assert schema[0].location.pointer == "/primus"
    # mdc re-plans without the invalid table, so MDC340 may follow; nothing else does
    assert {d.code for d in found} <= {"MDC103", "MDC340"}


def test_an_elastic_job_is_refused(tmp_path: Path) -> None:
    (found,) = errors(
        tmp_path, spec({"config_path": CONFIG}, nnodes=4, distributed={"min_nnodes": 2})
    )
    assert found.code == "MDC341" and "min_nnodes 2 < nnodes 4" in found.message


def test_parallel_sizes_and_batch_are_checked_but_not_passed(tmp_path: Path) -> None:
    data = spec(
        {"config_path": CONFIG},
        nnodes=2,
        nproc=8,
        parallelism={"tp": 4, "pp": 2, "vpp": 2},
        batch={"global_batch_size": 64, "micro_batch_size": 2},
    )
    found = warnings_of(tmp_path, data)
    assert set(found) == {"MDC342", "MDC343"}
    assert "tp=4, pp=2, vpp=2" in found["MDC342"].message
    assert "world size (16)" in found["MDC342"].message
    assert "global_batch_size 64" in found["MDC343"].message
    env = worker_env(tmp_path, data)
    assert not any("TP" in name or "BATCH" in name for name in env)


def test_sizes_left_at_their_defaults_raise_no_warning(tmp_path: Path) -> None:
    data = spec({"config_path": CONFIG}, parallelism={"tp": 1, "pp": 1})
    assert warnings_of(tmp_path, data) == {}


def test_the_arithmetic_still_applies(tmp_path: Path) -> None:
    found = errors(
        tmp_path, spec({"config_path": CONFIG}, nnodes=2, nproc=8, parallelism={"tp": 3})
    )
    assert [d.code for d in found] == ["MDC201"]


@pytest.mark.parametrize(
    ("primus", "code", "pointer"),
    [
        ({"backend": "jax", "config_path": "exp.yaml"}, "MDC346", "/primus/backend"),
        ({"model": "llama3_8b"}, "MDC345", "/primus/model"),
        ({"backend": "megatron"}, "MDC344", "/primus/backend"),  # the config lies under torchtitan/
        ({"cli_extra": ["--exp_name", "two words"]}, "MDC347", "/primus/cli_extra"),
    ],
)
def test_backend_and_cli_extra_warnings(
    tmp_path: Path, primus: dict[str, Any], code: str, pointer: str
) -> None:
    found = warnings_of(tmp_path, spec({"config_path": CONFIG, **primus}))
    assert list(found) == [code]
    assert found[code].location.pointer == pointer


def test_plain_cli_extra_words_raise_no_warning(tmp_path: Path) -> None:
    data = spec({"config_path": CONFIG, "cli_extra": ["--lr", "1e-4", "--save=/ckpt/run-1"]})
    assert warnings_of(tmp_path, data) == {}
    assert worker_env(tmp_path, data)["PRIMUS_CLI_EXTRA"] == "--lr 1e-4 --save=/ckpt/run-1"


def test_a_config_that_is_not_yaml_is_flagged(tmp_path: Path) -> None:
    found = warnings_of(tmp_path, spec({"config_path": "examples/run_pretrain.sh"}))
    assert list(found) == ["MDC348"]


def test_a_python_command_runs_once_per_node(tmp_path: Path) -> None:
    data = spec(
        {"config_path": CONFIG},
        nproc=8,
        command=["python3", "primus/cli/main.py", "train", "pretrain"],
    )
    found = warnings_of(tmp_path, data)
    assert list(found) == ["MDC349"]
    assert "1 process per node, not 8" in found["MDC349"].message
