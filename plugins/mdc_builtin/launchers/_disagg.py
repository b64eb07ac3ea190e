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
        f"  {node})\n"
        + "".join(f"    {line}\n" for part in lines for line in part.split("\n"))
        + "    ;;"
        for node, lines in starts.items()
    )
    return f"case {rank} in\n{cases}\nesac"
