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
from tests.tools import REPO

from mdc.api.flags import FlagReading, KnownFlag
from mdc.errors import SpecError
from mdc.loaders import load_file
from mdc.pipeline import Compiled, Compiler
from mdc.plugin_manager import load_plugins

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
            for warning in content.get("warnings", ()):
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


@pytest.mark.slow
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


def _issue_megatron(flags: bool) -> dict[str, Any]:
    """An fp8 MoE run whose dispatcher, recompute and precision options are flags of the
    command (as a migrated Megatron-LM script passes them) or keys."""
    options = {
        "moe_token_dispatcher_type": "alltoall",
        "recompute_granularity": "selective",
        "recompute_modules": ["core_attn", "mlp"],
        "grad_reduce_in_bf16": True,
        "fp8_param_gather": True,
    }
    command = ["python", "pretrain_gpt.py", "--mock-data"]
    if flags:
        command += [
            "--moe-token-dispatcher-type",
            "alltoall",
            "--recompute-granularity=selective",
            "--recompute-modules",
            "core_attn",
            "mlp",
            "--grad-reduce-in-bf16",
            "--fp8-param-gather",
        ]
    model = {
        "num_layers": 8,
        "hidden_size": 512,
        "num_attention_heads": 8,
        "seq_length": 1024,
        "num_experts": 8,
        "bias": False,
        "dtype": "fp8",
    }
    return {
        "job": {"name": "migrated", "command": command},
        "distributed": {
            "launcher": "megatron",
            "backend": "slurm",
            "nnodes": 2,
            "nproc_per_node": 8,
        },
        "parallelism": {"tp": 2, "pp": 1, "ep": 2, "etp": 1},
        "batch": {"global_batch_size": 64, "micro_batch_size": 1},
        "model": model,
        "megatron": {"fp8_recipe": "tensorwise", **({} if flags else options)},
    }


def _issue_vllm(flags: bool) -> dict[str, Any]:
    """examples/vllm-dp-ep-2x8.toml, its data and expert parallelism as vLLM's flags."""
    data = load_file(REPO / "examples/vllm-dp-ep-2x8.toml").data
    assert isinstance(data, dict)
    if flags:
        for key in ("dp", "ep"):
            del data["parallelism"][key]
        data["vllm"]["args"] = [
            "--enable-expert-parallel",
            "--data-parallel-size",
            "16",
            "--data-parallel-size-local",
            "8",
        ]
    return data


def _issue_sglang(flags: bool) -> dict[str, Any]:
    """examples/sglang-disagg-deepseek-4x8.toml, DP attention and the MoE all-to-all as
    SGLang's server flags."""
    data = load_file(REPO / "examples/sglang-disagg-deepseek-4x8.toml").data
    assert isinstance(data, dict)
    if flags:
        table = data["sglang_disagg"]
        for key in ("dp_size", "enable_dp_attention", "moe_a2a_backend"):
            del table[key]
        table["server_args"] = [
            *table["server_args"],
            "--dp-size=8",
            "--enable-dp-attention",
            "--moe-a2a-backend",
            "deepep",
        ]
    return data


@pytest.mark.parametrize("example", [_issue_megatron, _issue_vllm, _issue_sglang])
def test_a_migrated_command_line_compiles_as_its_keys(example: Any, tmp_path: Path) -> None:
    """The flags users bring from a working script, each owned by the launcher: the same
    tree as the spec that writes their keys, and every estimate and check sees them."""
    keyed = compile_data(tmp_path, example(False), "keyed.json")
    flagged = compile_data(tmp_path, example(True), "flagged.json")
    # plan.json echoes the launcher's table as written: a flag that has no key (vLLM's
    # --data-parallel-size-local, derived from the GPUs) stays in its args there, while
    # the command line carries mdc's one copy
    mine, theirs = tree(flagged), tree(keyed)
    for files in (mine, theirs):
        files["plan.json"].pop("options")
    assert mine == theirs
    assert flagged.plan.memory == keyed.plan.memory


@pytest.mark.parametrize(
    ("words", "key", "said"),
    [
        (
            ["--moe-token-dispatcher-type", "allgather"],
            "[megatron] moe_token_dispatcher_type",
            "'--moe-token-dispatcher-type allgather'",
        ),
        (["--fp8-param-gather"], None, None),
    ],
)
def test_a_flag_that_disagrees_names_both_places(
    words: list[str], key: str | None, said: str | None, tmp_path: Path
) -> None:
    """The key says alltoall; the command says allgather: refused at the word, naming the
    key. The command repeating the key's own value is the same spec."""
    data = _issue_megatron(False)
    data["job"]["command"] += words
    if key is None:
        assert tree(compile_data(tmp_path, data)) == tree(
            compile_data(tmp_path, _issue_megatron(False), "k.json")
        )
        return
    with pytest.raises(SpecError) as caught:
        compile_data(tmp_path, data)
    (error,) = [d for d in caught.value.diagnostics if d.is_error]
    assert error.code == "MDC323" and error.location.pointer == "/job/command/3"
    assert f'passes {said}, but {key} = "alltoall"' in error.message


def test_a_flag_mdc_derives_is_compared_as_megatron_lm_types_it(tmp_path: Path) -> None:
    """--moe-layer-freq "[0]+[1]*3" is the [0, 1, 1, 1] mdc writes from [model]
    moe_layer_freq (Megatron-LM evaluates the list expression): written once, by mdc; "[1]*4"
    is another pattern, refused naming the key it comes from."""
    data = load_file(HERE / "megatron-latent.json").data
    assert isinstance(data, dict)
    data["model"]["moe_layer_freq"] = [0, 1, 1, 1]
    keyed = compile_data(tmp_path, data, "keyed.json")
    data["job"]["command"] += ["--moe-layer-freq", "[0]+[1]*3"]
    flagged = compile_data(tmp_path, data, "flagged.json")
    (role,) = flagged.launch.roles
    assert role.argv == keyed.launch.roles[0].argv
    assert [w for w in role.argv if w == "--moe-layer-freq"] == ["--moe-layer-freq"]
    data["job"]["command"][-1] = "[1]*4"
    with pytest.raises(SpecError) as caught:
        compile_data(tmp_path, data, "other.json")
    (error,) = [d for d in caught.value.diagnostics if d.is_error]
    assert error.code == "MDC323" and "from [model] moe_layer_freq" in error.message


def test_a_finding_on_a_table_only_flags_made_points_at_a_flag(tmp_path: Path) -> None:
    """SGLang takes "--tp" for --tp-size (an unambiguous prefix): [parallelism] tp = 4,
    which does not fill the node (MDC371, on the table [parallelism] the spec never wrote):
    located at the flag, not at the top of the file."""
    data = {
        "job": {"name": "sg", "command": ["python", "-m", "sglang.launch_server"]},
        "distributed": {"launcher": "sglang", "nnodes": 1, "nproc_per_node": 8},
        "sglang": {"model": "m", "args": ["--enable-dp-attention", "--tp", "4"]},
    }
    with pytest.raises(SpecError) as caught:
        compile_data(tmp_path, data)
    (error,) = [d for d in caught.value.diagnostics if d.is_error]
    assert (error.code, error.location.pointer) == ("MDC371", "/sglang/args/1")
    assert error.location.line is not None
