"""Reading Megatron-LM flags out of a list of argument words, as argparse would."""

from __future__ import annotations

from collections.abc import Sequence


def passes(words: Sequence[str], flag: str) -> bool:
    """Whether ``words`` pass ``flag`` (alone, or as ``flag=value``)."""
    return any(w == flag or w.startswith(flag + "=") for w in words)


def value_after(words: Sequence[str], flag: str) -> str | None:
    """The value a flag is given in ``words`` (the last one, as argparse keeps)."""
    found = None
    for index, word in enumerate(words):
        if word.startswith(flag + "="):
            found = word.split("=", 1)[1]
        elif word == flag and index + 1 < len(words):
            found = words[index + 1]
    return found
