"""Loading plugins from the ``mdc`` entry-point group and collecting their records.

Built-ins come in exactly like third-party plugins. Entry points are loaded
sorted by name; every hook implementation is called on its own, so each
record (and each failure) is attributed to the plugin it came from. Records
are then sorted by name and duplicates rejected.

mdc's own entry points are imported only when a command needs one of their
records: each registers exactly one record named like its entry point, of the
kind its module path says (``mdc_builtin.launchers.NAME``; a test checks this
against loading them all), so their names are known without importing them. The
entry points in mdc's own metadata are the one list of built-ins. Third-party
plugins are always imported up front, so a broken one fails every command as before;
a third-party record whose name clashes with a built-in makes every plugin load up
front, for the same errors as before.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from types import ModuleType
from typing import Any, TypeVar

import attrs
import pluggy

from mdc import hookspecs
from mdc.api import BackendSpec, LauncherSpec
from mdc.errors import PluginError, PluginOrigin
from mdc.hardware import Accelerator
from mdc.spec import CORE_TABLES

GROUP = "mdc"
DISTRIBUTION = "mdc-compiler"
#: Where mdc's own plugins live: ``mdc_builtin.<kind>s.<name>``, one module per record.
BUILTIN_PACKAGE = "mdc_builtin"
BUILTIN_KINDS = ("launcher", "backend")
#: A plugin's name is also its spec table's name.
NAME_PATTERN = re.compile(r"^[a-z][a-z0-9_]*$")

Record = TypeVar("Record", LauncherSpec, BackendSpec)


# only read, never compared or printed: no generated ==, hash or repr (start-up time)
@attrs.frozen(kw_only=True, eq=False, repr=False)
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
    #: accelerator models plugins add to mdc's catalogue, by id
    hardware: Mapping[str, Accelerator] = attrs.field(factory=dict)

    def accelerators(self) -> Mapping[str, Accelerator]:
        """mdc's accelerator catalogue with the plugins' entries, by id."""
        from mdc.hardware import catalogue

        return catalogue(self.hardware)

    def launcher(self, name: str) -> LauncherSpec:
        record = self.launchers[name].record
        assert isinstance(record, LauncherSpec)
        return record

    def backend(self, name: str) -> BackendSpec:
        record = self.backends[name].record
        assert isinstance(record, BackendSpec)
        return record

    def tables(self) -> dict[str, Registered]:
        """Plugin table name -> the registration that owns it (imports every plugin)."""
        return {**self.launchers, **self.backends}

    def table(self, name: str) -> Registered:
        """The registration owning the table ``name`` (imports only that plugin)."""
        return self.launchers[name] if name in self.launchers else self.backends[name]

    def option_types(self) -> Mapping[str, type | None]:
        """Plugin table name -> its options type; a plugin is imported when first asked."""
        return _OptionTypes(self)


class _OptionTypes(Mapping[str, "type | None"]):
    def __init__(self, plugins: PluginSet) -> None:
        self._plugins = plugins

    def __getitem__(self, name: str) -> type | None:
        if name not in self._plugins.launchers and name not in self._plugins.backends:
            raise KeyError(name)
        return self._plugins.table(name).record.options_type

    def __iter__(self) -> Iterator[str]:
        return iter([*self._plugins.launchers, *self._plugins.backends])

    def __len__(self) -> int:
        return len(self._plugins.launchers) + len(self._plugins.backends)


class _Records(Mapping[str, Registered]):
    """Records of one kind, by name; deferred built-ins are imported on first access."""

    def __init__(self, names: Iterable[str], get: Callable[[str], Registered]) -> None:
        self._names = sorted(names)
        self._known = frozenset(self._names)
        self._get = get

    def __getitem__(self, name: str) -> Registered:
        if name not in self._known:
            raise KeyError(name)
        return self._get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._known

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


class EntryPoint:
    """One ``mdc`` entry point and the distribution declaring it."""

    __slots__ = ("distribution", "name", "value", "version")

    def __init__(self, name: str, value: str, distribution: str, version: str) -> None:
        self.name, self.value = name, value
        self.distribution, self.version = distribution, version

    def load(self) -> Any:
        """Import the module (and attribute) named by the value, as importlib.metadata does."""
        match = _OBJECT_REFERENCE.match(self.value)
        if match is None:
            raise ValueError(f"{self.value!r} is not a module or module:attribute")
        target: Any = importlib.import_module(match.group("module"))
        for part in filter(None, (match.group("attr") or "").split(".")):
            target = getattr(target, part)
        return target


#: importlib.metadata's pattern for an entry point's value
_OBJECT_REFERENCE = re.compile(
    r"(?P<module>[\w.]+)\s*(:\s*(?P<attr>[\w.]+)\s*)?((?P<extras>\[.*\])\s*)?$"
)
_INFO_SUFFIXES = (".dist-info", ".egg-info")


_SEPARATORS = re.compile(r"[-_.]+")


def _normalize(name: str) -> str:
    return _SEPARATORS.sub("-", name).lower().replace("-", "_")


def _read(path: str) -> str | None:
    # os.path and open, not pathlib: this runs for every distribution on sys.path
    try:
        with open(path, encoding="utf-8") as file:
            return file.read()
    except OSError:
        return None


def _scan(group: str) -> list[EntryPoint] | None:
    """The entry points of ``group``, read from the metadata directories on ``sys.path``.

    This is what ``importlib.metadata.entry_points`` finds (the first distribution of a
    name on ``sys.path`` wins), without importing it and the email parser it loads, which
    would cost as much as the rest of plugin discovery. ``None`` when ``sys.path`` holds
    something other than directories (zip files) or another finder lists distributions:
    then importlib.metadata is asked.

    It stays because it pays for itself (bench/run.py, "hand-written pieces against their
    libraries", CPU time of the whole process): with importlib.metadata, validate of
    examples/quickstart.toml took 141 instead of 111 ms (the scan saves 21 %), compile of
    the bench's 2x8 torchrun spec 153 instead of 129 ms (16 %). Differential tests against
    importlib.metadata: tests/plugins/test_plugin_manager.py.
    """
    from importlib.machinery import PathFinder

    if any(
        getattr(finder, "find_distributions", None) is not None and finder is not PathFinder
        for finder in sys.meta_path
    ):
        return None
    seen: set[str] = set()
    found: list[EntryPoint] = []
    for entry in sys.path:
        root = entry or "."
        try:
            children = os.listdir(root)
        except OSError:
            if os.path.exists(root):
                return None  # a zip file or something else importlib.metadata reads
            continue
        for child in children:
            low = child.lower()
            if not low.endswith(_INFO_SUFFIXES):
                continue
            normalized = _normalize(low.rpartition(".")[0].partition("-")[0])
            if normalized in seen:
                continue
            seen.add(normalized)
            info = os.path.join(root, child)
            text = _read(os.path.join(info, "entry_points.txt"))
            if not text or f"[{group}]" not in text:
                continue
            pairs = _section(text, group)
            if pairs:
                name, version = _name_version(info)
                found += [EntryPoint(n, v, name, version) for n, v in pairs]
    return found


def _section(text: str, group: str) -> list[tuple[str, str]]:
    """``name = value`` pairs of one ``[group]`` of an entry_points.txt."""
    pairs: list[tuple[str, str]] = []
    current = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = line[1:-1].strip()
        elif current == group:
            name, _, value = line.partition("=")
            pairs.append((name.strip(), value.strip()))
    return pairs


def _name_version(info: str) -> tuple[str, str]:
    """The Name and Version headers of a distribution's METADATA (PKG-INFO for eggs)."""
    text = _read(os.path.join(info, "METADATA")) or _read(os.path.join(info, "PKG-INFO")) or ""
    headers: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            break
        key, sep, value = line.partition(":")
        if sep and key in ("Name", "Version"):
            headers.setdefault(key, value.strip())
    return headers.get("Name", "unknown"), headers.get("Version", "unknown")


def _from_metadata(group: str) -> list[EntryPoint]:
    """The entry points of ``group`` as importlib.metadata lists them."""
    from importlib.metadata import entry_points

    dists: dict[int, tuple[object, str, str]] = {}
    found = []
    for ep in entry_points(group=group):
        dist = ep.dist
        name = version = "unknown"
        if dist is not None:
            cached = dists.get(id(dist))
            if cached is None or cached[0] is not dist:
                metadata = dist.metadata  # parsed once per distribution
                cached = dists[id(dist)] = (dist, metadata["Name"], metadata["Version"])
            name, version = cached[1], cached[2]
        found.append(EntryPoint(ep.name, ep.value, name, version))
    return found


def _origin(ep: EntryPoint) -> PluginOrigin:
    return PluginOrigin(
        entry_point=f"{ep.name} = {ep.value}", distribution=ep.distribution, version=ep.version
    )


def discover(*, autoload: bool = True, blocked: Iterable[str] = ()) -> list[EntryPoint]:
    """The entry points to load, sorted by name; duplicates are errors."""
    listed = _scan(GROUP)
    found = sorted(
        _from_metadata(GROUP) if listed is None else listed, key=lambda ep: (ep.name, ep.value)
    )
    ours = {ep.name for ep in found if ep.distribution == DISTRIBUTION}
    if not any(_builtin_kind(ep) for ep in found):
        raise PluginError(
            None,
            "startup",
            "mdc's own entry points are missing; reinstall mdc with `pip install -e .`",
        )
    seen: dict[str, EntryPoint] = {}
    for ep in found:
        if ep.name in seen and seen[ep.name].value != ep.value:
            raise PluginError(
                _origin(ep),
                "startup",
                f"entry point name {ep.name!r} is also "
                f"declared by {_origin(seen[ep.name]).distribution}",
            )
        seen[ep.name] = ep
    skip = set(blocked)
    return [
        ep for name, ep in sorted(seen.items()) if name not in skip and (autoload or name in ours)
    ]


def _builtin_kind(ep: EntryPoint) -> str | None:
    """ "launcher"/"backend" for one of mdc's own entry points, by its module; else None."""
    if ep.distribution != DISTRIBUTION:
        return None
    for kind in BUILTIN_KINDS:
        if ep.value == f"{BUILTIN_PACKAGE}.{kind}s.{ep.name}":
            return kind
    return None


def load_plugins(
    *,
    autoload: bool = True,
    blocked: Iterable[str] = (),
    extra: Sequence[tuple[str, object, PluginOrigin]] = (),
    trace: Callable[[str], Any] | None = None,
    lazy: bool = True,
) -> PluginSet:
    """Load entry-point plugins (plus ``extra`` in-process ones) and collect their records.

    With ``lazy`` (the default, unless tracing), mdc's own plugins are imported only when
    one of their records is first looked up; ``lazy=False`` imports every plugin now.
    """
    eps = discover(autoload=autoload, blocked=blocked)
    if not lazy or trace is not None:
        return _load(eps, extra, trace)
    deferred = {ep.name: kind for ep in eps if (kind := _builtin_kind(ep)) is not None}
    eager = [ep for ep in eps if ep.name not in deferred]
    manager, origins = _manager(eager, extra, None)
    launchers = _collect(manager, origins, "mdc_register_launchers", LauncherSpec)
    backends = _collect(manager, origins, "mdc_register_backends", BackendSpec)
    if set(deferred) & ({*launchers, *backends, *(name for name, _, _ in extra)}):
        return _load(eps, extra, None)  # a clash: the full load reports it as always
    for name in sorted(set(launchers) & set(backends)):
        raise PluginError(
            backends[name].origin,
            "mdc_register_backends",
            f"backend name {name!r} is already a launcher from "
            f"{launchers[name].origin.distribution}",
        )
    by_name = {ep.name: ep for ep in eps}
    for name in deferred:
        origins[name] = _origin(by_name[name])
    loaded: dict[str, Registered] = {**launchers, **backends}

    def get(name: str) -> Registered:
        if name not in loaded:
            loaded[name] = _load_builtin(manager, by_name[name], deferred[name], origins[name])
        return loaded[name]

    return PluginSet(
        launchers=_Records([*launchers, *(n for n, k in deferred.items() if k == "launcher")], get),
        backends=_Records([*backends, *(n for n, k in deferred.items() if k == "backend")], get),
        plugins=dict(sorted(origins.items())),
        hardware=_collect_hardware(manager, origins),
    )


def _load_builtin(
    manager: pluggy.PluginManager, ep: EntryPoint, kind: str, origin: PluginOrigin
) -> Registered:
    """Import one of mdc's own plugins and collect its one record."""
    try:
        module: ModuleType = ep.load()
    except Exception as exc:
        raise PluginError(origin, "import", f"{type(exc).__name__}: {exc}") from exc
    _register(manager, module, ep.name, origin)
    try:
        manager.check_pending()
    except pluggy.PluginValidationError as exc:
        raise PluginError(origin, "registration", str(exc)) from exc
    origins = {ep.name: origin}
    found = {
        **_collect(manager, origins, "mdc_register_launchers", LauncherSpec, only=ep.name),
        **_collect(manager, origins, "mdc_register_backends", BackendSpec, only=ep.name),
    }
    if list(found) != [ep.name] or found[ep.name].kind != kind:
        raise PluginError(
            origin,
            "registration",
            f"registered {sorted(found)}; mdc's list of "
            f"its own plugins expects one {kind} named {ep.name!r}",
        )
    return found[ep.name]


def _manager(
    eps: Sequence[EntryPoint],
    extra: Sequence[tuple[str, object, PluginOrigin]],
    trace: Callable[[str], Any] | None,
) -> tuple[pluggy.PluginManager, dict[str, PluginOrigin]]:
    """A plugin manager with ``eps`` imported and ``extra`` registered."""
    manager = pluggy.PluginManager(GROUP)
    manager.add_hookspecs(hookspecs)
    if trace is not None:
        manager.trace.root.setwriter(trace)
        manager.enable_tracing()
    origins: dict[str, PluginOrigin] = {}
    for ep in eps:
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
    return manager, origins


def _load(
    eps: Sequence[EntryPoint],
    extra: Sequence[tuple[str, object, PluginOrigin]],
    trace: Callable[[str], Any] | None,
) -> PluginSet:
    """Import every plugin now and collect all records."""
    manager, origins = _manager(eps, extra, trace)
    launchers = _collect(manager, origins, "mdc_register_launchers", LauncherSpec)
    backends = _collect(manager, origins, "mdc_register_backends", BackendSpec)
    for name in sorted(set(launchers) & set(backends)):
        raise PluginError(
            backends[name].origin,
            "mdc_register_backends",
            f"backend name {name!r} is already a launcher from "
            f"{launchers[name].origin.distribution}",
        )
    return PluginSet(
        launchers=launchers,
        backends=backends,
        plugins=dict(sorted(origins.items())),
        hardware=_collect_hardware(manager, origins),
    )


def _register(
    manager: pluggy.PluginManager, plugin: object, name: str, origin: PluginOrigin
) -> None:
    try:
        manager.register(plugin, name=name)
    except (pluggy.PluginValidationError, ValueError) as exc:
        raise PluginError(origin, "registration", str(exc)) from exc


def _collect(
    manager: pluggy.PluginManager,
    origins: Mapping[str, PluginOrigin],
    hook: str,
    record_type: type[Record],
    only: str | None = None,
) -> dict[str, Registered]:
    kind = "launcher" if record_type is LauncherSpec else "backend"
    collected: dict[str, Registered] = {}
    for name, result in _each_plugin(manager, origins, hook, only):
        origin = origins[name]
        if not isinstance(result, (list, tuple)) or not all(
            isinstance(r, record_type) for r in result
        ):
            raise PluginError(
                origin,
                hook,
                f"returned {type(result).__name__}; expected a list of {record_type.__name__}",
            )
        for record in result:
            if not NAME_PATTERN.match(record.name) or record.name in CORE_TABLES:
                raise PluginError(
                    origin,
                    hook,
                    f"{kind} name {record.name!r} is not allowed: "
                    "use lowercase letters, digits and '_', and not a core table",
                )
            if record.name in collected:
                raise PluginError(
                    origin,
                    hook,
                    f"{kind} {record.name!r} is also registered by "
                    f"{collected[record.name].origin.entry_point} "
                    f"({collected[record.name].origin.distribution})",
                )
            collected[record.name] = Registered(kind=kind, record=record, origin=origin)
    return dict(sorted(collected.items()))


def _collect_hardware(
    manager: pluggy.PluginManager, origins: Mapping[str, PluginOrigin]
) -> dict[str, Accelerator]:
    """The accelerators plugins add, each checked against the hardware schema."""
    from mdc.hardware import builtin, schema_errors

    hook = "mdc_register_hardware"
    collected: dict[str, tuple[Accelerator, PluginOrigin]] = {}
    for name, result in _each_plugin(manager, origins, hook):
        origin = origins[name]
        if not isinstance(result, (list, tuple)) or not all(
            isinstance(r, Accelerator) for r in result
        ):
            raise PluginError(
                origin, hook, f"returned {type(result).__name__}; expected a list of Accelerator"
            )
        for entry in result:
            errors = schema_errors({entry.id: entry.to_json()})
            if errors:
                raise PluginError(origin, hook, f"accelerator {entry.id!r}: {'; '.join(errors)}")
            if entry.id in builtin():
                raise PluginError(origin, hook, f"accelerator {entry.id!r} is already mdc's own")
            if entry.id in collected:
                other = collected[entry.id][1]
                raise PluginError(
                    origin,
                    hook,
                    f"accelerator {entry.id!r} is also registered by {other.entry_point} "
                    f"({other.distribution})",
                )
            collected[entry.id] = (entry, origin)
    return {ident: entry for ident, (entry, _) in sorted(collected.items())}


def _each_plugin(
    manager: pluggy.PluginManager,
    origins: Mapping[str, PluginOrigin],
    hook: str,
    only: str | None = None,
) -> Iterator[tuple[str, Any]]:
    """Each plugin's answer to ``hook``, by plugin name (or only ``only``'s).

    Each implementation is called through pluggy (a caller of that one plugin), so pluggy's
    tracing (``MDC_TRACE_PLUGINS``) and hook wrappers see every call; a plugin that raises is
    named in the :class:`PluginError`.
    """
    impls = sorted(getattr(manager.hook, hook).get_hookimpls(), key=lambda i: i.plugin_name)
    for impl in impls:
        if only is not None and impl.plugin_name != only:
            continue
        others = [i.plugin for i in impls if i is not impl]
        try:
            results = manager.subset_hook_caller(hook, remove_plugins=others)()
        except Exception as exc:
            origin = origins[impl.plugin_name]
            raise PluginError(origin, hook, f"{type(exc).__name__}: {exc}") from exc
        yield impl.plugin_name, results[0] if results else None  # pluggy drops a None
