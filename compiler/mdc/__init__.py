"""mdc: compile one declarative spec into checked launch artifacts for distributed ML jobs.

Plugin authors import ``hookimpl`` from here and their types from :mod:`mdc.api`.
"""

from __future__ import annotations

import pluggy

__version__ = "0.1.0"

#: Marker for plugin hook implementations (``@mdc.hookimpl``).
hookimpl = pluggy.HookimplMarker("mdc")

__all__ = ["__version__", "hookimpl"]
