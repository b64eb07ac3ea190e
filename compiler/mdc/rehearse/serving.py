"""Serving launchers in a rehearsal: the servers are shims that record, then checks.

``install_shims`` puts ``vllm``, ``ray``, ``trtllm-serve``, ``srun``, ``python`` and
``python3`` first on the nodes' PATH. ``vllm ...``, ``ray ...``, ``python -m sglang.launch_server ...``, ``python -m
sglang_router.launch_router ...``, ``python -m sglang.srt.disaggregation.mini_lb ...`` and
``python .../toy_proxy_server.py ...`` (vllm_disagg's proxy), ``trtllm-serve ...`` (a
TensorRT-LLM server, or ``trtllm-serve disaggregated -c CONFIG``, whose CONFIG is recorded
too) and ``srun ...`` (the step trtllm starts a server over nodes with) record their argv and
environment (``serving/node-<k>.jsonl`` under the results) and exit 0; the Ray head's
readiness poll (``python3 -c 'import ray ...'``) is answered with the GPUs of the nodes that
have run ``ray start`` so far; anything else runs the real interpreter.

``check`` then reads the records: each node ran the program of its plan role, and every
address handed to a node (``--dist-init-addr``, ``--node-rank``, ray's ``--address`` and
``--node-ip-address``, ``VLLM_HOST_IP``, the router's ``--prefill``/``--decode`` URLs and
bootstrap ports, the URLs of trtllm's disaggregated config) points at a node that has the
right role, by its loopback address.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from mdc.rehearse.argv import flag_value
from mdc.rehearse.trtllm import TRTLLM, check_trtllm, step_nodes

RECORDED_ENV = (
    "NODE_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "NODE_HOSTS",
    "VLLM_HOST_IP",
    "NCCL_INIT_ADDR",
    "SGLANG_DISAGG_ROLE",
    "VLLM_DISAGG_ROLE",
    "TRTLLM_DISAGG_ROLE",
    "VLLM_NIXL_SIDE_CHANNEL_HOST",
    "VLLM_NIXL_SIDE_CHANNEL_PORT",
    "CUDA_VISIBLE_DEVICES",
    "SGLANG_NODE_RANK",
    "MDC_REHEARSE_NODE",
    "MDC_REHEARSE_ROLE",
    "MDC_REHEARSE_HOST",
)
RECORDED_MODULES = (
    "sglang.launch_server",
    "sglang_router.launch_router",
    "sglang.srt.disaggregation.mini_lb",
)
ROUTERS = ("sglang_router.launch_router", "sglang.srt.disaggregation.mini_lb")
#: vLLM's toy proxy (vllm_disagg), run as ``python[3] .../toy_proxy_server.py ...``
VLLM_PROXY = "toy_proxy_server.py"


def install_shims(shims: Path, python: str) -> None:
    recorder = f"{shlex.quote(python)} -m mdc.rehearse.serving"
    for name in ("vllm", "ray", TRTLLM, "srun"):
        _script(shims / name, f'exec {recorder} {name} "$@"')
    for name in ("python", "python3"):
        _script(
            shims / name,
            "\n".join(
                [
                    'if [[ "${1:-}" == -m ]] && [[ " '
                    + " ".join(RECORDED_MODULES)
                    + ' " == *" ${2:-} "* ]]; then',
                    f'  exec {recorder} python "$@"',
                    "fi",
                    f'if [[ "${1:-}" == *{VLLM_PROXY} ]]; then',
                    f'  exec {recorder} python "$@"',
                    "fi",
                    'if [[ "${1:-}" == -c && "${2:-}" == *ray.cluster_resources* ]]; then',
                    f"  exec {recorder} ray-gpus",
                    "fi",
                    f'exec {shlex.quote(python)} "$@"',
                ]
            ),
        )


def _script(path: Path, body: str) -> None:
    path.write_text(f"#!/usr/bin/env bash\n{body}\n", encoding="utf-8")
    path.chmod(0o755)


def _results() -> Path:
    return Path(os.environ["MDC_REHEARSE_RESULTS"])


def record(program: str, argv: list[str]) -> int:
    """The shim's body: append one record for this node; answer Ray's GPU poll."""
    results = _results()
    folder = results / "serving"
    folder.mkdir(exist_ok=True)
    if program == "ray-gpus":
        total = 0
        for path in folder.glob("node-*.jsonl"):
            for line in path.read_text(encoding="utf-8").splitlines():
                entry = json.loads(line)
                args = entry["argv"]
                if entry["program"] == "ray" and args[:1] == ["start"]:
                    total += int(flag_value(args, "--num-gpus") or 0)
        print(total)
        return 0
    node = os.environ.get("MDC_REHEARSE_NODE", "unknown")
    (results / "up" / f"node-{node}").touch()
    entry = {
        "program": program,
        "argv": argv,
        "env": {k: os.environ[k] for k in RECORDED_ENV if k in os.environ},
    }
    if program == TRTLLM and argv[:1] == ["disaggregated"]:
        # the launch script writes the config into a temporary folder: keep what it said
        config = flag_value(argv, "-c") or flag_value(argv, "--config_file")
        entry["config"] = Path(config).read_text(encoding="utf-8") if config else None
    with (folder / f"node-{node}.jsonl").open("a", encoding="utf-8") as out:
        out.write(json.dumps(entry, sort_keys=True) + "\n")
    port = _probed_port(program, argv)
    return 0 if port is None else _answer_health(port)


#: seconds a disaggregated server's shim waits for the router's readiness probe
HEALTH_WAIT_SECONDS = 300
#: the servers' default HTTP ports (vLLM's, SGLang's)
DEFAULT_PORTS = {"vllm": 8000, "python": 30000}


def _probed_port(program: str, argv: list[str]) -> int | None:
    """The HTTP port of a disaggregated job's server, which its router probes (GET /health)
    before it starts: a server's first node (not vLLM's headless engines, not SGLang's later
    ranks); None for every other program."""
    role = os.environ.get("SGLANG_DISAGG_ROLE") or os.environ.get("VLLM_DISAGG_ROLE")
    if role not in ("prefill", "decode"):
        return None
    vllm_api = program == "vllm" and argv[:1] == ["serve"] and "--headless" not in argv
    sglang_head = (
        program == "python"
        and argv[1:2] == ["sglang.launch_server"]
        and (flag_value(argv, "--node-rank") or "0") == "0"
    )
    if not (vllm_api or sglang_head):
        return None
    return int(flag_value(argv, "--port") or DEFAULT_PORTS[program])


def _answer_health(port: int) -> int:
    """Stand in for a server that became ready: answer GET /health with 200 once (the
    router's probe), then end; 1 when no probe came in HEALTH_WAIT_SECONDS."""
    import time
    from http.server import BaseHTTPRequestHandler, HTTPServer

    answered: list[bool] = []

    class Health(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (the standard library's name)
            ok = self.path == "/health"
            self.send_response(200 if ok else 404)
            self.end_headers()
            if ok:
                answered.append(True)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            return

    deadline = time.monotonic() + HEALTH_WAIT_SECONDS
    with HTTPServer(("", port), Health) as server:
        server.timeout = 1
        while not answered and time.monotonic() < deadline:
            server.handle_request()
    return 0 if answered else 1


def read_records(results: Path) -> dict[int, list[dict[str, Any]]]:
    found: dict[int, list[dict[str, Any]]] = {}
    for path in sorted((results / "serving").glob("node-*.jsonl")):
        index = path.stem.removeprefix("node-")
        if index.isdigit():
            found[int(index)] = [
                json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()
            ]
    return found


def _server(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The node's server invocation (vllm serve, sglang's server or router)."""
    for entry in records:
        argv = entry["argv"]
        if entry["program"] == "vllm" and argv[:1] == ["serve"]:
            return entry
        if entry["program"] == "python" and len(argv) > 1 and argv[1] in RECORDED_MODULES:
            return entry
    return None


def _role_of(plan: dict[str, Any], node: int) -> str | None:
    for role in plan["roles"]:
        if role["first_node"] <= node < role["first_node"] + role["count"]:
            return str(role["name"])
    return None


def missing_nodes(
    plan: dict[str, Any], records: dict[int, list[dict[str, Any]]], hosts: list[str]
) -> list[int]:
    """The nodes that started nothing: not a node whose part is another node's srun step
    (trtllm's server over nodes), which starts its tasks there."""
    covered: set[int] = set()
    if plan["launcher"] == "trtllm":
        covered = step_nodes(records, hosts)
    return [n for n in range(len(hosts)) if not records.get(n) and n not in covered]


def check(
    plan: dict[str, Any], records: dict[int, list[dict[str, Any]]], hosts: list[str]
) -> list[str]:
    """Every mismatch between the plan's roles and what the nodes were started with."""
    found: list[str] = []
    where = {host: i for i, host in enumerate(hosts)}

    def node_at(host: str | None, what: str, node: int) -> int | None:
        if host is None or host not in where:
            found.append(
                f"node {node}: {what} is {host!r}, which is no node's address "
                f"(nodes: {' '.join(hosts)})"
            )
            return None
        return where[host]

    for node in missing_nodes(plan, records, hosts):
        found.append(f"node {node} ({hosts[node]}, role {_role_of(plan, node)}) started no server")
    launcher = plan["launcher"]
    if launcher == "sglang_disagg" and (plan.get("disagg") or {}).get("unit") == "gpus":
        found += _check_disagg_shared(plan, records, hosts)
    elif launcher == "sglang_disagg":
        found += _check_disagg(plan, records, hosts, node_at)
    elif launcher == "sglang":
        for node, entries in sorted(records.items()):
            server = _server(entries)
            if server is None:
                found.append(f"node {node}: no sglang.launch_server")
                continue
            argv = server["argv"]
            if plan["nnodes"] > 1:
                init = flag_value(argv, "--dist-init-addr") or ""
                host, _, port = init.rpartition(":")
                if node_at(host, "--dist-init-addr's host", node) not in (0, None):
                    found.append(f"node {node}: --dist-init-addr {init} is not node 0")
                if port != str(plan["rendezvous"]["master_port"]):
                    found.append(
                        f"node {node}: --dist-init-addr port {port}, the plan's "
                        f"master port is {plan['rendezvous']['master_port']}"
                    )
                if flag_value(argv, "--node-rank") != str(node):
                    found.append(f"node {node}: --node-rank is {flag_value(argv, '--node-rank')}")
                if flag_value(argv, "--nnodes") != str(plan["nnodes"]):
                    found.append(f"node {node}: --nnodes is {flag_value(argv, '--nnodes')}")
    elif launcher == "vllm":
        found += _check_vllm(plan, records, hosts, node_at)
    elif launcher == "vllm_disagg":
        found += _check_vllm_disagg(plan, records, hosts)
    elif launcher == "trtllm":
        found += check_trtllm(plan, records, hosts)
    return found


def _check_vllm(
    plan: dict[str, Any], records: dict[int, list[dict[str, Any]]], hosts: list[str], node_at: Any
) -> list[str]:
    found: list[str] = []
    ray_mode = plan["nnodes"] > 1 and any(
        e["program"] == "ray" for entries in records.values() for e in entries
    )
    servers = {node: _server(entries) for node, entries in records.items()}
    if not ray_mode:
        for node in range(plan["nnodes"]):
            if servers.get(node) is None:
                found.append(f"node {node}: no vllm serve (every node runs a server or engines)")
        found += _check_vllm_dp(plan, servers, hosts, node_at)
        return found
    head_port = None
    for node, entries in sorted(records.items()):
        starts = [e for e in entries if e["program"] == "ray" and e["argv"][:1] == ["start"]]
        if len(starts) != 1:
            found.append(f"node {node}: ran 'ray start' {len(starts)} times")
            continue
        argv = starts[0]["argv"]
        ip = flag_value(argv, "--node-ip-address")
        at = node_at(ip, "ray --node-ip-address", node)
        if at not in (node, None):
            found.append(f"node {node}: ray --node-ip-address {ip} is node {at}'s address")
        env_ip = starts[0]["env"].get("VLLM_HOST_IP")
        if env_ip != hosts[node]:
            found.append(f"node {node}: VLLM_HOST_IP is {env_ip!r}, its address is {hosts[node]}")
        if node == 0:
            if "--head" not in argv:
                found.append("node 0: ray start without --head")
            head_port = flag_value(argv, "--port")
            head = servers.get(0)
            if head is None:
                found.append("node 0 (the Ray head) did not start vllm serve")
            elif "ray" not in (
                flag_value(head["argv"], "--distributed-executor-backend"),
                flag_value(head["argv"], "--data-parallel-backend"),
            ):
                found.append(
                    "node 0: vllm serve without --distributed-executor-backend ray (one "
                    "engine) or --data-parallel-backend ray (engines over nodes)"
                )
        else:
            address = flag_value(argv, "--address") or ""
            host, _, port = address.rpartition(":")
            if node_at(host, "ray --address's host", node) not in (0, None):
                found.append(f"node {node}: ray --address {address} is not the head (node 0)")
            if head_port is not None and port != head_port:
                found.append(
                    f"node {node}: ray --address port {port}, the head listens on {head_port}"
                )
            if servers.get(node) is not None:
                found.append(f"node {node}: started vllm serve, but only the head serves")
    return found


def _check_vllm_dp(
    plan: dict[str, Any], servers: dict[int, Any], hosts: list[str], node_at: Any
) -> list[str]:
    """Data parallel over nodes: node 0 serves, the others run headless engines at node 0."""
    found: list[str] = []
    first = servers.get(0)
    if first is None or flag_value(first["argv"], "--data-parallel-size-local") is None:
        return found  # replicas: independent servers
    local = int(flag_value(first["argv"], "--data-parallel-size-local") or 0)
    for node, server in sorted(servers.items()):
        if server is None:
            continue
        argv = server["argv"]
        address = flag_value(argv, "--data-parallel-address")
        if node_at(address, "--data-parallel-address", node) not in (0, None):
            found.append(f"node {node}: --data-parallel-address {address} is not node 0")
        if flag_value(argv, "--data-parallel-rpc-port") != str(plan["rendezvous"]["master_port"]):
            found.append(
                f"node {node}: --data-parallel-rpc-port {flag_value(argv, '--data-parallel-rpc-port')}"
                f", the plan's master port is {plan['rendezvous']['master_port']}"
            )
        if server["env"].get("VLLM_HOST_IP") != hosts[node]:
            found.append(
                f"node {node}: VLLM_HOST_IP is {server['env'].get('VLLM_HOST_IP')!r}, its "
                f"address is {hosts[node]}"
            )
        start = flag_value(argv, "--data-parallel-start-rank")
        headless = "--headless" in argv
        if node == 0 and (headless or start is not None):
            found.append("node 0 (the API server) runs headless or with a start rank")
        if node > 0 and (not headless or start != str(node * local)):
            found.append(
                f"node {node}: --headless {headless}, --data-parallel-start-rank {start}; "
                f"its engines start at rank {node * local}"
            )
    return found


def _check_server_nodes(
    plan: dict[str, Any], node: int, role: str, argv: list[str], node_at: Any
) -> list[str]:
    """A server over several nodes: its nodes agree on its size, rank and first node."""
    found: list[str] = []
    size = int(flag_value(argv, "--nnodes") or 1)
    if size == 1:
        return found
    (first_of_role,) = [r["first_node"] for r in plan["roles"] if r["name"] == role]
    first = first_of_role + (node - first_of_role) // size * size
    rank = flag_value(argv, "--node-rank")
    if rank != str(node - first):
        found.append(f"node {node} ({role}): --node-rank {rank}, its server starts at node {first}")
    init = flag_value(argv, "--dist-init-addr") or ""
    host, _, _port = init.rpartition(":")
    at = node_at(host, "--dist-init-addr's host", node)
    if at not in (first, None):
        found.append(
            f"node {node} ({role}): --dist-init-addr {init} is node {at}, its server's first "
            f"node is {first}"
        )
    return found


def _check_disagg(
    plan: dict[str, Any], records: dict[int, list[dict[str, Any]]], hosts: list[str], node_at: Any
) -> list[str]:
    found: list[str] = []
    servers: dict[int, dict[str, Any]] = {}
    routers: dict[int, dict[str, Any]] = {}
    for node, entries in sorted(records.items()):
        role = _role_of(plan, node)
        started = [e for e in entries if e["program"] == "python" and len(e["argv"]) > 1]
        for entry in started:
            if entry["argv"][1] in ROUTERS:
                routers[node] = entry
        server = next((e for e in started if e["argv"][1] == "sglang.launch_server"), None)
        if server is None:
            found.append(f"node {node} (role {role}): no sglang server")
            continue
        servers[node] = server
        argv = server["argv"]
        seen_role = server["env"].get("SGLANG_DISAGG_ROLE")
        if seen_role != role:
            found.append(f"node {node}: SGLANG_DISAGG_ROLE is {seen_role!r}, plan role {role!r}")
        mode = flag_value(argv, "--disaggregation-mode")
        if mode != role:
            found.append(f"node {node} ({role}) runs --disaggregation-mode {mode}")
        found += _check_server_nodes(plan, node, str(role), argv, node_at)
    # the router runs on node 0 beside the first prefill server, in its own role
    if list(routers) != [0] or routers[0]["env"].get("SGLANG_DISAGG_ROLE") != "proxy":
        found.append(f"the router runs on node(s) {list(routers)}, the plan puts it on node 0")
        return found
    argv = routers[0]["argv"]
    pointed: dict[str, list[int]] = {"prefill": [], "decode": []}
    for i, word in enumerate(argv):
        if word not in ("--prefill", "--decode") or i + 1 >= len(argv):
            continue
        kind = word[2:]
        url = urlsplit(argv[i + 1])
        node = node_at(url.hostname, f"router {word} URL {argv[i + 1]}", 0)
        if node is None:
            continue
        pointed[kind].append(node)
        if _role_of(plan, node) != kind:
            found.append(
                f"router {word} {argv[i + 1]} points at node {node}, whose role is "
                f"{_role_of(plan, node)}"
            )
        target = servers.get(node)
        if target is not None and str(url.port) != flag_value(target["argv"], "--port"):
            found.append(
                f"router {word} {argv[i + 1]}: node {node} serves on port "
                f"{flag_value(target['argv'], '--port')}"
            )
        if kind == "prefill" and target is not None:
            bootstrap = argv[i + 2] if i + 2 < len(argv) and argv[i + 2].isdigit() else None
            theirs = flag_value(target["argv"], "--disaggregation-bootstrap-port")
            if bootstrap != theirs:
                found.append(
                    f"router --prefill {argv[i + 1]}: bootstrap port {bootstrap}, "
                    f"node {node}'s bootstrap server is on {theirs}"
                )
    for kind in ("prefill", "decode"):
        # the router knows a server by its first node (--node-rank 0)
        wanted = [
            n
            for n in range(len(hosts))
            if _role_of(plan, n) == kind
            and flag_value(servers.get(n, {}).get("argv", []), "--node-rank") in (None, "0")
        ]
        if sorted(pointed[kind]) != wanted:
            found.append(
                f"the router's --{kind} URLs point at nodes {sorted(pointed[kind])}, "
                f"the plan's {kind} nodes are {wanted}"
            )
    return found


def _gpus_of(argv: list[str]) -> range:
    """The GPUs an SGLang server takes from --base-gpu-id: tp, times dp without DP attention."""
    tp = int(flag_value(argv, "--tp-size") or 1)
    dp = 1 if "--enable-dp-attention" in argv else int(flag_value(argv, "--dp-size") or 1)
    base = int(flag_value(argv, "--base-gpu-id") or 0)
    return range(base, base + tp * dp)


def _check_disagg_shared(
    plan: dict[str, Any], records: dict[int, list[dict[str, Any]]], hosts: list[str]
) -> list[str]:
    """Servers sharing one or two nodes: every planned server started on its node with its
    role, on its own GPUs and port; the one router, on node 0, reaches each of them by role
    at its node's address (one node: 127.0.0.1, where SGLang's single-node example has it)."""
    found: list[str] = []
    where = {host: node for node, host in enumerate(hosts)}
    if len(hosts) == 1:
        where["127.0.0.1"] = 0
    by_port: dict[str, tuple[int, dict[str, Any]]] = {}
    taken: dict[tuple[int, int], str] = {}
    routers: list[tuple[int, dict[str, Any]]] = []
    for node, entries in sorted(records.items()):
        for entry in entries:
            argv = entry["argv"]
            if entry["program"] != "python" or len(argv) < 2:
                continue
            if argv[1] in ROUTERS:
                routers.append((node, entry))
            if argv[1] != "sglang.launch_server":
                continue
            role = entry["env"].get("SGLANG_DISAGG_ROLE")
            mode, port = flag_value(argv, "--disaggregation-mode"), flag_value(argv, "--port") or ""
            if role != mode:
                found.append(f"server on port {port}: SGLANG_DISAGG_ROLE {role!r}, mode {mode!r}")
            if port in by_port:
                found.append(f"two servers serve HTTP on port {port}")
            by_port[port] = (node, entry)
            for gpu in _gpus_of(argv):
                if gpu >= plan["nproc_per_node"] or (node, gpu) in taken:
                    found.append(
                        f"{mode} server on port {port} takes GPU {gpu}, "
                        + (
                            f"also {taken[(node, gpu)]}'s"
                            if (node, gpu) in taken
                            else "beyond the node's GPUs"
                        )
                    )
                taken.setdefault((node, gpu), f"the server on port {port}")
    planned = sorted(
        (s["role"], str(s["port"]), s["nodes"][0]) for s in plan["servers"] if s["gpus"]
    )
    ran = sorted(
        (flag_value(e["argv"], "--disaggregation-mode") or "", port, node)
        for port, (node, e) in by_port.items()
    )
    if ran != planned:
        found.append(f"servers started (role, port, node) {ran}, the plan has {planned}")
    if [n for n, _ in routers] != [0] or routers[0][1]["env"].get("SGLANG_DISAGG_ROLE") != "proxy":
        found.append(
            f"routers started on nodes {[n for n, _ in routers]}, the plan has one on node 0"
        )
        return found
    argv = routers[0][1]["argv"]
    # mini_lb takes no bootstrap ports (every prefill server keeps the fixed one)
    bootstraps = argv[1] == "sglang_router.launch_router"
    pointed: list[str] = []
    for i, word in enumerate(argv):
        if word not in ("--prefill", "--decode") or i + 1 >= len(argv):
            continue
        url = urlsplit(argv[i + 1])
        target = by_port.get(str(url.port))
        if url.hostname not in where or target is None:
            found.append(f"router {word} {argv[i + 1]} reaches no server")
            continue
        node, entry = target
        if where[url.hostname] != node:
            found.append(
                f"router {word} {argv[i + 1]} is node {where[url.hostname]}; the server on "
                f"port {url.port} runs on node {node}"
            )
        pointed.append(str(url.port))
        mode = flag_value(entry["argv"], "--disaggregation-mode")
        if word[2:] != mode:
            found.append(f"router {word} {argv[i + 1]} reaches a {mode} server")
        theirs = flag_value(entry["argv"], "--disaggregation-bootstrap-port") or "8998"
        if bootstraps and word == "--prefill" and argv[i + 2 : i + 3] != [theirs]:
            found.append(
                f"router --prefill {argv[i + 1]}: bootstrap port {argv[i + 2 : i + 3]}, the "
                f"server's is {theirs}"
            )
    if sorted(pointed) != sorted(by_port):
        found.append(
            f"the router reaches ports {sorted(pointed)}, servers run on {sorted(by_port)}"
        )
    return found


def _check_vllm_disagg(
    plan: dict[str, Any], records: dict[int, list[dict[str, Any]]], hosts: list[str]
) -> list[str]:
    """vllm_disagg: every planned server started on its node, role and port; the headless
    engines of a server over nodes reach its first node; each node's servers on their own
    GPUs and NIXL side-channel ports, on the node's address; the one proxy, on node 0,
    lists every server by role at its node's address and port."""
    found: list[str] = []
    where = {host: node for node, host in enumerate(hosts)}
    if len(hosts) == 1:
        where["127.0.0.1"] = 0
    served: dict[tuple[int, str], str] = {}  # (node, HTTP port) -> role
    proxies: list[tuple[int, list[str]]] = []
    for node, entries in sorted(records.items()):
        for entry in entries:
            argv, env = entry["argv"], entry["env"]
            if entry["program"] == "python" and argv[:1] and argv[0].endswith(VLLM_PROXY):
                proxies.append((node, argv))
            if entry["program"] != "vllm" or argv[:1] != ["serve"]:
                continue
            found += _check_vllm_disagg_server(node, argv, env, hosts, where)
            if "--headless" not in argv:
                served[(node, flag_value(argv, "--port") or "")] = env.get("VLLM_DISAGG_ROLE", "")
    found += _check_vllm_disagg_node_resources(records, plan["nproc_per_node"])
    planned = sorted(
        (s["nodes"][0], str(s["port"]), s["role"]) for s in plan["servers"] if s["gpus"]
    )
    ran = sorted((node, port, role) for (node, port), role in served.items())
    if ran != planned:
        found.append(f"servers started (node, port, role) {ran}, the plan has {planned}")
    if [node for node, _ in proxies] != [0]:
        found.append(f"proxies started on nodes {[n for n, _ in proxies]}, the plan has node 0")
        return found
    argv = proxies[0][1]
    for role, kind in (("prefill", "prefiller"), ("decode", "decoder")):
        addresses, ports = _values(argv, f"--{kind}-hosts"), _values(argv, f"--{kind}-ports")
        listed = sorted(
            (where.get(a.strip("[]"), -1), p) for a, p in zip(addresses, ports, strict=False)
        )
        wanted = sorted((node, port) for (node, port), r in served.items() if r == role)
        if len(addresses) != len(ports) or listed != wanted:
            found.append(
                f"the proxy's --{kind}-hosts {addresses} and --{kind}-ports {ports} reach "
                f"(node, port) {listed}; the {role} servers run at {wanted}"
            )
    return found


def _values(argv: list[str], flag: str) -> list[str]:
    """The words after ``flag`` up to the next flag (argparse's nargs "+")."""
    if flag not in argv:
        return []
    start = end = argv.index(flag) + 1
    while end < len(argv) and not argv[end].startswith("--"):
        end += 1
    return argv[start:end]


def _check_vllm_disagg_server(
    node: int, argv: list[str], env: dict[str, str], hosts: list[str], where: dict[str, int]
) -> list[str]:
    found: list[str] = []
    side = env.get("VLLM_NIXL_SIDE_CHANNEL_HOST")
    if len(hosts) > 1 and side != hosts[node]:
        found.append(f"node {node}: VLLM_NIXL_SIDE_CHANNEL_HOST is {side!r}, not {hosts[node]}")
    address = flag_value(argv, "--data-parallel-address")
    if "--headless" in argv and where.get(address or "") is None:
        found.append(f"node {node}: headless engines reach {address!r}, which is no node")
    return found


def _check_vllm_disagg_node_resources(
    records: dict[int, list[dict[str, Any]]], gpus: int
) -> list[str]:
    """Servers sharing a node take disjoint GPUs and NIXL port ranges (base + local rank)."""
    found: list[str] = []
    for node, entries in sorted(records.items()):
        devices: list[int] = []
        sides: list[int] = []
        for entry in entries:
            argv, env = entry["argv"], entry["env"]
            if entry["program"] != "vllm" or argv[:1] != ["serve"]:
                continue
            visible = env.get("CUDA_VISIBLE_DEVICES")
            devices += [int(d) for d in visible.split(",")] if visible else []
            local = int(flag_value(argv, "--data-parallel-size-local") or 0) or int(
                flag_value(argv, "--data-parallel-size") or 1
            )
            base = int(env.get("VLLM_NIXL_SIDE_CHANNEL_PORT") or 0)
            sides += range(base, base + local)
        if len(set(devices)) != len(devices) or any(d >= gpus for d in devices):
            found.append(f"node {node}: servers' CUDA_VISIBLE_DEVICES overlap or exceed: {devices}")
        if len(set(sides)) != len(sides):
            found.append(f"node {node}: servers' NIXL side-channel ports overlap: {sorted(sides)}")
    return found


if __name__ == "__main__":
    sys.exit(record(sys.argv[1], sys.argv[2:]))
