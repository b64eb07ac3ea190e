"""madengine's additional-context JSON as an mdc spec (placeholder: being written)."""

from __future__ import annotations

import argparse
from typing import Any

from mdc.errors import Diagnostic
from mdc.loaders import LoadedDocument


def detect(doc: LoadedDocument) -> bool:
    return False


def translate(doc: LoadedDocument) -> tuple[LoadedDocument, list[Diagnostic]]:
    return doc, []


def cmd_import(args: argparse.Namespace, out: Any) -> int:
    raise NotImplementedError
