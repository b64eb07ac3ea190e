#!/usr/bin/env bash
# One node of SGLang job 'pair-sglang' (2 nodes). launch/worker.sh runs it with
# NODE_RANK and NODE_HOSTS set and the server's command as its arguments; it exports
# SGLANG_HOST_IP, this node's address (SGLang reads it as the node's own IP): an IP
# in NODE_HOSTS as it is, a host name as its first IPv4 address.
set -euo pipefail
: "${NODE_RANK:?NODE_RANK must be set by the backend}"
: "${NODE_HOSTS:?NODE_HOSTS must be set by the backend}"
# node_ipv4 NAME: NAME's IPv4 address (a literal IP as it is), waiting for DNS.
node_ipv4() {
  local name="$1" ip="" waited=0
  local limit="${MDC_RESOLVE_SECONDS:-120}"
  if [[ "$name" =~ ^[0-9]+([.][0-9]+){3}$ || "$name" == *:* ]]; then
    printf '%s' "$name"
    return 0
  fi
  while true; do
    ip="$(getent ahostsv4 "$name" | awk 'NR == 1 { print $1 }' || true)"
    if [[ -n "$ip" ]]; then
      printf '%s' "$ip"
      return 0
    fi
    if ((waited >= limit)); then
      echo "mdc: '$name' (in NODE_HOSTS) has no IPv4 address after $limit s" >&2
      exit 1
    fi
    sleep 2
    waited=$((waited + 2))
  done
}
read -r -a hosts <<< "$NODE_HOSTS"
self="${hosts[NODE_RANK]:?NODE_HOSTS names no host for this node}"
ip="$(node_ipv4 "$self")"
export SGLANG_HOST_IP="$ip"
exec "$@"
