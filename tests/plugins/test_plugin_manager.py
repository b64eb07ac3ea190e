"""Loading plugins: inline plugins, errors that name the plugin, order, blocking, entry points.

Inline plugins are classes with ``@mdc.hookimpl`` methods handed to
``load_plugins(extra=...)``; autoload is off, so only mdc's own entry points
and the plugins a test passes in take part.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs
import pytest
from tests.tools import REPO

import mdc
from mdc.api import Artifact, BackendSpec, Launch, LauncherSpec, Plan, Role
from mdc.errors import PluginError, PluginOrigin, SpecError
from mdc.pipeline import Compiler
from mdc.plugin_manager import PluginSet, load_plugins

FAKE_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "description": "Options of the fake launcher.",
    "properties": {
        "greeting": {"type": "string", "minLength": 1, "description": "What workers say."},
        "repeat": {"type": "integer", "minimum": 1, "description": "How often they say it."},
    },
}


@attrs.frozen(kw_only=True)
class FakeOptions:
    greeting: str = "hello"
    repeat: int = 1


def origin(name: str, distribution: str | None = None, version: str = "1.0") -> PluginOrigin:
    return PluginOrigin(
        entry_point=f"{name} = tests_{name}",
        distribution=distribution or f"{name}-dist",
        version=version,
    )


def worker_launch(
    plan: Plan, options: FakeOptions | None, files: Sequence[Artifact] = ()
) -> Launch:
    opts = options or FakeOptions()
    argv = ("echo", *[opts.greeting] * opts.repeat)
    return Launch(roles=tuple(Role(name=r.name, argv=argv) for r in plan.roles), files=tuple(files))


def launcher(
    name: str = "fake", *, emit: Callable[[Plan, Any], Launch] = worker_launch, **fields: Any
) -> LauncherSpec:
    fields.setdefault("description", f"the {name} launcher")
    return LauncherSpec(name=name, parallelism="data", emit=emit, **fields)


def launcher_plugin(*records: LauncherSpec) -> object:
    class Plugin:
        @mdc.hookimpl
        def mdc_register_launchers(self) -> list[LauncherSpec]:
            return list(records)

    return Plugin()


def backend_plugin(*records: BackendSpec) -> object:
    class Plugin:
        @mdc.hookimpl
        def mdc_register_backends(self) -> list[BackendSpec]:
            return list(records)

    return Plugin()


def load(*plugins: tuple[str, object], **kwargs: Any) -> PluginSet:
    return load_plugins(
        autoload=False, extra=[(name, plugin, origin(name)) for name, plugin in plugins], **kwargs
    )


@pytest.fixture
def write_spec(tmp_path: Path) -> Callable[..., Path]:
    def write(launcher_name: str = "fake", extra: str = "", backend: str = "local") -> Path:
        path = tmp_path / "spec.toml"
        path.write_text(
            f'[job]\nname = "demo"\ncommand = ["python", "train.py"]\n\n'
            f'[distributed]\nlauncher = "{launcher_name}"\nbackend = "{backend}"\n'
            f"nnodes = 2\nnproc_per_node = 2\n{extra}"
        )
        return path

    return write


# ---------------------------------------------------------------- a working inline launcher


def test_inline_launcher_table_is_validated_and_structured(write_spec: Callable[..., Path]) -> None:
    record = launcher(schema=FAKE_SCHEMA, options_type=FakeOptions)
    compiler = Compiler(load(("fake", launcher_plugin(record))))
    assert compiler.schema["properties"]["fake"]["properties"].keys() == {"greeting", "repeat"}
    assert "fake" in compiler.schema["properties"]["distributed"]["properties"]["launcher"]["enum"]

    compiled = compiler.compile(write_spec(extra='\n[fake]\ngreeting = "hi"\nrepeat = 2\n'))
    assert compiled.plan.options["fake"] == FakeOptions(greeting="hi", repeat=2)
    script = {a.path: a for a in compiled.tree}["launch/worker.sh"].data.decode()
    assert script.rstrip().endswith("exec echo hi hi")

    with pytest.raises(SpecError) as failed:
        compiler.compile(write_spec(extra='\n[fake]\ngreting = "hi"\nrepeat = "two"\n'))
    found = {(d.code, d.location.pointer) for d in failed.value.diagnostics}
    assert found == {("MDC101", "/fake/greting"), ("MDC102", "/fake/repeat")}
    hints = [d.hint for d in failed.value.diagnostics if d.code == "MDC101"]
    assert hints == ["did you mean 'greeting'?"]


def test_table_of_a_plugin_without_schema_is_a_plain_mapping(
    write_spec: Callable[..., Path],
) -> None:
    compiler = Compiler(load(("fake", launcher_plugin(launcher()))))
    compiled = compiler.compile(write_spec())
    assert compiled.plan.launcher == "fake"


# ---------------------------------------------------------------- registration errors


def test_duplicate_launcher_names_name_both_plugins() -> None:
    with pytest.raises(PluginError) as failed:
        load(
            ("alpha", launcher_plugin(launcher("twin"))),
            ("beta", launcher_plugin(launcher("twin"))),
        )
    message = str(failed.value)
    assert "alpha-dist" in message and "beta-dist" in message and "'twin'" in message


def test_a_launcher_named_like_a_builtin_is_rejected() -> None:
    with pytest.raises(PluginError) as failed:
        load(("impostor", launcher_plugin(launcher("torchrun"))))
    message = str(failed.value)
    assert "impostor-dist" in message and "mdc-compiler" in message


def test_one_plugin_registering_a_name_twice() -> None:
    with pytest.raises(PluginError, match="also registered"):
        load(("dup", launcher_plugin(launcher("same"), launcher("same"))))


@pytest.mark.parametrize("name", ["Fake", "job", "with-dash", ""])
def test_bad_launcher_names(name: str) -> None:
    with pytest.raises(PluginError, match="not allowed"):
        load(("bad", launcher_plugin(launcher(name))))


def test_a_launcher_name_used_by_a_backend() -> None:
    backend = BackendSpec(name="both", description="d", emit=lambda plan, launch, opts: [])
    with pytest.raises(PluginError) as failed:
        load(("l", launcher_plugin(launcher("both"))), ("b", backend_plugin(backend)))
    assert "b-dist" in str(failed.value) and "l-dist" in str(failed.value)


def test_a_raising_hook_names_plugin_and_hook() -> None:
    class Broken:
        @mdc.hookimpl
        def mdc_register_launchers(self) -> list[LauncherSpec]:
            raise RuntimeError("no licence server")

    with pytest.raises(PluginError) as failed:
        load(("broken", Broken()))
    error = failed.value
    assert error.hook == "mdc_register_launchers"
    assert error.origin == origin("broken")
    message = str(error)
    for part in (
        "broken = tests_broken",
        "broken-dist",
        "1.0",
        "mdc_register_launchers",
        "RuntimeError: no licence server",
    ):
        assert part in message
    assert isinstance(error.__cause__, RuntimeError)


@pytest.mark.parametrize(
    "returned",
    [None, {"name": "x"}, "fake", [object()], (launcher(), "extra")],
    ids=["None", "dict", "str", "object", "mixed"],
)
def test_a_hook_returning_the_wrong_type(returned: object) -> None:
    class Wrong:
        @mdc.hookimpl
        def mdc_register_launchers(self) -> object:
            return returned

    with pytest.raises(PluginError) as failed:
        load(("wrong", Wrong()))
    assert "wrong-dist" in str(failed.value) and "expected a list of LauncherSpec" in str(
        failed.value
    )


def test_a_backend_record_from_the_launcher_hook() -> None:
    record = BackendSpec(name="x", description="d", emit=lambda plan, launch, opts: [])

    class Confused:
        @mdc.hookimpl
        def mdc_register_launchers(self) -> list[BackendSpec]:
            return [record]

    with pytest.raises(PluginError, match="LauncherSpec"):
        load(("confused", Confused()))


def test_a_misspelled_hook_name_is_a_plugin_error() -> None:
    class Typo:
        @mdc.hookimpl
        def mdc_register_launcher(self) -> list[LauncherSpec]:
            return []

    with pytest.raises(PluginError) as failed:
        load(("typo", Typo()))
    assert "typo-dist" in str(failed.value) and "mdc_register_launcher" in str(failed.value)


def test_a_hook_with_an_unknown_argument_is_a_plugin_error() -> None:
    class Greedy:
        @mdc.hookimpl
        def mdc_register_launchers(self, config: object) -> list[LauncherSpec]:
            return []

    with pytest.raises(PluginError) as failed:
        load(("greedy", Greedy()))
    assert "greedy-dist" in str(failed.value)


# ---------------------------------------------------------------- errors while compiling


def test_a_raising_emit_is_a_plugin_error(write_spec: Callable[..., Path]) -> None:
    def emit(plan: Plan, options: object) -> Launch:
        raise KeyError("missing template")

    compiler = Compiler(load(("fake", launcher_plugin(launcher(emit=emit)))))
    with pytest.raises(PluginError) as failed:
        compiler.compile(write_spec())
    message = str(failed.value)
    assert "fake-dist" in message and "emit" in message and "missing template" in message


def test_an_emit_returning_the_wrong_type(write_spec: Callable[..., Path]) -> None:
    wrong = launcher(emit=lambda plan, options: ["torchrun"])  # type: ignore[arg-type,return-value]
    compiler = Compiler(load(("fake", launcher_plugin(wrong))))
    with pytest.raises(PluginError, match="expected mdc.api.Launch"):
        compiler.compile(write_spec())


def test_an_emit_missing_a_role(write_spec: Callable[..., Path]) -> None:
    compiler = Compiler(
        load(("fake", launcher_plugin(launcher(emit=lambda plan, options: Launch(roles=())))))
    )
    with pytest.raises(PluginError, match="roles"):
        compiler.compile(write_spec())


def files_launcher(*files: Artifact) -> LauncherSpec:
    return launcher(emit=lambda plan, options: worker_launch(plan, options, files))


@pytest.mark.parametrize(
    "path", ["../x", "/abs", "launch/../../x", "launch//x", "launch/./x", "launch\\x", ""]
)
def test_a_launcher_file_outside_out_is_a_plugin_error(
    path: str, write_spec: Callable[..., Path]
) -> None:
    compiler = Compiler(load(("fake", launcher_plugin(files_launcher(Artifact.text(path, "x"))))))
    with pytest.raises(PluginError) as failed:
        compiler.compile(write_spec())
    assert "emit" in str(failed.value)


def test_a_launcher_file_given_twice_is_a_plugin_error(write_spec: Callable[..., Path]) -> None:
    twice = files_launcher(Artifact.text("launch/hosts", "a"), Artifact.text("launch/hosts", "b"))
    with pytest.raises(PluginError) as failed:
        Compiler(load(("fake", launcher_plugin(twice)))).compile(write_spec())
    assert "launch/hosts" in str(failed.value) and "twice" in str(failed.value)


def test_a_launcher_file_clashing_with_mdc_own_is_a_plugin_error(
    write_spec: Callable[..., Path],
) -> None:
    clash = files_launcher(Artifact.text("launch/worker.sh", "echo mine"))
    with pytest.raises(PluginError, match="launch/worker.sh"):
        Compiler(load(("fake", launcher_plugin(clash)))).compile(write_spec())


def test_a_bad_launcher_path_blames_the_launcher(write_spec: Callable[..., Path]) -> None:
    twice = files_launcher(Artifact.text("launch/hosts", "a"), Artifact.text("launch/hosts", "b"))
    with pytest.raises(PluginError) as failed:
        Compiler(load(("fake", launcher_plugin(twice)))).compile(write_spec())
    assert failed.value.origin == origin("fake")


@pytest.mark.parametrize("path", ["../x", "/abs", "plan.json", "manifest.json"])
def test_a_backend_file_outside_out_or_taken_is_a_plugin_error(
    path: str, write_spec: Callable[..., Path]
) -> None:
    backend = BackendSpec(
        name="bad_backend",
        description="d",
        emit=lambda plan, launch, opts: [Artifact.text(path, "x")],
    )
    compiler = Compiler(load(("bad_backend", backend_plugin(backend))))
    with pytest.raises(PluginError) as failed:
        compiler.compile(write_spec(launcher_name="torchrun", backend="bad_backend"))
    assert failed.value.origin == origin("bad_backend")
    assert repr(path) in str(failed.value)


def test_a_raising_backend_emit_is_a_plugin_error(write_spec: Callable[..., Path]) -> None:
    def emit(plan: Plan, launch: Launch, options: object) -> list[Artifact]:
        raise OSError("template missing")

    backend = BackendSpec(name="bad_backend", description="d", emit=emit)
    compiler = Compiler(load(("bad_backend", backend_plugin(backend))))
    with pytest.raises(PluginError, match="template missing") as failed:
        compiler.compile(write_spec(launcher_name="torchrun", backend="bad_backend"))
    assert failed.value.origin == origin("bad_backend")


def test_a_raising_check_is_a_plugin_error(write_spec: Callable[..., Path]) -> None:
    def check(plan: Plan, options: object) -> list[Any]:
        raise ZeroDivisionError("oops")

    compiler = Compiler(load(("fake", launcher_plugin(launcher(check=check)))))
    with pytest.raises(PluginError, match="check.*ZeroDivisionError"):
        compiler.compile(write_spec())


def test_a_check_returning_the_wrong_type_is_a_plugin_error(
    write_spec: Callable[..., Path],
) -> None:
    compiler = Compiler(
        load(("fake", launcher_plugin(launcher(check=lambda plan, options: ["looks wrong"]))))
    )
    with pytest.raises(PluginError, match="Finding"):
        compiler.compile(write_spec())


# ---------------------------------------------------------------- order and blocking


@pytest.mark.parametrize("order", [("p1", "p2", "p3"), ("p3", "p1", "p2"), ("p2", "p3", "p1")])
def test_records_are_sorted_by_name_whatever_the_registration_order(
    order: tuple[str, ...], declared_builtins: dict[str, list[str]]
) -> None:
    records = {
        "p1": launcher_plugin(launcher("zeta"), launcher("beta")),
        "p2": launcher_plugin(launcher("alpha")),
        "p3": launcher_plugin(launcher("mu")),
    }
    plugins = load(*[(name, records[name]) for name in order])
    launchers = sorted(["alpha", "beta", "mu", "zeta", *declared_builtins["launchers"]])
    assert list(plugins.launchers) == launchers
    assert list(plugins.plugins) == sorted(plugins.plugins)
    assert list(plugins.tables()) == launchers + declared_builtins["backends"]
    enum = Compiler(plugins).schema["properties"]["distributed"]["properties"]["launcher"]["enum"]
    assert enum == launchers


def test_records_are_attributed_to_their_plugin() -> None:
    plugins = load(
        ("p2", launcher_plugin(launcher("alpha"))), ("p1", launcher_plugin(launcher("zeta")))
    )
    assert plugins.launchers["alpha"].origin == origin("p2")
    assert plugins.launchers["zeta"].origin == origin("p1")
    assert plugins.launchers["torchrun"].origin.distribution == "mdc-compiler"


def test_blocking_a_builtin_removes_it(declared_builtins: dict[str, list[str]]) -> None:
    plugins = load_plugins(autoload=False, blocked=["torchrun"])
    assert "torchrun" not in plugins.launchers and "torchrun" not in plugins.plugins
    assert list(plugins.backends) == declared_builtins["backends"]
    compiler = Compiler(plugins)
    with pytest.raises(SpecError) as failed:
        compiler.compile(REPO / "examples" / "quickstart.toml")
    assert [d.location.pointer for d in failed.value.diagnostics] == ["/distributed/launcher"]


def test_the_builtins_load_without_autoload(declared_builtins: dict[str, list[str]]) -> None:
    plugins = load_plugins(autoload=False)
    declared = declared_builtins
    assert list(plugins.launchers) == declared["launchers"]
    assert list(plugins.backends) == declared["backends"]
    assert {o.distribution for o in plugins.plugins.values()} == {"mdc-compiler"}


# ---------------------------------------------------------------- a real, broken entry point


@pytest.fixture
def broken_distribution(tmp_path: Path) -> Path:
    """An installed-looking distribution whose ``mdc`` entry point fails to import."""
    site = tmp_path / "site"
    info = site / "fakeplug-1.2.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fakeplug\nVersion: 1.2\n")
    (info / "entry_points.txt").write_text("[mdc]\nbroken = fakeplug_mod\n")
    (site / "fakeplug_mod.py").write_text(
        'raise ImportError("fakeplug_mod needs libfrob, which is not installed")\n'
    )
    return site


def run_validate(
    site: Path, env_factory: Callable[..., dict[str, str]], *extra: str, **env: str
) -> subprocess.CompletedProcess[str]:
    path = os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])])
    return subprocess.run(
        [sys.executable, "-m", "mdc", "validate", *extra, "examples/quickstart.toml"],
        cwd=REPO,
        env=env_factory(PYTHONPATH=path, **env),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.slow
def test_a_broken_entry_point_is_a_plugin_error(
    broken_distribution: Path, clean_env: Callable[..., dict[str, str]]
) -> None:
    done = run_validate(broken_distribution, clean_env)
    assert done.returncode == 3, done.stderr
    for part in ("fakeplug", "1.2", "broken = fakeplug_mod", "import", "libfrob"):
        assert part in done.stderr, f"{part!r} missing from: {done.stderr}"
    assert "Traceback" not in done.stderr
    assert done.stdout == ""


@pytest.mark.slow
def test_a_broken_entry_point_with_traceback_flag(
    broken_distribution: Path, clean_env: Callable[..., dict[str, str]]
) -> None:
    done = run_validate(broken_distribution, clean_env, "--traceback")
    assert done.returncode == 3
    assert "Traceback" in done.stderr and "fakeplug_mod.py" in done.stderr


@pytest.mark.slow
def test_a_broken_entry_point_can_be_blocked(
    broken_distribution: Path, clean_env: Callable[..., dict[str, str]]
) -> None:
    done = run_validate(broken_distribution, clean_env, "-p", "no:broken")
    assert (done.returncode, done.stderr) == (0, "")


@pytest.mark.slow
def test_a_broken_entry_point_is_skipped_without_autoload(
    broken_distribution: Path, clean_env: Callable[..., dict[str, str]]
) -> None:
    done = run_validate(broken_distribution, clean_env, MDC_DISABLE_PLUGIN_AUTOLOAD="1")
    assert (done.returncode, done.stderr) == (0, "")


# ---------------------------------------------------------------- deferred built-ins


def test_each_builtin_registers_one_record_of_its_modules_kind() -> None:
    """Each built-in entry point registers one record, named after it, of its module's kind."""
    eager = load_plugins(autoload=False, lazy=False)
    for name, reg in eager.tables().items():
        assert reg.origin.entry_point == f"{name} = mdc_builtin.{reg.kind}s.{name}"
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert sorted(eager.tables()) == sorted(project["project"]["entry-points"]["mdc"])


def test_a_deferred_builtin_equals_the_eagerly_loaded_one() -> None:
    lazy, eager = load_plugins(autoload=False), load_plugins(autoload=False, lazy=False)
    assert list(lazy.launchers) == list(eager.launchers)
    assert list(lazy.backends) == list(eager.backends)
    assert lazy.plugins == eager.plugins
    for name, reg in eager.tables().items():
        deferred = lazy.table(name)
        assert (deferred.kind, deferred.origin) == (reg.kind, reg.origin)
        assert deferred.record.schema == reg.record.schema
        assert deferred.record.options_type is reg.record.options_type
    assert dict(lazy.option_types()) == {
        n: r.record.options_type for n, r in eager.tables().items()
    }


def test_the_composed_schema_is_the_same_with_deferred_builtins() -> None:
    assert (
        Compiler(load_plugins(autoload=False)).schema
        == Compiler(load_plugins(autoload=False, lazy=False)).schema
    )


DIAGNOSTIC_CASES = sorted(p for p in (REPO / "golden" / "diagnostics").glob("*/spec.*"))


@pytest.mark.parametrize("spec", DIAGNOSTIC_CASES, ids=lambda p: p.parent.name)
def test_deferred_builtins_give_the_same_diagnostics(spec: Path) -> None:
    """A fresh compiler that imports plugins on demand reports what the eager one does."""

    def diagnostics(lazy: bool) -> list[str]:
        compiler = Compiler(load_plugins(autoload=False, lazy=lazy))
        try:
            return [d.render() for d in compiler.compile(spec).diagnostics]
        except SpecError as exc:
            return [d.render() for d in exc.diagnostics]

    assert diagnostics(True) == diagnostics(False)


def test_an_unknown_table_lists_every_plugin_table(tmp_path: Path) -> None:
    """The hint for an unknown top-level key names the tables of plugins not yet imported."""
    spec = tmp_path / "spec.toml"
    spec.write_text(
        '[job]\nname = "x"\ncommand = ["python", "t.py"]\n[distributed]\n'
        'launcher = "torchrun"\nnnodes = 1\nnproc_per_node = 1\n[torchrn]\n'
        'rdzv_backend = "static"\n[slurmm]\npartition = "p"\n'
    )
    with pytest.raises(SpecError) as failed:
        Compiler(load_plugins(autoload=False)).compile(spec)
    hints = {d.location.pointer: d.hint for d in failed.value.diagnostics}
    assert hints == {"/torchrn": "did you mean 'torchrun'?", "/slurmm": "did you mean 'slurm'?"}


def test_a_name_clash_with_a_deferred_builtin_loads_everything() -> None:
    """The clash is reported exactly as when every plugin is imported up front."""
    with pytest.raises(PluginError) as lazy:
        load(
            (
                "impostor",
                backend_plugin(
                    BackendSpec(
                        name="torchrun", description="d", emit=lambda plan, launch, opts: []
                    )
                ),
            )
        )
    with pytest.raises(PluginError) as eager:
        load(
            (
                "impostor",
                backend_plugin(
                    BackendSpec(
                        name="torchrun", description="d", emit=lambda plan, launch, opts: []
                    )
                ),
            ),
            lazy=False,
        )
    assert str(lazy.value) == str(eager.value) and "mdc-compiler" in str(lazy.value)


def test_the_entry_point_scan_agrees_with_importlib_metadata(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from mdc.plugin_manager import _from_metadata, _scan

    def listed(found: Sequence[Any] | None) -> list[tuple[str, str, str, str]]:
        assert found is not None
        return sorted((e.name, e.value, e.distribution, e.version) for e in found)

    assert listed(_scan("mdc")) == listed(_from_metadata("mdc"))
    site = tmp_path / "site"
    for dist, body in (
        (
            "Other_Plug-2.0.dist-info",
            ("[mdc]\nother = other_mod:plugin [extra]\n# a comment\n[console_scripts]\nx = y\n"),
        ),
        ("legacy_plug-0.3.egg-info", "[mdc]\nlegacy=legacy_mod\n"),
    ):
        (site / dist).mkdir(parents=True)
        (site / dist / "entry_points.txt").write_text(body)
        meta = "METADATA" if dist.endswith("dist-info") else "PKG-INFO"
        name, version = dist.rsplit(".", 1)[0].split("-")
        (site / dist / meta).write_text(
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\nName: not-a-header\n"
        )
    monkeypatch.syspath_prepend(str(site))
    assert listed(_scan("mdc")) == listed(_from_metadata("mdc"))
    assert ("other", "other_mod:plugin [extra]", "Other_Plug", "2.0") in listed(_scan("mdc"))


def test_the_scan_defers_to_importlib_metadata_for_a_zip_on_the_path(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from mdc.plugin_manager import _scan

    archive = tmp_path / "plugins.zip"
    archive.write_bytes(b"PK\x05\x06" + b"\0" * 18)  # an empty zip archive
    monkeypatch.syspath_prepend(str(archive))
    assert _scan("mdc") is None


@pytest.mark.slow
def test_validate_imports_only_what_the_spec_needs(
    clean_env: Callable[..., dict[str, str]],
) -> None:
    """A TOML torchrun/local spec: two built-ins imported, no YAML parser, no metadata parser."""
    code = (
        "import sys; from mdc.cli import main\n"
        "assert main(['validate', '-q', 'examples/quickstart.toml']) == 0\n"
        "print(sorted(m for m in sys.modules if m.startswith(('mdc_builtin.', 'ruamel', "
        "'importlib.metadata', 'email'))))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert done.stdout.strip() == str(
        [
            "mdc_builtin.backends",
            "mdc_builtin.backends.local",
            "mdc_builtin.launchers",
            "mdc_builtin.launchers.torchrun",
        ]
    )


def test_tracing_shows_every_registration_hook_call(
    tmp_path: Path, declared_builtins: dict[str, list[str]]
) -> None:
    """MDC_TRACE_PLUGINS=1: pluggy's own tracing prints each plugin's hook call, as the
    plugin guide says (hooks are called through pluggy, not as plain functions)."""
    env = {**os.environ, "MDC_TRACE_PLUGINS": "1"}
    env.pop("MDC_DISABLE_PLUGIN_AUTOLOAD", None)
    done = subprocess.run(
        [sys.executable, "-m", "mdc", "compile", str(REPO / "examples" / "quickstart.toml"),
         "-o", str(tmp_path / "out")],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    calls = [line.strip() for line in done.stderr.splitlines() if line.strip().endswith("[hook]")]
    for hook, kind in (
        ("mdc_register_launchers", "launchers"),
        ("mdc_register_backends", "backends"),
    ):
        started = [c for c in calls if c == f"{hook} [hook]"]
        finished = [c for c in calls if c.startswith(f"finish {hook} -->")]
        assert len(started) == len(finished) >= len(declared_builtins[kind])
    assert any("LauncherSpec(name='torchrun'" in c for c in calls)


#: distributions laid out as installers and hands leave them: (folder, file -> text)
ODD_DISTRIBUTIONS = [
    # the same name twice, spelled differently: the first on the path wins
    [
        ("Twin_Plug-1.0.dist-info", {"entry_points.txt": "[mdc]\ntwin = first_mod\n"}),
        ("twin.plug-2.0.dist-info", {"entry_points.txt": "[mdc]\ntwin = second_mod\n"}),
    ],
    # spaces, blank lines, comments, other groups around ours, a value with extras
    [
        (
            "spaced-0.1.dist-info",
            {
                "entry_points.txt": "\n[console_scripts]\nx=y\n\n  [ mdc ]  \n"
                "  spaced   =   pkg.mod : obj.attr  [one, two]\n# one\n"
            },
        )
    ],
    # a group named like ours with a suffix, and ours empty
    [("near-1.0.dist-info", {"entry_points.txt": "[mdc.extra]\nnear = near_mod\n[mdc]\n"})],
    # a header block with folded lines and headers after the blank line
    [
        (
            "folded-3.0.dist-info",
            {
                "entry_points.txt": "[mdc]\nfolded = folded_mod\n",
                "METADATA": "Metadata-Version: 2.1\nName: folded\nSummary: two\n  lines\n"
                "Version: 3.0\n\nVersion: 9\n",
            },
        )
    ],
]


@pytest.mark.parametrize("layout", ODD_DISTRIBUTIONS, ids=["twins", "spaced", "near", "folded"])
def test_the_scan_agrees_with_importlib_metadata_on_odd_layouts(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, layout: list[tuple[str, dict[str, str]]]
) -> None:
    from mdc.plugin_manager import _from_metadata, _scan

    site = tmp_path / "site"
    for folder, files in layout:
        (site / folder).mkdir(parents=True)
        name, version = folder.rsplit(".", 1)[0].split("-")
        files = {"METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n", **files}
        for file, text in files.items():
            (site / folder / file).write_text(text)
    monkeypatch.syspath_prepend(str(site))
    scanned = _scan("mdc")
    assert scanned is not None
    ours = sorted((e.name, e.value, e.distribution, e.version) for e in scanned)
    library = sorted((e.name, e.value, e.distribution, e.version) for e in _from_metadata("mdc"))
    assert ours == library
