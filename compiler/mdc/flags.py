"""A framework's flags in a user's arguments: which spec key each stands for.

A launcher registers the flags it knows in a :class:`FlagTable`: each with the spec
key that sets the same thing (``source``) and, when the launcher can take the value
from the arguments instead (``key``: a field of its options), how to convert it. The
table finds those flags in a list of words the way argparse does (``--flag value``,
``--flag=value``, several values after one flag), so a launcher can

* read a flag given in its pass-through arguments into its options, as if the key
  had been written (:meth:`FlagTable.read`), and drop those words from what it emits;
* report a flag it sets itself that the user's arguments repeat
  (:func:`already_set`), one finding per word, naming the key to use instead.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Literal

import attrs

from mdc.errors import Finding, Severity


def _text(word: str) -> str:
    return word


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
    example, reads ``--a.b-c`` and ``--a.b_c`` alike).
    """

    def __init__(
        self, flags: Iterable[KnownFlag] = (), *, normalize: Callable[[str], str] = _text
    ) -> None:
        self._normalize = normalize
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
        return self._by_name.get(self._normalize(name))

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
