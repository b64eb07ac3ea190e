"""Calling plugin code: each failure attributed to the plugin and hook it came from."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from mdc.api import Finding
from mdc.errors import PluginError, SpecError
from mdc.plan import Plan
from mdc.plugin_manager import Registered

T = TypeVar("T")


def call(reg: Registered, hook: str, function: Callable[[], T]) -> T:
    """Run plugin code, attributing any failure to the plugin."""
    try:
        return function()
    except (SpecError, PluginError):
        raise
    except Exception as exc:
        raise PluginError(
            reg.origin, f"{reg.kind} {reg.record.name!r} {hook}", f"{type(exc).__name__}: {exc}"
        ) from exc


def listed(
    function: Callable[[Plan, Any], Iterable[Finding]], plan: Plan, options: Any
) -> list[Finding]:
    return list(function(plan, options))


def checked_findings(reg: Registered, results: Iterable[Any]) -> list[Finding]:
    items = list(results)
    if not all(isinstance(f, Finding) for f in items):
        raise PluginError(
            reg.origin,
            f"{reg.kind} {reg.record.name!r} check",
            "returned something other than mdc.api.Finding records",
        )
    return items
