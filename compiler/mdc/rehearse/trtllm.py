"""TensorRT-LLM in a rehearsal: what the ``trtllm-serve`` stand-ins recorded, against the plan.

Every server of plan.json's ``servers`` (aggregated replicas, or disaggregated context and
generation servers) started on its node, in its role (``TRTLLM_DISAGG_ROLE``), on its HTTP
port and on its own GPUs (``CUDA_VISIBLE_DEVICES``, as many as its tp x pp), and nothing else
did; in disaggregated mode the one ``trtllm-serve disaggregated``, on node 0, listens on the
plan's proxy port and its config lists each role's servers at their nodes' addresses and ports.
"""

from __future__ import annotations

from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError

from mdc.rehearse.serving import TRTLLM, _value

#: a server's role when the launch script names none (an aggregated replica)
REPLICA = "replica"
#: the disaggregated config's list of each role's servers
CONFIG_KEYS = {"context": "context_servers", "generation": "generation_servers"}


def _ran_servers(
    records: dict[int, list[dict[str, Any]]],
) -> tuple[list[tuple[int, str, str, list[int]]], list[tuple[int, dict[str, Any]]], list[str]]:
    """(node, port, role, GPUs) of each server that started; the proxies; what is wrong."""
    found: list[str] = []
    servers: list[tuple[int, str, str, list[int]]] = []
    proxies: list[tuple[int, dict[str, Any]]] = []
    for node, entries in sorted(records.items()):
        for entry in entries:
            argv, env = entry["argv"], entry["env"]
            if entry["program"] != TRTLLM:
                continue
            if argv[:1] == ["disaggregated"]:
                proxies.append((node, entry))
                continue
            port = _value(argv, "--port") or ""
            visible = env.get("CUDA_VISIBLE_DEVICES", "")
            gpus = [int(d) for d in visible.split(",")] if visible else []
            size = int(_value(argv, "--tp_size") or 1) * int(_value(argv, "--pp_size") or 1)
            if len(gpus) != size:
                found.append(
                    f"node {node}: the server on port {port} sees GPUs {gpus}, its tp x pp "
                    f"is {size}"
                )
            servers.append((node, port, env.get("TRTLLM_DISAGG_ROLE", REPLICA), gpus))
    return servers, proxies, found


def _check_proxy_config(
    config: dict[str, Any],
    port: str,
    servers: list[tuple[int, str, str, list[int]]],
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
        wanted = sorted((node, p) for node, p, r, _ in servers if r == role)
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
    servers, proxies, found = _ran_servers(records)
    planned = sorted(
        (
            s["nodes"][0],
            str(s["port"]),
            s["role"],
            list(range(s["first_gpu"], s["first_gpu"] + s["gpus"])),
        )
        for s in plan["servers"]
        if s["gpus"]
    )
    if sorted(servers) != planned:
        found.append(
            f"servers started (node, port, role, GPUs) {sorted(servers)}, the plan has {planned}"
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
        where = {host: node for node, host in enumerate(hosts)}
        found += _check_proxy_config(config, proxy_ports[0], servers, where)
    return found
