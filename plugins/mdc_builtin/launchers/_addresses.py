"""The shell function the serving launchers share: a NODE_HOSTS name to its IPv4 address.

vLLM (``VLLM_HOST_IP``, ``--data-parallel-address``, Ray's ``--node-ip-address``) and
SGLang (``SGLANG_HOST_IP``, madengine's ``POD_IP``/``SGLANG_NODE_IPS``) want addresses,
while backends hand the nodes host names. One behaviour for every launcher: an IPv4 or
IPv6 literal stays as it is; a name becomes its first IPv4 address (``getent
ahostsv4``), waiting up to ``MDC_RESOLVE_SECONDS`` (default 120) because a peer's DNS
record can appear after its pod starts (Kubernetes headless Services); a name that
still does not resolve stops the node with an error, since a server bound to an
unresolvable name fails later and less clearly.
"""

from __future__ import annotations

#: seconds a node waits for a host name to resolve, unless MDC_RESOLVE_SECONDS says otherwise
RESOLVE_SECONDS = 120


def ipv4_function() -> list[str]:
    """Bash lines defining ``node_ipv4 NAME``: prints NAME's address, or exits 1."""
    return [
        "# node_ipv4 NAME: NAME's IPv4 address (a literal IP as it is), waiting for DNS.",
        "node_ipv4() {",
        '  local name="$1" ip="" waited=0',
        f'  local limit="${{MDC_RESOLVE_SECONDS:-{RESOLVE_SECONDS}}}"',
        '  if [[ "$name" =~ ^[0-9]+([.][0-9]+){3}$ || "$name" == *:* ]]; then',
        "    printf '%s' \"$name\"",
        "    return 0",
        "  fi",
        "  while true; do",
        '    ip="$(getent ahostsv4 "$name" | awk \'NR == 1 { print $1 }\' || true)"',
        '    if [[ -n "$ip" ]]; then',
        "      printf '%s' \"$ip\"",
        "      return 0",
        "    fi",
        "    if ((waited >= limit)); then",
        "      echo \"mdc: '$name' (in NODE_HOSTS) has no IPv4 address after $limit s\" >&2",
        "      exit 1",
        "    fi",
        "    sleep 2",
        "    waited=$((waited + 2))",
        "  done",
        "}",
    ]


#: seconds between two rounds of the router's readiness probes
READY_POLL_SECONDS = 5


def ready_functions() -> list[str]:
    """Bash lines defining ``ready HOST PORT PATH`` (whether the server there answers GET
    PATH with HTTP 200) and ``wait_ready HOST PORT PATH`` (until it does). Bash's own
    ``/dev/tcp``, since a serving image need not have curl. The router of a disaggregated
    job starts only once every server is ready, so that it never fails on a server still
    loading its model (and, beside a server, never stops that server with it). The wait
    has no limit unless ``MDC_READY_SECONDS`` sets one, after which the router starts
    anyway (0: at once)."""
    return [
        "# ready HOST PORT PATH: whether the server at HOST:PORT answers GET PATH with 200",
        "ready() {",
        "  local fd line",
        '  exec {fd}<>"/dev/tcp/$1/$2" || return 1',
        '  printf \'GET %s HTTP/1.0\\r\\nHost: %s\\r\\n\\r\\n\' "$3" "$1" >&"$fd" || true',
        '  IFS= read -r -t 10 line <&"$fd" || line=""',
        "  exec {fd}>&-",
        '  [[ "$line" =~ ^HTTP/[0-9.]+\\ 200 ]]',
        "}",
        "# wait_ready HOST PORT PATH: until that server is ready (at most MDC_READY_SECONDS)",
        "wait_ready() {",
        '  local waited=0 limit="${MDC_READY_SECONDS:-}"',
        '  until [[ "$limit" == 0 ]] || ready "$1" "$2" "$3" 2>/dev/null; do',
        '    if [[ -n "$limit" ]] && ((waited >= limit)); then',
        '      echo "mdc: $1:$2 is not ready after $limit s (MDC_READY_SECONDS); starting the router" >&2',
        "      return 0",
        "    fi",
        '    echo "mdc: waiting for the server at $1:$2 ($3) before starting the router" >&2',
        f"    sleep {READY_POLL_SECONDS}",
        f"    waited=$((waited + {READY_POLL_SECONDS}))",
        "  done",
        "}",
    ]


def wait_line(node: int | None, port: int) -> str:
    """A router function's line waiting for the server on ``port`` of node ``node`` (its
    name from the script's ``hosts``), or of this one node (None: 127.0.0.1)."""
    host = "127.0.0.1" if node is None else '"${hosts[' + str(node) + ']}"'
    return f"  wait_ready {host} {port} /health"
