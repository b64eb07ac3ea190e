"""Translating configs written for other tools into mdc spec documents.

An importer recognises its tool's config by shape, and returns an mdc spec
document plus a report (warnings) of every key it dropped or reinterpreted.
The report locates each entry in the original file.
"""

from __future__ import annotations

from mdc.errors import Diagnostic
from mdc.loaders import LoadedDocument
from mdc.plan.named_models import name_model


def translate(doc: LoadedDocument) -> tuple[LoadedDocument, list[Diagnostic]]:
    """``doc`` as an mdc spec: translated if a known tool wrote it, and its named model's keys
    filled in (:mod:`mdc.plan.named_models`). The diagnostics are what the translation
    dropped or reinterpreted (warnings) and a model name or config it could not read (errors,
    which fail the compile beside the schema's findings)."""
    # An mdc spec has a job table and madengine's context is JSON: specs never import
    # the importer (the rest of the test is madengine.detect's).
    data = doc.data
    notes: list[Diagnostic] = []
    if isinstance(data, dict) and "job" not in data and doc.path.lower().endswith(".json"):
        from mdc.importers import madengine

        if madengine.detect(doc):
            doc, notes = madengine.translate(doc)
    doc, unnamed = name_model(doc)
    return doc, [*notes, *unnamed]
