"""package_text reads a package's data from its directory, or through importlib.resources."""

from __future__ import annotations

import sys
import zipfile
from importlib import resources
from pathlib import Path

import pytest

from mdc.package_data import package_text


def test_a_package_on_disk_reads_as_importlib_resources_reads_it() -> None:
    name = "job.v1.schema.json"
    assert package_text("mdc_schemas", name) == resources.files("mdc_schemas").joinpath(
        name
    ).read_text(encoding="utf-8")


def test_a_zipped_package_is_read_through_importlib_resources(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive = tmp_path / "plugins.zip"
    with zipfile.ZipFile(archive, "w") as zipped:
        zipped.writestr("zipped_plugin/__init__.py", "")
        zipped.writestr("zipped_plugin/schemas/table.json", '{"type": "object", "é": 1}')
    monkeypatch.syspath_prepend(str(archive))
    monkeypatch.delitem(sys.modules, "zipped_plugin", raising=False)
    assert package_text("zipped_plugin", "schemas/table.json") == '{"type": "object", "é": 1}'
