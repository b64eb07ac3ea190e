#!/usr/bin/env bash
# One node of SGLang job 'sglang-deepseek' (2 nodes). launch/worker.sh runs it with
# NODE_RANK and NODE_HOSTS set and the server's command as its arguments; it exports
# SGLANG_HOST_IP, this node's address (SGLang reads it as the node's own IP): an IP in
# NODE_HOSTS as it is, a host name as its first IPv4 address, or the name itself when
# it does not resolve.
set -euo pipefail
: "${NODE_RANK:?NODE_RANK must be set by the backend}"
: "${NODE_HOSTS:?NODE_HOSTS must be set by the backend}"
read -r -a hosts <<< "$NODE_HOSTS"
self="${hosts[NODE_RANK]:-}"
if [[ -z "$self" ]]; then
  echo "mdc: NODE_HOSTS names no host for node $NODE_RANK: '$NODE_HOSTS'" >&2
  exit 1
fi
if [[ "$self" =~ ^[0-9]+([.][0-9]+){3}$ || "$self" == *:* ]]; then
  ip="$self"
else
  ip="$(getent ahostsv4 "$self" | awk 'NR == 1 { print $1 }' || true)"
fi
if [[ -z "$ip" ]]; then
  echo "mdc: '$self' (node $NODE_RANK in NODE_HOSTS) does not resolve; SGLANG_HOST_IP is the name" >&2
  ip="$self"
fi
export SGLANG_HOST_IP="$ip"
exec "$@"
