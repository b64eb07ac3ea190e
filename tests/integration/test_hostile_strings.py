"""Hostile strings in every string field of every example: refused where they land, or quoted.

test_scripts_lint.py runs one hostile spec through the local backend and a stub torchrun,
and k8s/test_kubernetes.py reads YAML-special words back from the Kubernetes backend. Here
the sweep covers every string an example spec holds (job name, image, command words, env
names and values, workdir, and each launcher's and backend's string options: slurm
partition and sbatch arguments, ssh hosts and options, Kubernetes namespace, labels, node
selector, tolerations, volumes, serving arguments, Primus and TorchTitan paths, ...), plus a
hostile key and a hostile value in every string map (env, labels, node selector, rendezvous
options), plus every free-text option of the example's launcher and backend schema that the
example leaves out (slurm qos/constraint/output..., ssh remote_dir, Kubernetes cpu/memory...).
The sweep runs on the few examples that together hold every field, launcher and backend.

For each example and each hostile value, the value goes into every such field at once.
Fields that refuse it must do so with an error located at (or inside) that field, not a
silent rewrite, and are then restored; the rest must compile, and then:

* every emitted shell script (``#!`` ... ``sh``) passes ``bash -n`` and shellcheck;
* every YAML document parses (YAML 1.2, safe) and every JSON and TOML file parses;
* a value in a field that lands in a Kubernetes document verbatim (job name and image,
  namespace, labels, node selector, tolerations, service account, ...) reads back as exactly
  that string (so a value mdc accepts is never rewritten on the way);
* a NUL in any field or key is refused with a located error (MDC106, or an enum's MDC104).

Last, real processes: the basic launcher on the local backend runs a Python program that
records its argv, environment and working directory; commands hidden in the arguments, the
environment and the working directory must not run, and every byte must arrive.
"""

from __future__ import annotations

import copy
import io
import json
import os
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML
from tests.tools import REPO, shellcheck

from mdc.errors import SpecError, join_pointer
from mdc.loaders import load_file
from mdc.pipeline import Compiler
from mdc.plugin_manager import load_plugins

EXAMPLES = sorted(
    p for p in (REPO / "examples").iterdir() if p.suffix in (".toml", ".yaml", ".yml", ".json")
)
#: chosen by the spec's vocabulary, not free text: an enum, a launcher or backend name
FIXED = {
    ("distributed", "launcher"),
    ("distributed", "backend"),
    ("distributed", "accelerator"),
    ("$schema",),
}
#: string maps that get a hostile key too
MAPS = {
    ("job", "env"),
    ("torchrun", "rdzv_conf"),
    ("kubernetes", "labels"),
    ("kubernetes", "node_selector"),
    ("leaderworkerset", "labels"),
    ("leaderworkerset", "node_selector"),
    ("pytorchjob", "labels"),
    ("pytorchjob", "node_selector"),
    ("trainjob", "labels"),
    ("trainjob", "node_selector"),
}
MAP_POINTERS = {join_pointer(table) for table in MAPS}
#: fields that land in a Kubernetes document as they are (the last part may be any key)
VERBATIM_IN_YAML = {
    ("job", "image"),
    ("namespace",),
    ("labels", "*"),
    ("node_selector", "*"),
    ("service_account",),
    ("priority_class",),
    ("image_pull_secrets", "*"),
    ("tolerations", "*", "value"),
    ("tolerations", "*", "key"),
}
K8S_TABLES = {"kubernetes", "leaderworkerset", "pytorchjob", "trainjob"}


def hostile_values(canary: Path) -> dict[str, str]:
    """The values, by name; the shell ones try to create a file in ``canary``."""
    return {
        "subshell": f"$(touch {canary}/subshell)",
        "backticks": f"`touch {canary}/backticks`",
        "semicolon": f"x; touch {canary}/semicolon",
        "single-quote": f"it's' ; touch {canary}/single ; '",
        "double-quote": f'say "hi" " ; touch {canary}/double ; "',
        "newline": f"line1\ntouch {canary}/newline\n",
        "operators": f"x && touch {canary}/and | tee {canary}/pipe & > {canary}/redirect",
        "variables": "${HOME} $HOME \\$x ${x:-$(id)} $'\\x41'",
        "yaml-yes": "yes",
        "yaml-no": "No",
        "yaml-on": "on",
        "yaml-null": "null",
        "yaml-tilde": "~",
        "yaml-hex": "0x1",
        "yaml-octal": "012",
        "yaml-float": "1e3",
        "yaml-date": "2026-11-22",
        "yaml-time": "12:30",
        "yaml-map": "{a: 1}",
        "yaml-list": "- item",
        "yaml-comment": "x # y",
        "yaml-anchor": "&anchor",
        "yaml-alias": "*alias",
        "yaml-tag": "!!str x",
        "yaml-document": "---",
        "yaml-block": "|\n  text",
        "percent": "%s %n %(x)s",
        "unicode": "naïve ✓ 日本語 🚀 \u202eevil\u200b",
        "spaces": " leading and trailing ",
        "tab-cr": "a\tb\rc",
        "backslash": "back\\slash\\",
        "glob": "*",
        "option": "--help",
        "dash": "-",
        "empty": "",
        "long": "x" * 5000 + f"$(touch {canary}/long)",
    }


def string_fields(value: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Paths of the strings inside a spec (vocabulary fields left out)."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from string_fields(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from string_fields(item, (*prefix, index))
    elif isinstance(value, str) and prefix[:2] not in FIXED and prefix[:1] not in FIXED:
        yield prefix


def put(spec: dict[str, Any], path: tuple[Any, ...], value: Any) -> None:
    node: Any = spec
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value


def get(spec: Any, path: tuple[Any, ...]) -> Any:
    for part in path:
        spec = spec[part]
    return spec


def related(a: str, b: str) -> bool:
    """Whether one pointer lies inside the other (or they are the same)."""
    return a == b or a.startswith(b + "/") or b.startswith(a + "/")


@pytest.fixture(scope="module")
def compiler() -> Compiler:
    return COMPILER


@pytest.fixture(scope="module")
def canary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("canary")


COMPILER = Compiler(load_plugins(autoload=False))
#: options not added where an example leaves them out, and why
NOT_ADDED: set[tuple[str, str]] = set()
#: marks a field the example did not have (removed again when refused)
ADDED = "<added>"


def string_options(table: str) -> Iterator[tuple[str, bool]]:
    """The launcher's or backend's free-text options: (name, whether it is a list)."""
    fragment = COMPILER.schema["properties"].get(table, {})
    for name, sub in fragment.get("properties", {}).items():
        if "enum" in sub or "pattern" in sub:
            continue
        if sub.get("type") == "string" or "string" in sub.get("type", []):
            yield name, False
        elif sub.get("type") == "array" and sub.get("items", {}).get("type") == "string":
            yield name, True


def inject(spec: dict[str, Any], value: str) -> dict[tuple[Any, ...], str]:
    """Put ``value`` in every string field, and in every string map as a key and a value.

    The launcher's and backend's free-text options the example leaves out are added too,
    so every such option of the schema is swept, not only those the examples use.
    Returns pointer parts -> what was there before (:data:`ADDED` for an added option, ""
    for an added key; both are removed when refused).
    """
    changed: dict[tuple[Any, ...], str] = {}
    for path in list(string_fields(spec)):
        changed[path] = get(spec, path)
        put(spec, path, value)
    dist = spec["distributed"]
    for table in (dist["launcher"], dist.get("backend", "local")):
        if table not in COMPILER.schema["properties"]:  # a plugin without options
            continue
        options = spec.setdefault(table, {})
        if not isinstance(options, dict):
            continue
        for name, is_list in string_options(table):
            if name not in options and (table, name) not in NOT_ADDED:
                options[name] = [value] if is_list else value
                changed[(table, name, 0) if is_list else (table, name)] = ADDED
    for table in MAPS:
        if table[0] in spec and isinstance(spec[table[0]], dict) and table[1] in spec[table[0]]:
            target = spec[table[0]][table[1]]
            if not isinstance(target, dict):
                continue
            # a hostile value under a plain key, and a hostile key with a plain value
            target["mdc_hostile"] = value
            changed[(*table, "mdc_hostile", "<key>")] = ""
            if value not in target:
                target[value] = "v"
                changed[(*table, value, "<key>")] = ""
    return changed


def compile_hostile(
    compiler: Compiler, original: dict[str, Any], value: str, path: Path
) -> tuple[dict[str, Any], dict[tuple[Any, ...], str], Any]:
    """Inject ``value``; restore each field whose own located error refuses it; compile."""
    spec = copy.deepcopy(original)
    changed = inject(spec, value)
    accepted = dict(changed)
    for _ in range(len(changed) + 1):
        path.write_text(json.dumps(spec, ensure_ascii=False), encoding="utf-8")
        try:
            return spec, accepted, compiler.compile(path)
        except SpecError as exc:
            errors = [d for d in exc.diagnostics if d.is_error]
        refused = set()
        for diag in errors:
            pointer = diag.location.pointer or ""
            owners = [
                p
                for p in accepted
                if related(join_pointer(p[:-1] if p[-1] == "<key>" else p), pointer)
            ]
            if pointer in MAP_POINTERS:  # a bad key is reported at its table: only keys go
                owners = [
                    p for p in owners if p[-1] == "<key>" and p[-2] != "mdc_hostile"
                ] or owners
            assert owners, f"{value!r}: an error no injected field explains:\n{diag.render()}"
            assert diag.location.line is not None, f"unlocated: {diag.render()}"
            refused.update(owners)
        for owner in refused:
            if accepted[owner] == ADDED:
                spec[owner[0]].pop(owner[1], None)
            elif owner[-1] == "<key>":
                del get(spec, owner[:-2])[owner[-2]]
            else:
                put(spec, owner, accepted[owner])
            del accepted[owner]
    raise AssertionError(f"{value!r}: still refused after restoring every field")


def scripts_of(tree: dict[str, bytes]) -> list[str]:
    return sorted(
        p for p, data in tree.items() if data.startswith(b"#!") and b"sh" in data.split(b"\n", 1)[0]
    )


def yaml_documents(tree: dict[str, bytes]) -> list[Any]:
    yaml = YAML(typ="safe", pure=True)
    docs: list[Any] = []
    for path, data in tree.items():
        if path.endswith((".yaml", ".yml")):
            docs += [d for d in yaml.load_all(data.decode("utf-8")) if d is not None]
        elif path.endswith(".json"):
            json.loads(data)
        elif path.endswith(".toml"):
            tomllib.loads(data.decode("utf-8"))
    return docs


def scalars(value: Any) -> Iterator[Any]:
    if isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from scalars(item)
    elif isinstance(value, list):
        for item in value:
            yield from scalars(item)
    else:
        yield value


def lands_verbatim(path: tuple[Any, ...], backend: str) -> bool:
    if path[:2] in (("job", "image"), ("job", "name")):
        return backend in K8S_TABLES
    if path[-1] == "<key>":
        if path[-2] == "mdc_hostile" and path[0] in K8S_TABLES:
            return path[1] in ("labels", "node_selector")
        return False
    if path[0] not in K8S_TABLES:
        return False
    rest = tuple(
        "*" if isinstance(p, int) or (i == 1 and len(path) > 2 and p not in ("value", "key")) else p
        for i, p in enumerate(path[1:])
    )
    return rest in VERBATIM_IN_YAML


def check_scripts(root: Path, scripts: list[Path]) -> None:
    for script in scripts:
        parsed = subprocess.run(
            ["bash", "-n", str(script)], capture_output=True, text=True, check=False
        )
        assert parsed.returncode == 0, f"bash -n {script.relative_to(root)}:\n{parsed.stderr}"
    for start in range(0, len(scripts), 200):
        batch = scripts[start : start + 200]
        linted = subprocess.run(
            [shellcheck(), "--norc", "-S", "warning", *map(str, batch)],
            capture_output=True,
            text=True,
            check=False,
        )
        assert linted.returncode == 0, f"shellcheck:\n{linted.stdout}{linted.stderr}"


def shape(path: tuple[Any, ...]) -> tuple[Any, ...]:
    """A field's path with list indexes and free-form keys (env names, labels, ...) as ``*``."""
    free = path[:2] in MAPS or path[:2] in {("deepspeed", "config"), ("torchtitan", "config")}
    return tuple("*" if isinstance(p, int) or (free and i == 2) else p for i, p in enumerate(path))


def covering_examples() -> list[Path]:
    """Few examples that together hold every string field, launcher and backend (greedy)."""
    shapes: dict[Path, set[tuple[Any, ...]]] = {}
    for example in EXAMPLES:
        data: Any = load_file(example).data
        shapes[example] = {shape(p) for p in string_fields(data)} | {
            ("backend", data["distributed"].get("backend", "local")),
            ("launcher", data["distributed"]["launcher"]),
        }
    wanted = set().union(*shapes.values())
    chosen: list[Path] = []
    while wanted:
        best = max(EXAMPLES, key=lambda e: (len(shapes[e] & wanted), e.name))
        chosen.append(best)
        wanted -= shapes[best]
    return sorted(chosen)


SWEPT = covering_examples()


@pytest.mark.slow
@pytest.mark.parametrize("example", SWEPT, ids=[p.name for p in SWEPT])
def test_hostile_values_in_every_string_field(
    example: Path, compiler: Compiler, canary: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)  # the examples' relative paths (primus configs, programs)
    original = load_file(example).data
    assert isinstance(original, dict)
    scripts: list[Path] = []
    read_back: set[str] = set()
    written: set[bytes] = set()
    for name, value in hostile_values(canary).items():
        spec, accepted, compiled = compile_hostile(
            compiler, original, value, tmp_path / f"{name}.json"
        )
        tree = {a.path: a.data for a in compiled.tree}
        docs = yaml_documents(tree)
        found = set(map(str, scalars(docs)))
        backend = spec["distributed"].get("backend", "local")
        for path in accepted:
            if lands_verbatim(path, backend):
                assert value in found, f"{name}: {join_pointer(path)} did not read back exactly"
                read_back.add(join_pointer(path))
        out = tmp_path / name
        for script in scripts_of(tree):
            if tree[script] in written:  # the same bytes: checked once
                continue
            written.add(tree[script])
            target = out / script
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(tree[script])
            scripts.append(target)
    assert scripts, f"no script emitted for {example.name}"
    if original["distributed"].get("backend") in K8S_TABLES:
        assert "/job/image" in read_back, "no hostile image reached the pod spec"
    check_scripts(tmp_path, scripts)
    assert sorted(os.listdir(canary)) == [], "a command hidden in a value ran"


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_a_nul_is_refused_in_every_field(
    example: Path, compiler: Compiler, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No artifact can carry a NUL: each field that holds one is a located error."""
    monkeypatch.chdir(REPO)
    original = load_file(example).data
    assert isinstance(original, dict)
    spec = copy.deepcopy(original)
    changed = inject(spec, "a\x00b")
    spec_path = tmp_path / "nul.json"
    spec_path.write_text(json.dumps(spec), encoding="utf-8")
    with pytest.raises(SpecError) as refused:
        compiler.compile(spec_path)
    # MDC106, or the field's own error where the value is refused anyway (an enum: MDC104)
    nul = {
        d.location.pointer
        for d in refused.value.diagnostics
        if d.is_error and d.location.line is not None
    }
    assert any(d.code == "MDC106" and "NUL" in d.message for d in refused.value.diagnostics)
    for path in changed:
        pointer = join_pointer(path[:-1] if path[-1] == "<key>" else path)
        assert pointer in nul, f"{pointer}: a NUL was not refused"


PROGRAM = """\
import json, os, sys
rank = os.environ["RANK"]
with open(os.path.join(os.environ["CAPTURE"], f"rank-{rank}.json"), "w") as f:
    json.dump({"argv": sys.argv[1:], "cwd": os.getcwd(),
               "env": {k: v for k, v in os.environ.items() if k.startswith("HOSTILE_")}}, f)
"""


@pytest.mark.slow
@pytest.mark.xdist_group("loopback")  # real processes: one xdist worker runs these in turn
def test_a_local_run_gets_the_exact_bytes_and_runs_nothing_hidden(tmp_path: Path) -> None:
    """basic launcher on the local backend: 2 nodes x 2 processes of a real Python program."""
    canary = tmp_path / "canary"
    canary.mkdir()
    values = {name: value for name, value in hostile_values(canary).items() if name != "long"}
    values["long"] = "y" * 20000 + f"$(touch {canary}/long)"
    args = list(values.values())
    env = {f"HOSTILE_{i}": value for i, value in enumerate(values.values())}
    workdir = tmp_path / f"work $(touch {canary}/workdir) `touch {canary}/w2`; ' \" ü"
    workdir.mkdir(parents=True)
    capture = tmp_path / "capture"
    capture.mkdir()
    env["CAPTURE"] = str(capture)
    spec = {
        "job": {
            "name": "hostile-run",
            "command": ["python", "-c", PROGRAM, *args],
            "workdir": str(workdir),
            "env": env,
        },
        "distributed": {
            "launcher": "basic",
            "backend": "local",
            "nnodes": 2,
            "nproc_per_node": 2,
            "accelerator": "cpu",
        },
    }
    spec_path = tmp_path / "hostile.json"
    spec_path.write_text(json.dumps(spec, ensure_ascii=False), encoding="utf-8")
    out = tmp_path / "out"
    from mdc.cli import main

    stderr = io.StringIO()
    code = main(
        ["compile", str(spec_path), "-o", str(out), "--no-plugin-autoload"],
        stdout=io.StringIO(),
        stderr=stderr,
    )
    assert code == 0, stderr.getvalue()
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    run_env = {k: v for k, v in os.environ.items() if not k.startswith("HOSTILE_")}
    run_env["PATH"] = path
    done = subprocess.run(
        ["bash", str(out / "local" / "run.sh")],
        cwd=tmp_path,
        env=run_env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, f"run.sh exited {done.returncode}:\n{done.stderr}"
    assert sorted(os.listdir(canary)) == [], "a command hidden in the spec ran"
    records = sorted(p.name for p in capture.iterdir())
    assert records == [f"rank-{r}.json" for r in range(4)], records
    for rank, record in enumerate(records):
        seen = json.loads((capture / record).read_text(encoding="utf-8"))
        # the basic launcher appends --world_size W --rank R to each process's arguments
        assert seen["argv"] == [*args, "--world_size", "4", "--rank", str(rank)]
        assert seen["env"] == {k: v for k, v in env.items() if k.startswith("HOSTILE_")}
        assert os.path.realpath(seen["cwd"]) == os.path.realpath(workdir)
