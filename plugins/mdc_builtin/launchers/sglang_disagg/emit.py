"""The launch: the prefill and decode roles (or the one role whose servers share the nodes),
their environment and madengine's names for it, the node script."""

from __future__ import annotations

from mdc.api import NODE_RANK, ONE_NODE_ROLE, Artifact, Endpoint, Launch, Plan, Role, Word
from mdc.api.shell import out_file
from mdc_builtin.launchers.sglang_disagg.options import HELPER, SglangDisaggOptions, tp_size
from mdc_builtin.launchers.sglang_disagg.script import helper_script, shared_script
from mdc_builtin.launchers.sglang_disagg.servers import server, server_words, servers


def _env(plan: Plan, options: SglangDisaggOptions, role: str) -> dict[str, Word]:
    split = plan.disagg
    assert split is not None
    tp = str(tp_size(plan, options))
    return {
        "SGLANG_DISAGG_MODE": "enabled",
        "SGLANG_DISAGG_ROLE": role,
        "SGLANG_DISAGG_PREFILL_NODES": str(split.prefill),
        "SGLANG_DISAGG_DECODE_NODES": str(split.decode),
        "SGLANG_DISAGG_TOTAL_NODES": str(plan.nnodes),
        "SGLANG_DISAGG_TRANSFER_BACKEND": options.transfer_backend,
        "SGLANG_TP_SIZE": tp,
        "SGLANG_NODE_RANK": NODE_RANK,
        "MODEL_PATH": options.model_path,
        # madengine's Kubernetes names for the same facts
        "POD_INDEX": NODE_RANK,
        "TOTAL_PODS": str(plan.nnodes),
        "PREFILL_COUNT": str(split.prefill),
        "DECODE_COUNT": str(split.decode),
        "TP_SIZE": tp,
    }


def _worker_env(plan: Plan, options: SglangDisaggOptions) -> dict[str, str]:
    split = plan.disagg
    assert split is not None
    last = plan.nnodes - 1
    meaning = {k: v for k, v in _env(plan, options, "prefill").items() if isinstance(v, str)}
    meaning.update(
        {
            "SGLANG_DISAGG_ROLE": f"prefill (nodes 0..{split.prefill - 1}), decode (nodes "
            f"{split.prefill}..{last}); proxy for the router beside node 0's prefill server",
            "SGLANG_NODE_RANK": f"the backend's node index, 0..{last}",
            "POD_INDEX": f"the backend's node index, 0..{last}",
            "POD_IP": f"this node's IPv4 address from NODE_HOSTS (set by {HELPER})",
            "SGLANG_NODE_IPS": f"every node's address from NODE_HOSTS in node-rank order, "
            f"separated by commas (set by {HELPER}, as POD_IP)",
        }
    )
    return dict(sorted(meaning.items()))


def _emit_shared(plan: Plan, options: SglangDisaggOptions) -> Launch:
    env = {k: v for k, v in _env(plan, options, "").items() if k in ONE_NODE_ENV}
    argv: tuple[Word, ...] = ("bash", out_file(HELPER), *plan.job.argv)
    meaning = {k: v for k, v in env.items() if isinstance(v, str)}
    rank = "0 (the only node)" if plan.nnodes == 1 else "the backend's node index, 0..1"
    meaning.update(
        {
            "SGLANG_DISAGG_ROLE": f"proxy (the router), prefill or decode: each process its "
            f"own (set by {HELPER})",
            "SGLANG_NODE_RANK": rank,
            "POD_INDEX": rank,
        }
    )
    return Launch(
        roles=(Role(name=ONE_NODE_ROLE, argv=argv, env=env),),
        files=(Artifact.text(HELPER, shared_script(plan, options), executable=True),),
        worker_env=dict(sorted(meaning.items())),
        endpoint=Endpoint(port=options.router_port),
        servers=servers(plan, options),
    )


#: the variables of the multi-node layout that still mean something on one node
ONE_NODE_ENV = (
    "SGLANG_DISAGG_MODE",
    "SGLANG_DISAGG_TRANSFER_BACKEND",
    "SGLANG_TP_SIZE",
    "SGLANG_NODE_RANK",
    "MODEL_PATH",
    "POD_INDEX",
    "TOTAL_PODS",
    "TP_SIZE",
)


def emit(plan: Plan, options: SglangDisaggOptions | None) -> Launch:
    if options is None or plan.disagg is None:  # check() / the core reported it
        raise ValueError("the sglang_disagg launcher needs [sglang_disagg] and a split")
    if plan.disagg.unit == "gpus":
        return _emit_shared(plan, options)
    python = tuple(plan.job.argv)
    helper: tuple[Word, ...] = ("bash", out_file(HELPER))
    roles = []
    for mode in ("prefill", "decode"):
        shape = server(plan, options, mode)
        argv: list[Word] = [*helper, mode, *python, *server_words(options, shape)]
        roles.append(Role(name=mode, argv=tuple(argv), env=_env(plan, options, mode)))
    return Launch(
        roles=tuple(roles),
        files=(Artifact.text(HELPER, helper_script(plan, options), executable=True),),
        worker_env=_worker_env(plan, options),
        endpoint=Endpoint(port=options.router_port),
        servers=servers(plan, options),
    )
