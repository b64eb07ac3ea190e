"""The accelerator catalogue: what ``[distributed] accelerator_model`` names.

mdc's own entries are package data (``catalogue.toml``, checked against
``hardware.schema.json`` by the tests); plugins add more through the
``mdc_register_hardware`` hook. Each entry gives the dense peak TFLOP/s per
precision, the HBM capacity and bandwidth, and the per-GPU bandwidth of the
scale-up (NVLink / Infinity Fabric) and scale-out (NIC) networks.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import attrs

from mdc.package_data import package_text
from mdc.spec import NetworkTable


@attrs.frozen(kw_only=True)
class Accelerator:
    """One accelerator model; bandwidths are per GPU, one direction, in GB/s."""

    id: str
    name: str
    vendor: str
    memory_gib: float
    memory_bandwidth_gb_s: float
    #: precision ("bf16", "fp8", "fp4", ...) -> dense tensor peak in TFLOP/s
    dense_tflops: Mapping[str, float]
    #: GPUs on one scale-up network (8, or 72 for an NVL72 rack)
    scale_up_domain: int
    scale_up_gb_s: float
    scale_out_gb_s: float
    #: "major.minor" as torch.cuda.get_device_properties reports it (9.0 for Hopper, 10.0
    #: for Blackwell); None where the entry does not say
    compute_capability: str | None = None
    #: streaming multiprocessors (NVIDIA SMs; AMD compute units) on the chip; None where the
    #: entry does not say (what a kernel that runs one tile per SM spreads its tiles over)
    multiprocessors: int | None = None
    #: field group ("compute", "memory", "scale_up", "scale_out", "arch") -> public source URL
    sources: Mapping[str, str] = attrs.field(factory=dict)

    @property
    def arch_major(self) -> int | None:
        """The compute capability's major number (Megatron-LM's get_device_arch_version)."""
        return int(self.compute_capability.split(".")[0]) if self.compute_capability else None

    def peak_tflops(self, precision: str) -> float:
        """The dense peak for ``precision``; bf16's when the chip has no faster path for it."""
        return self.dense_tflops.get(precision) or self.dense_tflops["bf16"]

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "vendor": self.vendor,
            "memory_gib": self.memory_gib,
            "memory_bandwidth_gb_s": self.memory_bandwidth_gb_s,
            "dense_tflops": dict(self.dense_tflops),
            "scale_up_domain": self.scale_up_domain,
            "scale_up_gb_s": self.scale_up_gb_s,
            "scale_out_gb_s": self.scale_out_gb_s,
            **({"compute_capability": self.compute_capability} if self.compute_capability else {}),
            **({"multiprocessors": self.multiprocessors} if self.multiprocessors else {}),
            "sources": dict(self.sources),
        }


def with_network(hw: Accelerator, network: NetworkTable | None, gpus: int) -> Accelerator:
    """``hw`` on the spec's scale-out network: each of the node's ``gpus`` GPUs gets an equal
    share of its NICs (what the catalogue's per-GPU figure is on the system it describes)."""
    if network is None:
        return hw
    per_gpu = network.nics_per_node * network.nic_gbit_s / 8 / gpus
    where = f"[distributed] network: {network.nics_per_node} x {network.nic_gbit_s:g} Gb/s"
    return attrs.evolve(
        hw, scale_out_gb_s=per_gpu, sources={**hw.sources, "scale_out": f"{where} per node"}
    )


def from_json(ident: str, data: Mapping[str, Any]) -> Accelerator:
    """An entry as the catalogue (or a plugin's JSON-shaped entry) writes it."""
    return Accelerator(id=ident, **{k: data[k] for k in data})


@functools.cache
def builtin() -> Mapping[str, Accelerator]:
    """mdc's own catalogue, by id."""
    import tomllib  # a JSON or YAML spec without accelerator_model never needs it

    data = tomllib.loads(package_text("mdc.hardware", "catalogue.toml"))
    return {ident: from_json(ident, entry) for ident, entry in sorted(data.items())}


def schema() -> dict[str, Any]:
    import json

    result: dict[str, Any] = json.loads(package_text("mdc.hardware", "hardware.schema.json"))
    return result


def schema_errors(entries: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """What is wrong with ``entries`` (id -> JSON-shaped entry) under the schema."""
    import jsonschema

    validator = jsonschema.Draft202012Validator(schema())
    return sorted(
        f"/{'/'.join(map(str, e.absolute_path))}: {e.message}"
        for e in validator.iter_errors(dict(entries))
    )


def catalogue(extra: Mapping[str, Accelerator] = {}) -> Mapping[str, Accelerator]:  # noqa: B006
    """mdc's entries plus ``extra`` (plugins'), by id."""
    return dict(sorted({**builtin(), **extra}.items())) if extra else builtin()


__all__ = ["Accelerator", "builtin", "catalogue", "from_json", "schema", "schema_errors"]
