"""Reading files shipped inside Python packages (the schemas)."""

from __future__ import annotations

import importlib
import os


def package_text(package: str, resource: str) -> str:
    """The text of ``resource`` (a ``/``-separated path) inside ``package``.

    A package that is one directory on disk is read directly: importlib.resources and the
    readers it imports (zipfile among them) cost more than reading the file. Anything else
    (a zip, a namespace package) goes through importlib.resources.
    """
    locations = list(getattr(importlib.import_module(package), "__path__", []))
    if len(locations) == 1 and os.path.isdir(locations[0]):
        path = os.path.join(locations[0], *resource.split("/"))
        with open(path, encoding="utf-8") as file:
            return file.read()
    from importlib import resources

    return resources.files(package).joinpath(resource).read_text(encoding="utf-8")
