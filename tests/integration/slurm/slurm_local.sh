#!/usr/bin/env bash
# A real SLURM cluster of several emulated nodes on this machine, for mdc's tests.
#
#   slurm_local.sh up       install (apt) when missing, configure, start, wait until idle
#   slurm_local.sh status   what runs, and sinfo; exit 0 only when every node is idle
#   slurm_local.sh down     cancel jobs, stop exactly the daemons `up` started, undo /etc/hosts
#
# Debian's SLURM is built with multiple-slurmd support, so one `slurmd -N nodeX`
# per emulated node runs here, each on its own port of 127.0.0.1.
#
# Settings (environment):
#   MDC_SLURM_NODES=4       emulated nodes node1..nodeN (ports 17001..)
#   MDC_SLURM_FAKE_GPUS=0   N > 0: GRES gpu:N per node, backed by fake character devices
#                           (jobs may request GPUs; nothing can open them)
#   MDC_SLURM_WAIT=60       seconds `up` waits for every node to be idle
#
# Needs root. Every step is idempotent: `up` on a running cluster with the same
# settings does nothing; with other settings it restarts the daemons. `down`
# stops only PIDs recorded in /run/mdc-slurm-local/*.pid by `up`.
set -euo pipefail

NODES="${MDC_SLURM_NODES:-4}"
FAKE_GPUS="${MDC_SLURM_FAKE_GPUS:-0}"
WAIT="${MDC_SLURM_WAIT:-60}"
STATE=/run/mdc-slurm-local
MARK="mdc-slurm-local"
CONF=/etc/slurm/slurm.conf
GRES_CONF=/etc/slurm/gres.conf
FIRST_PORT=17001
PACKAGES=(munge slurmctld slurmd slurm-client)

say() { printf 'slurm_local: %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }

[[ "$NODES" =~ ^[1-9][0-9]?$ ]] || die "MDC_SLURM_NODES must be 1..99, got '$NODES'"
[[ "$FAKE_GPUS" =~ ^[0-9]$ ]] || die "MDC_SLURM_FAKE_GPUS must be 0..9, got '$FAKE_GPUS'"
[[ "$WAIT" =~ ^[1-9][0-9]*$ ]] || die "MDC_SLURM_WAIT must be a positive integer, got '$WAIT'"

node_names() { local i; for ((i = 1; i <= NODES; i++)); do printf 'node%d\n' "$i"; done; }

# ---------------------------------------------------------------- processes

# alive PID: running and not a zombie (PID 1 here may reap exited daemons late)
alive() {
  local stat
  stat="$(cat "/proc/$1/stat" 2>/dev/null)" || return 1
  stat="${stat##*) }"
  [[ "${stat:0:1}" != "Z" ]]
}

# the PID recorded in pidfile NAME.pid, if that process still runs the expected program
recorded() {
  local file="$STATE/$1.pid" exe="$2" pid
  [[ -f "$file" ]] || return 1
  pid="$(cat "$file")"
  [[ "$pid" =~ ^[0-9]+$ ]] && alive "$pid" || return 1
  [[ "$(readlink "/proc/$pid/exe" 2>/dev/null)" == "$(readlink -f "$exe")" ]] || return 1
  printf '%s\n' "$pid"
}

start_daemon() {  # NAME EXE [--chuid USER] -- ARGS...
  local name="$1" exe="$2"
  shift 2
  local user=()
  if [[ "${1:-}" == "--chuid" ]]; then user=(--chuid "$2"); shift 2; fi
  [[ "${1:-}" == "--" ]] && shift
  if recorded "$name" "$exe" >/dev/null; then
    return 0
  fi
  rm -f "$STATE/$name.pid"
  start-stop-daemon --start --background --make-pidfile --pidfile "$STATE/$name.pid" \
    --output "$STATE/$name.out" "${user[@]}" --exec "$exe" -- "$@"
}

stop_pid() {  # NAME: TERM the recorded daemon, KILL it after 10 s
  local name="$1" file="$STATE/$1.pid" pid i
  [[ -f "$file" ]] || return 0
  pid="$(cat "$file")"
  if [[ "$pid" =~ ^[0-9]+$ ]] && alive "$pid"; then
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 100; i++)); do alive "$pid" || break; sleep 0.1; done
    if alive "$pid"; then
      say "$name ($pid) ignored TERM for 10 s; killing it"
      kill -KILL "$pid" 2>/dev/null || true
      for ((i = 0; i < 50; i++)); do alive "$pid" || break; sleep 0.1; done
    fi
    alive "$pid" && say "warning: $name ($pid) is still alive"
  fi
  rm -f "$file"
}

# ---------------------------------------------------------------- installation

install_packages() {
  local missing=() exe
  for exe in /usr/sbin/munged /usr/sbin/slurmctld /usr/sbin/slurmd /usr/bin/sbatch; do
    [[ -x "$exe" ]] || missing+=("$exe")
  done
  ((${#missing[@]} == 0)) && return 0
  command -v apt-get >/dev/null || die "SLURM is not installed (${missing[*]}) and there is no apt-get"
  say "installing ${PACKAGES[*]} (missing: ${missing[*]})"
  # Debian's maintainer scripts would start munge with its default setup: deny service starts
  local policy=/usr/sbin/policy-rc.d made_policy=0
  if [[ ! -e "$policy" ]]; then
    printf '#!/bin/sh\n# %s: no service starts while installing\nexit 101\n' "$MARK" >"$policy"
    chmod 755 "$policy"
    made_policy=1
  fi
  local status=0
  export DEBIAN_FRONTEND=noninteractive
  if ! apt-get install -y -qq --no-install-recommends "${PACKAGES[@]}" >"$STATE/apt.log" 2>&1; then
    apt-get update -qq >>"$STATE/apt.log" 2>&1 || true
    apt-get install -y -qq --no-install-recommends "${PACKAGES[@]}" >>"$STATE/apt.log" 2>&1 \
      || status=$?
  fi
  ((made_policy)) && rm -f "$policy"
  if ((status != 0)); then
    tail -n 20 "$STATE/apt.log" >&2
    die "apt-get install ${PACKAGES[*]} failed (status $status); log: $STATE/apt.log"
  fi
}

# ---------------------------------------------------------------- configuration

render_conf() {
  local last=$((FIRST_PORT + NODES - 1)) gres=""
  ((FAKE_GPUS > 0)) && gres=" Gres=gpu:$FAKE_GPUS"
  cat <<EOF
# $MARK (generated by tests/integration/slurm/slurm_local.sh; $NODES nodes, $FAKE_GPUS fake GPUs each)
ClusterName=mdclocal
SlurmctldHost=localhost
SlurmctldPort=6817
SlurmUser=slurm
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
CommunicationParameters=NoInAddrAny
MpiDefault=none
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
EOF
  if ((FAKE_GPUS > 0)); then echo "GresTypes=gpu"; else echo "# no GresTypes (no fake GPUs)"; fi
  cat <<EOF
ReturnToService=2
JobRequeue=0
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd/%n
SlurmctldPidFile=$STATE/self/slurmctld.pid
SlurmdPidFile=$STATE/self/slurmd-%n.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
SlurmdTimeout=60
InactiveLimit=0
KillWait=5
MinJobAge=300
Waittime=0
NodeName=node[1-$NODES] NodeHostname=localhost NodeAddr=127.0.0.1 Port=[$FIRST_PORT-$last] CPUs=$(nproc) RealMemory=4000$gres State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
}

ours() { [[ ! -e "$1" ]] || grep -q "^# $MARK" "$1"; }

# write FILE from stdin; succeeds when the content changed
write_if_changed() {
  local file="$1" new
  new="$(cat)"
  if [[ -f "$file" && "$(cat "$file")" == "$new" ]]; then
    return 1
  fi
  printf '%s\n' "$new" >"$file"
}

configure() {
  ours "$CONF" || die "$CONF exists and was not written by this tool; not touching it"
  ours "$GRES_CONF" || die "$GRES_CONF exists and was not written by this tool; not touching it"
  mkdir -p /etc/slurm "$STATE/self" /var/spool/slurmctld /var/spool/slurmd /var/log/slurm
  chown slurm "$STATE/self" /var/spool/slurmctld /var/log/slurm
  if render_conf | write_if_changed "$CONF"; then CHANGED=1; fi
  if ((FAKE_GPUS > 0)); then
    mkdir -p "$STATE/dev"
    local i
    for ((i = 0; i < FAKE_GPUS; i++)); do
      [[ -c "$STATE/dev/nvidia$i" ]] || mknod "$STATE/dev/nvidia$i" c 195 "$i"
    done
    if printf '# %s\nNodeName=node[1-%d] Name=gpu File=%s/dev/nvidia[0-%d]\n' \
        "$MARK" "$NODES" "$STATE" "$((FAKE_GPUS - 1))" | write_if_changed "$GRES_CONF"; then
      CHANGED=1
    fi
  elif [[ -e "$GRES_CONF" ]]; then
    rm -f "$GRES_CONF"
    CHANGED=1
  fi
  # node names must resolve: torchrun's store connects to the first host by name
  local line
  line="127.0.0.1 $(node_names | tr '\n' ' ')# $MARK"
  if ! grep -qxF "$line" /etc/hosts; then
    remove_hosts_line
    printf '%s\n' "$line" >>/etc/hosts
  fi
  # munge: a key, and its run directory
  if [[ ! -s /etc/munge/munge.key ]]; then
    if command -v mungekey >/dev/null; then
      mungekey --create --keyfile=/etc/munge/munge.key
    else
      dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key status=none
    fi
    chown munge: /etc/munge/munge.key
    chmod 400 /etc/munge/munge.key
  fi
  mkdir -p /run/munge
  chown munge: /run/munge
  chmod 755 /run/munge
}

remove_hosts_line() {
  if grep -q "# $MARK\$" /etc/hosts; then
    # /etc/hosts may be a bind mount: rewrite it in place, never replace the file
    local kept
    kept="$(grep -v "# $MARK\$" /etc/hosts || true)"
    printf '%s\n' "$kept" >/etc/hosts
  fi
}

# ---------------------------------------------------------------- up, status, down

daemons_running() {
  recorded munged /usr/sbin/munged >/dev/null && recorded slurmctld /usr/sbin/slurmctld >/dev/null || return 1
  local node
  for node in $(node_names); do recorded "slurmd-$node" /usr/sbin/slurmd >/dev/null || return 1; done
}

node_states() { sinfo -h -N -o '%N %T' 2>/dev/null | sort -u; }

all_idle() {
  local states
  states="$(node_states)" || return 1
  [[ "$(grep -c ' idle$' <<<"$states")" == "$NODES" ]] \
    && [[ "$(wc -l <<<"$states")" == "$NODES" ]]
}

up() {
  mkdir -p "$STATE"
  install_packages
  CHANGED=0
  configure
  if ((CHANGED)) && daemons_running; then
    say "configuration changed: restarting the daemons"
    stop_daemons
  fi
  start_daemon munged /usr/sbin/munged --chuid munge -- -F
  local i
  for ((i = 0; i < 50; i++)); do [[ -S /run/munge/munge.socket.2 ]] && break; sleep 0.1; done
  start_daemon slurmctld /usr/sbin/slurmctld -- -D -c -i
  for ((i = 0; i < 100; i++)); do scontrol ping >/dev/null 2>&1 && break; sleep 0.1; done
  local node
  for node in $(node_names); do
    start_daemon "slurmd-$node" /usr/sbin/slurmd -- -D -N "$node"
  done
  local deadline=$((SECONDS + WAIT))
  until all_idle; do
    if ((SECONDS >= deadline)); then
      say "nodes not idle after $WAIT s:"
      node_states >&2 || true
      tail -n 20 /var/log/slurm/slurmctld.log >&2 || true
      die "bring-up failed (logs: /var/log/slurm/, $STATE/*.out)"
    fi
    # nodes left down by an earlier run come back when told to
    local down
    down="$(sinfo -h -N -t down,drain -o '%N' 2>/dev/null | sort -u | paste -sd, || true)"
    [[ -n "$down" ]] && scontrol update nodename="$down" state=resume >/dev/null 2>&1 || true
    sleep 0.2
  done
  say "up: $NODES nodes idle ($FAKE_GPUS fake GPUs each)"
}

status() {
  local name exe pid ok=0
  for name in munged slurmctld $(node_names | sed 's/^/slurmd-/'); do
    case "$name" in
      munged) exe=/usr/sbin/munged ;;
      slurmctld) exe=/usr/sbin/slurmctld ;;
      *) exe=/usr/sbin/slurmd ;;
    esac
    if pid="$(recorded "$name" "$exe")"; then
      printf '%-14s running (pid %s)\n' "$name" "$pid"
    else
      printf '%-14s not running\n' "$name"
      ok=1
    fi
  done
  if command -v sinfo >/dev/null; then sinfo 2>&1 || ok=1; fi
  all_idle || ok=1
  return "$ok"
}

stop_daemons() {
  local node
  for node in $(node_names); do stop_pid "slurmd-$node" & done
  wait
  stop_pid slurmctld
  stop_pid munged
}

down() {
  if [[ -d "$STATE" ]] && recorded slurmctld /usr/sbin/slurmctld >/dev/null; then
    local jobs
    jobs="$(squeue -h -o '%i' 2>/dev/null || true)"
    if [[ -n "$jobs" ]]; then
      # shellcheck disable=SC2086  # job ids: one word each
      scancel $jobs 2>/dev/null || true
      local i
      for ((i = 0; i < 50; i++)); do [[ -z "$(squeue -h -o '%i' 2>/dev/null)" ]] && break; sleep 0.1; done
    fi
  fi
  # every slurmd this tool may have started, whatever MDC_SLURM_NODES says now
  local file
  for file in "$STATE"/slurmd-*.pid; do
    [[ -e "$file" ]] || continue
    file="${file##*/}"
    stop_pid "${file%.pid}" &
  done
  wait
  stop_pid slurmctld
  stop_pid munged
  remove_hosts_line
  say "down"
}

case "${1:-}" in
  up) [[ "$(id -u)" == 0 ]] || die "needs root"; up ;;
  status) status ;;
  down) [[ "$(id -u)" == 0 ]] || die "needs root"; down ;;
  *) echo "usage: $0 up|status|down" >&2; exit 2 ;;
esac
