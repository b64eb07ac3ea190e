#!/usr/bin/env bash
# Runs job 'mpi-ssh-2x8' over ssh: 2 node(s) x 8 process(es), launcher mpirun.
# Node i runs on line i+1 of ssh/hostfile. Needs password-less ssh from here to every
# host, and the compiled tree at this same path on every host (a shared filesystem).
# The first node to fail stops the others; its status is the job's.
set -euo pipefail
dir="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
hosts=(gpu-a gpu-b)
ssh_command=(ssh -o BatchMode=yes -o LogLevel=ERROR -tt -p 2222)
forward=()
export MASTER_ADDR=gpu-a
# This launch's id, exported to every process: fresh for every run of this script.
MDC_LAUNCH_ID="$(date -u +%Y%m%dT%H%M%SZ)-$$-$RANDOM"
export MDC_LAUNCH_ID
# The rendezvous port: a hash of the launch id picks a start in 20000-29999;
# then, on node 0, the first port from there that nothing listens on, so concurrent
# launches on one host never share it. Every node is given the same port.
port=$((20000 + $(printf '%s' "$MDC_LAUNCH_ID" | cksum | cut -d ' ' -f 1) % 10000))
export MASTER_PORT="$port"
export NODE_HOSTS="${hosts[*]}"

# One word for the remote shell, in POSIX single quotes.
quote() {
  local text="$1" tick="'"
  printf "'%s'" "${text//$tick/$tick\\$tick$tick}"
}

# The command the remote login shell runs for node $1 with role script $2.
remote_command() {
  local command name
  # a terminal would turn each line end into CR LF: keep the output as it is
  command="stty -onlcr 2>/dev/null; cd $(quote "$dir") && exec env"
  for name in "${forward[@]}"; do
    if [[ -n "${!name+set}" ]]; then
      command+=" $(quote "$name=${!name}")"
    fi
  done
  command+=" NODE_RANK=$1 $(quote "MASTER_ADDR=$MASTER_ADDR") MASTER_PORT=$MASTER_PORT"
  command+=" $(quote "MDC_LAUNCH_ID=$MDC_LAUNCH_ID")"
  command+=" $(quote "NODE_HOSTS=$NODE_HOSTS")"
  command+=" bash $(quote "$2")"
  printf "%s" "$command"
}

pids=()
stop() { if ((${#pids[@]})); then kill "${pids[@]}" 2>/dev/null || true; fi; }
# On Ctrl-C or TERM, stop every node and wait for it before exiting.
trap 'stop; wait || true; exit 130' INT
trap 'stop; wait || true; exit 143' TERM
for ((node = 0; node < 2; node++)); do
  "${ssh_command[@]}" "${hosts[node]}" "$(remote_command "$node" launch/worker.sh)" </dev/null &
  pids+=("$!")
done
# The first node to fail stops the others; its status is the job's.
# each ended one's status read by its pid, before and after every wait -n, as bash
# can drop one killed by a signal unreported (and wait -n then never returns it)
status=0
waited=0
while ((${#pids[@]})); do
  running=()
  for pid in "${pids[@]}"; do
    if kill -0 "$pid" 2>/dev/null; then
      running+=("$pid")
    else
      wait "$pid" || status=$?
    fi
  done
  # all ended; or wait -n found no child and none ended (what kill -0 finds is not ours)
  if ((${#running[@]} == 0)) || ((waited == 127 && ${#running[@]} == ${#pids[@]})); then
    pids=()
  else
    pids=("${running[@]}")
  fi
  if ((status != 0 || ${#pids[@]} == 0)); then
    break
  fi
  waited=0
  wait -n || waited=$?
done
if ((status != 0)); then
  echo "mdc: a node exited with status $status; stopping the others" >&2
  stop
  wait || true
  exit "$status"
fi
