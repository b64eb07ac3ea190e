"""The accelerator catalogue and [distributed] accelerator_model."""

from __future__ import annotations

import io
import json
import tomllib
from pathlib import Path

import pytest
from tests.tools import REPO

from mdc.cli import main
from mdc.hardware import builtin, schema_errors
from mdc.package_data import package_text

REQUIRED = (
    "a100-40gb", "a100-80gb", "h100-sxm", "h100-pcie", "h100-nvl", "h200", "b200", "b300",
    "gb200", "gb300", "mi300x", "mi325x", "mi355x",
)  # fmt: skip
#: PCIe cards deployed as NVLink-bridged pairs
BRIDGED = ("h100-pcie", "h100-nvl")


def test_the_catalogue_file_passes_its_schema() -> None:
    raw = tomllib.loads(package_text("mdc.hardware", "catalogue.toml"))
    assert schema_errors(raw) == []


def test_the_schema_rejects_a_missing_source_and_sparse_keys() -> None:
    raw = tomllib.loads(package_text("mdc.hardware", "catalogue.toml"))
    entry = dict(raw["h100-sxm"])
    entry["sources"] = {k: v for k, v in entry["sources"].items() if k != "compute"}
    entry["dense_tflops"] = {**entry["dense_tflops"], "fp8_sparse": 3958}
    errors = schema_errors({"h100-sxm": entry})
    assert any("compute" in e for e in errors) and any("fp8_sparse" in e for e in errors)


def test_every_required_accelerator_is_there_with_sources() -> None:
    known = builtin()
    assert set(REQUIRED) <= set(known)
    for ident in REQUIRED:
        entry = known[ident]
        required = {"compute", "memory", "scale_up", "scale_out", "arch"}
        assert entry.compute_capability is not None
        optional = {"memory_exposed"} | ({"multiprocessors"} if entry.multiprocessors else set())
        assert required <= set(entry.sources) <= required | optional
        assert (entry.multiprocessors is None) == ("multiprocessors" not in entry.sources)
        assert all(url.startswith("https://") for url in entry.sources.values())
        assert entry.dense_tflops["bf16"] > 0


def test_the_architecture_is_what_megatron_reads() -> None:
    """get_device_arch_version's major: Blackwell is 10; Ampere, Hopper and ROCm's CDNA 3 and
    4 (torch reports gfx942 as 9.4, gfx950 as 9.5) are below it."""
    majors = {ident: entry.arch_major for ident, entry in builtin().items()}
    assert {ident for ident, major in majors.items() if major is not None and major >= 10} == {
        "b200", "gb200", "b300", "gb300"
    }  # fmt: skip
    assert majors["h100-sxm"] == 9 and majors["a100-40gb"] == 8 and majors["mi355x"] == 9


def test_memory_is_what_the_device_exposes_not_the_datasheet_gb() -> None:
    """nvidia-smi / rocm-smi totals: a little under the datasheet's decimal GB read as GiB."""
    exposed_mib = {
        "a100-40gb": 40960, "a100-80gb": 81920, "h100-sxm": 81559, "h100-pcie": 81559,
        "h100-nvl": 95830, "h200": 143771,
        "b200": 183359, "b300": 275040, "gb200": 189471, "gb300": 284208,
    }  # fmt: skip
    known = builtin()
    for ident, mib in exposed_mib.items():
        assert known[ident].memory_gib == pytest.approx(mib / 1024, abs=0.01), ident
    assert known["mi300x"].memory_gib == pytest.approx(206141652992 / 2**30, abs=0.01)
    assert known["mi355x"].memory_gib == pytest.approx(309220868096 / 2**30, abs=0.01)


def test_rack_scale_systems_have_a_72_gpu_domain() -> None:
    known = builtin()
    assert known["gb200"].scale_up_domain == known["gb300"].scale_up_domain == 72
    assert all(known[i].scale_up_domain == 2 for i in BRIDGED)
    eight = [i for i in REQUIRED if not i.startswith("gb") and i not in BRIDGED]
    assert all(known[i].scale_up_domain == 8 for i in eight)


def test_the_h100_pcie_cards_are_the_datasheets_dense_halves() -> None:
    """NVIDIA's tables print the sparse peaks (PCIe: TF32 756, BF16 1,513, FP8 3,026; NVL:
    835, 1,671, 3,341 TFLOPS); HBM 2.0 and 3.9 TB/s; the NVLink bridge 600 GB/s both ways."""
    known = builtin()
    for ident, (tf32, bf16, fp8, hbm) in {
        "h100-pcie": (756, 1513, 3026, 2000),
        "h100-nvl": (835, 1671, 3341, 3900),
    }.items():
        entry = known[ident]
        assert entry.dense_tflops["tf32"] == tf32 / 2
        assert entry.dense_tflops["bf16"] == pytest.approx(bf16 / 2, abs=0.05)
        assert entry.dense_tflops["fp8"] == fp8 / 2
        assert entry.memory_bandwidth_gb_s == hbm and entry.scale_up_gb_s == 600 / 2
        assert entry.compute_capability == "9.0" and entry.arch_major == 9
    assert known["h100-pcie"].multiprocessors == 114 and known["h100-nvl"].multiprocessors == 132


def test_fp8_is_twice_bf16_and_fp4_only_where_it_exists() -> None:
    """Dense peaks, not the sparse ones NVIDIA prints first: fp8 = 2 x bf16 on every chip
    that has it; fp4 exists from Blackwell and CDNA 4 on."""
    for ident, entry in builtin().items():
        if "fp8" in entry.dense_tflops:
            assert entry.dense_tflops["fp8"] == pytest.approx(2 * entry.dense_tflops["bf16"], 0.01)
        has_fp4 = ident.startswith(("b", "gb")) or ident == "mi355x"
        assert ("fp4" in entry.dense_tflops) == has_fp4, ident


#: the system pages' totals, PFLOPS: (GPUs, bf16 sparse, fp8 sparse, fp4 dense) of HGX B200,
#: HGX B300, GB200 NVL72 and GB300 NVL72 (nvidia.com/en-us/data-center/hgx/, .../gb200-nvl72/,
#: .../gb300-nvl72/; GB200 NVL72's fp4 printed sparse only, 1,440)
SYSTEM_PFLOPS = {
    "b200": (8, 36, 72, 72),
    "b300": (8, 36, 72, 108),
    "gb200": (72, 360, 720, 1440 / 2),
    "gb300": (72, 360, 720, 1080),
}


def test_blackwell_peaks_are_the_system_pages_totals_per_gpu() -> None:
    """Each Blackwell chip's dense peaks are its system's totals over its GPUs (the sparse
    ones halved): Blackwell Ultra keeps Blackwell's bf16 and fp8 and runs fp4 1.5x."""
    known = builtin()
    for ident, (gpus, bf16, fp8, fp4) in SYSTEM_PFLOPS.items():
        peaks = known[ident].dense_tflops
        assert peaks["bf16"] == pytest.approx(bf16 * 1e3 / gpus / 2), ident
        assert peaks["fp8"] == pytest.approx(fp8 * 1e3 / gpus / 2), ident
        assert peaks["fp4"] == pytest.approx(fp4 * 1e3 / gpus), ident
    for ultra, base in (("b300", "b200"), ("gb300", "gb200")):
        assert known[ultra].dense_tflops["fp8"] == known[base].dense_tflops["fp8"]
        assert known[ultra].dense_tflops["fp4"] == 1.5 * known[base].dense_tflops["fp4"]


def _run(spec: str, *args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main([*args, spec], stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def _spec(tmp_path: Path, distributed: str) -> str:
    text = (REPO / "examples" / "tune-llama70b-64xh100.toml").read_text(encoding="utf-8")
    text = text.replace('accelerator_model = "h100-sxm"\n', distributed)
    path = tmp_path / "spec.toml"
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_accelerator_model_sets_the_memory_limit(tmp_path: Path) -> None:
    code, out, _ = _run(_spec(tmp_path, 'accelerator_model = "h100-sxm"\n'), "explain")
    # the GiB the device exposes (nvidia-smi: 81559 MiB), not the datasheet's 80 GB
    assert code == 0 and "of 79.6475 GiB" in out
    code, out, _ = _run(_spec(tmp_path, 'accelerator_model = "mi300x"\n'), "explain")
    # rocm-smi: 206141652992 bytes
    assert code == 0 and "of 191.984 GiB" in out and "accelerator amd" in out


@pytest.mark.parametrize(("model", "limit"), [("h100-pcie", "79.6475"), ("h100-nvl", "93.584")])
def test_a_pcie_h100_compiles_and_explains(tmp_path: Path, model: str, limit: str) -> None:
    """Memory fits read the GiB the card exposes (81559 and 95830 MiB), and the prediction
    names the card."""
    spec = _spec(tmp_path, f'accelerator_model = "{model}"\n')
    code, _, err = _run(spec, "compile", "-o", str(tmp_path / "out"))
    assert code == 0, err
    plan = json.loads((tmp_path / "out" / "plan.json").read_text(encoding="utf-8"))
    assert plan["parallelism"]["tp"] == 8
    code, out, _ = _run(spec, "explain")
    name = builtin()[model].name
    assert code == 0 and f"of {limit} GiB" in out and f"predicted on {name}" in out


def test_tensor_parallel_past_the_bridged_pair_is_priced_off_nvlink(tmp_path: Path) -> None:
    """On NVLink-bridged pairs only two GPUs share the 300 GB/s link: mdc tune keeps
    Llama-3-70B's tensor parallel on the pair, tp 2, on 64 H100 NVL in nodes of 8 (before,
    the whole node was priced as one NVLink domain and tp 4 came out first)."""
    spec = _spec(tmp_path, 'accelerator_model = "h100-nvl"\n')
    code, out, err = _run(spec, "tune", "--format", "json", "--top", "1")
    assert code == 0, err
    assert json.loads(out)["candidates"][0]["parallelism"]["tp"] == 2


def test_an_explicit_memory_wins(tmp_path: Path) -> None:
    spec = _spec(tmp_path, 'accelerator_model = "h100-sxm"\naccelerator_memory_gib = 79\n')
    code, out, _ = _run(spec, "explain")
    assert code == 0 and "of 79 GiB" in out


def test_the_estimate_is_checked_against_the_model_memory(tmp_path: Path) -> None:
    """On A100 40GB, Llama-3-70B at tp 8, pp 8 with 8k sequences keeps its model state in
    memory but its estimated activations do not fit: a warning (MDC262), not a refusal."""
    code, _, err = _run(_spec(tmp_path, 'accelerator_model = "a100-40gb"\n'), "validate")
    assert code == 0 and "MDC262" in err and "accelerator_memory_gib = 40" in err


def test_an_unknown_model_is_located_and_lists_the_known_ones(tmp_path: Path) -> None:
    code, _, err = _run(_spec(tmp_path, 'accelerator_model = "h100"\n'), "validate")
    assert code == 1
    assert "spec.toml:16:21: error[MDC600]" in err and "h100-sxm" in err


def test_a_contradicting_vendor_is_refused(tmp_path: Path) -> None:
    spec = _spec(tmp_path, 'accelerator = "nvidia"\naccelerator_model = "mi355x"\n')
    code, _, err = _run(spec, "validate")
    assert code == 1 and "MDC601" in err and 'accelerator = "amd"' in err


def test_the_schema_refuses_a_malformed_id(tmp_path: Path) -> None:
    code, _, err = _run(_spec(tmp_path, 'accelerator_model = "H100 SXM"\n'), "validate")
    assert code == 1 and "/distributed/accelerator_model" in err


@pytest.mark.parametrize(
    ("model", "dtype", "megatron", "refused"),
    [
        # Ampere has no FP8 tensor cores (Transformer Engine: compute capability 8.9 or higher)
        ("a100-80gb", "fp8", "", True),
        ("h100-sxm", "fp8", "", False),
        ("mi300x", "fp8", "", False),
        # FP4 GEMMs need Blackwell or CDNA 4 (Transformer Engine: compute capability 10.0)
        ("h100-sxm", "bf16", 'fp4_format = "e2m1"\n', True),
        ("mi325x", "bf16", 'fp4_format = "e2m1"\n', True),
        ("b200", "bf16", 'fp4_format = "e2m1"\n', False),
        ("a100-80gb", "bf16", "", False),
    ],
)
def test_quantized_gemms_need_the_chips_tensor_cores(
    tmp_path: Path, model: str, dtype: str, megatron: str, refused: bool
) -> None:
    spec = _spec(tmp_path, f'accelerator_model = "{model}"\n')
    text = Path(spec).read_text(encoding="utf-8").replace('dtype = "bf16"', f'dtype = "{dtype}"')
    Path(spec).write_text(text + (f"\n[megatron]\n{megatron}" if megatron else ""), "utf-8")
    code, _, err = _run(spec, "validate")
    assert ("error[MDC602]" in err) == refused, err
    if refused:
        pointer = "/model/dtype" if dtype != "bf16" else "/distributed/accelerator_model"
        assert code == 1 and f"(at {pointer})" in err


@pytest.mark.parametrize(
    ("model", "refused"), [("h100-sxm", True), ("mi300x", True), ("b200", False), ("mi355x", False)]
)
def test_mxfp8_needs_block_scaled_tensor_cores(tmp_path: Path, model: str, refused: bool) -> None:
    spec = _spec(tmp_path, f'accelerator_model = "{model}"\n')
    text = Path(spec).read_text(encoding="utf-8").replace('dtype = "bf16"', 'dtype = "fp8"')
    Path(spec).write_text(text + '\n[megatron]\nfp8_recipe = "mxfp8"\n', "utf-8")
    code, _, err = _run(spec, "validate")
    assert ("error[MDC602]" in err) == refused, err
    if refused:
        assert code == 1 and "(at /megatron/fp8_recipe)" in err
