"""Words of a launch script: literals, and values known only on the node at run time.

Part of the plugin surface (re-exported by :mod:`mdc.api`).
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable

import attrs


@attrs.frozen
class Ref:
    """A value known only on the node at run time, read from a shell variable."""

    name: str


#: This node's index, 0..nnodes-1 (the backend sets it).
NODE_RANK = Ref("NODE_RANK")
#: Address of node 0, reachable from every node (the backend sets it).
MASTER_ADDR = Ref("MASTER_ADDR")
#: The plan's rendezvous port (the backend sets it).
MASTER_PORT = Ref("MASTER_PORT")
#: What every backend sets before it runs ``launch/<role>.sh``.
RUNTIME_VARIABLES = (NODE_RANK.name, MASTER_ADDR.name, MASTER_PORT.name)
#: The absolute path of the compiled ``out/`` tree on the node; the launch script sets it.
OUT_DIR = Ref("MDC_OUT")


@attrs.frozen
class Concat:
    """One shell word built from literals and runtime variables, e.g. ``HOST:PORT``."""

    parts: tuple[str | Ref, ...]


Word = str | Ref | Concat


def out_file(path: str) -> Concat:
    """The run-time path of ``path`` (relative to ``out/``), e.g. a launcher config file."""
    return Concat((OUT_DIR, "/" + path))


def _in_double_quotes(text: str) -> str:
    for special in ("\\", '"', "$", "`"):
        text = text.replace(special, "\\" + special)
    return text


def shell_word(word: Word) -> str:
    """One shell word: literals quoted, runtime variables expanded (inside double quotes)."""
    if isinstance(word, str):
        return shlex.quote(word)
    parts = word.parts if isinstance(word, Concat) else (word,)
    inner = "".join(f"${{{p.name}}}" if isinstance(p, Ref) else _in_double_quotes(p)
                    for p in parts)
    return f'"{inner}"'


def refs_in(words: Iterable[Word]) -> list[str]:
    """Names of the runtime variables the words read, in first-use order."""
    names: list[str] = []
    for word in words:
        parts = word.parts if isinstance(word, Concat) else (word,)
        names += [p.name for p in parts if isinstance(p, Ref) and p.name not in names]
    return names


def shell_join(words: Iterable[Word]) -> str:
    return " ".join(shell_word(w) for w in words)
