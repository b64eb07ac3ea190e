"""sglang_disagg: SGLang prefill/decode disaggregated serving, one SGLang server per node.

The core splits the nodes (nodes 0..P-1 prefill, the rest decode; ``plan.disagg``). Every
node runs ``sglang.launch_server`` with ``--disaggregation-mode prefill|decode``; node 0
also runs SGLang's router (``--pd-disaggregation``, every prefill and decode URL) beside
its prefill server, on no GPU and its own port, as SGLang's multi-node recipes place it,
so the job asks the scheduler for the servers' nodes only. The router starts once every
server answers ``GET /health``. The URLs are built on the node at run time
from ``$NODE_HOSTS`` (the host names the backend hands every node) by the helper
``launch/sglang_disagg.sh``, never from ``hostname``; it also exports madengine's
``POD_IP`` (this node's address) and ``SGLANG_NODE_IPS`` (every node's, commas).

Ports: node ``i`` serves HTTP on ``port + i`` and a prefill node's KV bootstrap server
listens on ``bootstrap_port + i``, so servers of different nodes never collide when a
backend puts several nodes on one host (local). The router listens on ``router_port``,
which no server port of node 0 may equal (MDC382).

Flag names are SGLang's: ``--model-path``, ``--tp-size``, ``--host``, ``--port``,
``--disaggregation-mode``, ``--disaggregation-transfer-backend``,
``--disaggregation-bootstrap-port`` (``ServerArgs`` in ``python/sglang/srt/server_args.py``,
default bootstrap port 8998), and ``python -m sglang_router.launch_router
--pd-disaggregation --prefill URL BOOTSTRAP_PORT ... --decode URL ... --host --port
[--policy]`` (SGLang's "PD Disaggregation" documentation). ``router = "mini_lb"`` uses
the older ``python -m sglang.srt.disaggregation.mini_lb --prefill URL ... --decode URL ...``
as madengine does (no bootstrap ports: every prefill server keeps one fixed bootstrap port).

The launcher's parts (modules of this package): options (the [sglang_disagg] table and the
flags mdc writes), servers (each role's servers and their command words), script (the node
script), emit (the roles and their environment), checks (the refusals), serving (what the
memory check reads).
"""

from __future__ import annotations

import mdc
from mdc.api import LauncherSpec
from mdc.api.files import read_schema
from mdc_builtin.launchers.sglang_disagg.checks import check
from mdc_builtin.launchers.sglang_disagg.emit import emit
from mdc_builtin.launchers.sglang_disagg.options import READING, SglangDisaggOptions
from mdc_builtin.launchers.sglang_disagg.servers import server_units
from mdc_builtin.launchers.sglang_disagg.serving import serving

__all__ = [
    "SglangDisaggOptions",
    "check",
    "emit",
    "mdc_register_launchers",
    "server_units",
    "serving",
]


@mdc.hookimpl
def mdc_register_launchers() -> list[LauncherSpec]:
    return [
        LauncherSpec(
            name="sglang_disagg",
            description="SGLang prefill/decode disaggregation: prefill servers on nodes 0..P-1, "
            "decode servers on the rest, the router beside node 0's, URLs from $NODE_HOSTS",
            parallelism="data",
            disaggregated=True,
            workload="serving",
            emit=emit,
            check=check,
            server_units=server_units,
            serving=serving,
            schema=read_schema("mdc_schemas", "plugins/sglang_disagg.v1.schema.json"),
            options_type=SglangDisaggOptions,
            arguments=READING,
        )
    ]
