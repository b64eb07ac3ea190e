"""vllm_disagg: vLLM prefill/decode disaggregation over NixlConnector, behind a proxy.

The core splits the job as for every disaggregated launcher (``plan.disagg``): from 3
nodes nodes 0..P-1 run the prefill servers and the rest the decode servers; on one or two
nodes the servers share the nodes' GPUs side by side (``CUDA_VISIBLE_DEVICES``). Either
way node 0 also runs the proxy, on no GPU and its own port, as vLLM's multi-node P/D
examples run it beside a server: the job asks the scheduler for the servers' nodes only.
From 3 nodes the proxy starts once every server answers ``GET /health``.

Every server is ``vllm serve MODEL`` with its role's ``--tensor-parallel-size``,
``--data-parallel-size`` and ``--enable-expert-parallel``, and ``--kv-transfer-config
{"kv_connector": "NixlConnector", "kv_role": "kv_both"}`` (vLLM's NixlConnector guide,
v0.11.0: the proxy, not kv_role, makes an instance prefill or decode). NIXL's handshake
listens on ``VLLM_NIXL_SIDE_CHANNEL_HOST``/``VLLM_NIXL_SIDE_CHANNEL_PORT`` (vllm/envs.py;
each data-parallel rank of a server on base + its rank); mdc gives server ``s`` the base
``side_channel_port + the job-wide index of s's first GPU``, so no two servers' ranges
meet even when a backend puts several nodes on one host. A server over several nodes is
data parallel as vLLM's "Data Parallel Deployment" runs it (``--data-parallel-size-local``,
``--data-parallel-address``, ``--data-parallel-rpc-port``, ``--headless
--data-parallel-start-rank`` on its later nodes).

The arguments are read as keys by the pipeline (``LauncherSpec.arguments``): a role's size
flags in its ``args`` are that role's keys, in ``[vllm_disagg] args`` the shared ones.

The proxy is vLLM's documented ``toy_proxy_server.py`` (``--port``, ``--host``,
``--prefiller-hosts``/``--prefiller-ports``, ``--decoder-hosts``/``--decoder-ports``, each
one or more values; health at ``/healthcheck``); ``router_command`` names the program.

The launcher's parts (modules of this package): options (the [vllm_disagg] table and the
flags mdc writes), servers (each role's servers, their command words and ports), script
(the node script), emit (the roles and their environment), checks (the refusals), serving
(what the memory check reads).
"""

from __future__ import annotations

import mdc
from mdc.api import LauncherSpec
from mdc.api.files import read_schema
from mdc_builtin.launchers.vllm_disagg.checks import check
from mdc_builtin.launchers.vllm_disagg.emit import emit
from mdc_builtin.launchers.vllm_disagg.options import NAME, READING, VllmDisaggOptions
from mdc_builtin.launchers.vllm_disagg.servers import server_units
from mdc_builtin.launchers.vllm_disagg.serving import serving

__all__ = [
    "VllmDisaggOptions",
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
            name=NAME,
            description="vLLM prefill/decode disaggregation over NixlConnector: prefill servers "
            "on nodes 0..P-1, decode servers on the rest, the proxy beside node 0's",
            parallelism="data",
            disaggregated=True,
            workload="serving",
            emit=emit,
            check=check,
            server_units=server_units,
            serving=serving,
            schema=read_schema("mdc_schemas", f"plugins/{NAME}.v1.schema.json"),
            options_type=VllmDisaggOptions,
            arguments=READING,
        )
    ]
