"""Models by name: ``[model] name`` from the shipped catalogue, ``[model] hf_config`` from a
Hugging Face ``config.json``.

A serving or training user names the model (a Hugging Face id such as
``"meta-llama/Llama-3.3-70B-Instruct"``, or the catalogue's own id such as ``"llama3.1-70b"``)
instead of writing its architecture keys. The named model's keys fill the ``[model]`` table
before the schema sees it; keys the spec writes itself win. The filled keys are located at
the ``name`` (or ``hf_config``) key, so a finding about one of them points there.

The catalogue (``models.toml`` beside this module) holds published architectures, each with
the URL of the configuration it was read from and its published parameter count, which the
tests hold every count to. Its ``seq_length`` is the pre-training length, a setting of a run
rather than of the architecture: a named model leaves it to the spec.
"""

from __future__ import annotations

import functools
import os
import tomllib
from collections import ChainMap
from collections.abc import Mapping
from typing import Any

import attrs

from mdc.errors import Diagnostic, Severity
from mdc.loaders import LoadedDocument, load_file
from mdc.plan.hf_config import model_keys
from mdc.suggest import did_you_mean

CATALOGUE_FILE = os.path.join(os.path.dirname(__file__), "models.toml")
#: [model] keys a name sets; the rest of a catalogue table describes the run it came from
RUN_KEYS = frozenset({"seq_length"})
#: the [model] keys that name a model: replaced by its keys before the spec is structured
NAMING_KEYS = ("name", "hf_config")


@functools.cache
def catalogue() -> Mapping[str, Mapping[str, Any]]:
    """The catalogue's entries by id: ``source``, ``published_params``, ``model``, ..."""
    with open(CATALOGUE_FILE, "rb") as file:
        return tomllib.load(file)


@functools.cache
def _ids() -> Mapping[str, str]:
    """Every name a user may write (lower case) -> the catalogue id it means."""
    names: dict[str, str] = {}
    for ident, entry in catalogue().items():
        for name in (ident, *entry.get("hf_ids", ())):
            names[name.lower()] = ident
    return names


def names() -> list[str]:
    """The names the catalogue answers to, as written there."""
    return sorted({n for i, e in catalogue().items() for n in (i, *e.get("hf_ids", ()))})


def lookup(name: str) -> str | None:
    """The catalogue id ``name`` means (Hugging Face ids match case-insensitively)."""
    return _ids().get(name.strip().lower())


def architecture(ident: str) -> dict[str, Any]:
    """The ``[model]`` keys of catalogue entry ``ident``, without the run's settings."""
    return {k: v for k, v in catalogue()[ident]["model"].items() if k not in RUN_KEYS}


def name_model(doc: LoadedDocument) -> tuple[LoadedDocument, list[Diagnostic]]:
    """``doc`` with ``[model] name`` / ``hf_config`` replaced by the keys they stand for.

    An unknown name or a config mdc cannot read is an error finding (the document then keeps
    no ``name``, so nothing downstream reads a half-described model as a whole one).
    """
    data = doc.data
    if not isinstance(data, dict) or not isinstance(model := data.get("model"), dict):
        return doc, []
    # a value that is not a string stays for the schema to refuse
    naming = {k: v for k, v in model.items() if k in NAMING_KEYS and isinstance(v, str)}
    if not naming:
        return doc, []
    found: list[Diagnostic] = []
    filled: dict[str, Any] = {}
    where: dict[str, str] = {}
    for key, read in (("hf_config", _from_config), ("name", _from_name)):
        value = naming.get(key)
        if value is None:
            continue
        try:
            keys = read(value, doc)
        except _Refused as exc:
            found.append(_error(doc, f"/model/{key}", exc))
            continue
        for k, v in keys.items():
            filled.setdefault(k, v)  # hf_config, the user's own file, before the catalogue
            where.setdefault(k, key)
    kept = {k: v for k, v in model.items() if k not in naming}
    merged = {**filled, **kept}
    positions = {f"/model/{k}": doc.values.get(f"/model/{where[k]}") for k in filled}
    added = {p: pos for p, pos in positions.items() if pos is not None and p[7:] not in kept}
    named = attrs.evolve(
        doc,
        data={**data, "model": merged},
        values=ChainMap(added, doc.values),  # type: ignore[arg-type]  # read-only: a Mapping
        keys=ChainMap(added, doc.keys),  # type: ignore[arg-type]
    )
    return named, found


class _Refused(Exception):
    def __init__(self, message: str, hint: str) -> None:
        super().__init__(message)
        self.message, self.hint = message, hint


def _from_name(name: str, doc: LoadedDocument) -> dict[str, Any]:
    ident = lookup(name)
    if ident is None:
        near = did_you_mean(name, names())
        raise _Refused(
            f"no model named {name!r} in mdc's catalogue",
            (f"did you mean {near!r}? " if near else "")
            + "write the model's keys under [model], or point hf_config at its config.json "
            "(docs/model.md lists the catalogue)",
        )
    return architecture(ident)


def _from_config(path: str, doc: LoadedDocument) -> dict[str, Any]:
    base = os.path.dirname(doc.path)
    config = load_file(os.path.join(base, path) if base else path)
    if not isinstance(config.data, dict):
        raise _Refused(f"{path} is not a JSON object", "point hf_config at a model's config.json")
    try:
        return model_keys(config.data)
    except ValueError as exc:
        raise _Refused(f"{path}: {exc}", "write the model's keys under [model] instead") from None


def _error(doc: LoadedDocument, pointer: str, refused: _Refused) -> Diagnostic:
    code = "MDC040" if pointer.endswith("/name") else "MDC041"
    return Diagnostic(
        severity=Severity.ERROR,
        code=code,
        message=refused.message,
        location=doc.locate(pointer),
        hint=refused.hint,
    )
