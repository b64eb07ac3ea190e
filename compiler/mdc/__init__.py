"""mdc: compile one declarative spec into checked launch artifacts for distributed ML jobs.

Plugin authors import ``hookimpl`` from here and their types from :mod:`mdc.api`.
"""

from __future__ import annotations

import os
import sys


def _forget_working_directory() -> None:
    """Under ``python -m mdc`` (``sys.argv`` is ``["-m"]`` while the package is found),
    Python put the current directory first on ``sys.path``: a ``pluggy.py``, a ``yaml.py``, a
    ``mdc_builtin/`` or an ``*.dist-info`` with mdc entry points there would be imported as
    mdc's own code or plugins. The ``mdc`` command has no such entry; neither does this."""
    if sys.argv[:1] != ["-m"] or sys.flags.safe_path or not sys.path:
        return
    try:
        here = os.getcwd()
    except OSError:  # the directory was removed: nothing can be imported from it
        return
    if sys.path[0] in ("", here):
        del sys.path[0]


_forget_working_directory()

import pluggy  # noqa: E402 - after the working directory is off sys.path

__version__ = "0.1.0"

#: Marker for plugin hook implementations (``@mdc.hookimpl``).
hookimpl = pluggy.HookimplMarker("mdc")

__all__ = ["__version__", "hookimpl"]
