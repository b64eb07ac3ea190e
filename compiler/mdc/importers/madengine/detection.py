"""Recognising a madengine additional context, as opposed to an mdc spec."""

from __future__ import annotations

from pathlib import PurePath

from mdc.loaders import LoadedDocument

from .tables import OWN_DISTRIBUTED, OWN_K8S, OWN_SLURM, OWN_TOP


def detect(doc: LoadedDocument) -> bool:
    """Whether ``doc`` is a madengine additional context rather than an mdc spec.

    An mdc spec always has ``job`` (the schema requires it), so a document with one is
    never taken. Without it, the document must hold a key only madengine uses, or a
    ``distributed``/``slurm``/``kubernetes`` block with a key only madengine's has
    (e.g. ``slurm.nodes``, ``distributed.port``, ``kubernetes.gpu_count``). JSON files only:
    madengine's context file is JSON.
    """
    data = doc.data
    if not isinstance(data, dict) or "job" in data or PurePath(doc.path).suffix.lower() != ".json":
        return False
    if any(key in data for key in OWN_TOP):
        return True
    for block, own in (
        ("distributed", OWN_DISTRIBUTED),
        ("slurm", OWN_SLURM),
        ("kubernetes", OWN_K8S),
    ):
        value = data.get(block)
        if isinstance(value, dict) and any(k in value for k in own):
            return True
    return False
