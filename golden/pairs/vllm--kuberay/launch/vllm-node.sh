#!/usr/bin/env bash
# One node of vLLM job 'pair-vllm' over Ray: 2 nodes x 8 GPUs, tensor parallel 8, pipeline parallel 2.
# launch/worker.sh runs it with NODE_RANK, MASTER_ADDR, MASTER_PORT and NODE_HOSTS
# set and the server's command as its arguments. Node 0 starts the Ray head at
# MASTER_PORT, waits until Ray reports 16 GPUs (at most 600 s), then runs
# the server; the other nodes join the head and block until Ray stops.
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
# vLLM and Ray need this node's IP address as the other nodes reach it.
self="${hosts[NODE_RANK]:?NODE_HOSTS names no host for this node}"
ip="$(node_ipv4 "$self")"
export VLLM_HOST_IP="$ip"
if ((NODE_RANK == 0)); then
  ray start --head --node-ip-address="$ip" --port="$MASTER_PORT" --num-gpus=8
  # However this node's part ends, its Ray processes stop with it.
  trap 'ray stop >/dev/null 2>&1 || true' EXIT
  deadline=$((SECONDS + 600))
  while true; do
    gpus="$(python3 -c 'import ray; ray.init(address="auto", logging_level="ERROR"); print(int(ray.cluster_resources().get("GPU", 0)))' 2>/dev/null | tail -n 1 || true)"
    [[ "$gpus" =~ ^[0-9]+$ ]] || gpus=0
    if ((gpus >= 16)); then
      break
    fi
    if ((SECONDS >= deadline)); then
      echo "mdc: Ray reports $gpus of 16 GPUs after 600 s; a node did not join the head at $MASTER_ADDR:$MASTER_PORT (see its log, or raise [vllm] ray_wait_seconds)" >&2
      exit 1
    fi
    sleep 5
  done
  echo "mdc: Ray reports 16 GPUs on 2 nodes; starting the server" >&2
  "$@" &
  server=$!
  # On Ctrl-C or TERM, stop the server and wait for it; the EXIT trap then stops Ray.
  trap 'kill "$server" 2>/dev/null || true; wait "$server" || true; exit 130' INT
  trap 'kill "$server" 2>/dev/null || true; wait "$server" || true; exit 143' TERM
  status=0
  wait "$server" || status=$?
  exit "$status"
fi
exec ray start --address="$MASTER_ADDR:$MASTER_PORT" --node-ip-address="$ip" --num-gpus=8 --block
