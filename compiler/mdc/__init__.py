"""mdc: compile one declarative spec into checked launch artifacts for distributed ML jobs.

Plugin authors import ``hookimpl`` from here, the contract's records from :mod:`mdc.api`
and the helpers they use from its modules (:mod:`mdc.api.shell`, :mod:`mdc.api.torchrun`, ...).
"""

from __future__ import annotations

import os
import sys


def _running_mdc_module() -> bool:
    """Whether this process is ``python -m mdc`` (or ``-m mdc.something``), being started:
    ``sys.argv`` is ``["-m"]`` while the module is found."""
    if sys.argv[:1] != ["-m"]:
        return False
    args = sys.orig_argv[1:]
    for index, arg in enumerate(args):
        if arg.startswith("-m"):
            module = arg[2:] or (args[index + 1] if index + 1 < len(args) else "")
            return module == "mdc" or module.startswith("mdc.")
    return False


def _forget_working_directory() -> None:
    """Under ``python -m mdc``, Python put the current directory first on ``sys.path``: a
    ``pluggy.py``, a ``yaml.py``, a ``mdc_builtin/`` or an ``*.dist-info`` with mdc entry
    points there would be imported as mdc's own code or plugins. The ``mdc`` command has no
    such entry; neither does this (another program run with -m keeps its sys.path)."""
    if sys.flags.safe_path or not sys.path or not _running_mdc_module():
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
