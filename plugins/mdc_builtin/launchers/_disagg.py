"""What the prefill/decode launchers of SGLang and vLLM (sglang_disagg, vllm_disagg) share:
the split's unit for one server of each role, and the node script's case over the nodes
when the servers share one or two nodes."""

from __future__ import annotations

import math
from typing import Protocol


class ServerShape(Protocol):
    """One role's servers, as far as the split reads them."""

    @property
    def gpus(self) -> int: ...

    @property
    def nodes(self) -> int: ...


def split_units(nnodes: int, prefill: ServerShape, decode: ServerShape) -> tuple[int, int]:
    """Nodes (up to two nodes: GPUs) one prefill and one decode server take, for the split."""
    if nnodes == 1:
        return prefill.gpus, decode.gpus
    if nnodes == 2:
        # servers side by side over both nodes: the decode servers start where prefill
        # ends, which must be a multiple of theirs too to keep each inside a node
        return math.lcm(prefill.gpus, decode.gpus), decode.gpus
    return prefill.nodes, decode.nodes


def node_cases(starts: dict[int, list[str]], rank: str) -> str:
    """A bash ``case`` over ``rank`` (a shell word, the node's rank): each node runs its
    start lines (each of one or more lines)."""
    cases = "\n".join(
        f"  {node})\n" + "".join(_indented(part, "    ") for part in lines) + "    ;;"
        for node, lines in starts.items()
    )
    return f"case {rank} in\n{cases}\nesac"


def _indented(text: str, indent: str) -> str:
    """``text`` and a line break, each line indented, but for a line break inside a quoted
    word (an argument that holds one): indenting there would change the argument."""
    out, quote, escaped = [indent], "", False
    for char in text:
        out.append(char)
        if escaped:
            escaped = False
        elif char == "\\" and quote != "'":
            escaped = True
        elif char in "'\"" and quote in ("", char):
            quote = "" if quote else char
        elif char == "\n" and not quote:
            out.append(indent)
    return "".join(out) + "\n"
