"""A launcher's flags read as spec keys, before the spec is checked.

The launcher names them in its :class:`~mdc.api.flags.FlagReading`: each flag that stands
for a key, wherever the user passes it (the job's command, a launcher's argument lists), is
read into that key as if the key had been written, so every check and estimate sees the
value and mdc emits the flag once; only a flag that disagrees with the key (or with the same
flag elsewhere) is refused, naming both places.
"""

from __future__ import annotations

import copy
import json
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from mdc.api.flags import ArgPlace, FlagReading, FlagUse, KnownFlag, drop_flags, same_setting
from mdc.errors import Finding, SourceLocation
from mdc.loaders import LoadedDocument


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
        if written and not same_setting(value, read.value):
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
        elif not written and read is not final and not same_setting(read.value, final.value):
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
    if not reads:  # no flag stands for a key: nothing changes, so nothing to copy
        return ReadArguments(data=data, moved={}, findings=tuple(findings))
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
