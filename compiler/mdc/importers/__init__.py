"""Translating configs written for other tools into mdc spec documents.

An importer recognises its tool's config by shape, and returns an mdc spec
document plus a report (warnings) of every key it dropped or reinterpreted.
The report locates each entry in the original file.
"""

from __future__ import annotations

from mdc.errors import Diagnostic
from mdc.loaders import LoadedDocument


def translate(doc: LoadedDocument) -> tuple[LoadedDocument, list[Diagnostic]]:
    """``doc`` as an mdc spec: unchanged if it is one, translated if a known tool wrote it."""
    # An mdc spec has a job table and madengine's context is JSON: specs never import
    # the importer (the rest of the test is madengine.detect's).
    data = doc.data
    if isinstance(data, dict) and "job" not in data and doc.path.lower().endswith(".json"):
        from mdc.importers import madengine

        if madengine.detect(doc):
            return madengine.translate(doc)
    return doc, []
