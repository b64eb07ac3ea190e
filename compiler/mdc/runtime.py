"""Words of a launch script: literals, and values known only on the node at run time.

The records of the plugin contract (:mod:`mdc.api` gives them to plugins); turning them into
bash is :mod:`mdc.api.shell`'s.
"""

from __future__ import annotations

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
#: Every node's host name as the other nodes reach it, in node-rank order, separated by
#: spaces (the backend sets it), for launchers that hand one node another's address.
NODE_HOSTS = Ref("NODE_HOSTS")
#: What every backend sets before it runs ``launch/<role>.sh``.
RUNTIME_VARIABLES = (NODE_RANK.name, MASTER_ADDR.name, MASTER_PORT.name, NODE_HOSTS.name)
#: The absolute path of the compiled ``out/`` tree on the node; the launch script sets it.
OUT_DIR = Ref("MDC_OUT")
#: This launch's id, the same in every process of one launch and different for every launch:
#: the scheduler's job id where there is one, else a fresh one (the backend sets it).
LAUNCH_ID = Ref("MDC_LAUNCH_ID")
#: Where a derived rendezvous port falls, [low, high): unprivileged, below Linux's ephemeral
#: ports; a hash picks the start.
PORT_RANGE = (20000, 30000)


@attrs.frozen
class Concat:
    """One shell word built from literals and runtime variables, e.g. ``HOST:PORT``."""

    parts: tuple[str | Ref, ...]


Word = str | Ref | Concat
