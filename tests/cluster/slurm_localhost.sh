#!/usr/bin/env bash
# tests/cluster/slurm_localhost.sh start|stop|install|status|env — a real Slurm cluster on this one
# machine for the cluster-launch tests: its own munged, one slurmctld and two slurmd (nodes n1 and
# n2: its slurm.conf gives both 127.0.0.1 and a port of their own, and each slurmd is started
# with -N for its node name).
#
# Everything it runs or writes lives in its own state directory, $DOWNPOUR_SLURM_DIR (default
# /tmp/downpour-slurm): slurm.conf (clients find it through SLURM_CONF, which `env` prints),
# a munge key and socket of its own, free ports picked at start, logs and pid files. So it never
# touches /etc/slurm or a munged or Slurm already running on the machine. The one change outside
# that directory: when n1 or n2 does not resolve it appends a marked line to /etc/hosts (jobs see
# n1/n2 in SLURM_STEP_NODELIST and must reach them), and stop removes that line again.
#
#   start   installs the Debian packages if missing (slurmctld slurmd slurm-client munge, and
#           openmpi-bin), starts the daemons and waits until both nodes are idle. Idempotent: a
#           cluster that is already up is left as it is.
#   stop    cancels every job, waits for the jobs' processes to end, then stops the daemons by the
#           pids in their pid files (SIGTERM, then SIGKILL after 10 s) and SIGKILLs any of this
#           cluster's slurmstepd (with its processes) that outlived its slurmd. Idempotent.
#   install only installs the packages that are missing (the MPI test needs no daemon).
#   status  exit 0 when the cluster is up and both nodes answer, else 1.
#   env     prints `export SLURM_CONF=...` for a shell to eval.
#
# Across hosts made of network namespaces (scripts/netns-cluster), with DOWNPOUR_SLURM_NETNS=P set
# (and DOWNPOUR_SLURM_SUBNET=A.B.C, default 10.231.9; DOWNPOUR_SLURM_NODES=N, default 3): start
# makes hosts P1..PN at A.B.C.1..N, runs slurmctld on host 1 and slurmd -N Pn<i> on host i, each at
# its host's address and Slurm's own ports (every namespace has its own), and names the nodes in
# /etc/hosts by those addresses; stop removes all of it. Slurm's clients (sbatch, srun, sinfo) must
# then run on a host: `scripts/netns-cluster --prefix P exec 1 sbatch ...`. Its default state
# directory is /tmp/downpour-slurm-P.
#
# Exit codes: 0 done; 1 failed (the reason and the daemon logs' tails on stderr); 77 this machine
# cannot run it (not root, packages cannot be installed): the reason on stderr, and a test skips.
# Not safe to run twice at once (the tests hold a ctest resource lock).
set -uo pipefail

NETNS=${DOWNPOUR_SLURM_NETNS:-}
SUBNET=${DOWNPOUR_SLURM_SUBNET:-10.231.9}
NETNS_CLUSTER="$(cd "$(dirname "$0")/../.." && pwd)/scripts/netns-cluster"
if [[ -n $NETNS ]]; then
  DIR=${DOWNPOUR_SLURM_DIR:-/tmp/downpour-slurm-$NETNS}
  NODES=()
  for ((i = 1; i <= ${DOWNPOUR_SLURM_NODES:-3}; ++i)); do NODES+=("${NETNS}n$i"); done
else
  DIR=${DOWNPOUR_SLURM_DIR:-/tmp/downpour-slurm}
  NODES=(n1 n2)
fi
CONF="$DIR/slurm.conf"
HOSTS_MARK="# downpour tests/cluster/slurm_localhost.sh${NETNS:+ $NETNS}"
export SLURM_CONF="$CONF"

# Runs a daemon on host $1 (1-based) of the namespace cluster, else here. nsenter enters the
# host's network namespace only: `ip netns exec` would also mount a sysfs of its own over /sys,
# hiding /sys/fs/cgroup, without which slurmd does not start.
on_host() {
  local i=$1
  shift
  if [[ -n $NETNS ]]; then nsenter --net="/run/netns/${NETNS}$i" "$@"; else "$@"; fi
}
# Runs a Slurm client (sinfo, squeue, scancel) where slurmctld can be reached: on host 1.
client() { on_host 1 "$@"; }

say() { echo "slurm_localhost: $*" >&2; }
cannot() { say "cannot run a local Slurm: $*"; exit 77; }
die() { say "$*"; exit 1; }

pid_alive() { [[ -s "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

ensure_packages() {
  local missing=()
  command -v slurmctld > /dev/null || missing+=(slurmctld)
  command -v slurmd > /dev/null || missing+=(slurmd)
  command -v sbatch > /dev/null || missing+=(slurm-client)
  command -v munged > /dev/null || missing+=(munge)
  command -v mpirun > /dev/null || missing+=(openmpi-bin)
  ((${#missing[@]} == 0)) && return 0
  command -v apt-get > /dev/null || cannot "missing ${missing[*]} and there is no apt-get to install them"
  [[ $(id -u) -eq 0 ]] || cannot "missing ${missing[*]}; installing them needs root"
  say "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  # apt-get update only when the install fails for want of package lists.
  if ! apt-get install -y -qq --no-install-recommends "${missing[@]}" > "$DIR/apt.log" 2>&1; then
    apt-get update -qq >> "$DIR/apt.log" 2>&1
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >> "$DIR/apt.log" 2>&1 ||
      cannot "apt-get install ${missing[*]} failed: $(tail -n 3 "$DIR/apt.log" | tr '\n' ' ')"
  fi
}

# Three free TCP ports on 127.0.0.1 (slurmctld, slurmd n1, slurmd n2), picked by the kernel.
free_ports() {
  python3 - << 'PY'
import socket
socks = []
for _ in range(3):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
PY
}

# slurm.conf: on 127.0.0.1 with free ports, n1 and n2 each with a port of its own; or with a node
# per namespace host, each at its host's address and Slurm's default ports (every host has its
# own), slurmctld on host 1.
write_conf() {
  local ports host i
  host=$(hostname -s)
  if [[ -n $NETNS ]]; then
    ports=(6817)
    for ((i = 0; i < ${#NODES[@]}; ++i)); do ports+=(6818); done
  else
    read -r -a ports <<< "$(free_ports)" || die "no free ports on 127.0.0.1"
  fi
  {
    echo "# Written by tests/cluster/slurm_localhost.sh: a ${#NODES[@]}-node Slurm on this one machine${NETNS:+, a node per network namespace}."
    echo "ClusterName=downpourci"
    if [[ -n $NETNS ]]; then echo "SlurmctldHost=$host($SUBNET.1)"; else echo "SlurmctldHost=$host"; fi
    echo "SlurmctldPort=${ports[0]}"
    common_conf
    # CPUs=8 on a smaller machine (config_overrides): one task per role, and a job of 5 tasks
    # must fit on two nodes.
    for ((i = 0; i < ${#NODES[@]}; ++i)); do
      echo "NodeName=${NODES[i]} NodeHostname=$host NodeAddr=$(node_addr "$i") Port=${ports[i + 1]} CPUs=8 RealMemory=1000 State=UNKNOWN"
    done
    echo "PartitionName=debug Nodes=$(IFS=,; echo "${NODES[*]}") Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES"
  } > "$CONF"
}

# Node $1's (0-based) address.
node_addr() {
  if [[ -n $NETNS ]]; then echo "$SUBNET.$(($1 + 1))"; else echo 127.0.0.1; fi
}

# What both kinds of cluster share (from SlurmUser to SlurmdLogFile).
common_conf() {
  cat << CONF
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$DIR/munge/munge.socket
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
SlurmdParameters=config_overrides
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.%n.log
CONF
}

# Its own munged (as the munge user, which munged wants), own key and socket.
start_munge() {
  pid_alive "$DIR/munge/munged.pid" && return 0
  id munge > /dev/null 2>&1 || die "the munge user does not exist (the munge package makes it)"
  mkdir -p "$DIR/munge"
  if [[ ! -s "$DIR/munge/munge.key" ]]; then
    dd if=/dev/urandom of="$DIR/munge/munge.key" bs=1024 count=1 status=none || die "cannot write the munge key"
  fi
  # The socket's directory must be searchable by every client; the key stays 0600.
  chown -R munge:munge "$DIR/munge" && chmod 755 "$DIR/munge" && chmod 600 "$DIR/munge/munge.key"
  su -s /bin/sh munge -c "/usr/sbin/munged --socket=$DIR/munge/munge.socket --key-file=$DIR/munge/munge.key \
      --pid-file=$DIR/munge/munged.pid --log-file=$DIR/munge/munged.log --seed-file=$DIR/munge/munged.seed" ||
    die "munged did not start: $(tail -n 3 "$DIR/munge/munged.log" 2> /dev/null | tr '\n' ' ')"
}

add_hosts_line() {
  local unresolved=0 n i
  if [[ -n $NETNS ]]; then  # each node at its host's address, whatever else names it
    for ((i = 0; i < ${#NODES[@]}; ++i)); do
      echo "$(node_addr "$i") ${NODES[i]} $HOSTS_MARK" >> /etc/hosts || die "cannot add ${NODES[i]} to /etc/hosts"
    done
    return 0
  fi
  for n in "${NODES[@]}"; do getent hosts "$n" > /dev/null || unresolved=1; done
  ((unresolved)) || return 0
  echo "127.0.0.1 ${NODES[*]} $HOSTS_MARK" >> /etc/hosts || die "cannot add ${NODES[*]} to /etc/hosts"
}

remove_hosts_line() {
  grep -qF -- "$HOSTS_MARK" /etc/hosts 2> /dev/null || return 0
  # In place (sed -i renames, which fails when /etc/hosts is a bind mount). Only this cluster's
  # lines: the mark ends the line.
  local kept
  kept=$(grep -v -- "$HOSTS_MARK\$" /etc/hosts)
  printf '%s\n' "$kept" > /etc/hosts
}

nodes_idle() {
  local states want="" n
  states=$(client sinfo -h -N -o '%N %T' 2> /dev/null | sort -u | tr '\n' ' ')
  for n in "${NODES[@]}"; do want+="$n idle "; done
  [[ "$states" == "$want" ]]
}

daemons_alive() {
  local n
  pid_alive "$DIR/munge/munged.pid" && pid_alive "$DIR/slurmctld.pid" || return 1
  for n in "${NODES[@]}"; do pid_alive "$DIR/slurmd.$n.pid" || return 1; done
}

logs_tail() {
  local f
  for f in "$DIR"/log/*.log "$DIR/munge/munged.log"; do
    [[ -f "$f" ]] && { echo "--- $f"; tail -n 15 "$f"; } >&2
  done
}

start() {
  [[ $(id -u) -eq 0 ]] || cannot "needs root (slurmd starts jobs as their users; munged runs as munge)"
  mkdir -p "$DIR" || cannot "cannot create $DIR"
  if daemons_alive && nodes_idle; then
    say "already up ($CONF)"
    return 0
  fi
  stop_quietly
  ensure_packages
  rm -rf "$DIR/state" "$DIR/spool" "$DIR/log"
  mkdir -p "$DIR/state" "$DIR/spool" "$DIR/log"
  if [[ -n $NETNS ]]; then
    "$NETNS_CLUSTER" up "${#NODES[@]}" --prefix "$NETNS" --subnet "$SUBNET" >&2 ||
      die "scripts/netns-cluster up ${#NODES[@]} --prefix $NETNS --subnet $SUBNET failed"
  fi
  write_conf
  add_hosts_line
  start_munge
  on_host 1 slurmctld -f "$CONF" || { logs_tail; die "slurmctld did not start"; }
  local i
  for ((i = 0; i < ${#NODES[@]}; ++i)); do
    on_host $((i + 1)) slurmd -f "$CONF" -N "${NODES[i]}" || { logs_tail; die "slurmd -N ${NODES[i]} did not start"; }
  done
  for ((i = 0; i < 300; ++i)); do
    nodes_idle && { say "up: nodes ${NODES[*]} idle ($CONF)"; return 0; }
    sleep 0.1
  done
  logs_tail
  die "nodes not idle after 30 s: $(client sinfo -h -N -o '%N %T' 2>&1 | tr '\n' ' ')"
}

# Sends SIGTERM to the process in pid file $1, SIGKILL after 10 s; waits until it is gone.
stop_pid() {
  pid_alive "$1" || { rm -f "$1"; return 0; }
  local pid i
  pid=$(cat "$1")
  kill "$pid" 2> /dev/null
  for ((i = 0; i < 100; ++i)); do
    kill -0 "$pid" 2> /dev/null || { rm -f "$1"; return 0; }
    sleep 0.1
  done
  say "pid $pid ($1) ignored SIGTERM for 10 s: SIGKILL"
  kill -9 "$pid" 2> /dev/null
  rm -f "$1"
}

# The slurmstepd processes of this cluster's jobs, told apart from another Slurm's by the file
# they hold open: their slurmd's log under our state directory.
our_stepds() {
  local p fd
  for p in $(pgrep -x slurmstepd 2> /dev/null); do
    for fd in "/proc/$p/fd"/*; do
      if [[ "$(readlink "$fd" 2> /dev/null)" == "$DIR/"* ]]; then
        echo "$p"
        break
      fi
    done
  done
}

# SIGKILL to process $1 and all its descendants (children first found, then killed top-down, so
# none is re-parented out of reach).
kill_tree() {
  local all=("$1") i=0 c
  while ((i < ${#all[@]})); do
    for c in $(pgrep -P "${all[i]}" 2> /dev/null); do all+=("$c"); done
    ((++i))
  done
  kill -9 "${all[@]}" 2> /dev/null
}

cancel_jobs() {
  pid_alive "$DIR/slurmctld.pid" || return 0
  [[ -n "$(client squeue -h -o %i 2> /dev/null)" ]] || return 0
  say "cancelling jobs: $(client squeue -h -o '%i %j %T' | tr '\n' ';')"
  local jobs
  read -r -a jobs <<< "$(client squeue -h -o %i | tr '\n' ' ')"
  client scancel --full --quiet "${jobs[@]}" 2> /dev/null
  local i
  for ((i = 0; i < 150; ++i)); do
    [[ -z "$(client squeue -h -o %i 2> /dev/null)" ]] && return 0
    sleep 0.2
  done
  say "jobs still listed after 30 s: $(client squeue -h -o '%i %T' | tr '\n' ';')"
}

stop_quietly() {
  cancel_jobs
  local n p
  for n in "${NODES[@]}"; do stop_pid "$DIR/slurmd.$n.pid"; done
  stop_pid "$DIR/slurmctld.pid"
  for p in $(our_stepds); do
    say "slurmstepd $p outlived its job: SIGKILL to it and its processes"
    kill_tree "$p"
  done
  stop_pid "$DIR/munge/munged.pid"
  remove_hosts_line
  if [[ -n $NETNS ]]; then "$NETNS_CLUSTER" down --prefix "$NETNS" > /dev/null 2>&1; fi
}

case "${1:-}" in
  start) start ;;
  stop)
    [[ -d "$DIR" ]] || exit 0
    [[ $(id -u) -eq 0 ]] || cannot "needs root to stop daemons started as root"
    stop_quietly
    say "stopped"
    ;;
  install)
    mkdir -p "$DIR" || cannot "cannot create $DIR"
    ensure_packages
    ;;
  status) daemons_alive && nodes_idle ;;
  env) echo "export SLURM_CONF=$CONF" ;;
  *)
    echo "usage: $0 start|stop|install|status|env" >&2
    exit 2
    ;;
esac
