#!/usr/bin/env bash
# One node of vLLM job 'deepseek-v3-dp-ep', data parallel: 16 engines of tp 1 x pp 1, 8 per node.
# launch/worker.sh runs it with NODE_RANK, MASTER_ADDR, MASTER_PORT and NODE_HOSTS
# set and the server's command as its arguments. Node 0 runs the API server and its
# engines; the others run headless engines that connect to node 0's address at
# MASTER_PORT (--data-parallel-rpc-port).
set -euo pipefail
: "${NODE_RANK:?NODE_RANK must be set by the backend}"
: "${MASTER_ADDR:?MASTER_ADDR must be set by the backend}"
: "${MASTER_PORT:?MASTER_PORT must be set by the backend}"
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
VLLM_HOST_IP="$(node_ipv4 "$self")"
export VLLM_HOST_IP
head="$(node_ipv4 "$MASTER_ADDR")"
dp_args=(--data-parallel-address "$head" --data-parallel-rpc-port "$MASTER_PORT")
if ((NODE_RANK > 0)); then
  exec "$@" --headless --data-parallel-start-rank "$((NODE_RANK * 8))" "${dp_args[@]}"
fi
exec "$@" "${dp_args[@]}" --api-server-count=8
