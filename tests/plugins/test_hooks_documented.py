"""Every hook is documented, with its exact signature, and tested.

* Each ``@hookspec`` function in ``compiler/mdc/hookspecs.py`` has a docstring that says
  when it is called, what it returns (``:returns:``) and since when (``.. versionadded::``).
* ``docs/plugin-guide.md`` holds the hook reference generated from those functions, between
  the markers below; the test regenerates it and compares. After changing a hookspec, rewrite
  it with ``.venv/bin/python tests/plugins/test_hooks_documented.py --write``.
* Every field of the records a plugin builds (``LauncherSpec``, ``BackendSpec``, ``Launch``,
  ``Role``, ``Artifact``, ``Finding``) is named in the guide.
* Every hook is called by a test: :data:`HOOK_TESTS` maps each to a test in this module that
  registers an in-process plugin implementing it and checks what mdc made of the result.
"""

from __future__ import annotations

import ast
import inspect
import re
import sys
import textwrap
from pathlib import Path

import attrs
import pytest

from mdc.plugin_manager import PluginSet

#: not tests.tools.REPO: this module also runs as a script, where tests/ is not importable
REPO = Path(__file__).resolve().parents[2]
HOOKSPECS = REPO / "compiler" / "mdc" / "hookspecs.py"
GUIDE = REPO / "docs" / "plugin-guide.md"
BEGIN = (
    "<!-- BEGIN HOOK REFERENCE: generated from compiler/mdc/hookspecs.py by "
    "tests/plugins/test_hooks_documented.py --write; do not edit by hand -->"
)
END = "<!-- END HOOK REFERENCE -->"


@attrs.frozen
class Hook:
    name: str
    signature: str
    docstring: str


def hookspecs(path: Path = HOOKSPECS) -> list[Hook]:
    """The functions of ``path`` decorated with ``@hookspec`` (or ``@hookspec(...)``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef):
            continue
        marks = [d.func if isinstance(d, ast.Call) else d for d in node.decorator_list]
        if not any(isinstance(m, ast.Name) and m.id == "hookspec" for m in marks):
            continue
        returns = f" -> {ast.unparse(node.returns)}" if node.returns else ""
        found.append(
            Hook(
                name=node.name,
                signature=f"{node.name}({ast.unparse(node.args)}){returns}",
                docstring=ast.get_docstring(node) or "",
            )
        )
    return found


def _markdown(docstring: str) -> str:
    """The docstring's reST, as Markdown: roles as code, ``::`` blocks fenced."""
    text = re.sub(r":(?:class|func|data|mod|meth|attr):`~?([^`]+)`", r"`\1`", docstring)
    text = re.sub(r"``([^`]+)``", r"`\1`", text)
    text = re.sub(r"^:returns:", "**Returns:**", text, flags=re.MULTILINE)
    text = re.sub(r"^\.\. versionadded:: (\S+)$", r"*Added in mdc \1.*", text, flags=re.MULTILINE)
    out: list[str] = []
    lines = text.splitlines()
    index = 0
    while index < len(lines):
        line = lines[index]
        if line.endswith("::"):
            out += [line[:-1], "", "```python"]
            index += 1
            block = []
            while index < len(lines) and (
                not lines[index].strip() or lines[index].startswith("    ")
            ):
                block.append(lines[index])
                index += 1
            out += textwrap.dedent("\n".join(block)).strip("\n").splitlines()
            out += ["```", ""]
            continue
        out.append(line)
        index += 1
    return "\n".join(out).strip("\n").replace("\n\n\n", "\n\n")


def reference(hooks: list[Hook]) -> str:
    """The generated hook reference, markers included."""
    parts = [BEGIN, ""]
    for hook in hooks:
        parts += [
            f"### `{hook.name}`",
            "",
            "```python",
            "@mdc.hookimpl",
            f"def {hook.signature}: ...",
            "```",
            "",
            _markdown(hook.docstring),
            "",
        ]
    return "\n".join([*parts, END])


def _guide_reference(text: str) -> str | None:
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        return None
    return text[start : end + len(END)]


def write() -> None:
    text = GUIDE.read_text(encoding="utf-8")
    current = _guide_reference(text)
    if current is None:
        raise SystemExit(f"{GUIDE}: no {BEGIN!r} ... {END!r} markers to write between")
    GUIDE.write_text(text.replace(current, reference(hookspecs())), encoding="utf-8")


# ---------------------------------------------------------------- the checks


def test_there_are_hooks() -> None:
    assert [h.name for h in hookspecs()] == [
        "mdc_register_launchers",
        "mdc_register_backends",
        "mdc_register_hardware",
    ]


def test_the_parser_sees_what_pluggy_sees() -> None:
    """hookspecs() finds exactly the functions pluggy registers as specs."""
    import pluggy

    from mdc import hookspecs as module

    manager = pluggy.PluginManager("mdc")
    manager.add_hookspecs(module)
    assert sorted(h.name for h in hookspecs()) == sorted(
        name for name in dir(manager.hook) if not name.startswith("_")
    )


@pytest.mark.parametrize("hook", hookspecs(), ids=lambda h: h.name)
def test_every_hook_has_a_full_docstring(hook: Hook) -> None:
    doc = hook.docstring
    assert doc, f"{hook.name} has no docstring"
    first = doc.splitlines()[0]
    assert first.endswith(".") and len(first) <= 79, f"{hook.name}: a one-line summary first"
    assert re.search(r"^:returns: \S", doc, re.MULTILINE), f"{hook.name}: no `:returns:`"
    assert "Called" in doc, f"{hook.name}: does not say when mdc calls it"
    assert re.search(r"^\.\. versionadded:: \d", doc, re.MULTILINE), (
        f"{hook.name}: no `.. versionadded::`"
    )


def test_guide_holds_the_generated_reference() -> None:
    assert GUIDE.is_file(), "docs/plugin-guide.md is missing"
    current = _guide_reference(GUIDE.read_text(encoding="utf-8"))
    assert current is not None, f"docs/plugin-guide.md has no {BEGIN!r} ... {END!r} section"
    assert current == reference(hookspecs()), (
        "the hook reference in docs/plugin-guide.md differs from compiler/mdc/hookspecs.py; "
        "regenerate it with `.venv/bin/python tests/plugins/test_hooks_documented.py --write` "
        "and review the diff"
    )


@pytest.mark.parametrize("hook", hookspecs(), ids=lambda h: h.name)
def test_every_signature_appears_exactly(hook: Hook) -> None:
    assert f"def {hook.signature}: ..." in GUIDE.read_text(encoding="utf-8")


def _record_fields() -> list[tuple[str, str]]:
    from mdc import api

    return [
        (record.__name__, field.name)
        for record in (
            api.LauncherSpec,
            api.BackendSpec,
            api.Launch,
            api.Role,
            api.Artifact,
            api.Finding,
        )
        for field in attrs.fields(record)
    ]


@pytest.mark.parametrize(("record", "field"), _record_fields(), ids=lambda x: str(x))
def test_every_record_field_is_in_the_guide(record: str, field: str) -> None:
    """Each field appears as `field` in the section that documents its record."""
    text = GUIDE.read_text(encoding="utf-8")
    section = re.search(rf"^#+ `{record}`.*?(?=^#+ )", text, re.MULTILINE | re.DOTALL)
    assert section is not None, f"docs/plugin-guide.md has no heading for `{record}`"
    assert f"`{field}`" in section.group(), f"`{record}.{field}` is not documented"


# ---------------------------------------------------------------- every hook is called


def _load_with(plugin: object) -> PluginSet:
    from mdc.errors import PluginOrigin
    from mdc.plugin_manager import load_plugins

    origin = PluginOrigin(
        entry_point="probe = tests_probe", distribution="probe-dist", version="9.9"
    )
    return load_plugins(autoload=False, extra=[("probe", plugin, origin)])


def test_hook_mdc_register_launchers_is_called() -> None:
    import mdc
    from mdc.api import Launch, LauncherSpec, Plan, Role

    def emit(plan: Plan, options: object) -> Launch:
        return Launch(roles=(Role(name="worker", argv=("true",)),))

    class Probe:
        @mdc.hookimpl
        def mdc_register_launchers(self) -> list[LauncherSpec]:
            return [
                LauncherSpec(
                    name="probe_launcher", description="probe", parallelism="data", emit=emit
                )
            ]

    plugins = _load_with(Probe())
    registered = plugins.launchers["probe_launcher"]
    assert registered.kind == "launcher" and registered.origin.distribution == "probe-dist"
    assert registered.record.emit is emit


def test_hook_mdc_register_backends_is_called() -> None:
    import mdc
    from mdc.api import Artifact, BackendSpec, Launch, Plan

    def emit(plan: Plan, launch: Launch, options: object) -> list[Artifact]:
        return []

    class Probe:
        @mdc.hookimpl
        def mdc_register_backends(self) -> list[BackendSpec]:
            return [BackendSpec(name="probe_backend", description="probe", emit=emit)]

    plugins = _load_with(Probe())
    registered = plugins.backends["probe_backend"]
    assert registered.kind == "backend" and registered.origin.version == "9.9"
    assert registered.record.emit is emit


def test_hook_mdc_register_hardware_is_called() -> None:
    import mdc
    from mdc.api import Accelerator

    entry = Accelerator(
        id="probe-gpu",
        name="Probe GPU",
        vendor="nvidia",
        memory_gib=48,
        memory_bandwidth_gb_s=1000,
        dense_tflops={"bf16": 100},
        scale_up_domain=4,
        scale_up_gb_s=100,
        scale_out_gb_s=25,
        sources=dict.fromkeys(
            ("compute", "memory", "scale_up", "scale_out"), "https://example.com/probe"
        ),
    )

    class Probe:
        @mdc.hookimpl
        def mdc_register_hardware(self) -> list[Accelerator]:
            return [entry]

    plugins = _load_with(Probe())
    assert plugins.hardware == {"probe-gpu": entry}
    assert plugins.accelerators()["probe-gpu"] is entry
    assert "h100-sxm" in plugins.accelerators()


#: hook -> the test above that calls it through mdc's plugin manager
HOOK_TESTS = {
    "mdc_register_launchers": test_hook_mdc_register_launchers_is_called,
    "mdc_register_backends": test_hook_mdc_register_backends_is_called,
    "mdc_register_hardware": test_hook_mdc_register_hardware_is_called,
}


def test_every_hook_is_called_by_a_test() -> None:
    names = [h.name for h in hookspecs()]
    missing = [n for n in names if n not in HOOK_TESTS]
    assert not missing, (
        f"hooks without a test: {missing}; add a test that registers a plugin "
        "implementing each and add it to HOOK_TESTS"
    )
    for name, test in HOOK_TESTS.items():
        assert name in names, f"HOOK_TESTS names {name}, which is no longer a hook"
        source = inspect.getsource(test)
        assert f"@mdc.hookimpl\n        def {name}(self)" in source, (
            f"{test.__name__} does not implement {name}"
        )


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        raise SystemExit("usage: tests/plugins/test_hooks_documented.py --write")
    write()
