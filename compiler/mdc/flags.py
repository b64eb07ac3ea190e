"""A framework's flags in a user's arguments: which spec key each stands for.

A launcher registers the flags it knows in a :class:`FlagTable`: each with the spec
key that sets the same thing (``source``) and, when the launcher can take the value
from the arguments instead (``key``: a field of its options), how to convert it. The
table finds those flags in a list of words the way argparse does (``--flag value``,
``--flag=value``, several values after one flag), so a launcher can

* read a flag given in its pass-through arguments into its options, as if the key
  had been written (:meth:`FlagTable.read`), and drop those words from what it emits;
* read every flag that stands for a spec key, wherever the user passes it (the job's
  command, a launcher's argument lists), into the spec before it is checked, as if the
  key had been written (:func:`read_arguments`, run by the compiler for a launcher's
  :class:`FlagReading`): every check and estimate then sees the value, mdc emits the flag
  once, and only a flag that disagrees with the key (or with the same flag elsewhere) is
  refused, naming both places;
* compare a flag whose value mdc derives (no key of its own) with the value mdc emits
  (:func:`disagreeing`), and drop the words that agree (:func:`drop_flags`);
* report a flag it sets itself that the user's arguments repeat
  (:func:`already_set`), one finding per word, naming the key to use instead.
"""

from __future__ import annotations

import copy
import json
import shlex
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Literal

import attrs

from mdc.errors import Finding, Severity, SourceLocation
from mdc.loaders import LoadedDocument


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


@attrs.frozen(kw_only=True)
class ReadArguments:
    """The spec with its flags read as keys (:func:`read_arguments`)."""

    data: object
    #: pointer in ``data`` -> the pointer it was read from in the spec as written (a key ->
    #: its flag's word; a word of a shortened list -> where it was written)
    moved: Mapping[str, str]
    findings: tuple[Finding, ...]


@attrs.frozen
class _Read:
    place: ArgPlace
    use: FlagUse
    value: Any
    pointer: str


def _lookup(data: object, pointer: str) -> tuple[bool, Any]:
    here = data
    for token in pointer.split("/")[1:]:
        if not isinstance(here, dict) or token not in here:
            return False, None
        here = here[token]
    return True, here


def _words(data: object, place: ArgPlace) -> list[str] | None:
    found, words = _lookup(data, place.pointer)
    if isinstance(words, str) and place.pointer == "/job/command":
        try:
            return shlex.split(words)
        except ValueError:
            return None
    if not found or not isinstance(words, list) or not all(isinstance(w, str) for w in words):
        return None
    return words


def _word_pointer(data: object, place: ArgPlace, index: int) -> str:
    _, words = _lookup(data, place.pointer)
    return place.pointer if isinstance(words, str) else f"{place.pointer}/{index}"


def _key_of(flag: KnownFlag, place: ArgPlace) -> str:
    assert flag.spec_key is not None
    if flag.spec_key.startswith("/"):
        return flag.spec_key
    return f"{place.table}/{flag.spec_key}"


def _agree(a: Any, b: Any) -> bool:
    """Whether two key values are the same setting (1 and 1.0 are; True and 1 are not)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_agree(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def _said(use: FlagUse, words: Sequence[str]) -> str:
    """The flag and its values as written, for messages."""
    return shlex.join(words[use.index : use.index + use.count])


def _collect(
    data: object, reading: FlagReading
) -> tuple[dict[str, list[_Read]], list[Finding], dict[str, list[str]]]:
    """Every keyed flag in the places, by key, in reading order; the refused values; the
    words of each place."""
    reads: dict[str, list[_Read]] = {}
    refused: list[Finding] = []
    words_of: dict[str, list[str]] = {}
    for place in reading.places:
        words = _words(data, place)
        if words is None:
            continue
        words_of[place.pointer] = words
        for use in reading.table.find(words):
            flag = use.flag
            if flag.spec_key is None:
                continue
            at = _word_pointer(data, place, use.index)
            if use.error is not None:
                refused.append(
                    Finding(
                        code=reading.refused_code or reading.code,
                        pointer=at,
                        message=f"{place.where}: {use.error} ({reading.framework} refuses it)",
                        hint=f"give {use.spelled} a value {reading.framework} takes",
                    )
                )
                continue
            key = _key_of(flag, place)
            if flag.needs_table and not _lookup(data, key.rsplit("/", 1)[0])[0]:
                continue
            if flag.read_if is not None and not flag.read_if(data):
                continue
            value = use.value
            value = flag.to_key(list(value) if isinstance(value, tuple) else value)
            reads.setdefault(key, []).append(_Read(place, use, value, at))
    return reads, refused, words_of


def _disagreements(
    key: str, reads: list[_Read], data: object, reading: FlagReading, words_of: dict[str, list[str]]
) -> list[Finding]:
    """The flags of one key that disagree with the key as written, or (the key not written)
    with the same flag in another place; within one place the last wins, as in argparse."""
    last_of = {read.place.pointer: read for read in reads}
    written, value = _lookup(data, key)
    found = []
    final = reads[-1]
    for read in last_of.values():
        said = _said(read.use, words_of[read.place.pointer])
        if written and not _agree(value, read.value):
            found.append(
                Finding(
                    code=reading.code,
                    pointer=read.pointer,
                    message=f"{read.place.where} passes {said!r}, but {key_name(key)} = "
                    f"{json.dumps(value)} ({key}): {reading.framework} would silently keep "
                    "the last of the two",
                    hint=f"remove {read.use.spelled} from {read.place.where}, or make the two "
                    "agree",
                )
            )
        elif not written and read is not final and not _agree(read.value, final.value):
            last = _said(final.use, words_of[final.place.pointer])
            found.append(
                Finding(
                    code=reading.code,
                    pointer=final.pointer,
                    message=f"{read.place.where} passes {said!r} ({read.pointer}), and "
                    f"{final.place.where} {last!r}: {reading.framework} would silently keep "
                    "the last of the two",
                    hint=f"keep one of them (both set {key_name(key)})",
                )
            )
    return found


def key_name(pointer: str) -> str:
    """A key's pointer as the spec's tables say it: "/sglang_disagg/prefill/tp_size" is
    "[sglang_disagg.prefill] tp_size"."""
    *tables, key = pointer.strip("/").split("/")
    return f"[{'.'.join(tables)}] {key}" if tables else key


def _computed(reads: list[_Read]) -> bool:
    return reads[-1].use.flag.compute is not None


def _compute(read: _Read, data: object) -> Any:
    compute = read.use.flag.compute
    assert compute is not None
    return compute(read.value, data)


def _put(data: object, key: str, value: Any) -> bool:
    """Set ``key`` in ``data``, making the tables above it; False where something else is."""
    tokens = key.split("/")[1:]
    here = data
    for token in tokens[:-1]:
        if not isinstance(here, dict):
            return False
        here = here.setdefault(token, {})
    if not isinstance(here, dict):
        return False
    here[tokens[-1]] = value
    return True


def read_arguments(data: object, reading: FlagReading) -> ReadArguments:
    """``data`` with every flag of ``reading`` that stands for a key read into that key (a
    key not written is set; one written to the same value stays) and its words taken out
    of the arguments, so mdc emits it once; a flag that disagrees (or has a value the
    framework refuses) is a finding naming both places, and stays as written."""
    reads, findings, words_of = _collect(data, reading)
    result = copy.deepcopy(data)
    moved: dict[str, str] = {}
    dropped: dict[str, list[FlagUse]] = {}
    # the keys that follow from others last, from the spec with the others read
    for key, found in sorted(reads.items(), key=lambda item: _computed(item[1])):
        if _computed(found):
            found = [attrs.evolve(r, value=_compute(r, result)) for r in found]
        disagree = _disagreements(key, found, data, reading, words_of)
        if disagree:
            findings += disagree
            continue
        if not _lookup(data, key)[0]:
            if not _put(result, key, found[-1].value):
                continue
            moved[key] = found[-1].pointer
        for read in found:
            dropped.setdefault(read.place.pointer, []).append(read.use)
    for place in reading.places:
        if place.pointer in dropped:
            _shorten(result, place, words_of[place.pointer], dropped[place.pointer], moved)
    return ReadArguments(data=result, moved=moved, findings=tuple(findings))


def _shorten(
    data: object, place: ArgPlace, words: list[str], uses: list[FlagUse], moved: dict[str, str]
) -> None:
    """Take the words of ``uses`` out of the place's list (a command string is re-quoted),
    remembering where each remaining word was written."""
    kept = drop_flags(words, uses)
    _, written = _lookup(data, place.pointer)
    value: object = shlex.join(kept) if isinstance(written, str) else kept
    _put(data, place.pointer, value)
    if isinstance(written, str):
        return
    gone = {i for use in uses for i in range(use.index, use.index + use.count)}
    old = [i for i in range(len(words)) if i not in gone]
    for new, was in enumerate(old):
        if new != was:
            moved[f"{place.pointer}/{new}"] = f"{place.pointer}/{was}"


@attrs.frozen(kw_only=True)
class ReadDocument(LoadedDocument):
    """A document with flags read as keys (:func:`read_arguments`): a finding on a key read
    from a flag, or on a word of a shortened list, is located where the user wrote it."""

    moved: Mapping[str, str]

    def locate(self, pointer: str, *, key: bool = False) -> SourceLocation:
        probe = pointer
        while probe:
            if probe in self.moved:
                return super().locate(self.moved[probe])
            probe = probe.rsplit("/", 1)[0]
        if pointer and pointer not in self.values:  # a table only read keys made
            inside = [moved for read, moved in self.moved.items() if read.startswith(pointer + "/")]
            if inside:
                return super().locate(inside[0])
        return super().locate(pointer, key=key)


def read_document(
    doc: LoadedDocument, reading: FlagReading
) -> tuple[LoadedDocument, list[Finding]]:
    """``doc`` with the flags of ``reading`` read as keys, and the findings on them."""
    result = read_arguments(doc.data, reading)
    if not result.moved and result.data == doc.data:
        return doc, list(result.findings)
    fields = {a.name: getattr(doc, a.name) for a in attrs.fields(LoadedDocument)}
    read = ReadDocument(**{**fields, "data": result.data, "moved": result.moved})
    return read, list(result.findings)


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
    mine: dict[str, FlagUse] = {}
    for use in table.find(plain_words(emitted)):
        mine[use.flag.name] = use
    agree: list[FlagUse] = []
    differ: list[tuple[FlagUse, FlagUse]] = []
    for use in table.find(words):
        own = mine.get(use.flag.name)
        if own is None:
            continue
        if use.error is None and _agree(use.value, own.value):
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
