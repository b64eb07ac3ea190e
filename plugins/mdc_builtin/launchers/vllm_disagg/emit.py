"""The launch: the prefill and decode roles (or the one role whose servers share the nodes),
their environment and what it means, the node script."""

from __future__ import annotations

from mdc.api import NODE_RANK, ONE_NODE_ROLE, Artifact, Endpoint, Launch, Plan, Role, Word
from mdc.api.shell import out_file
from mdc_builtin.launchers.vllm_disagg.options import (
    HELPER,
    PROXY_HEALTH,
    ROLES,
    SIDE_HOST,
    SIDE_PORT,
    VllmDisaggOptions,
)
from mdc_builtin.launchers.vllm_disagg.script import helper_script, shared_script
from mdc_builtin.launchers.vllm_disagg.servers import server, server_words, servers


def _env(plan: Plan, options: VllmDisaggOptions, role: str) -> dict[str, Word]:
    split = plan.disagg
    assert split is not None
    return {
        "VLLM_DISAGG_ROLE": role,
        "VLLM_DISAGG_PREFILL": str(split.prefill),
        "VLLM_DISAGG_DECODE": str(split.decode),
        "VLLM_DISAGG_UNIT": split.unit,
        "MODEL": options.model,
        "NODE_RANK": NODE_RANK,
    }


def _meaning(plan: Plan, options: VllmDisaggOptions, role: str) -> dict[str, str]:
    split = plan.disagg
    assert split is not None
    last = plan.nnodes - 1
    meaning = {k: v for k, v in _env(plan, options, role).items() if isinstance(v, str)}
    meaning["NODE_RANK"] = (
        "0 (the only node)" if last == 0 else f"the backend's node index, 0..{last}"
    )
    if split.unit == "gpus":
        meaning["VLLM_DISAGG_ROLE"] = f"proxy, prefill or decode: each process its own ({HELPER})"
        meaning["CUDA_VISIBLE_DEVICES"] = f"a server's GPUs on its node (set by {HELPER})"
    else:
        meaning["VLLM_DISAGG_ROLE"] = (
            f"prefill (nodes 0..{split.prefill - 1}), decode (nodes {split.prefill}..{last}); "
            "proxy for the proxy beside node 0's prefill server"
        )
        meaning["VLLM_HOST_IP"] = f"this node's IPv4 address from NODE_HOSTS (set by {HELPER})"
    meaning[SIDE_PORT] = (
        f"a server's NIXL handshake port base: {options.side_channel_port} + the job-wide "
        f"index of its first GPU (set by {HELPER})"
    )
    if plan.nnodes > 1:
        meaning[SIDE_HOST] = f"this node's IPv4 address from NODE_HOSTS (set by {HELPER})"
    return dict(sorted(meaning.items()))


def emit(plan: Plan, options: VllmDisaggOptions | None) -> Launch:
    if options is None or plan.disagg is None:  # check() / the core reported it
        raise ValueError("the vllm_disagg launcher needs [vllm_disagg] and a split")
    helper: tuple[Word, ...] = ("bash", out_file(HELPER))
    endpoint = Endpoint(port=options.router_port, health_path=PROXY_HEALTH)
    if plan.disagg.unit == "gpus":
        env = _env(plan, options, "")
        env.pop("VLLM_DISAGG_ROLE")
        return Launch(
            roles=(Role(name=ONE_NODE_ROLE, argv=(*helper, *plan.job.argv), env=env),),
            files=(Artifact.text(HELPER, shared_script(plan, options), executable=True),),
            worker_env=_meaning(plan, options, ""),
            endpoint=endpoint,
            servers=servers(plan, options),
        )
    roles = []
    for role in ROLES:
        words = server_words(plan, options, server(plan, options, role))
        env = {**_env(plan, options, role), **getattr(options, role).env}
        roles.append(Role(name=role, argv=(*helper, role, *words), env=env))
    return Launch(
        roles=tuple(roles),
        files=(Artifact.text(HELPER, helper_script(plan, options), executable=True),),
        worker_env=_meaning(plan, options, "prefill"),
        endpoint=endpoint,
        servers=servers(plan, options),
    )
