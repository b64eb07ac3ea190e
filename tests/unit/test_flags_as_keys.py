"""A flag the launcher writes, given in the user's arguments instead of its key, is read as
that key: the spec compiles to the same artifacts as the spec with the key written.

For every example and base spec of the megatron, vllm, sglang and sglang_disagg launchers,
each key the spec writes whose flag mdc emits is taken out of the spec and the words mdc
emitted for it are put into each place the launcher reads flags from (the job's command,
its argument lists), in every spelling (the flag, its aliases, ``--flag=value``). The
compiled tree must be the same, byte for byte, as the original's (the manifest differs
only in the spec's hash); and every flag of each launcher's table that stands for a key
must have been exercised so. A value that disagrees with the key is refused, naming both.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mdc.api import FlagReading, KnownFlag
from mdc.errors import SpecError
from mdc.loaders import load_file
from mdc.pipeline import Compiled, Compiler
from mdc.plugin_manager import load_plugins

REPO = Path(__file__).resolve().parents[2]
LAUNCHERS = ("megatron", "vllm", "sglang", "sglang_disagg")
COMPILER = Compiler(load_plugins(autoload=False))
HERE = Path(__file__).resolve().parent / "flags_as_keys"


def _launcher(data: Any) -> str | None:
    section = data.get("distributed") if isinstance(data, dict) else None
    return section.get("launcher") if isinstance(section, dict) else None


def base_specs() -> list[Path]:
    """The examples, the golden pairs' bases and this test's own specs of these launchers."""
    found = []
    for folder in (REPO / "examples", REPO / "tests/golden/pairs", HERE):
        for path in sorted(folder.glob("*")):
            ours = path.suffix in (".toml", ".yaml", ".json")
            if ours and _launcher(load_file(path).data) in LAUNCHERS:
                found.append(path)
    return found


BASES = base_specs()


def reading(launcher: str) -> FlagReading:
    found = COMPILER.plugins.launcher(launcher).arguments
    assert found is not None, launcher
    return found


def tree(compiled: Compiled) -> dict[str, Any]:
    """The compiled files; the manifest without the spec's hash (the specs differ), and
    plan.json's warnings without their places."""
    files: dict[str, Any] = {}
    for artifact in compiled.tree:
        content: Any = (artifact.data, artifact.executable)
        if artifact.path == "manifest.json":
            content = json.loads(artifact.data)
            content.pop("spec_sha256")
            content["files"]["plan.json"].pop("sha256")  # compared as JSON below
        elif artifact.path == "plan.json":  # a warning on a key read from a flag is located
            content = json.loads(artifact.data)  # at the flag's word: where is not compared
            for warning in content["warnings"]:
                for where in ("pointer", "line", "column"):
                    warning.pop(where, None)

        files[artifact.path] = content
    return files


def compile_data(tmp_path: Path, data: Any, name: str = "spec.json") -> Compiled:
    path = tmp_path / name
    path.write_text(json.dumps(data), encoding="utf-8")
    return COMPILER.compile(path)


def _lookup(data: Any, pointer: str) -> tuple[bool, Any]:
    here = data
    for token in pointer.split("/")[1:]:
        if not isinstance(here, dict) or token not in here:
            return False, None
        here = here[token]
    return True, here


def _remove(data: Any, pointer: str) -> None:
    *tables, key = pointer.split("/")[1:]
    here = data
    for token in tables:
        here = here[token]
    del here[key]


def _append(data: Any, pointer: str, words: list[str]) -> None:
    *tables, key = pointer.split("/")[1:]
    here = data
    for token in tables:
        here = here.setdefault(token, {})
    if pointer == "/job/command" and isinstance(here.get(key), str):
        here[key] = " ".join([here[key], *words])
    else:
        here[key] = [*here.get(key, []), *words]


def flag_words(flag: KnownFlag, value: Any, data: Any) -> list[str] | None:
    """The words that pass ``value`` through ``flag``, as a user would write them (None: the
    flag cannot say it, e.g. a switch's key set to the other value)."""
    if flag.compute is not None:  # a key that follows from others: the switch says it
        return [flag.name] if flag.compute(flag.switch_value, data) == value else None
    if flag.nargs == 0:
        return [flag.name] if flag.to_key(flag.switch_value) == value else None
    if flag.nargs == "+":
        return [flag.name, *map(str, value)] if isinstance(value, list) else None
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        return None
    return [flag.name, str(value)]


def spellings(flag: KnownFlag, words: list[str]) -> Iterator[list[str]]:
    """The flag's words under each of its names, and as --flag=value."""
    for name in (flag.name, *flag.aliases):
        yield [name, *words[1:]]
        if flag.nargs == 1:
            yield [f"{name}={words[1]}"]


def cases(path: Path) -> Iterator[tuple[str, str, list[str], str]]:
    """(key pointer, place pointer, the flag's words, flag name) for each key the spec
    writes that a flag of the launcher can say, in each place and spelling."""
    data = load_file(path).data
    launcher = _launcher(data)
    assert launcher is not None
    read = reading(launcher)
    for place in read.places:
        for flag in read.table.flags:
            if flag.spec_key is None:
                continue
            relative = not flag.spec_key.startswith("/")
            if relative and not place.table:
                continue
            key = f"{place.table}/{flag.spec_key}" if relative else flag.spec_key
            written, value = _lookup(data, key)
            words = flag_words(flag, value, data) if written else None
            if words is None:
                continue
            for spelled in spellings(flag, words):
                yield key, place.pointer, spelled, flag.name


@pytest.mark.parametrize("path", BASES, ids=lambda p: p.name)
def test_a_key_given_as_its_flag_compiles_to_the_same_tree(path: Path, tmp_path: Path) -> None:
    data = load_file(path).data
    originals: dict[str, dict[str, Any]] = {}
    for key, place, words, _ in cases(path):
        if place not in originals:  # the spec with the keys, and the place's list (if empty)
            keyed = copy.deepcopy(data)
            _append(keyed, place, [])
            originals[place] = tree(compile_data(tmp_path, keyed))
        original = originals[place]
        moved = copy.deepcopy(data)
        _remove(moved, key)
        _append(moved, place, words)
        try:
            got = tree(compile_data(tmp_path, moved))
        except SpecError as exc:  # pragma: no cover - the message says which
            raise AssertionError(f"{key} as {words} in {place}: {exc}") from None
        assert got == original, f"{key} as {words} in {place}"
        # the flag and the key together, agreeing: the same again
        both = copy.deepcopy(data)
        _append(both, place, words)
        assert tree(compile_data(tmp_path, both)) == original, f"{key} and {words} in {place}"


def test_every_flag_that_stands_for_a_key_is_exercised() -> None:
    """Across the base specs, each keyed flag of each launcher is moved out of its key."""
    exercised: dict[str, set[str]] = {name: set() for name in LAUNCHERS}
    for path in BASES:
        launcher = _launcher(load_file(path).data)
        assert launcher is not None
        exercised[launcher] |= {name for _, _, _, name in cases(path)}
    for launcher in LAUNCHERS:
        keyed = {f.name for f in reading(launcher).table.flags if f.spec_key is not None}
        assert keyed - exercised[launcher] == set(), launcher
