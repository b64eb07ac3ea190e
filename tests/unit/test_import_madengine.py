"""`mdc import madengine`: madengine additional contexts as mdc specs.

The fixtures (tests/fixtures/madengine/*.json) are hand-written configs in madengine's
shape, one realistic use each. Every one imports to a golden spec and report
(golden/imports/<case>/), and compiles with mdc's own plugins; the deliberately wrong
ones fail with errors located in the JSON file, at positions computed here from the
JSON text. The compiled artifacts are checked against madengine's env contract
(docs/madengine.md), with the expected values derived from madengine's
rules (TP = G, PP = N, the auto split, ...), not read back from mdc's output.
"""

from __future__ import annotations

import io
import json
import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.tools import REPO, shellcheck, spec_data

from mdc.api import Concat, Ref
from mdc.cli import main
from mdc.errors import Diagnostic, SpecError
from mdc.importers import madengine
from mdc.importers import translate as translate_any
from mdc.importers.madengine import tables as madengine_tables
from mdc.loaders import load_file
from mdc.pipeline import Compiled, Compiler
from mdc.spec import EnvValue
from mdc.testing import Golden

GOLDEN_ROOT = REPO / "golden"

FIXTURES = Path("tests/fixtures/madengine")
CASES = sorted(p.stem for p in (REPO / FIXTURES).glob("*.json"))
#: the fixtures whose values are wrong for mdc (they import, and compile with errors)
BROKEN = {"typo", "wrong-values"}


@pytest.fixture(autouse=True)
def _in_repo(monkeypatch: pytest.MonkeyPatch, no_ambient_plugins: None) -> None:
    """Paths in reports are shown as given: run from the checkout, with relative paths."""
    monkeypatch.chdir(REPO)


def fixture(case: str) -> str:
    return str(FIXTURES / f"{case}.json")


def compiled(compiler: Compiler, case: str) -> Compiled:
    return compiler.compile(fixture(case))


def env_of(result: Compiled) -> dict[str, Any]:
    """What the worker processes see: [job] env, then the launcher's role env."""
    env: dict[str, Any] = dict(result.plan.job.env)
    for role in result.launch.roles:
        env.update(role.env)
    return env


def position(text: str, pattern: str, group: int = 1) -> tuple[int, int]:
    """1-based (line, column) of ``group`` of the first match of ``pattern`` in ``text``."""
    match = re.search(pattern, text, re.DOTALL)
    assert match is not None, pattern
    offset = match.start(group)
    line = text.count("\n", 0, offset) + 1
    return line, offset - (text.rfind("\n", 0, offset) + 1) + 1


def run_cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


# --- goldens: the imported spec and the report ------------------------------------------------


@pytest.mark.parametrize("case", CASES)
def test_import_matches_golden(case: str, tmp_path: Path, golden: Golden) -> None:
    spec = tmp_path / "spec.toml"
    code, out, err = run_cli(
        "import", "madengine", fixture(case), "-o", str(spec), "--no-plugin-autoload"
    )
    assert out == ""
    assert code == (1 if case in BROKEN else 0), err
    base = GOLDEN_ROOT / "imports" / case
    golden.check_text(base / "spec.toml", spec.read_text(encoding="utf-8"))
    golden.check_text(base / "report.txt", err.replace(str(tmp_path), "<tmp>"))


@pytest.mark.parametrize("case", CASES)
def test_report_is_located_in_the_json(case: str) -> None:
    """Every report entry names the madengine file and a position in it."""
    source = load_file(fixture(case))
    _, notes = madengine.translate(source)
    assert notes
    for note in notes:
        assert note.location.path == fixture(case)
        assert note.location.line is not None
        assert re.fullmatch(r"MDC5[0-2]\d", note.code)
        assert not note.is_error


# --- compiling -----------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(set(CASES) - BROKEN))
def test_fixture_compiles(compiler: Compiler, case: str) -> None:
    result = compiled(compiler, case)
    assert not any(d.is_error for d in result.diagnostics)
    assert any(d.code.startswith("MDC50") for d in result.notes)
    for artifact in result.tree:
        if artifact.path.endswith(".sh") or artifact.path.endswith(".sbatch"):
            text = artifact.data.decode("utf-8")
            for tool in (
                ["bash", "-n"],
                [shellcheck(), "--norc", "-S", "warning", "-s", "bash", "-"],
            ):
                check = subprocess.run(
                    tool, input=text, text=True, capture_output=True, check=False
                )
                assert check.returncode == 0, (artifact.path, check.stdout, check.stderr)


def errors_of(compiler: Compiler, case: str) -> list[Diagnostic]:
    with pytest.raises(SpecError) as caught:
        compiled(compiler, case)
    return [d for d in caught.value.diagnostics if d.is_error]


def located(diagnostics: list[Diagnostic], pointer: str) -> tuple[int | None, int | None]:
    found = [d for d in diagnostics if d.location.pointer == pointer]
    assert found, (pointer, [d.render() for d in diagnostics])
    return found[0].location.line, found[0].location.column


def test_wrong_values_point_into_the_json(compiler: Compiler) -> None:
    text = (REPO / fixture("wrong-values")).read_text(encoding="utf-8")
    errors = errors_of(compiler, "wrong-values")
    assert all(d.location.path == fixture("wrong-values") for d in errors)
    # gpu_vendor "INTEL" -> accelerator; slurm.nodes "2" -> nnodes; distributed.port -> master_port
    assert located(errors, "/distributed/accelerator") == position(text, r'"gpu_vendor": (")')
    assert located(errors, "/distributed/nnodes") == position(text, r'"nodes": (")')
    assert located(errors, "/slurm/time") == position(text, r'"time": (1)')
    assert located(errors, "/distributed/master_port") == position(text, r'"port": (7)')
    assert located(errors, "/job/env/NCCL_DEBUG/level") == position(text, r'(")level"')


def test_typo_launcher_points_at_the_value(compiler: Compiler) -> None:
    text = (REPO / fixture("typo")).read_text(encoding="utf-8")
    errors = errors_of(compiler, "typo")
    assert located(errors, "/distributed/launcher") == position(text, r'"launcher": (")')
    notes = madengine.translate(load_file(fixture("typo")))[1]
    hints = {d.location.pointer: d.hint for d in notes}
    assert hints["/distributed/launcher"] == "did you mean 'torchrun'?"
    assert hints["/slurm/partiton"] == "did you mean 'partition'?"
    assert hints["/distributed/nproc_per_nodes"] == "did you mean 'nproc_per_node'?"
    assert hints["/env_var"] == "did you mean 'env_vars'?"
    assert located(notes, "/env_var") == position(text, r'(")env_var"')


def test_too_few_disagg_nodes_is_noted_at_nnodes(compiler: Compiler) -> None:
    """madengine refuses sglang-disagg on 2 nodes; mdc runs it (servers sharing the nodes)
    and says so where nnodes is written."""
    text = (REPO / fixture("k8s-sglang-disagg-2")).read_text(encoding="utf-8")
    compiled = compiler.compile(REPO / fixture("k8s-sglang-disagg-2"))
    (note,) = [d for d in compiled.diagnostics if "fewer than 3 nodes" in d.message]
    assert note.code == "MDC504" and not note.is_error
    assert (note.location.line, note.location.column) == position(text, r'("nnodes"): 2')


def test_nnodes_from_slurm_nodes_is_located_there(tmp_path: Path, compiler: Compiler) -> None:
    """A finding on nnodes taken from slurm.nodes lands on slurm.nodes."""
    text = (
        '{\n  "slurm": {"nodes": 2, "gpus_per_node": 8},\n  "distributed": {"launcher": '
        '"sglang-disagg"}\n}\n'
    )
    path = tmp_path / "disagg.json"
    path.write_text(text, encoding="utf-8")
    compiled = compiler.compile(path)
    (note,) = [d for d in compiled.diagnostics if "fewer than 3 nodes" in d.message]
    assert (note.location.line, note.location.column) == position(text, r'("nodes"): 2')


# --- madengine's meaning ----------------------------------------------------------------------------


def spec_of(case: str) -> dict[str, Any]:
    doc, _ = madengine.translate(load_file(fixture(case)))
    assert isinstance(doc.data, dict)
    return doc.data


def test_counts_ports_and_targets() -> None:
    # SLURM: nnodes from slurm.nodes, nproc from gpus_per_node, port from distributed.port
    slurm = spec_of("slurm-torchrun-2x8")["distributed"]
    assert (slurm["backend"], slurm["nnodes"], slurm["nproc_per_node"], slurm["master_port"]) == (
        "slurm",
        2,
        8,
        29600,
    )
    # distributed.master_port is ignored by madengine: the port stays 29500
    assert spec_of("slurm-megatron-4x8")["distributed"]["master_port"] == 29500
    # Kubernetes: launcher.master_port
    assert spec_of("k8s-megatron-4x8")["distributed"]["master_port"] == 23456
    # the SLURM presets: 1 node of 8 GPUs unless slurm says otherwise; torchrun by default
    minimal = spec_of("preset-minimal")
    assert minimal["distributed"] == {
        "launcher": "torchrun",
        "backend": "slurm",
        "nnodes": 2,
        "nproc_per_node": 8,
        "accelerator": "amd",
        "master_port": 29500,
    }
    assert minimal["slurm"]["partition"] == "amd-rccl"
    assert minimal["torchrun"] == {"rdzv_backend": "static"}
    # local: one node, GPUs from the top-level n_gpus; NVIDIA
    local = spec_of("local-env-vars")["distributed"]
    assert (local["backend"], local["nnodes"], local["nproc_per_node"], local["accelerator"]) == (
        "local",
        1,
        4,
        "nvidia",
    )
    # Kubernetes, one GPU and no launcher: the script runs directly (basic, 1 process)
    native = spec_of("k8s-native-1gpu")
    assert (native["distributed"]["launcher"], native["distributed"]["nproc_per_node"]) == (
        "basic",
        1,
    )
    assert native["job"]["image"] == "nvcr.io/nvidia/pytorch:25.01-py3"


def test_kubernetes_keys() -> None:
    k8s = spec_of("k8s-advanced-4x2")["kubernetes"]
    assert k8s["namespace"] == "ml-training"
    assert k8s["gpu_resource"] == "amd.com/gpu"
    assert k8s["node_selector"] == {"node.kubernetes.io/instance-type": "mi300x", "gpu-count": "8"}
    assert k8s["tolerations"][1] == {
        "key": "maintenance",
        "operator": "Equal",
        "value": "planned",
        "effect": "NoExecute",
        "toleration_seconds": 600,
    }
    assert k8s["volumes"] == [{"name": "data", "mount_path": "/data", "claim": "datasets-pvc"}]
    assert (k8s["backoff_limit"], k8s["active_deadline_seconds"], k8s["memory"], k8s["cpu"]) == (
        5,
        7200,
        "128Gi",
        "32",
    )
    # gpu_count 3 with nproc 1 (madengine's sglang-disagg-minimal shape): GPUs per pod kept
    assert spec_of("k8s-sglang-disagg-2")["kubernetes"]["gpus_per_node"] == 3


def test_env_layers() -> None:
    env = spec_of("slurm-torchrun-2x8")["job"]["env"]
    # the user's value beats the preset; network_interface beats the preset's eth0
    assert env["NCCL_DEBUG"] == "INFO"
    assert env["NCCL_SOCKET_IFNAME"] == env["GLOO_SOCKET_IFNAME"] == "ib0"
    assert env["OMP_NUM_THREADS"] == "16"
    assert env["NCCL_TIMEOUT"] == "600"  # the multi-node profile
    local = spec_of("local-env-vars")["job"]["env"]
    assert local == {
        "HF_HOME": "/cache/hf",
        "NCCL_DEBUG": "WARN",
        "TOKENIZERS_PARALLELISM": "False",
    }
    nvidia = spec_of("k8s-native-1gpu")["job"]["env"]
    assert nvidia["OMP_NUM_THREADS"] == "12" and nvidia["NCCL_P2P_LEVEL"] == "NVL"
    assert nvidia["HSA_NO_SCRATCH_RECLAIM"] == "1"
    assert "HSA_ENABLE_SDMA" not in nvidia  # AMD's multi-GPU env is not added for NVIDIA


def literal(word: object) -> object:
    return word if isinstance(word, str) else None


def text_of(word: object) -> str:
    """A word with its run-time values shown as ${NAME}."""
    parts = word.parts if isinstance(word, Concat) else (word,)
    return "".join(f"${{{p.name}}}" if isinstance(p, Ref) else str(p) for p in parts)


def runner_words(value: object) -> list[str]:
    """MAD_MULTI_NODE_RUNNER as a madengine script's unquoted ``$MAD_MULTI_NODE_RUNNER``
    splits it."""
    assert isinstance(value, Concat)
    return text_of(value).split()


def flag(words: list[str], name: str) -> str:
    return words[words.index(name) + 1]


def test_env_contract_torchrun(compiler: Compiler) -> None:
    """madengine (§4.1 torchrun, §5, §6): MAD_MULTI_NODE_RUNNER = torchrun up to the script,
    NNODES, NPROC_PER_NODE, MAD_RUNTIME_NGPUS = G; standalone on one node."""
    for case, nnodes, gpus in (("slurm-torchrun-2x8", 2, 8), ("k8s-torchrun-1x2", 1, 2)):
        result = compiled(compiler, case)
        env = env_of(result)
        assert (env["NNODES"], env["NPROC_PER_NODE"], env["MAD_RUNTIME_NGPUS"]) == (
            str(nnodes),
            str(gpus),
            str(gpus),
        )
        runner = runner_words(env["MAD_MULTI_NODE_RUNNER"])
        assert runner[0] == "torchrun"
        assert (flag(runner, "--nnodes"), flag(runner, "--nproc-per-node")) == (
            str(nnodes),
            str(gpus),
        )
        assert ("--standalone" in runner) == (nnodes == 1)
        # the same words start mdc's own command
        (role,) = result.launch.roles
        assert [text_of(w) for w in role.argv[: len(runner)]] == runner


def test_env_contract_torchrun_based_launchers(compiler: Compiler) -> None:
    """megatron and torchtitan run on torchrun: the same runner, NNODES, NPROC_PER_NODE."""
    for case in ("slurm-megatron-4x8", "k8s-megatron-4x8", "slurm-torchtitan-4x8"):
        env = env_of(compiled(compiler, case))
        assert (env["NNODES"], env["NPROC_PER_NODE"]) == ("4", "8")
        runner = runner_words(env["MAD_MULTI_NODE_RUNNER"])
        assert runner[0] == "torchrun" and flag(runner, "--nnodes") == "4"
        assert "MAD_RUNTIME_NGPUS" not in env  # madengine sets it for torchrun and primus only


def test_env_contract_deepspeed_sizes(compiler: Compiler) -> None:
    env = env_of(compiled(compiler, "slurm-deepspeed-1x4"))
    assert (env["NNODES"], env["NPROC_PER_NODE"]) == ("1", "4")


def test_launcher_env_lists_everything_the_launchers_set(compiler: Compiler) -> None:
    """The importer drops a config's env_vars entry that mdc sets itself (else MDC240)."""
    for case in sorted(set(CASES) - BROKEN):
        result = compiled(compiler, case)
        launcher = result.plan.launcher
        names = {n for role in result.launch.roles for n in role.env} | set(
            result.launch.worker_env
        )
        known = {*madengine_tables.MANAGED_ENV, *madengine_tables.LAUNCHER_ENV.get(launcher, ())}
        if launcher == "megatron":  # the importer adds it when tp > 1 on GPUs
            known.add("CUDA_DEVICE_MAX_CONNECTIONS")
        assert names <= known, (case, sorted(names - known))


def test_env_vars_mdc_sets_are_dropped(tmp_path: Path, compiler: Compiler) -> None:
    path = tmp_path / "ctx.json"
    path.write_text(
        json.dumps(
            {
                "slurm": {"nodes": 2, "gpus_per_node": 8},
                "distributed": {"launcher": "torchrun"},
                "env_vars": {"NNODES": "2", "MAD_MULTI_NODE_RUNNER": "torchrun", "HF_HOME": "/h"},
            }
        ),
        encoding="utf-8",
    )
    result = compiler.compile(path)
    assert result.plan.job.env == {**result.plan.job.env, "HF_HOME": "/h"}
    assert "NNODES" not in result.plan.job.env
    dropped = {d.location.pointer for d in result.notes if d.code == "MDC504"}
    assert {"/env_vars/NNODES", "/env_vars/MAD_MULTI_NODE_RUNNER"} <= dropped


def test_env_contract_megatron(compiler: Compiler) -> None:
    """TP = G, PP = N, CP = 1 on several nodes (madengine's K8s rule; SLURM never got it)."""
    for case in ("slurm-megatron-4x8", "k8s-megatron-4x8"):
        env = env_of(compiled(compiler, case))
        assert {
            k: literal(env[k])
            for k in (
                "TENSOR_MODEL_PARALLEL_SIZE",
                "PIPELINE_MODEL_PARALLEL_SIZE",
                "CONTEXT_PARALLEL_SIZE",
            )
        } == {
            "TENSOR_MODEL_PARALLEL_SIZE": "8",
            "PIPELINE_MODEL_PARALLEL_SIZE": "4",
            "CONTEXT_PARALLEL_SIZE": "1",
        }
        assert env["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"


def test_env_contract_torchtitan(compiler: Compiler) -> None:
    """madengine on N > 1: TP = G, PP = N, CP = 1 and FSDP_ENABLED=1 regardless of dp.

    mdc says whether TorchTitan shards: with tp 8 x pp 4 on 32 GPUs dp is 1, so no FSDP.
    """
    env = env_of(compiled(compiler, "slurm-torchtitan-4x8"))
    dp = 4 * 8 // (8 * 4)
    assert {k: env[k] for k in env if k.startswith("TORCHTITAN_")} == {
        "TORCHTITAN_TENSOR_PARALLEL_SIZE": "8",
        "TORCHTITAN_PIPELINE_PARALLEL_SIZE": "4",
        "TORCHTITAN_FSDP_ENABLED": "1" if dp > 1 else "0",
        "TORCHTITAN_CONTEXT_PARALLEL_SIZE": "1",
    }


def test_env_contract_vllm(compiler: Compiler) -> None:
    """madengine: TP = G and PP = 1 on every node, each node its own server."""
    result = compiled(compiler, "slurm-vllm-2x4")
    env = env_of(result)
    assert (
        env["VLLM_TENSOR_PARALLEL_SIZE"],
        env["VLLM_PIPELINE_PARALLEL_SIZE"],
        env["NNODES"],
        env["NPROC_PER_NODE"],
    ) == ("4", "1", "2", "4")
    assert getattr(result.plan.options["vllm"], "mode", None) == "replicas"


def test_env_contract_sglang(compiler: Compiler) -> None:
    env = env_of(compiled(compiler, "k8s-sglang-2x4"))
    assert (env["SGLANG_PIPELINE_PARALLEL_SIZE"], env["NNODES"], env["NPROC_PER_NODE"]) == (
        "1",
        "2",
        "4",
    )
    # one server over both nodes: tp = 2 x 4 (madengine exports 4; see docs/madengine.md)
    assert env["SGLANG_TENSOR_PARALLEL_SIZE"] == "8"
    assert isinstance(env["NCCL_INIT_ADDR"], Concat)
    # SGLANG_HOST_IP (§4.1 sglang N > 1): exported by launch/sglang-node.sh from NODE_HOSTS
    result = compiled(compiler, "k8s-sglang-2x4")
    assert "SGLANG_HOST_IP" in result.launch.worker_env
    script = next(a for a in result.tree if a.path == "launch/sglang-node.sh")
    assert 'export SGLANG_HOST_IP="$ip"' in script.data.decode("utf-8")


def test_env_contract_sglang_disagg(compiler: Compiler) -> None:
    env = env_of(compiled(compiler, "slurm-sglang-disagg-7"))
    expected = {
        "SGLANG_DISAGG_MODE": "enabled",
        "SGLANG_DISAGG_PREFILL_NODES": "4",
        "SGLANG_DISAGG_DECODE_NODES": "2",
        "SGLANG_DISAGG_TOTAL_NODES": "6",  # madengine's 7 less its proxy's node
        "SGLANG_TP_SIZE": "8",
        "PREFILL_COUNT": "4",
        "DECODE_COUNT": "2",
        "TP_SIZE": "8",
    }
    assert {k: env[k] for k in expected} == expected
    assert isinstance(env["SGLANG_NODE_RANK"], Ref)
    # madengine's Kubernetes POD_INDEX / TOTAL_PODS / POD_IP and SLURM SGLANG_NODE_IPS
    assert (env["POD_INDEX"], env["TOTAL_PODS"]) == (Ref("NODE_RANK"), "6")
    worker_env = compiled(compiler, "slurm-sglang-disagg-7").launch.worker_env
    assert {"POD_IP", "SGLANG_NODE_IPS"} <= set(worker_env)


def test_disagg_auto_split_and_one_sided_split(tmp_path: Path, compiler: Compiler) -> None:
    """madengine ignores a split with only one side: prefill = max(1, (n-1)*2//5)."""
    path = tmp_path / "disagg.json"
    path.write_text(
        json.dumps(
            {
                "slurm": {"nodes": 5, "gpus_per_node": 8},
                "distributed": {"launcher": "sglang-disagg", "sglang_disagg": {"prefill_nodes": 2}},
            }
        ),
        encoding="utf-8",
    )
    result = compiler.compile(path)
    env = env_of(result)
    prefill = max(1, (5 - 1) * 2 // 5)
    assert (env["PREFILL_COUNT"], env["DECODE_COUNT"]) == (str(prefill), str(5 - 1 - prefill))
    assert "/distributed/sglang_disagg/prefill_nodes" in {
        d.location.pointer for d in result.notes if d.code == "MDC504"
    }


def test_env_contract_primus(compiler: Compiler) -> None:
    env = env_of(compiled(compiler, "k8s-primus-2x8"))
    expected = {
        "PRIMUS_CONFIG_PATH": "examples/megatron/configs/MI300X/llama3.1_8B-BF16-pretrain.yaml",
        "PRIMUS_CLI_EXTRA": "--train_iters 100 --micro_batch_size 2",
        "BACKEND": "megatron",
        "NNODES": "2",
        "GPUS_PER_NODE": "8",
        "MAD_RUNTIME_NGPUS": "8",
        "HF_HOME": "/data/huggingface",
    }
    assert {k: env[k] for k in expected} == expected


def test_env_contract_deepspeed_runner(compiler: Compiler) -> None:
    result = compiled(compiler, "slurm-deepspeed-1x4")
    script = next(a for a in result.tree if a.path == "launch/worker.sh").data.decode("utf-8")
    line = next(x for x in script.splitlines() if x.startswith("export MAD_MULTI_NODE_RUNNER="))
    runner = shlex.split(shlex.split(line[len("export ") :])[0].split("=", 1)[1])
    assert runner[0] == "deepspeed" and runner[runner.index("--num_gpus") + 1] == "4"


def test_values_are_quoted_not_run(compiler: Compiler) -> None:
    """madengine writes export K="V" (so $(...) runs on the node); mdc passes V verbatim."""
    result = compiled(compiler, "slurm-torchrun-2x8")
    script = next(a for a in result.tree if a.path == "launch/worker.sh")
    text = script.data.decode("utf-8")
    line = next(x for x in text.splitlines() if x.startswith("export RUN_BANNER="))
    assert shlex.split(line[len("export ") :]) == ['RUN_BANNER=node $(hostname) at `date` "quoted"']


def test_pods_get_a_subdomain(compiler: Compiler) -> None:
    """madengine gives no subdomain to sglang pods, so their DNS names do not resolve."""
    for case in ("k8s-sglang-2x4", "k8s-megatron-4x8", "k8s-primus-2x8"):
        result = compiled(compiler, case)
        job = next(a for a in result.tree if a.path == "kubernetes/job.yaml")
        text = job.data.decode("utf-8")
        assert f"subdomain: {result.plan.job.name}" in text
        # MASTER_ADDR is pod 0's DNS name, never empty (madengine's megatron bug)
        assert f"{result.plan.job.name}-0.{result.plan.job.name}." in text


# --- errors madengine refuses too -----------------------------------------------------------------


def test_k8s_and_slurm_conflict(tmp_path: Path) -> None:
    path = tmp_path / "both.json"
    text = '{"k8s": {"gpu_count": 1},\n "slurm": {"nodes": 1}}\n'
    path.write_text(text, encoding="utf-8")
    with pytest.raises(SpecError) as caught:
        madengine.translate(load_file(path))
    errors = [d for d in caught.value.diagnostics if d.is_error]
    assert [d.code for d in errors] == ["MDC530"]
    assert (errors[0].location.line, errors[0].location.column) == position(text, r'(")slurm"')
    assert "Both 'k8s' and 'slurm' fields present" in errors[0].message


def test_deploy_string(tmp_path: Path) -> None:
    good = tmp_path / "good.json"
    good.write_text('{"deploy": "slurm", "slurm": {"nodes": 3}}', encoding="utf-8")
    _, notes = madengine.translate(load_file(good))
    assert "MDC505" in {d.code for d in notes if d.location.pointer == "/deploy"}
    bad = tmp_path / "bad.json"
    bad.write_text('{"deploy": "k8s", "slurm": {"nodes": 3}}', encoding="utf-8")
    with pytest.raises(SpecError) as caught:
        madengine.translate(load_file(bad))
    assert [d.code for d in caught.value.diagnostics if d.is_error] == ["MDC531"]


def test_block_of_the_wrong_type(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text('{"gpu_vendor": "AMD", "env_vars": ["A=1"]}', encoding="utf-8")
    with pytest.raises(SpecError) as caught:
        madengine.translate(load_file(path))
    assert [(d.code, d.location.pointer) for d in caught.value.diagnostics] == [
        ("MDC532", "/env_vars")
    ]


# --- detection, the CLI, determinism ---------------------------------------------------------------


def spec_files() -> list[Path]:
    found = [p for p in (REPO / "examples").iterdir() if p.suffix in (".toml", ".yaml", ".json")]
    found += list((REPO / "golden" / "diagnostics").glob("*/spec.*"))
    return sorted(found)


def test_detect_never_fires_on_mdc_specs() -> None:
    files = spec_files()
    assert len(files) > 30
    for path in files:
        try:
            doc = load_file(path)
        except SpecError:
            continue  # a diagnostics case that does not even parse
        assert not madengine.detect(doc), path
        assert translate_any(doc) == (doc, [])


@pytest.mark.parametrize("case", CASES)
def test_detect_fires_on_madengine_contexts(case: str) -> None:
    assert madengine.detect(load_file(fixture(case)))


def test_compile_a_madengine_file_directly(tmp_path: Path) -> None:
    out = tmp_path / "out"
    code, _, err = run_cli(
        "compile", fixture("slurm-torchrun-2x8"), "-o", str(out), "--no-plugin-autoload"
    )
    assert code == 0, err
    assert "warning[MDC502]" in err and "warning[MDC505]" in err
    assert f"{fixture('slurm-torchrun-2x8')}:" in err
    assert (out / "slurm" / "job.sbatch").exists() or any((out / "slurm").iterdir())
    sbatch = "".join(p.read_text() for p in (out / "slurm").iterdir() if p.is_file())
    assert "--partition=mi300x" in sbatch or "--partition mi300x" in sbatch


def test_import_to_stdout_yaml_and_json(tmp_path: Path, compiler: Compiler) -> None:
    case = fixture("k8s-primus-2x8")
    code, toml_text, _ = run_cli("import", "madengine", case, "--no-plugin-autoload")
    assert code == 0 and toml_text.startswith("# Imported from madengine's")
    for suffix in (".yaml", ".json", ".toml"):
        target = tmp_path / f"spec{suffix}"
        assert (
            run_cli("import", "madengine", case, "-o", str(target), "--no-plugin-autoload")[0] == 0
        )
        # the written spec is an mdc spec: it compiles as one, and is not taken for madengine's
        doc = load_file(target)
        assert not madengine.detect(doc)
        assert compiler.compile(target).plan.launcher == "primus"
    code, out, _ = run_cli("import", "madengine", case, "--format", "json", "--no-plugin-autoload")
    report = json.loads(out)
    assert report["ok"] is True and report["text"] == toml_text
    assert {d["code"] for d in report["diagnostics"]} >= {"MDC502", "MDC503"}


def test_import_refuses_an_mdc_spec() -> None:
    code, _, err = run_cli(
        "import", "madengine", "examples/torchrun-2x2-static.json", "--no-plugin-autoload"
    )
    assert code == 1 and "MDC533" in err


@pytest.mark.parametrize("case", ["k8s-advanced-4x2", "slurm-sglang-disagg-7", "typo"])
def test_deterministic(case: str, tmp_path: Path) -> None:
    outputs = []
    for index in range(2):
        target = tmp_path / f"spec{index}.toml"
        run_cli("import", "madengine", fixture(case), "-o", str(target), "--no-plugin-autoload")
        outputs.append(target.read_bytes())
    assert outputs[0] == outputs[1]


def test_detect_by_block_contents(tmp_path: Path) -> None:
    """Keys shared with mdc's tables count only with a madengine-only key inside."""
    cases = {
        '{"kubernetes": {"gpu_count": 2}}': True,
        '{"slurm": {"nodes": 2}}': True,
        '{"distributed": {"port": 29500}}': True,
        "{}": False,
        '{"distributed": {"launcher": "torchrun"}}': False,
        '{"slurm": {"partition": "gpu"}}': False,
    }
    for index, (text, expected) in enumerate(cases.items()):
        path = tmp_path / f"c{index}.json"
        path.write_text(text, encoding="utf-8")
        assert madengine.detect(load_file(path)) is expected, text
    yaml_path = tmp_path / "context.yaml"
    yaml_path.write_text("gpu_vendor: AMD\n", encoding="utf-8")
    assert not madengine.detect(load_file(yaml_path))  # madengine's context file is JSON


def test_kubernetes_block_name_and_timeout(tmp_path: Path, compiler: Compiler) -> None:
    path = tmp_path / "k.json"
    path.write_text(
        json.dumps(
            {
                "kubernetes": {"gpu_count": 4, "kubeconfig": "~/.kube/x"},
                "distributed": {"launcher": "torchrun", "nnodes": 2},
                "MAD_CONTAINER_IMAGE": "rocm/pytorch:latest",
            }
        ),
        encoding="utf-8",
    )
    result = compiler.compile(path)
    assert (result.plan.backend, result.plan.nnodes, result.plan.nproc_per_node) == (
        "kubernetes",
        2,
        4,
    )
    assert "/kubernetes/kubeconfig" in {d.location.pointer for d in result.notes}
    slurm = tmp_path / "s.json"
    slurm.write_text(json.dumps({"slurm": {"nodes": 1}, "timeout": 600}), encoding="utf-8")
    notes = madengine.translate(load_file(slurm))[1]
    assert [d.code for d in notes if d.location.pointer == "/timeout"] == ["MDC500"]


# --- what madengine does that used to be lost without a report line ----------------------------


@pytest.mark.parametrize(
    ("case", "pointer", "said"),
    [
        ("k8s-megatron-4x8", "/k8s", "hostIPC: true"),
        ("k8s-sglang-disagg-2", "", "--trust-remote-code"),
        ("slurm-sglang-disagg-7", "", "exports NNODES (slurm.nodes"),
        ("slurm-sglang-disagg-7", "/distributed/nnodes", "the servers' 6 nodes"),
        ("k8s-torchrun-1x2", "/k8s", "POD_INDEX"),
        ("k8s-native-1gpu", "/k8s", "appends --world_size 1 --rank 0"),
        ("slurm-multi-3x8", "/distributed/launcher", "has no mdc equivalent"),
        ("slurm-sglang-2x8", "", "one server per node"),
    ],
)
def test_each_loss_is_reproduced_or_reported(case: str, pointer: str, said: str) -> None:
    doc, notes = madengine.translate(load_file(fixture(case)))
    found = [n for n in notes if said in n.message]
    assert found, [n.message for n in notes]
    assert found[0].location is not None and found[0].location.pointer == pointer


def test_what_is_reproduced_is_in_the_spec() -> None:
    def spec(case: str) -> dict[str, Any]:
        return spec_data(madengine.translate(load_file(fixture(case)))[0])

    assert spec("k8s-megatron-4x8")["kubernetes"]["host_ipc"] is True
    assert spec("k8s-torchrun-1x2")["kubernetes"].get("host_ipc") is None  # one node
    assert spec("k8s-sglang-disagg-2")["sglang_disagg"]["server_args"] == ["--trust-remote-code"]
    # madengine's 7 nodes hold its proxy's node; mdc's router runs beside a server: 6
    assert spec("slurm-sglang-disagg-7")["job"]["env"]["NNODES"] == "6"
    assert spec("slurm-sglang-disagg-7")["distributed"]["nnodes"] == 6
    assert spec("slurm-multi-3x8")["slurm"]["sbatch_args"] == ["--reservation=mad-bench"]
    # madengine's Job template exports POD_INDEX for the PyTorch-native launchers and
    # primus only when nnodes > 1 (job.yaml.j2: `{% if nnodes > 1 %}`)
    assert "POD_INDEX" not in spec("k8s-torchrun-1x2")["job"]["env"]  # one node
    assert spec("k8s-primus-2x8")["job"]["env"]["POD_INDEX"] == {"ref": "NODE_RANK"}
    assert spec("k8s-megatron-4x8")["job"]["env"]["POD_INDEX"] == {"ref": "NODE_RANK"}


def test_single_node_pod_index_line_says_what_madengine_does() -> None:
    _, notes = madengine.translate(load_file(fixture("k8s-torchrun-1x2")))
    said = [n.message for n in notes if "POD_INDEX" in n.message]
    assert len(said) == 1 and "only when nnodes > 1" in said[0] and "not set" in said[0]


def test_pod_index_reaches_primus_pods_on_several_nodes(compiler: Compiler) -> None:
    result = compiled(compiler, "k8s-primus-2x8")
    assert result.plan.nnodes == 2
    assert env_of(result)["POD_INDEX"] == EnvValue(ref="NODE_RANK")


# --- null values and the Job TTL --------------------------------------------------------------


def test_null_values_read_as_absent_and_reported(tmp_path: Path, compiler: Compiler) -> None:
    """A JSON null in env_vars, docker_env_vars, slurm or k8s is reported at its key."""
    contexts = {
        "slurm.json": {
            "slurm": {"nodes": 2, "partition": None, "exclusive": None, "qos": None},
            "env_vars": {"KEEP": "1", "GONE": None},
            "docker_env_vars": {"ALSO_GONE": None},
        },
        "k8s.json": {
            "k8s": {"gpu_count": 2, "namespace": None, "memory": None, "tolerations": None},
            "env_vars": {"GONE": None},
            "MAD_CONTAINER_IMAGE": "rocm/pytorch:latest",
        },
    }
    for name, context in contexts.items():
        path = tmp_path / name
        text = json.dumps(context, indent=2)
        path.write_text(text, encoding="utf-8")
        target = tmp_path / f"{name}.toml"
        code, _, err = run_cli(
            "import", "madengine", str(path), "-o", str(target), "--no-plugin-autoload"
        )
        assert code == 0, err
        data = load_file(target).data
        assert isinstance(data, dict)
        assert {"GONE", "ALSO_GONE"}.isdisjoint(data["job"]["env"])
        nulls = [
            (block, key)
            for block, v in context.items()
            if isinstance(v, dict)
            for key, value in v.items()
            if value is None
        ]
        for block, key in nulls:
            line, column = position(text, rf'"{block}": \{{.*?("{key}"): null')
            assert f"{path}:{line}:{column}: warning[MDC50" in err, (block, key, err)
            assert f"{key} is null" in err
        assert compiler.compile(target).plan is not None
    slurm = load_file(tmp_path / "slurm.json.toml").data
    assert isinstance(slurm, dict) and slurm["job"]["env"]["KEEP"] == "1"
    assert "qos" not in slurm["slurm"]
    k8s = load_file(tmp_path / "k8s.json.toml").data
    assert isinstance(k8s, dict) and k8s["kubernetes"]["namespace"] == "default"  # the preset


def null_pointers(value: Any, pointer: str = "") -> list[str]:
    """The JSON pointers of the nulls in ``value``."""
    if value is None:
        return [pointer]
    if not isinstance(value, dict | list):
        return []
    items = value.items() if isinstance(value, dict) else enumerate(value)
    return [p for key, item in items for p in null_pointers(item, f"{pointer}/{key}")]


@pytest.mark.parametrize(
    "context",
    [
        {"slurm": {"nodes": 1}, "distributed": {"nnodes": None, "launcher": None, "port": None}},
        {"k8s": {"gpu_count": 1}, "launcher": {"type": None, "nnodes": None, "master_port": None}},
        {"slurm": {"nodes": 1, "modules": [None, "rocm"]}, "distributed": {"primus": None}},
        {"slurm": {"nodes": 1}, "gpu_vendor": None, "MAD_CONTAINER_IMAGE": None, "deploy": None},
        {"k8s": {"gpu_count": 1, "tolerations": [{"key": None, "operator": "Exists"}]}},
        {"k8s": {"gpu_count": 1, "node_selector": {"pool": None}}, "env_vars": {"A": None}},
    ],
)
def test_a_null_anywhere_is_reported_never_a_crash(tmp_path: Path, context: dict[str, Any]) -> None:
    path = tmp_path / "context.json"
    path.write_text(json.dumps(context), encoding="utf-8")
    code, _, err = run_cli(
        "import", "madengine", str(path), "-o", str(tmp_path / "spec.toml"), "--no-plugin-autoload"
    )
    assert code == 0, err
    _, notes = madengine.translate(load_file(path))
    reported = sorted(n.location.pointer for n in notes if " is null: " in n.message)
    assert reported == sorted(null_pointers(context))


def test_the_job_ttl_difference_is_reported(tmp_path: Path, compiler: Compiler) -> None:
    """madengine writes no ttlSecondsAfterFinished; the import says what mdc's Job does."""
    result = compiled(compiler, "k8s-torchrun-1x2")
    job = next(
        doc
        for artifact in result.tree
        if artifact.path.endswith(".yaml")
        for doc in yaml.safe_load_all(artifact.data)
        if doc and doc.get("kind") == "Job"
    )
    ttl = job["spec"]["ttlSecondsAfterFinished"]
    said = [n for n in result.notes if "ttlSecondsAfterFinished" in n.message]
    assert len(said) == 1 and f"{ttl} s" in said[0].message
    assert said[0].location.pointer == "/k8s"
    path = tmp_path / "ttl.json"
    path.write_text(
        json.dumps({"k8s": {"gpu_count": 1, "ttl_seconds_after_finished": 60}}), encoding="utf-8"
    )
    doc, notes = madengine.translate(load_file(path))
    assert doc.data["kubernetes"]["ttl_seconds_after_finished"] == 60  # type: ignore[index]
    assert not [n for n in notes if "ttlSecondsAfterFinished" in n.message]


def test_multi_node_sglang_on_slurm_is_not_said_to_get_nccl_init_addr() -> None:
    _, notes = madengine.translate(load_file(fixture("slurm-sglang-2x8")))
    said = [n.message for n in notes if "NCCL_INIT_ADDR" in n.message]
    assert said and all("no NCCL_INIT_ADDR" in m for m in said)


@pytest.mark.parametrize(
    ("command", "warned"),
    [
        (["bash", "run.sh"], True),
        (["./run_llama.sh", "--steps", "10"], True),
        (["sh", "-e", "scripts/train.sh"], True),
        (["bash", "-c", "python train.py"], False),
        (["python", "train.py"], False),
    ],
)
def test_a_shell_script_under_torchrun_is_a_warning(
    compiler: Compiler, tmp_path: Path, command: list[str], warned: bool
) -> None:
    spec = tmp_path / "spec.json"
    spec.write_text(
        json.dumps(
            {
                "job": {"name": "script", "command": command},
                "distributed": {
                    "launcher": "torchrun",
                    "backend": "local",
                    "nnodes": 1,
                    "nproc_per_node": 2,
                    "accelerator": "cpu",
                },
            }
        ),
        encoding="utf-8",
    )
    codes = [d.code for d in compiler.compile(spec).diagnostics]
    assert ("MDC252" in codes) == warned, codes


def test_disagg_on_madengine_3_nodes_splits_two_nodes_gpus(
    tmp_path: Path, compiler: Compiler
) -> None:
    """madengine's 3-node sglang-disagg is 1 proxy + 1 prefill + 1 decode node; mdc runs the
    router beside the prefill server, on 2 nodes, where the split is of GPUs: the same
    servers, one node each."""
    path = tmp_path / "disagg.json"
    split = {"prefill_nodes": 1, "decode_nodes": 1}
    path.write_text(
        json.dumps(
            {
                "slurm": {"nodes": 3, "gpus_per_node": 8},
                "distributed": {"launcher": "sglang-disagg", "sglang_disagg": split},
            }
        ),
        encoding="utf-8",
    )
    data = spec_data(madengine.translate(load_file(path))[0])
    dist = data["distributed"]
    assert (dist["nnodes"], dist["prefill_gpus"], dist["decode_gpus"]) == (2, 8, 8)
    assert "prefill_nodes" not in dist
    result = compiler.compile(path)
    assert not [d for d in result.diagnostics if d.is_error]
    servers = [s for s in result.launch.servers if s.gpus]
    assert [(s.role, s.nodes, s.gpus) for s in servers] == [
        ("prefill", (0,), 8),
        ("decode", (1,), 8),
    ]
