"""TensorRT-LLM in a rehearsal: what the ``trtllm-serve`` stand-ins recorded, against the plan.

Every server of plan.json's ``servers`` (aggregated replicas, or disaggregated context and
generation servers) started on its node, in its role (``TRTLLM_DISAGG_ROLE``), on its HTTP
port and on its own GPUs (``CUDA_VISIBLE_DEVICES``, as many as its tp x pp), or, over several
nodes, as the ``srun`` step of its first node over its nodes with a task a GPU; and nothing else
started; in disaggregated mode the one ``trtllm-serve disaggregated``, on node 0, listens on the
plan's proxy port and its config lists each role's servers at their nodes' addresses and ports.
"""

from __future__ import annotations

from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError

from mdc.rehearse.argv import flag_value

#: TensorRT-LLM's server program (its disaggregated proxy is ``trtllm-serve disaggregated``)
TRTLLM = "trtllm-serve"

#: a server's role when the launch script names none (an aggregated replica or server)
AGGREGATED = "aggregated"
#: the disaggregated config's list of each role's servers
CONFIG_KEYS = {"context": "context_servers", "generation": "generation_servers"}
#: TensorRT-LLM's wrapper that an srun step runs the server's ranks under
LLMAPI_LAUNCH = "trtllm-llmapi-launch"
#: a server that ran: (its nodes, its HTTP port, its role, its GPUs on each node)
Server = tuple[tuple[int, ...], str, str, list[int]]


def _step(
    node: int, argv: list[str], where: dict[str, int]
) -> tuple[tuple[int, ...], list[str], list[int], list[str]]:
    """An srun step's nodes, its server's argv, the GPUs its tasks take on each node (one
    a task, from 0), and what is wrong with it."""
    found: list[str] = []
    start = next((i for i, word in enumerate(argv) if not word.startswith("-")), len(argv))
    options, command = argv[:start], argv[start:]
    listed = (flag_value(options, "--nodelist") or "").split(",")
    nodes = tuple(where.get(host, -1) for host in listed)
    if -1 in nodes or nodes[:1] != (node,):
        found.append(f"node {node}: srun --nodelist {listed} reaches nodes {list(nodes)}")
    if flag_value(options, "--nodes") != str(len(listed)):
        found.append(
            f"node {node}: srun --nodes {flag_value(options, '--nodes')}, nodelist {listed}"
        )
    per_node = int(flag_value(options, "--ntasks-per-node") or 0)
    if flag_value(options, "--ntasks") != str(per_node * len(listed)):
        found.append(
            f"node {node}: srun --ntasks {flag_value(options, '--ntasks')}, --ntasks-per-node "
            f"{per_node} on {len(listed)} nodes"
        )
    if command[:2] != [LLMAPI_LAUNCH, TRTLLM]:
        found.append(f"node {node}: srun runs {command[:2]}, not {LLMAPI_LAUNCH} {TRTLLM}")
    return nodes, command[2:], list(range(per_node)), found


def step_nodes(records: dict[int, list[dict[str, Any]]], hosts: list[str]) -> set[int]:
    """The nodes that the srun steps of the records reach (where their tasks would run)."""
    where = {host: node for node, host in enumerate(hosts)}
    reached: set[int] = set()
    for entries in records.values():
        for entry in entries:
            if entry["program"] == "srun":
                listed = flag_value(entry["argv"], "--nodelist") or ""
                reached |= {where[h] for h in listed.split(",") if h in where}
    return reached


def _ran_servers(
    records: dict[int, list[dict[str, Any]]], where: dict[str, int]
) -> tuple[list[Server], list[tuple[int, dict[str, Any]]], list[str]]:
    """Each server that started (alone or in an srun step); the proxies; what is wrong."""
    found: list[str] = []
    servers: list[Server] = []
    proxies: list[tuple[int, dict[str, Any]]] = []
    for node, entries in sorted(records.items()):
        for entry in entries:
            argv, env = entry["argv"], entry["env"]
            if entry["program"] == "srun":
                nodes, argv, gpus, wrong = _step(node, argv, where)
                found += wrong
            elif entry["program"] == TRTLLM and argv[:1] == ["disaggregated"]:
                proxies.append((node, entry))
                continue
            elif entry["program"] == TRTLLM:
                visible = env.get("CUDA_VISIBLE_DEVICES", "")
                nodes, gpus = (node,), [int(d) for d in visible.split(",")] if visible else []
            else:
                continue
            port = flag_value(argv, "--port") or ""
            size = int(flag_value(argv, "--tp_size") or 1) * int(flag_value(argv, "--pp_size") or 1)
            if len(gpus) * len(nodes) != size:
                found.append(
                    f"node {node}: the server on port {port} takes GPUs {gpus} on "
                    f"{len(nodes)} node(s), its tp x pp is {size}"
                )
            servers.append((nodes, port, env.get("TRTLLM_DISAGG_ROLE", AGGREGATED), gpus))
    return servers, proxies, found


def _check_proxy_config(
    config: dict[str, Any],
    port: str,
    servers: list[Server],
    where: dict[str, int],
) -> list[str]:
    """The proxy's port, and each role's URLs: the (node, port) its servers really run at."""
    found: list[str] = []
    if str(config.get("port")) != port:
        found.append(f"the proxy's config listens on port {config.get('port')}, the plan's {port}")
    for role, key in CONFIG_KEYS.items():
        listed = (config.get(key) or {}).get("urls") or []
        count = (config.get(key) or {}).get("num_instances")
        reached = []
        for url in listed:
            host, _, at = str(url).rpartition(":")
            reached.append((where.get(host, -1), at))
        wanted = sorted((nodes[0], p) for nodes, p, r, _ in servers if r == role)
        if sorted(reached) != wanted:
            found.append(
                f"the proxy's {key} {listed} reach (node, port) {sorted(reached)}; the {role} "
                f"servers run at {wanted}"
            )
        if count != len(listed):
            found.append(f"the proxy's {key} num_instances is {count}, it lists {len(listed)}")
    return found


def check_trtllm(
    plan: dict[str, Any], records: dict[int, list[dict[str, Any]]], hosts: list[str]
) -> list[str]:
    """Every mismatch between plan.json's servers and what the trtllm-serve stand-ins saw."""
    where = {host: node for node, host in enumerate(hosts)}
    servers, proxies, found = _ran_servers(records, where)
    planned = sorted(
        (
            tuple(s["nodes"]),
            str(s["port"]),
            s["role"] if s["role"] in CONFIG_KEYS else AGGREGATED,
            list(range(s["first_gpu"], s["first_gpu"] + s["gpus"] // len(s["nodes"]))),
        )
        for s in plan["servers"]
        if s["gpus"]
    )
    if sorted(servers) != planned:
        found.append(
            f"servers started (nodes, port, role, GPUs a node) {sorted(servers)}, the plan has "
            f"{planned}"
        )
    proxy_ports = [str(s["port"]) for s in plan["servers"] if s["role"] == "proxy"]
    if [n for n, _ in proxies] != [0] * len(proxy_ports):
        found.append(
            f"trtllm-serve disaggregated started on nodes {[n for n, _ in proxies]}, the plan "
            f"has it {'on node 0' if proxy_ports else 'nowhere'}"
        )
        return found
    for _node, entry in proxies:
        if entry["env"].get("TRTLLM_DISAGG_ROLE") != "proxy":
            found.append(
                f"the proxy runs as TRTLLM_DISAGG_ROLE {entry['env'].get('TRTLLM_DISAGG_ROLE')!r}"
            )
        try:
            config = YAML(typ="safe").load(entry.get("config") or "")
        except YAMLError as error:
            found.append(f"the proxy's config is no YAML: {error}")
            continue
        if not isinstance(config, dict):
            found.append(f"the proxy's config is {config!r}, not a mapping")
            continue
        found += _check_proxy_config(config, proxy_ports[0], servers, where)
    return found
