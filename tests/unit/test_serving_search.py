"""mdc tune on serving specs: the deployment search, its table, JSON, --write and --svg."""

from __future__ import annotations

import io
import json
import tomllib
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from tests.tools import REPO

from mdc.cli import main
from mdc.describe import plan_json
from mdc.pipeline import Compiler
from mdc.plugin_manager import load_plugins

EXAMPLE = REPO / "examples" / "tune-serving-r1-16xh200.toml"
COMPILER = Compiler(load_plugins(autoload=False))
ROLE_KEYS = {"tp", "pp", "dp", "ep", "servers", "max_batch"}
PREDICTED_KEYS = {
    "ttft_ms",
    "tpot_ms",
    "output_tokens_per_s_per_gpu",
    "output_tokens_per_s_per_user",
    "requests_per_s",
}


def _run(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(args), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def tuned() -> dict[str, Any]:
    code, out, err = _run("tune", str(EXAMPLE), "--format", "json", "--top", "6")
    assert code == 0, err
    result: dict[str, Any] = json.loads(out)
    return result


def _explained(tmp_path: Path, data: dict[str, Any], name: str) -> dict[str, Any]:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    compiled = COMPILER.compile(path, tree=False)
    return plan_json(compiled.plan, compiled.launch)


def test_json_lists_the_candidates_best_first(tuned: dict[str, Any]) -> None:
    rows = tuned["candidates"]
    assert len(rows) == 6
    for row in rows:
        assert row["launcher"] == "trtllm"
        assert row["mode"] in ("aggregated", "disaggregated")
        expected = {"server"} if row["mode"] == "aggregated" else {"prefill", "decode"}
        assert set(row["roles"]) == expected
        for role in row["roles"].values():
            assert set(role) >= ROLE_KEYS
        assert set(row["predicted"]) >= PREDICTED_KEYS
        assert row["gpus"] == 16
        assert row["memory_gib"] <= 141
    # those meeting the SLO first, each group by output per GPU
    order = [(not r["meets_slo"], -r["predicted"]["output_tokens_per_s_per_gpu"]) for r in rows]
    assert order == sorted(order)
    assert rows[0]["meets_slo"] and rows[0]["predicted"]["tpot_ms"] <= 50


def test_every_candidate_compiles_and_explains_to_its_row(
    tuned: dict[str, Any], tmp_path: Path
) -> None:
    for i, row in enumerate(tuned["candidates"]):
        explained = _explained(tmp_path, row["spec"], f"row{i}")
        predicted = explained["predicted"]
        assert {k: predicted[k] for k in PREDICTED_KEYS} == {
            k: row["predicted"][k] for k in PREDICTED_KEYS
        }


def test_the_search_covers_both_modes(tmp_path: Path) -> None:
    code, out, err = _run("tune", str(EXAMPLE), "--format", "json", "--top", "40")
    assert code == 0, err
    modes = {row["mode"] for row in json.loads(out)["candidates"]}
    assert modes == {"aggregated", "disaggregated"}


def test_write_gives_a_spec_that_compiles_to_the_first_row(
    tuned: dict[str, Any], tmp_path: Path
) -> None:
    out_spec = tmp_path / "best.toml"
    code, _, err = _run("tune", str(EXAMPLE), "--write", str(out_spec), "--format", "json")
    assert code == 0, err
    written = tomllib.loads(out_spec.read_text(encoding="utf-8"))
    best = tuned["candidates"][0]
    if best["mode"] == "disaggregated":
        # the split is written out: compile's default rule is never the answer
        assert written["trtllm"]["context"]["servers"] == best["roles"]["prefill"]["servers"]
        assert written["trtllm"]["generation"]["tp_size"] == best["roles"]["decode"]["tp"]
        # and the prefill role's step budget, in its own table
        budget = best["roles"]["prefill"]["step_tokens"]
        assert budget in (2048, 8192, 16384)
        assert written["trtllm"]["context"]["max_num_tokens"] == budget
    assert written["model"]["name"] == "deepseek-ai/DeepSeek-R1"  # the spec as the user wrote it
    explained = _explained(tmp_path, written, "written")
    assert {k: explained["predicted"][k] for k in PREDICTED_KEYS} == {
        k: best["predicted"][k] for k in PREDICTED_KEYS
    }


def _default_graphs(tmp_path: Path, **trtllm: Any) -> Path:
    """The example with TensorRT-LLM's CUDA graphs left to the engine's default."""
    data = tomllib.loads(EXAMPLE.read_text(encoding="utf-8"))
    del data["trtllm"]["extra_llm_api_options"]["cuda_graph_config"]
    data["trtllm"].update(trtllm)
    spec = tmp_path / "default-graphs.json"
    spec.write_text(json.dumps(data), encoding="utf-8")
    return spec


def test_trtllm_graphs_left_to_the_default_are_written_padded_to_each_rows_batch(
    tuned: dict[str, Any], tmp_path: Path
) -> None:
    """trtllm-serve's default graphs replay only up to 32 requests a rank; a spec that
    leaves them so is searched with padded graphs, each row's spec carrying them up to its
    decode batch a rank (at least 128): the rows are those of the spec that pads its own
    (the example), and each compiles and explains to its row."""
    code, out, err = _run("tune", str(_default_graphs(tmp_path)), "--format", "json", "--top", "6")
    assert code == 0, err
    rows = json.loads(out)["candidates"]
    # and the table says so, where the example's (its own graphs) does not
    said = "each row's spec pads them up to its decode batch a rank"
    assert said in _run("tune", str(_default_graphs(tmp_path)))[1]
    assert said not in _run("tune", str(EXAMPLE))[1]
    assert [r["predicted"] for r in rows] == [r["predicted"] for r in tuned["candidates"]]
    for i, row in enumerate(rows):
        name = "decode" if row["mode"] == "disaggregated" else "server"
        graphs = row["spec"]["trtllm"]["extra_llm_api_options"]["cuda_graph_config"]
        per_rank = -(-row["predicted"]["batch"][name] // row["roles"][name]["dp"])
        assert graphs == {"enable_padding": True, "max_batch_size": max(128, per_rank)}
        explained = _explained(tmp_path, row["spec"], f"row{i}")["predicted"]
        assert {k: explained[k] for k in PREDICTED_KEYS} == {
            k: row["predicted"][k] for k in PREDICTED_KEYS
        }


def test_trtllm_graphs_are_not_written_over_an_options_file_of_the_users_own(
    tmp_path: Path,
) -> None:
    """An options file passed in [trtllm] args is the user's (mdc does not read its
    graphs): the search keeps the spec's graphs as the engine's default, unwritten."""
    spec = _default_graphs(
        tmp_path, args=["--trust_remote_code", "--extra_llm_api_options", "mine.yaml"]
    )
    from mdc.loaders import load_file
    from mdc.tune.serving_layouts import searches_graphs

    assert searches_graphs("trtllm", load_file(spec).data) is False
    assert searches_graphs("trtllm", load_file(_default_graphs(tmp_path)).data) is True
    assert searches_graphs("trtllm", load_file(EXAMPLE).data) is False


def test_text_names_the_binding_constraint_and_why_the_runners_up_lost() -> None:
    code, out, err = _run("tune", str(EXAMPLE), "--top", "3")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[1].split()[:3] == ["#", "deployment", "GPUs"]
    assert len([line for line in lines if line[:2].strip().isdigit()]) == 3
    assert lines[-1].startswith("best: ")


def test_svg_draws_the_families_the_limit_and_the_choice(tmp_path: Path) -> None:
    picture = tmp_path / "r1.svg"
    code, _, err = _run("tune", str(EXAMPLE), "--svg", str(picture))
    assert code == 0, err
    root = ET.fromstring(picture.read_text(encoding="utf-8"))
    ns = "{http://www.w3.org/2000/svg}"
    assert len(root.findall(f"{ns}polyline")) >= 2  # aggregated and disaggregated families
    texts = [t.text or "" for t in root.iter(f"{ns}text")]
    assert "TPOT 50 ms" in texts
    ringed = [c for c in root.findall(f"{ns}circle") if c.get("r") == "9"]
    assert len(ringed) == 1


def test_without_a_workload_the_search_says_what_is_missing(tmp_path: Path) -> None:
    text = EXAMPLE.read_text(encoding="utf-8").split("[workload]")[0]
    spec = tmp_path / "no-workload.toml"
    spec.write_text(text, encoding="utf-8")
    code, out, err = _run("tune", str(spec))
    assert code != 0
    assert "MDC621" in err and "/workload" in err


def test_a_launcher_the_search_does_not_cover_is_named(tmp_path: Path) -> None:
    data = tomllib.loads(EXAMPLE.read_text(encoding="utf-8"))
    data["distributed"]["launcher"] = "sglang"
    data["job"]["command"] = ["python3"]
    data["sglang"] = {"model": "deepseek-ai/DeepSeek-R1"}
    del data["trtllm"]
    spec = tmp_path / "sglang.json"
    spec.write_text(json.dumps(data), encoding="utf-8")
    code, _, err = _run("tune", str(spec))
    assert code != 0
    assert "MDC622" in err


def test_the_docs_worked_example_and_picture_are_real(tmp_path: Path) -> None:
    """docs/tune-serving.md prints what `mdc tune` prints for the example today, and its
    picture is what --svg draws, byte for byte."""
    import re

    text = (REPO / "docs" / "tune-serving.md").read_text(encoding="utf-8")
    session = re.search(r"```\n\$ mdc (tune examples/[^\n]+)\n(.*?)```", text, re.DOTALL)
    assert session, "docs/tune-serving.md shows an `mdc tune` session"
    argv = [str(REPO / a) if a.startswith("examples/") else a for a in session[1].split()]
    picture = tmp_path / "r1.svg"
    code, out, err = _run(*argv, "--svg", str(picture))
    assert code == 0, err
    assert out == session[2]
    shown = REPO / "docs" / "img" / "tune-serving-r1-16xh200.svg"
    assert picture.read_bytes() == shown.read_bytes()


def _as_launcher(launcher: str, nnodes: int) -> dict[str, Any]:
    """The example's model and workload behind another disaggregated launcher."""
    data = tomllib.loads(EXAMPLE.read_text(encoding="utf-8"))
    del data["trtllm"]
    data["distributed"].update(launcher=launcher, nnodes=nnodes)
    if launcher == "sglang_disagg":
        data["job"]["command"] = "python3"
        data["sglang_disagg"] = {"model_path": "deepseek-ai/DeepSeek-R1"}
    else:
        data["job"]["command"] = ["vllm", "serve"]
        data["vllm_disagg"] = {"model": "deepseek-ai/DeepSeek-R1"}
    return data


@pytest.mark.parametrize("launcher", ["sglang_disagg", "vllm_disagg"])
@pytest.mark.parametrize("nnodes", [2, 5])
def test_disaggregated_launchers_are_searched(tmp_path: Path, launcher: str, nnodes: int) -> None:
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(_as_launcher(launcher, nnodes)), encoding="utf-8")
    code, out, err = _run("tune", str(spec), "--format", "json", "--top", "4")
    assert code == 0, err
    rows = json.loads(out)["candidates"]
    assert len(rows) == 4
    # the router runs beside a server: every GPU of the job serves
    serving = 8 * nnodes
    for i, row in enumerate(rows):
        assert row["launcher"] == launcher and row["mode"] == "disaggregated"
        assert row["gpus"] == serving
        explained = _explained(tmp_path, row["spec"], f"row{i}")["predicted"]
        assert {k: explained[k] for k in PREDICTED_KEYS} == {
            k: row["predicted"][k] for k in PREDICTED_KEYS
        }


def test_without_an_slo_the_pareto_front_leads(tmp_path: Path) -> None:
    spec = tmp_path / "no-slo.toml"
    spec.write_text(EXAMPLE.read_text(encoding="utf-8").split("[workload.slo]")[0])
    code, out, err = _run("tune", str(spec), "--format", "json", "--top", "15")
    assert code == 0, err
    rows = json.loads(out)["candidates"]
    front = [r for r in rows if r["pareto_front"]]
    assert front and rows[: len(front)] == front

    def point(r: dict[str, Any]) -> tuple[float, float]:
        p = r["predicted"]
        return p["output_tokens_per_s_per_gpu"], p["output_tokens_per_s_per_user"]

    for r in front:  # none of them is beaten on both axes by a printed row
        gpu, user = point(r)
        assert not any(
            g >= gpu and u >= user and (g, u) != (gpu, user) for g, u in map(point, rows)
        )
    # off the front, each is beaten on both axes by one on it
    for r in rows[len(front) :]:
        gpu, user = point(r)
        assert any(g >= gpu and u >= user for g, u in map(point, front))


def test_vllm_aggregated_deployments_compile_to_their_rows(tmp_path: Path) -> None:
    """vLLM: one API server over dp engines of tp GPUs, under an open-loop rate."""
    spec = _v70(tmp_path, {"input_tokens": 2048, "output_tokens": 512, "request_rate": 2.0})
    code, out, err = _run("tune", str(spec), "--format", "json")
    assert code == 0, err
    rows = json.loads(out)["candidates"]
    # bf16 70B: 141 GB of weights need at least 2 of the 80 GB GPUs per engine
    assert {r["roles"]["server"]["tp"] for r in rows} == {2, 4, 8}
    for i, row in enumerate(rows):
        assert row["predicted"]["requests_per_s"] == 2.0  # the rate, carried
        explained = _explained(tmp_path, row["spec"], f"row{i}")["predicted"]
        assert {k: explained[k] for k in PREDICTED_KEYS} == {
            k: row["predicted"][k] for k in PREDICTED_KEYS
        }


def test_a_batch_limit_makes_an_aggregated_server_meet_the_tpot_limit(tmp_path: Path) -> None:
    code, out, err = _run("tune", str(EXAMPLE), "--format", "json", "--top", "15")
    assert code == 0, err
    candidates = json.loads(out)["candidates"]
    limited = [r for r in candidates if r["spec"]["trtllm"].get("max_batch_size")]
    assert limited, "the example's tp 8 replicas meet 50 ms only with a batch limit (docs)"
    row = limited[0]
    limit = row["spec"]["trtllm"]["max_batch_size"]
    assert row["meets_slo"] and row["predicted"]["tpot_ms"] <= 50
    assert row["predicted"]["binding"] == "batch limit"
    # the largest limit that meets it: one more request per rank misses
    data = json.loads(json.dumps(row["spec"]))
    data["trtllm"]["max_batch_size"] = limit + 1
    assert _explained(tmp_path, data, "one-more")["predicted"]["tpot_ms"] > 50


def test_aggregated_servers_take_their_best_token_budget(tmp_path: Path) -> None:
    """Each aggregated layout is listed at the step budget (2k, 8k or 16k tokens) that
    serves best, the budget on its row and written as TensorRT-LLM's max_num_tokens; the
    row compiles and explains to itself, and no other budget does better there."""
    code, out, err = _run("tune", str(EXAMPLE), "--format", "json", "--top", "15")
    assert code == 0, err
    aggregated = [r for r in json.loads(out)["candidates"] if r["mode"] == "aggregated"]
    assert aggregated
    for i, row in enumerate(aggregated):
        budget = row["roles"]["server"]["step_tokens"]
        assert budget in (2048, 8192, 16384)
        assert row["spec"]["trtllm"]["max_num_tokens"] == budget
        explained = _explained(tmp_path, row["spec"], f"row{i}")
        assert explained["serving_memory"]["step_tokens"] == budget
        predicted = explained["predicted"]
        assert {k: predicted[k] for k in PREDICTED_KEYS} == {
            k: row["predicted"][k] for k in PREDICTED_KEYS
        }
        for other in {2048, 8192, 16384} - {budget}:
            data = json.loads(json.dumps(row["spec"]))
            data["trtllm"]["max_num_tokens"] = other
            there = _explained(tmp_path, data, f"row{i}-{other}")["predicted"]
            assert there["output_tokens_per_s_per_gpu"] <= predicted["output_tokens_per_s_per_gpu"]


def test_a_budget_the_spec_sets_is_kept(tmp_path: Path) -> None:
    data = tomllib.loads(EXAMPLE.read_text(encoding="utf-8"))
    data["trtllm"]["max_num_tokens"] = 4096
    spec = tmp_path / "set.json"
    spec.write_text(json.dumps(data), encoding="utf-8")
    code, out, err = _run("tune", str(spec), "--format", "json", "--top", "15")
    assert code == 0, err
    aggregated = [r for r in json.loads(out)["candidates"] if r["mode"] == "aggregated"]
    assert aggregated
    assert {r["roles"]["server"]["step_tokens"] for r in aggregated} == {4096}
    assert {r["spec"]["trtllm"]["max_num_tokens"] for r in aggregated} == {4096}


def test_vllm_limits_are_written_as_its_flags(tmp_path: Path) -> None:
    """vLLM's chosen budget and batch limit go into [vllm] args as --max-num-batched-tokens
    and --max-num-seqs (replacing the spec's own copies), and the rows compile to
    themselves."""
    data = tomllib.loads(EXAMPLE.read_text(encoding="utf-8"))
    del data["trtllm"]
    data["job"]["command"] = ["vllm", "serve"]
    data["distributed"]["launcher"] = "vllm"
    data["vllm"] = {"model": "deepseek-ai/DeepSeek-R1", "args": ["--max-num-seqs=999"]}
    spec = tmp_path / "vllm.json"
    spec.write_text(json.dumps(data), encoding="utf-8")
    code, out, err = _run("tune", str(spec), "--format", "json", "--top", "4")
    assert code == 0, err
    rows = json.loads(out)["candidates"]
    assert rows
    for i, row in enumerate(rows):
        args = row["spec"]["vllm"]["args"]
        assert "--max-num-seqs=999" not in args
        budget = args[args.index("--max-num-batched-tokens") + 1]
        assert int(budget) == row["roles"]["server"]["step_tokens"]
        explained = _explained(tmp_path, row["spec"], f"row{i}")["predicted"]
        assert {k: explained[k] for k in PREDICTED_KEYS} == {
            k: row["predicted"][k] for k in PREDICTED_KEYS
        }


def _tuned_with(tmp_path: Path, data: dict[str, Any], top: int = 15) -> list[dict[str, Any]]:
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(data), encoding="utf-8")
    code, out, err = _run("tune", str(spec), "--format", "json", "--top", str(top))
    assert code == 0, err
    rows: list[dict[str, Any]] = json.loads(out)["candidates"]
    return rows


def test_the_prefill_role_takes_the_budget_that_prefills_a_prompt_in_one_step(
    tmp_path: Path,
) -> None:
    """16k-token prompts: the context servers' max_num_tokens is 16k (one step per prompt),
    written in [trtllm.context]; the row compiles and explains to itself, and the engine's
    default 8k budget serves less."""
    data = tomllib.loads(EXAMPLE.read_text(encoding="utf-8"))
    data["workload"].update(input_tokens=16384)
    data["model"]["seq_length"] = 16384 + 1024
    # at 40 ms the decode servers' batch limit binds, whatever the prefill budget
    data["workload"]["slo"]["tpot_ms"] = 50
    rows = [r for r in _tuned_with(tmp_path, data, top=3) if r["mode"] == "disaggregated"]
    assert rows
    for i, row in enumerate(rows):
        assert row["roles"]["prefill"]["step_tokens"] == 16384
        assert row["spec"]["trtllm"]["context"]["max_num_tokens"] == 16384
        predicted = _explained(tmp_path, row["spec"], f"row{i}")["predicted"]
        assert {k: predicted[k] for k in PREDICTED_KEYS} == {
            k: row["predicted"][k] for k in PREDICTED_KEYS
        }
        smaller = json.loads(json.dumps(row["spec"]))
        smaller["trtllm"]["context"]["max_num_tokens"] = 8192
        there = _explained(tmp_path, smaller, f"row{i}-8k")["predicted"]
        assert there["output_tokens_per_s_per_gpu"] < predicted["output_tokens_per_s_per_gpu"]


def test_a_decode_batch_limit_makes_a_split_meet_the_tpot_limit(tmp_path: Path) -> None:
    """At TPOT <= 35 ms the decode servers meet the limit only with a batch limit: the
    largest one that meets it, written as [trtllm.generation] max_batch_size (per attention
    rank); the row compiles and explains to itself, and one more request per rank misses."""
    data = tomllib.loads(EXAMPLE.read_text(encoding="utf-8"))
    data["workload"]["slo"]["tpot_ms"] = 35
    rows = _tuned_with(tmp_path, data)
    limited = [
        r
        for r in rows
        if r["mode"] == "disaggregated" and "max_batch_size" in r["spec"]["trtllm"]["generation"]
    ]
    assert limited
    for i, row in enumerate(limited):
        limit = row["spec"]["trtllm"]["generation"]["max_batch_size"]
        decode = row["roles"]["decode"]
        assert decode["max_batch"] == limit * decode["dp"]  # the running batch, at the limit
        assert row["meets_slo"] and row["predicted"]["binding"] == "batch limit"
        predicted = _explained(tmp_path, row["spec"], f"row{i}")["predicted"]
        assert {k: predicted[k] for k in PREDICTED_KEYS} == {
            k: row["predicted"][k] for k in PREDICTED_KEYS
        }
        more = json.loads(json.dumps(row["spec"]))
        more["trtllm"]["generation"]["max_batch_size"] = limit + 1
        assert _explained(tmp_path, more, f"row{i}-more")["predicted"]["tpot_ms"] > 35


def test_limits_the_spec_sets_are_kept_on_the_roles(tmp_path: Path) -> None:
    """[trtllm] max_num_tokens and max_batch_size hold for the context and generation
    servers too: the search keeps them there."""
    data = tomllib.loads(EXAMPLE.read_text(encoding="utf-8"))
    data["trtllm"].update(max_num_tokens=4096, max_batch_size=32)
    rows = [r for r in _tuned_with(tmp_path, data) if r["mode"] == "disaggregated"]
    assert rows
    for row in rows:
        assert row["roles"]["prefill"]["step_tokens"] == 4096
        assert row["roles"]["decode"]["step_tokens"] == 4096
        assert row["roles"]["decode"]["max_batch"] <= 32 * row["roles"]["decode"]["dp"]
        table = row["spec"]["trtllm"]
        assert table["max_num_tokens"] == 4096 and table["max_batch_size"] == 32
        for role in ("context", "generation"):
            assert table[role].get("max_num_tokens", 4096) == 4096
            assert table[role].get("max_batch_size", 32) == 32


#: each disaggregated launcher's flags for the prefill budget and the decode batch limit
ROLE_FLAGS = {
    "vllm_disagg": ("--max-num-batched-tokens", "--max-num-seqs"),
    "sglang_disagg": ("--chunked-prefill-size", "--max-running-requests"),
}


def _ranks(launcher: str, role: dict[str, Any]) -> int:
    """SGLang divides its limits over the DP attention ranks (vLLM's are each engine's)."""
    if launcher == "sglang_disagg" and role.get("enable_dp_attention"):
        return int(role["dp_size"])
    return 1


@pytest.mark.parametrize("launcher", ["vllm_disagg", "sglang_disagg"])
def test_role_limits_are_written_as_each_roles_flags(tmp_path: Path, launcher: str) -> None:
    """The prefill engines' budget in [LAUNCHER.prefill] args, the decode engines' batch
    limit in [LAUNCHER.decode] args (SGLang's times its DP attention ranks); the rows
    explain to themselves."""
    data = _as_launcher(launcher, 2)
    data["workload"]["slo"]["tpot_ms"] = 35
    rows = _tuned_with(tmp_path, data, top=6)
    assert rows
    budget_flag, cap_flag = ROLE_FLAGS[launcher]
    limited = 0
    for i, row in enumerate(rows):
        prefill = row["spec"][launcher]["prefill"]
        budget = int(prefill["args"][prefill["args"].index(budget_flag) + 1])
        assert budget == row["roles"]["prefill"]["step_tokens"] * _ranks(launcher, prefill)
        decode = row["spec"][launcher]["decode"]
        if cap_flag in decode.get("args", []):
            limited += 1
            cap = int(decode["args"][decode["args"].index(cap_flag) + 1])
            # the running batch at the limit: the whole server's
            per_engine = cap // _ranks(launcher, decode)
            engines = row["roles"]["decode"]["dp"]
            assert row["roles"]["decode"]["max_batch"] == per_engine * engines
        predicted = _explained(tmp_path, row["spec"], f"row{i}")["predicted"]
        assert {k: predicted[k] for k in PREDICTED_KEYS} == {
            k: row["predicted"][k] for k in PREDICTED_KEYS
        }
    assert limited


def _v70_kv_bound(tmp_path: Path) -> Path:
    """Llama 3.3 70B (bf16) behind vLLM on 8 H100s with 1,024 requests in flight: the
    engines' KV caches, not the HBM, bound the running batch at the default share."""
    workload = {"input_tokens": 2048, "output_tokens": 512, "concurrency": 1024}
    return _v70(tmp_path, {**workload, "slo": {"tpot_ms": 100}})


def _v70(tmp_path: Path, workload: dict[str, Any]) -> Path:
    """A spec of Llama 3.3 70B (bf16) behind vLLM on 8 H100s under ``workload``."""
    data = {
        "job": {"name": "v70", "command": ["vllm", "serve"]},
        "distributed": {
            "launcher": "vllm",
            "backend": "local",
            "nnodes": 1,
            "nproc_per_node": 8,
            "accelerator_model": "h100-sxm",
        },
        "model": {"name": "meta-llama/Llama-3.3-70B-Instruct", "seq_length": 4096},
        "vllm": {"model": "meta-llama/Llama-3.3-70B-Instruct"},
        "workload": workload,
    }
    spec = tmp_path / "v70.json"
    spec.write_text(json.dumps(data), encoding="utf-8")
    return spec


def _memory_share(role: dict[str, Any], row: dict[str, Any], tmp_path: Path) -> float:
    """The share the role's engine runs at, as the row's spec compiles it."""
    if role["memory_share"] is not None:
        return float(role["memory_share"])
    return float(_explained(tmp_path, row["spec"], "shares")["serving_memory"]["share"])


def _spec_file(tmp_path: Path, row: dict[str, Any]) -> Path:
    path = tmp_path / "row.json"
    path.write_text(json.dumps(row["spec"]), encoding="utf-8")
    return path


def test_the_share_is_raised_where_kv_capacity_binds_and_kept_where_not(
    tuned: dict[str, Any], tmp_path: Path
) -> None:
    """The example's rows at a 60 ms TPOT limit (at 50 ms a larger share's batch of a tp 8
    decode server misses the limit): those bound by HBM bandwidth or queueing keep the
    engine's default 0.9; a split whose decode server's KV cache binds gets a larger
    free_gpu_memory_fraction, which holds more requests (the same spec at 0.9 holds fewer
    and serves less), and leaves TensorRT-LLM room for its CUDA graphs outside it."""
    data = tomllib.loads(EXAMPLE.read_text(encoding="utf-8"))
    data["workload"]["slo"]["tpot_ms"] = 60
    spec = tmp_path / "slo60.json"
    spec.write_text(json.dumps(data), encoding="utf-8")
    code, out, err = _run("tune", str(spec), "--format", "json", "--top", "8")
    assert code == 0, err
    rows = json.loads(out)["candidates"]
    kept = [r for r in rows if r["predicted"]["binding"] in ("HBM bandwidth", "queueing")]
    bound = [r for r in rows if r["predicted"]["binding"] == "KV capacity"]
    assert kept and bound
    for row in kept:
        assert all(_memory_share(role, row, tmp_path) == 0.9 for role in row["roles"].values())
    for row in bound:
        decode = row["roles"]["decode"]
        share = _memory_share(decode, row, tmp_path)
        assert share in (0.92, 0.95)
        generation = row["spec"]["trtllm"]["generation"]
        config = generation["extra_llm_api_options"]["kv_cache_config"]
        assert config == {"dtype": "fp8", "free_gpu_memory_fraction": share}
        # the same deployment at the engine's default share
        default = json.loads(json.dumps(row["spec"]))
        del default["trtllm"]["generation"]["extra_llm_api_options"]
        at_default = _explained(tmp_path, default, "default")
        at_share = _explained(tmp_path, row["spec"], "raised")
        assert at_default["serving_memory"]["share"] == 0.9
        assert at_share["predicted"]["batch"]["decode"] > at_default["predicted"]["batch"]["decode"]
        more = at_share["predicted"]["output_tokens_per_s_per_gpu"]
        assert more > at_default["predicted"]["output_tokens_per_s_per_gpu"]
        # what the share leaves of the free memory holds the CUDA graphs (1.3 GiB)
        m = at_share["serving_memory"]
        assert m["share"] == share
        free = m["capacity"] - m["weights"] - m["workspace"]
        assert (1 - share) * free >= 1.3 * 2**30


def test_a_vllm_share_is_written_as_its_flag_and_parsed_as_vllm_parses_it(
    tmp_path: Path,
) -> None:
    """vLLM's engines whose KV caches bind: --write gives --gpu-memory-utilization in [vllm]
    args, which the rebuilt vLLM CLI parses to the chosen share; the written spec compiles
    and explains to the first row. The share leaves vLLM's CUDA context and graphs
    (0.7 + 1.3 GiB) outside it."""
    from tests.conformance.test_serving_flags import VLLM_FLAGS, VLLM_PROGRAMS, parse, server_argv

    best = tmp_path / "best.json"
    code, out, err = _run(
        "tune", str(_v70_kv_bound(tmp_path)), "--format", "json", "--write", str(best)
    )
    assert code == 0, err
    first = json.loads(out)["candidates"][0]
    assert first["predicted"]["binding"] == "KV capacity"
    written = json.loads(best.read_text(encoding="utf-8"))
    args = written["vllm"]["args"]
    share = float(args[args.index("--gpu-memory-utilization") + 1])
    assert share in (0.92, 0.95)
    compiled = COMPILER.compile(best)
    parsed = parse(VLLM_FLAGS, VLLM_PROGRAMS, server_argv(compiled))
    assert parsed.gpu_memory_utilization == share
    explained: dict[str, Any] = plan_json(compiled.plan, compiled.launch)
    assert {k: explained["predicted"][k] for k in PREDICTED_KEYS} == {
        k: first["predicted"][k] for k in PREDICTED_KEYS
    }
    m = explained["serving_memory"]
    assert m["share"] == share and (1 - share) * m["capacity"] >= 2.0 * 2**30


@pytest.mark.parametrize(
    ("launcher", "flag"),
    [("sglang_disagg", "--mem-fraction-static"), ("vllm_disagg", "--gpu-memory-utilization")],
)
def test_a_decode_roles_share_is_written_in_its_own_args(
    tmp_path: Path, launcher: str, flag: str
) -> None:
    """A split whose decode servers' KV caches bind: the decode role's args carry the
    engine's own flag at the raised share, the prefill role's keep the default (SGLang's:
    the share it picks itself for an 8-GPU H200 prefill server of DeepSeek-R1, 0.893, below
    the estimate's 0.9); the node script passes the raised share to the decode servers, and
    the row explains to itself."""
    data = _as_launcher(launcher, 2)
    data["workload"]["slo"]["tpot_ms"] = 60  # a raised share's batch meets it
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(data), encoding="utf-8")
    code, out, err = _run("tune", str(spec), "--format", "json", "--top", "6")
    assert code == 0, err
    rows = [r for r in json.loads(out)["candidates"] if r["predicted"]["binding"] == "KV capacity"]
    assert rows
    for i, row in enumerate(rows):
        share = row["roles"]["decode"]["memory_share"]
        # SGLang's decode servers: what it picks itself (its reserve is the 10 GiB floor)
        assert share == 0.929 if launcher == "sglang_disagg" else share in (0.92, 0.95)
        decode_args = row["spec"][launcher]["decode"]["args"]
        assert decode_args[decode_args.index(flag) + 1] == f"{share:g}"
        prefill_args = row["spec"][launcher]["prefill"].get("args", [])
        if launcher == "sglang_disagg":
            # SGLang's reserve: 512 + 8,192 x 1.5 + 8 / 8 x 1,024 + 1,536 (MLA prefill
            # graphs) = 15,360 of 143,771 MiB
            assert prefill_args[prefill_args.index(flag) + 1] == "0.893"
        else:
            assert flag not in prefill_args
        out_dir = tmp_path / f"out{i}"
        assert _run("compile", str(_spec_file(tmp_path, row)), "-o", str(out_dir))[0] == 0
        script = "\n".join(p.read_text() for p in (out_dir / "launch").glob("*.sh"))
        assert f"{flag} {share:g}" in script
        explained = _explained(tmp_path, row["spec"], f"row{i}")["predicted"]
        assert {k: explained[k] for k in PREDICTED_KEYS} == {
            k: row["predicted"][k] for k in PREDICTED_KEYS
        }


@pytest.mark.parametrize("kv_config", [True, False])
def test_an_aggregated_trtllm_share_is_written_where_trtllm_reads_it(
    tmp_path: Path, kv_config: bool
) -> None:
    """TensorRT-LLM's share of an aggregated server: free_gpu_memory_fraction inside the
    spec's kv_cache_config (which replaces the command line's), else trtllm-serve's
    --kv_cache_free_gpu_memory_fraction; either way the plan's estimate runs at it."""
    from mdc.tune.serving_layouts import write_share
    from mdc.tune.serving_records import Role

    data = tomllib.loads(EXAMPLE.read_text(encoding="utf-8"))
    data["parallelism"] = {"tp": 8, "pp": 1}
    data["distributed"]["nnodes"] = 1
    if not kv_config:
        del data["trtllm"]["extra_llm_api_options"]
    write_share("trtllm", data, Role(name="server", servers=1, gpus=8, tp=8, share=0.95))
    out_dir = tmp_path / "out"
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(data), encoding="utf-8")
    assert _run("compile", str(spec), "-o", str(out_dir))[0] == 0
    script = "\n".join(p.read_text(encoding="utf-8") for p in out_dir.rglob("*.sh"))
    if kv_config:
        (path,) = out_dir.rglob("*.yaml")
        lines = path.read_text(encoding="utf-8").splitlines()
        options = json.loads("\n".join(x for x in lines if not x.startswith("#")))
        assert options["kv_cache_config"] == {"dtype": "fp8", "free_gpu_memory_fraction": 0.95}
        assert "--kv_cache_free_gpu_memory_fraction" not in script
    else:
        assert "--kv_cache_free_gpu_memory_fraction 0.95" in script
    assert _explained(tmp_path, data, "aggregated")["serving_memory"]["share"] == 0.95


def test_sglang_shares_never_pass_what_sglang_picks_itself(tmp_path: Path) -> None:
    """DeepSeek-R1 on two 8-GPU H200 servers behind SGLang: no role is written a share above
    the one SGLang picks itself for its layout (server_args.py: prefill 0.893, decode 0.929,
    decode with DP attention over 8 ranks 0.833), and a role whose own is below 0.9 is
    predicted and written at it."""
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(_as_launcher("sglang_disagg", 2)), encoding="utf-8")
    code, out, err = _run("tune", str(spec), "--format", "json", "--top", "8")
    assert code == 0, err
    rows = json.loads(out)["candidates"]
    assert {r["roles"]["decode"]["dp"] for r in rows} == {1, 8}
    for row in rows:
        prefill, decode = row["roles"]["prefill"], row["roles"]["decode"]
        assert prefill["memory_share"] == 0.893
        if decode["dp"] == 8:
            assert decode["memory_share"] == 0.833
        else:
            assert decode["memory_share"] in (None, 0.9, 0.929)
        args = row["spec"]["sglang_disagg"]["prefill"]["args"]
        assert args[args.index("--mem-fraction-static") + 1] == "0.893"


def _small_dense_split(tmp_path: Path, accelerator: str) -> Path:
    """Llama 3.1 8B behind SGLang on one 8-GPU node, 32k-token prompts, 2,048 in flight:
    the decode servers' KV caches bind."""
    data = {
        "job": {"name": "s8", "command": "python3"},
        "distributed": {
            "launcher": "sglang_disagg",
            "backend": "local",
            "nnodes": 1,
            "nproc_per_node": 8,
            "accelerator_model": accelerator,
        },
        "model": {"name": "meta-llama/Llama-3.1-8B-Instruct", "seq_length": 36864},
        "sglang_disagg": {"model_path": "meta-llama/Llama-3.1-8B-Instruct"},
        "workload": {"input_tokens": 32768, "output_tokens": 4096, "concurrency": 2048},
    }
    spec = tmp_path / f"s8-{accelerator}.json"
    spec.write_text(json.dumps(data), encoding="utf-8")
    return spec


def test_a_small_dense_models_sglang_decode_share_is_raised_where_its_rule_allows(
    tmp_path: Path,
) -> None:
    """A small dense model's SGLang decode servers reserve only the 10 GiB floor: on an H200
    a KV-bound decode role is raised to the share SGLang picks itself, 0.929 (never 0.95);
    on an 80 GB H100 that is 0.874, below 0.9, which the search keeps."""
    found = {}
    for accelerator in ("h200", "h100-sxm"):
        path = _small_dense_split(tmp_path, accelerator)
        code, out, err = _run("tune", str(path), "--format", "json", "--top", "8")
        assert code == 0, err
        rows = json.loads(out)["candidates"]
        bound = [r for r in rows if r["predicted"]["binding"] == "KV capacity"]
        assert bound
        found[accelerator] = {r["roles"]["decode"]["memory_share"] for r in bound}
    assert found == {"h200": {0.929}, "h100-sxm": {0.874}}


def _without_shares(spec: dict[str, Any], launcher: str) -> dict[str, Any]:
    """The spec with every role's --mem-fraction-static dropped (SGLang picks its own)."""
    data: dict[str, Any] = json.loads(json.dumps(spec))
    for role in ("prefill", "decode"):
        args = data[launcher][role].get("args", [])
        if "--mem-fraction-static" in args:
            at = args.index("--mem-fraction-static")
            data[launcher][role]["args"] = args[:at] + args[at + 2 :]
    return data


def test_an_sglang_spec_without_a_share_explains_as_its_row(tmp_path: Path) -> None:
    """DeepSeek-R1 on two 8-GPU H200 servers behind SGLang: each row's spec with its shares
    dropped explains at the shares SGLang picks itself, the row's own (prefill 0.893, decode
    0.929, 0.833 with DP attention), and predicts what the row predicts."""
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(_as_launcher("sglang_disagg", 2)), encoding="utf-8")
    code, out, err = _run("tune", str(spec), "--format", "json", "--top", "4")
    assert code == 0, err
    rows = json.loads(out)["candidates"]
    assert {r["roles"]["decode"]["memory_share"] for r in rows} >= {0.833, 0.929}
    for i, row in enumerate(rows):
        bare = _without_shares(row["spec"], "sglang_disagg")
        assert "--mem-fraction-static" not in json.dumps(bare)
        explained = _explained(tmp_path, bare, f"bare{i}")
        memory = explained["serving_memory"]
        # both roles' servers have 8 GPUs: the estimate is the decode role's
        assert memory["share"] == row["roles"]["decode"]["memory_share"]
        assert memory["share_source"].startswith("SGLang's own")
        assert memory["roles"]["prefill"]["share"] == row["roles"]["prefill"]["memory_share"]
        assert {k: explained["predicted"][k] for k in PREDICTED_KEYS} == {
            k: row["predicted"][k] for k in PREDICTED_KEYS
        }


@pytest.mark.parametrize("launcher", ["vllm_disagg", "trtllm"])
def test_a_spec_without_a_share_explains_at_the_searchs_default(
    tmp_path: Path, launcher: str
) -> None:
    """vLLM's --gpu-memory-utilization and TensorRT-LLM's free_gpu_memory_fraction (its
    KvCacheConfig default) where the spec sets neither: the search's default, 0.9 (of the
    GPU; of what the weights leave)."""
    from mdc.tune.serving_search import DEFAULT_SHARE, SHARE

    if launcher == "trtllm":
        data = tomllib.loads(EXAMPLE.read_text(encoding="utf-8"))
    else:
        data = _as_launcher(launcher, 2)
    memory = _explained(tmp_path, data, launcher)["serving_memory"]
    share_of, share = SHARE.get(launcher, ("capacity", DEFAULT_SHARE))
    assert (memory["share"], memory.get("share_of", "capacity")) == (share, share_of)
    assert share == DEFAULT_SHARE == 0.9


def test_where_no_server_holds_a_request_the_search_names_the_closest(tmp_path: Path) -> None:
    # Llama 3.3 70B (bf16) on 2 H100s with a 120,000-token prompt: tp 2 holds the weights,
    # but not one request's KV cache beside them
    spec = _v70(tmp_path, {"input_tokens": 120_000, "output_tokens": 1024, "concurrency": 1})
    data = json.loads(spec.read_text(encoding="utf-8"))
    data["distributed"]["nproc_per_node"] = 2
    data["model"]["seq_length"] = 121_024
    spec.write_text(json.dumps(data), encoding="utf-8")
    code, out, err = _run("tune", str(spec))
    assert (code, out) == (1, "")
    assert "0 fit memory): none holds its weights and one request's KV cache" in err
    assert "refused" not in err  # nothing reached the compiler
    # Llama 3 70B's cache per token: 80 layers x 8 KV heads x 128 x (K, V) x 2 bytes, half
    # of the heads on each GPU of tp 2
    needed = 121_024 * 80 * 8 * 128 * 2 * 2 / 2 / 2**30
    assert f"one request of 121,024 tokens needs {needed:.1f} GiB of KV cache" in err
    # the closest is tp 2, with the room compile's estimate of it leaves
    data["vllm"]["args"] = ["--tensor-parallel-size", "2"]
    memory = _explained(tmp_path, data, "tp2")["serving_memory"]
    assert 0 < memory["cache"] < needed * 2**30
    assert f"The closest, 1x tp2: {memory['weights'] / 2**30:.1f} GiB of weights" in err
    assert f"leave {memory['cache'] / 2**30:.1f} GiB for the KV cache" in err


def test_where_the_weights_overfill_every_server_the_search_says_so(tmp_path: Path) -> None:
    # DeepSeek-R1 (671B parameters, FP8: a byte each) on 2 H200s: over 300 GiB a GPU
    data = tomllib.loads(EXAMPLE.read_text(encoding="utf-8"))
    data["distributed"].update(nnodes=1, nproc_per_node=2)
    spec = tmp_path / "r1-on-2.json"
    spec.write_text(json.dumps(data), encoding="utf-8")
    code, _, err = _run("tune", str(spec))
    assert code == 1
    said = err.split("The closest, 1x tp2: ")[1]
    weights = float(said.split(" GiB of weights per GPU")[0])
    assert weights > 671e9 / 2 / 2**30 * 0.95
    assert "overfill a 140.4 GiB GPU" in said
    # --format json says the same on stdout: no candidates, what was searched, and why
    code, out, err = _run("tune", str(spec), "--format", "json")
    found = json.loads(out)
    assert code == 1 and found["candidates"] == []
    assert found["searched"]["fit_memory"] == 0 and found["why"] == err.strip()


def test_where_the_compiler_refuses_every_deployment_it_says_why(tmp_path: Path) -> None:
    spec = _v70(tmp_path, {"input_tokens": 1024, "output_tokens": 256, "concurrency": 8})
    data = json.loads(spec.read_text(encoding="utf-8"))
    del data["vllm"]["model"]  # every deployment is refused for it
    spec.write_text(json.dumps(data), encoding="utf-8")
    code, _, err = _run("tune", str(spec))
    assert code == 1
    assert "refused by the compiler: MDC360 x" in err and "the compiler on the best of them:" in err
    assert "error[MDC360]" in err


def _disaggregated(tmp_path: Path, launcher: str, model: str, gpus: int) -> Path:
    """``model`` (FP8) behind a disaggregated launcher on ``gpus`` H100s, 8k/1k prompts."""
    data = _as_launcher(launcher, 1)
    data["distributed"]["nproc_per_node"] = gpus
    data["distributed"]["accelerator_model"] = "h100-sxm"
    data["model"] = {"name": model, "dtype": "fp8", "seq_length": 9216}
    data[launcher] = {"model_path" if launcher == "sglang_disagg" else "model": model}
    spec = tmp_path / "split.json"
    spec.write_text(json.dumps(data), encoding="utf-8")
    return spec


@pytest.mark.parametrize("launcher", ["vllm_disagg", "sglang_disagg"])
def test_where_one_server_takes_every_gpu_the_search_says_a_split_needs_two(
    tmp_path: Path, launcher: str
) -> None:
    spec = _disaggregated(tmp_path, launcher, "meta-llama/Llama-3.1-8B-Instruct", 1)
    code, _, err = _run("tune", str(spec))
    assert code == 1
    assert (
        "a prefill/decode split needs a server of each role, and the smallest server that "
        "holds a request, tp1 (1 GPU), leaves too few of the 1 GPUs for another"
    ) in err


def test_where_sglangs_own_share_leaves_no_room_the_search_names_the_role(
    tmp_path: Path,
) -> None:
    # Llama 3.3 70B (FP8) on 2 H100s behind sglang_disagg: one GPU a role, each holding all
    # 70 GB of weights; at a share of 0.9 a role would keep 6 GiB for the cache, but at the
    # share SGLang picks itself for it, less than one request takes
    spec = _disaggregated(tmp_path, "sglang_disagg", "meta-llama/Llama-3.3-70B-Instruct", 2)
    code, _, err = _run("tune", str(spec))
    assert code == 1
    said = err.split("none holds its weights and one request's KV cache. The closest, ")[1]
    assert said.startswith("P 1x tp1") and ", in its prefill servers: " in said
    left = float(said.split(" GiB for the KV cache")[0].split(" leave ")[1])
    # 80 layers x 8 KV heads x 128 x (K, V) x 2 bytes a token, all of them on one GPU
    needed = 9216 * 80 * 8 * 128 * 2 * 2 / 2**30
    assert f"one request of 9,216 tokens needs {needed:.1f} GiB of KV cache" in said
    assert 0 <= left < needed
