"""mdc's own plugins' options classes carry no attrs-generated ``__repr__``: nothing shows
them, and Python compiles every method attrs writes when a plugin is imported (about 39 M
of the 1,678 M instructions of validating bench/run.py's 100 specs, docs/performance.md)."""

from __future__ import annotations

import sys

import attrs

from mdc.plugin_manager import load_plugins


def test_builtin_options_classes_have_no_generated_repr() -> None:
    plugins = load_plugins(autoload=False, lazy=False)
    registered = [*plugins.launchers.values(), *plugins.backends.values()]
    tables = {r.record.options_type for r in registered if r.origin.distribution == "mdc-compiler"}
    modules = {sys.modules[t.__module__] for t in tables if t is not None}
    classes = {  # each table's class, its bases and the modules' other options (a role's)
        c
        for m in modules
        for value in vars(m).values()
        if isinstance(value, type) and value.__name__.endswith("Options")
        for c in value.__mro__
        if attrs.has(c)
    }
    shown = sorted(c.__qualname__ for c in classes if "__repr__" in vars(c))
    assert len(classes) > 15 and shown == []
