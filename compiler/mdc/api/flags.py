"""Helpers for plugins: a framework's flags in a user's arguments, and which spec key each
stands for.

Not part of the contract (:mod:`mdc.api`), except :class:`FlagReading`, the type of
:attr:`mdc.api.LauncherSpec.arguments`. A launcher registers the flags it knows in a :class:`FlagTable`: each with the spec
key that sets the same thing (``source``) and, when the launcher can take the value
from the arguments instead (``key``: a field of its options), how to convert it. The
table finds those flags in a list of words the way argparse does (``--flag value``,
``--flag=value``, several values after one flag), so a launcher can

* read a flag given in its pass-through arguments into its options, as if the key
  had been written (:meth:`FlagTable.read`), and drop those words from what it emits;
* read every flag that stands for a spec key, wherever the user passes it (the job's
  command, a launcher's argument lists), into the spec before it is checked, as if the
  key had been written (``mdc.passes.flags``, run by the compiler for a launcher's
  :class:`FlagReading`): every check and estimate then sees the value, mdc emits the flag
  once, and only a flag that disagrees with the key (or with the same flag elsewhere) is
  refused, naming both places;
* compare a flag whose value mdc derives (no key of its own) with the value mdc emits
  (:func:`disagreeing`), and drop the words that agree (:func:`drop_flags`);
* report a flag it sets itself that the user's arguments repeat
  (:func:`already_set`), one finding per word, naming the key to use instead.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Literal

import attrs

# not from mdc.api: the contract names FlagReading, so this module stays below it
from mdc.errors import Finding, Severity


def _text(word: str) -> str:
    return word


def _same(value: Any) -> Any:
    return value


@attrs.frozen(kw_only=True)
class KnownFlag:
    """One flag of a framework, and the spec key that sets the same thing."""

    #: the flag as the launcher writes it, e.g. ``--use-megatron-fsdp``
    name: str
    #: where the spec sets it, for messages, e.g. ``[megatron] use_megatron_fsdp``
    source: str
    #: the launcher option the flag's value is read into; None: never read (the spec
    #: derives it from another table, so the flag is refused with ``source`` as the way)
    key: str | None = None
    #: 0: a switch (its value is ``switch_value``); 1: one value; "+": one or more values
    nargs: Literal[0, 1, "+"] = 0
    switch_value: Any = True
    #: turns one value word into the option's value (raises ValueError when it cannot)
    convert: Callable[[str], Any] = _text
    #: the values the framework accepts (empty: any that ``convert`` takes)
    choices: tuple[str, ...] = ()
    #: other spellings of the same setting (e.g. a deprecated name)
    aliases: tuple[str, ...] = ()
    #: the spec key the flag stands for, as a JSON pointer ("/parallelism/tp"), or relative
    #: to the table of the arguments it is found in ("tp_size": that table's tp_size). None:
    #: no key of its own (mdc derives the value; see :func:`disagreeing`)
    spec_key: str | None = None
    #: the key's value from the flag's (converted) value, e.g. "RMSNorm" -> "rmsnorm"
    to_key: Callable[[Any], Any] = _same
    #: read only where the key's table is written (a [model] flag with no [model] table
    #: stays a plain argument: a table of one key would ask for the rest)
    needs_table: bool = False
    #: (spec data) -> whether the flag stands for its key in this spec (None: always)
    read_if: Callable[[object], bool] | None = None
    #: (the flag's value, the spec data with the other flags read) -> the key's value, for
    #: a flag whose key follows from others (vLLM's --enable-expert-parallel: ep = tp x dp)
    compute: Callable[[Any, object], Any] | None = None


@attrs.frozen(kw_only=True)
class FlagUse:
    """A known flag found in a list of words."""

    flag: KnownFlag
    #: as written (an alias, or the name), without ``=value``
    spelled: str
    #: index of the flag's word, and how many words it took (the flag and its values)
    index: int
    count: int
    #: the converted value (a tuple with nargs "+"), or None when ``error`` says why not
    value: Any = None
    error: str | None = None


def _starts_flag(word: str) -> bool:
    """Whether argparse would read ``word`` as an option rather than a value."""
    if not word.startswith("-") or word == "-":
        return False
    try:
        float(word)
    except ValueError:
        return True
    return False


class FlagTable:
    """The flags one launcher knows. Others may :meth:`register` more (no name twice).

    ``normalize`` maps a written flag to the form names are stored in (TorchTitan, for
    example, reads ``--a.b-c`` and ``--a.b_c`` alike; vLLM ``--a_b`` as ``--a-b``).
    """

    def __init__(
        self,
        flags: Iterable[KnownFlag] = (),
        *,
        normalize: Callable[[str], str] = _text,
        abbreviations: bool = False,
    ) -> None:
        self._normalize = normalize
        #: the framework's parser takes an unambiguous prefix of a long option (argparse's
        #: allow_abbrev, its default): a prefix of exactly one known spelling is that flag
        self.abbreviations = abbreviations
        self._by_name: dict[str, KnownFlag] = {}
        self.register(*flags)

    def register(self, *flags: KnownFlag) -> None:
        for flag in flags:
            for name in (flag.name, *flag.aliases):
                spelled = self._normalize(name)
                if spelled in self._by_name and self._by_name[spelled] != flag:
                    raise ValueError(f"flag {name} is registered twice")
                self._by_name[spelled] = flag

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self._normalize(name) in self._by_name

    def get(self, name: str) -> KnownFlag | None:
        spelled = self._normalize(name)
        found = self._by_name.get(spelled)
        if found is None and self.abbreviations and spelled.startswith("--") and len(spelled) > 2:
            # argparse refuses a prefix of several option strings (even of one action's)
            matches = [known for known in self._by_name if known.startswith(spelled)]
            found = self._by_name[matches[0]] if len(matches) == 1 else None
        return found

    @property
    def flags(self) -> list[KnownFlag]:
        """Every registered flag once, in registration order."""
        return list(dict.fromkeys(self._by_name.values()))

    def find(self, words: Sequence[str]) -> list[FlagUse]:
        """Every known flag in ``words``, in order, with its value as argparse would take it."""
        found: list[FlagUse] = []
        index = 0
        while index < len(words):
            word = words[index]
            if word == "--":  # argparse: every word after it is a positional argument
                break
            spelled, equals, inline = word.partition("=")
            flag = self.get(spelled) if _starts_flag(word) else None
            if flag is None:
                index += 1
                continue
            values = [inline] if equals else []
            if not equals and flag.nargs != 0:
                end = index + 1
                while end < len(words) and not _starts_flag(words[end]):
                    values.append(words[end])
                    end += 1
                    if flag.nargs == 1:
                        break
            count = 1 + (0 if equals else len(values))
            found.append(_use(flag, spelled, index, count, values))
            index += count
        return found

    def read(self, words: Sequence[str]) -> tuple[dict[str, Any], list[FlagUse]]:
        """(option values of the readable flags in ``words``, the last one winning as in
        argparse; every use found)."""
        uses = self.find(words)
        values = {
            use.flag.key: use.value
            for use in uses
            if use.flag.key is not None and use.error is None
        }
        return values, uses


def _use(flag: KnownFlag, spelled: str, index: int, count: int, values: list[str]) -> FlagUse:
    def made(value: Any = None, error: str | None = None) -> FlagUse:
        return FlagUse(
            flag=flag, spelled=spelled, index=index, count=count, value=value, error=error
        )

    if flag.nargs == 0:
        if values:
            return made(error=f"{spelled} takes no value")
        return made(flag.switch_value)
    if not values:
        return made(error=f"{spelled} needs a value")
    converted = []
    for value in values:
        if flag.choices and value not in flag.choices:
            return made(error=f"{spelled} {value!r} is not one of {', '.join(flag.choices)}")
        try:
            converted.append(flag.convert(value))
        except ValueError:
            return made(error=f"{spelled} cannot take {value!r}")
    return made(tuple(converted) if flag.nargs == "+" else converted[0])


def drop_flags(words: Sequence[str], uses: Iterable[FlagUse]) -> list[str]:
    """``words`` with the words of ``uses`` taken out."""
    dropped = {i for use in uses for i in range(use.index, use.index + use.count)}
    return [word for i, word in enumerate(words) if i not in dropped]


def command_pointer(command: str | tuple[str, ...], index: int) -> str:
    """The JSON pointer of word ``index`` of ``[job] command``: that word when the command is
    a list, the whole command when it is one string."""
    return f"/job/command/{index}" if isinstance(command, tuple) else "/job/command"


def already_set(
    uses: Iterable[FlagUse],
    *,
    code: str,
    launcher: str,
    where: str,
    pointer: Callable[[int], str],
    canonical: Mapping[str, str] | None = None,
    severity: Severity = Severity.ERROR,
) -> Iterator[Finding]:
    """One finding per flag the launcher sets itself that ``where`` also passes.

    ``pointer`` maps a word's index to its JSON pointer; ``canonical`` names, for a
    spelling that is not the flag's own, the flag mdc writes (when that differs from
    :attr:`KnownFlag.name`).
    """
    for use in uses:
        mine = (canonical or {}).get(use.spelled, use.flag.name)
        also = "" if use.spelled == mine else f" (another spelling of {mine})"
        yield Finding(
            code=code,
            severity=severity,
            pointer=pointer(use.index),
            message=f"{where} passes {use.spelled}{also}, which the {launcher} launcher "
            f"sets from {use.flag.source}",
            hint=f"remove {use.spelled} from {where}; set the value through {use.flag.source}",
        )


def flag_names(uses: Iterable[FlagUse]) -> list[str]:
    """The registered names of the flags in ``uses``, each once, in order."""
    return list(dict.fromkeys(use.flag.name for use in uses))


@attrs.frozen(kw_only=True)
class ArgPlace:
    """A list of words in the spec where a user passes the framework's flags."""

    #: the list's JSON pointer ("/job/command" may also be one shell-quoted string)
    pointer: str
    #: how messages name it, e.g. "[vllm] args"
    where: str
    #: the table a relative :attr:`KnownFlag.spec_key` belongs to, e.g. "/sglang_disagg/prefill"
    table: str = ""


@attrs.frozen(kw_only=True)
class FlagReading:
    """A launcher's flags read as spec keys (:attr:`mdc.api.LauncherSpec.arguments`)."""

    table: FlagTable
    #: where the flags may be given, in the order the framework reads them (the last wins)
    places: tuple[ArgPlace, ...]
    #: the diagnostic code of a flag that disagrees with its key or that the framework refuses
    code: str
    #: the framework, for messages, e.g. "Megatron-LM"
    framework: str
    #: the code of a value the framework refuses (None: ``code``)
    refused_code: str | None = None


def same_setting(a: Any, b: Any) -> bool:
    """Whether two key values are the same setting (1 and 1.0 are; True and 1 are not)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(same_setting(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


#: stands for a word mdc writes that differs between nodes (a variable of the launch)
PER_NODE = "\x00per-node"


def plain_words(emitted: Sequence[object]) -> list[str]:
    """mdc's words as text; a word that differs between nodes is :data:`PER_NODE`."""
    return [w if isinstance(w, str) else PER_NODE for w in emitted]


def disagreement_text(
    framework: str,
    where: str,
    words: Sequence[str],
    use: FlagUse,
    emitted: Sequence[str],
    own: FlagUse,
) -> tuple[str, str]:
    """(message, hint) for a flag of the user's that disagrees with mdc's (:func:`disagreeing`)."""
    said = shlex.join(words[use.index : use.index + use.count])
    mine = emitted[own.index : own.index + own.count]
    per_node = any(PER_NODE in word for word in mine)
    if per_node:
        what = f"mdc writes {use.flag.name} per node (from {use.flag.source})"
    else:
        what = f"mdc writes {shlex.join(mine)!r} from {use.flag.source}"
    return (
        f"{where} passes {said!r}, but {what}: {framework} would silently keep the last",
        f"remove {use.spelled} from {where}"
        + ("" if per_node else f", or set {use.flag.source} to agree"),
    )


def disagreeing(
    table: FlagTable, words: Sequence[str], emitted: Sequence[object]
) -> tuple[list[FlagUse], list[tuple[FlagUse, FlagUse]]]:
    """The flags of ``table`` in ``words`` (those with no key of their own, and those the
    spec's reading left, e.g. vLLM's --data-parallel-size in replicas mode) against the
    words mdc emits: (those that agree with mdc's value, to be dropped; (user's, mdc's)
    pairs that disagree). A flag mdc does not emit is neither: the framework reads it."""
    uses = table.find(words)
    if not uses:  # mdc's words (the longer list) need no reading
        return [], []
    mine: dict[str, FlagUse] = {}
    for use in table.find(plain_words(emitted)):
        mine[use.flag.name] = use
    agree: list[FlagUse] = []
    differ: list[tuple[FlagUse, FlagUse]] = []
    for use in uses:
        own = mine.get(use.flag.name)
        if own is None:
            continue
        if use.error is None and same_setting(use.value, own.value):
            agree.append(use)
        else:
            differ.append((use, own))
    return agree, differ


def dashes(word: str) -> str:
    """A long option with underscores read as dashes up to its first dot, as vLLM's
    FlexibleArgumentParser reads ``--tensor_parallel_size``."""
    if not word.startswith("--"):
        return word
    name, dot, rest = word[2:].partition(".")
    return "--" + name.replace("_", "-") + dot + rest


__all__ = [
    "PER_NODE",
    "ArgPlace",
    "FlagReading",
    "FlagTable",
    "FlagUse",
    "KnownFlag",
    "already_set",
    "command_pointer",
    "dashes",
    "disagreeing",
    "disagreement_text",
    "drop_flags",
    "flag_names",
    "plain_words",
    "same_setting",
]
