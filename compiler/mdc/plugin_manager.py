"""Loading plugins from the ``mdc`` entry-point group and collecting their records.

Built-ins come in exactly like third-party plugins. Entry points are loaded
sorted by name; every hook implementation is called on its own, so each
record (and each failure) is attributed to the plugin it came from. Records
are then sorted by name and duplicates rejected.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from importlib.metadata import EntryPoint, entry_points
from types import ModuleType
from typing import Any, TypeVar

import attrs
import pluggy

from mdc import hookspecs
from mdc.api import BackendSpec, LauncherSpec
from mdc.errors import PluginError, PluginOrigin
from mdc.spec import CORE_TABLES

GROUP = "mdc"
DISTRIBUTION = "mdc-compiler"
#: Entry points mdc itself declares; missing ones mean a broken install.
BUILTINS = ("basic", "deepspeed", "kubernetes", "leaderworkerset", "local", "megatron", "primus",
            "pytorchjob", "sglang", "sglang_disagg", "slurm", "ssh", "torchrun", "torchtitan",
            "trainjob", "vllm")
#: A plugin's name is also its spec table's name.
NAME_PATTERN = re.compile(r"^[a-z][a-z0-9_]*$")

Record = TypeVar("Record", LauncherSpec, BackendSpec)


@attrs.frozen(kw_only=True)
class Registered:
    """A launcher or backend record and the plugin it came from."""

    kind: str
    record: LauncherSpec | BackendSpec
    origin: PluginOrigin


@attrs.frozen(kw_only=True)
class PluginSet:
    launchers: Mapping[str, Registered]
    backends: Mapping[str, Registered]
    #: every loaded plugin, by entry-point name
    plugins: Mapping[str, PluginOrigin]

    def launcher(self, name: str) -> LauncherSpec:
        record = self.launchers[name].record
        assert isinstance(record, LauncherSpec)
        return record

    def backend(self, name: str) -> BackendSpec:
        record = self.backends[name].record
        assert isinstance(record, BackendSpec)
        return record

    def tables(self) -> dict[str, Registered]:
        """Plugin table name -> the registration that owns it."""
        return {**self.launchers, **self.backends}


def _origin(ep: EntryPoint) -> PluginOrigin:
    dist = ep.dist
    return PluginOrigin(entry_point=f"{ep.name} = {ep.value}",
                        distribution=dist.name if dist else "unknown",
                        version=dist.version if dist else "unknown")


def discover(*, autoload: bool = True, blocked: Iterable[str] = ()) -> list[EntryPoint]:
    """The entry points to load, sorted by name; duplicates are errors."""
    found = sorted(entry_points(group=GROUP), key=lambda ep: (ep.name, ep.value))
    ours = {ep.name for ep in found if ep.dist is not None and ep.dist.name == DISTRIBUTION}
    missing = [name for name in BUILTINS if name not in ours]
    if missing:
        raise PluginError(None, "startup", f"mdc's own entry points are missing ({', '.join(missing)}); "
                          "reinstall mdc with `pip install -e .`")
    seen: dict[str, EntryPoint] = {}
    for ep in found:
        if ep.name in seen and seen[ep.name].value != ep.value:
            raise PluginError(_origin(ep), "startup", f"entry point name {ep.name!r} is also "
                              f"declared by {_origin(seen[ep.name]).distribution}")
        seen[ep.name] = ep
    skip = set(blocked)
    return [ep for name, ep in sorted(seen.items()) if name not in skip and
            (autoload or name in ours)]


def load_plugins(*, autoload: bool = True, blocked: Iterable[str] = (),
                 extra: Sequence[tuple[str, object, PluginOrigin]] = (),
                 trace: Callable[[str], Any] | None = None) -> PluginSet:
    """Load entry-point plugins (plus ``extra`` in-process ones) and collect their records."""
    manager = pluggy.PluginManager(GROUP)
    manager.add_hookspecs(hookspecs)
    if trace is not None:
        manager.trace.root.setwriter(trace)
        manager.enable_tracing()
    origins: dict[str, PluginOrigin] = {}
    for ep in discover(autoload=autoload, blocked=blocked):
        origin = _origin(ep)
        try:
            module: ModuleType = ep.load()
        except Exception as exc:
            raise PluginError(origin, "import", f"{type(exc).__name__}: {exc}") from exc
        _register(manager, module, ep.name, origin)
        origins[ep.name] = origin
    for name, plugin, origin in extra:
        _register(manager, plugin, name, origin)
        origins[name] = origin
    try:
        manager.check_pending()
    except pluggy.PluginValidationError as exc:
        name = manager.get_name(exc.plugin) or ""
        raise PluginError(origins.get(name), "registration", str(exc)) from exc
    launchers = _collect(manager, origins, "mdc_register_launchers", LauncherSpec)
    backends = _collect(manager, origins, "mdc_register_backends", BackendSpec)
    for name in sorted(set(launchers) & set(backends)):
        raise PluginError(backends[name].origin, "mdc_register_backends",
                          f"backend name {name!r} is already a launcher from "
                          f"{launchers[name].origin.distribution}")
    return PluginSet(launchers=launchers, backends=backends, plugins=dict(sorted(origins.items())))


def _register(manager: pluggy.PluginManager, plugin: object, name: str,
              origin: PluginOrigin) -> None:
    try:
        manager.register(plugin, name=name)
    except (pluggy.PluginValidationError, ValueError) as exc:
        raise PluginError(origin, "registration", str(exc)) from exc


def _collect(manager: pluggy.PluginManager, origins: Mapping[str, PluginOrigin], hook: str,
             record_type: type[Record]) -> dict[str, Registered]:
    kind = "launcher" if record_type is LauncherSpec else "backend"
    collected: dict[str, Registered] = {}
    for impl in sorted(getattr(manager.hook, hook).get_hookimpls(), key=lambda i: i.plugin_name):
        origin = origins[impl.plugin_name]
        try:
            result = impl.function()
        except Exception as exc:
            raise PluginError(origin, hook, f"{type(exc).__name__}: {exc}") from exc
        if not isinstance(result, (list, tuple)) or not all(
                isinstance(r, record_type) for r in result):
            raise PluginError(origin, hook, f"returned {type(result).__name__}; expected a list "
                              f"of {record_type.__name__}")
        for record in result:
            if not NAME_PATTERN.match(record.name) or record.name in CORE_TABLES:
                raise PluginError(origin, hook, f"{kind} name {record.name!r} is not allowed: "
                                  "use lowercase letters, digits and '_', and not a core table")
            if record.name in collected:
                raise PluginError(origin, hook, f"{kind} {record.name!r} is also registered by "
                                  f"{collected[record.name].origin.entry_point} "
                                  f"({collected[record.name].origin.distribution})")
            collected[record.name] = Registered(kind=kind, record=record, origin=origin)
    return dict(sorted(collected.items()))
