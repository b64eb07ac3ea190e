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
