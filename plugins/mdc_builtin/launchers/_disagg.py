"""What the prefill/decode launchers of SGLang and vLLM (sglang_disagg, vllm_disagg) share:
the servers' default tensor-parallel size, the split's unit for one server of each role,
where the servers run (over whole nodes, or side by side on one or two), the refusals
written alike (flags that disagree with mdc's, an elastic job, a server across a node's
edge) and the node script's pieces (a ``case`` over the nodes or the roles, a process
started in the background, the router started once every server answers)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from mdc.api import Finding, Plan, Server
from mdc.api.flags import ArgPlace, FlagReading, disagreeing, disagreement_text, plain_words

ROLES = ("prefill", "decode")


class ServerShape(Protocol):
    """One role's servers, as far as the split reads them."""

    @property
    def role(self) -> str: ...

    @property
    def gpus(self) -> int: ...

    @property
    def nodes(self) -> int: ...


class Engine(ServerShape, Protocol):
    """One role's servers, as the rank map lists them."""

    @property
    def tp(self) -> int: ...

    @property
    def dp(self) -> int: ...

    @property
    def expert_ranks(self) -> int: ...


class Placed(Protocol):
    """A server side by side with others: its shape, node, first GPU there and port."""

    @property
    def shape(self) -> Engine: ...

    @property
    def node(self) -> int: ...

    @property
    def first_gpu(self) -> int: ...

    @property
    def port(self) -> int: ...


S = TypeVar("S", bound=ServerShape)
E = TypeVar("E", bound=Engine)


def default_tp(plan: Plan, option: int | None) -> int:
    """The servers' tensor-parallel size: the launcher's option, else [parallelism] tp, else
    a node's GPUs (one node, where the roles share the GPUs: 1)."""
    if option is not None:
        return option
    if plan.sizes.tp > 1:
        return plan.sizes.tp
    return 1 if plan.nnodes == 1 else plan.nproc_per_node


def split_units(nnodes: int, prefill: ServerShape, decode: ServerShape) -> tuple[int, int]:
    """Nodes (up to two nodes: GPUs) one prefill and one decode server take, for the split."""
    if nnodes == 1:
        return prefill.gpus, decode.gpus
    if nnodes == 2:
        # servers side by side over both nodes: the decode servers start where prefill
        # ends, which must be a multiple of theirs too to keep each inside a node
        return math.lcm(prefill.gpus, decode.gpus), decode.gpus
    return prefill.nodes, decode.nodes


def over_nodes(
    plan: Plan, shape_of: Callable[[str], S]
) -> Iterator[tuple[S, int, tuple[int, ...]]]:
    """From 3 nodes: each server (prefill from node 0, then decode), its first node and its
    nodes."""
    split = plan.disagg
    assert split is not None
    first = 0
    for role in ROLES:
        count: int = getattr(split, role)
        shape = shape_of(role)
        for start in range(first, first + count, shape.nodes):
            yield shape, start, tuple(range(start, min(start + shape.nodes, first + count)))
        first += count


def side_by_side(plan: Plan, shape_of: Callable[[str], S]) -> Iterator[tuple[S, int, int]]:
    """One or two nodes: each server (prefill on the first GPUs, node 0 first, then decode),
    its node and its first GPU there."""
    split = plan.disagg
    assert split is not None
    gpu = 0  # over the job's GPUs: node 0's, then node 1's
    for role in ROLES:
        shape = shape_of(role)
        for _ in range(getattr(split, role) // shape.gpus):
            node, first = divmod(gpu, plan.nproc_per_node)
            yield shape, node, first
            gpu += shape.gpus


def api_servers(
    plan: Plan,
    router_port: int,
    shared: Callable[[], Iterable[Placed]],
    shape_of: Callable[[str], E],
    port_of: Callable[[E, int], int],
) -> tuple[Server, ...]:
    """The router on node 0 (no GPU, beside the first prefill server), then each prefill
    and decode server: ``shared()`` when they share the nodes, else over whole nodes, the
    first on ``port_of(shape, its first node)``."""
    split = plan.disagg
    assert split is not None
    found = [Server(role="router", nodes=(0,), gpus=0, port=router_port)]
    if split.unit == "gpus":
        found += [_api_server(p.shape, (p.node,), p.port, p.first_gpu) for p in shared()]
    else:
        for shape, start, nodes in over_nodes(plan, shape_of):
            found.append(_api_server(shape, nodes, port_of(shape, start), 0))
    return tuple(found)


def _api_server(shape: Engine, nodes: tuple[int, ...], port: int, first_gpu: int) -> Server:
    return Server(
        role=shape.role,
        nodes=nodes,
        gpus=shape.gpus,
        tp=shape.tp,
        dp=shape.dp,
        ep=shape.expert_ranks,
        port=port,
        first_gpu=first_gpu,
    )


def crossing(plan: Plan, shape: ServerShape) -> int | None:
    """Servers side by side: the job-wide GPU where a server of ``shape``'s role starts and
    crosses into the next node (the first such), if one does."""
    split = plan.disagg
    assert split is not None
    gpus, size = plan.nproc_per_node, shape.gpus
    first = 0 if shape.role == "prefill" else split.prefill
    starts = range(first, first + getattr(split, shape.role), size)
    return next((s for s in starts if s // gpus != (s + size - 1) // gpus), None)


def arg_places(name: str, shared: str) -> tuple[ArgPlace, ...]:
    """Where a user passes server flags: ``[name] shared`` (every server's), then each
    role's ``args``."""
    return (
        ArgPlace(pointer=f"/{name}/{shared}", where=f"[{name}] {shared}", table=f"/{name}"),
        *(
            ArgPlace(pointer=f"/{name}/{r}/args", where=f"[{name}.{r}] args", table=f"/{name}/{r}")
            for r in ROLES
        ),
    )


def disagreements(
    reading: FlagReading,
    words_of: Callable[[str], Sequence[str]],
    mine_of: Callable[[str], Sequence[object]],
) -> Iterator[Finding]:
    """A flag mdc writes passed in a place of ``reading`` with another value than mdc writes
    for a server it reaches, once per word. ``words_of`` gives a table's words by its name
    (a role, or the launcher's), ``mine_of`` what mdc writes for a role's servers."""
    for place in reading.places:
        own_table = place.table.rsplit("/", 1)[1]
        roles = (own_table,) if own_table in ROLES else ROLES
        words = words_of(own_table)
        seen: set[int] = set()
        for role in roles:
            mine = mine_of(role)
            emitted = plain_words(mine)
            for use, own in disagreeing(reading.table, words, mine)[1]:
                if use.index in seen:
                    continue
                seen.add(use.index)
                message, hint = disagreement_text(
                    reading.framework, place.where, words, use, emitted, own
                )
                pointer = f"{place.pointer}/{use.index}"
                yield Finding(code=reading.code, pointer=pointer, message=message, hint=hint)


def elastic_findings(plan: Plan, code: str) -> Iterator[Finding]:
    """The split is fixed at compile time: an elastic job is refused."""
    if plan.elastic:
        yield Finding(
            code=code,
            pointer="/distributed/min_nnodes",
            message=f"the prefill/decode split is fixed at compile time; it cannot run "
            f"elastic (min_nnodes {plan.min_nnodes} < nnodes {plan.nnodes})",
            hint=f"remove min_nnodes, or set it to nnodes ({plan.nnodes})",
        )


def node_cases(starts: Mapping[Any, Sequence[str]], rank: str) -> str:
    """A bash ``case`` over ``rank`` (a shell word): each arm (a node, a role, ``*``) runs
    its lines (each of one or more lines)."""
    cases = "\n".join(
        f"  {node})\n" + "".join(_indented(part, "    ") for part in lines) + "    ;;"
        for node, lines in starts.items()
    )
    return f"case {rank} in\n{cases}\nesac"


def nodes_body(starts: Mapping[int, Sequence[str]], rank: str) -> str:
    """What each node runs: one node's lines as they are, else a ``case`` over ``rank``."""
    if len(starts) == 1:
        return "\n".join(starts[0])
    return node_cases(starts, rank)


def role_case(launcher: str, prefill: Sequence[str], decode: Sequence[str]) -> str:
    """The node script's dispatch on its first argument, the node's role."""
    unknown = [f'echo "{launcher}: unknown role $role" >&2', "exit 2"]
    arms = {"prefill": prefill, "decode": decode, "*": unknown}
    return 'role="$1"\nshift\n' + node_cases(arms, '"$role"')


def hosts_lines(launcher: str) -> str:
    """Bash lines reading NODE_HOSTS into ``hosts`` (one per node, TOTAL_NODES of them) and
    requiring NODE_RANK."""
    return f"""read -r -a hosts <<< "${{NODE_HOSTS:?NODE_HOSTS is not set}}"
if [ "${{#hosts[@]}}" -ne "$TOTAL_NODES" ]; then
  echo "{launcher}: NODE_HOSTS has ${{#hosts[@]}} hosts, expected $TOTAL_NODES" >&2
  exit 2
fi
: "${{NODE_RANK:?NODE_RANK is not set}}\""""


def background(env: Sequence[str], words: Sequence[str]) -> str:
    """Start one process in the background: the script's arguments, then ``words`` (both
    already shell-quoted), with ``env`` set."""
    return f'{" ".join(env)} "$@" {" ".join(words)} &\npids+=("$!")'


def after_servers(name: str, probes: Sequence[str], command: str, call: str) -> str:
    """Define and start ``name`` in the background: once every server answers (``probes``),
    it becomes ``command``; ``call`` is how it is started."""
    return (
        f"{name}() {{\n"
        + "".join(f"{line}\n" for line in probes)
        + f"  {command}\n}}\n"
        + f'{call} &\npids+=("$!")'
    )


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
