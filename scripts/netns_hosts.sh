#!/usr/bin/env bash
# Several "hosts" on one machine, made of Linux network namespaces, so that a multi-host mpirun
# (its daemons launched as over ssh, its ranks talking TCP between hosts and shared memory within
# one) can be run and tested without a second machine.
#
#   scripts/netns_hosts.sh up   [--hosts 2] [--prefix titan] [--net 10.77.0]
#   scripts/netns_hosts.sh down [--prefix titan]
#   scripts/netns_hosts.sh run  [--hosts 2] [--prefix titan] [--net 10.77.0] -- CMD [ARG...]
#   scripts/netns_hosts.sh env  [--prefix titan]     # the exports `run` gives CMD, for after `up`
#
# up: namespaces PREFIX-h0..PREFIX-h{N-1}, each with loopback up and an interface eth0 at
#   NET.(i+2)/24, the far end of a veth pair whose near end PREFIX-v{i} is a port of the bridge
#   PREFIX-br in this (the root) namespace. The bridge has NET.1/24: mpirun runs here and its
#   daemons in the namespaces must reach it. Leftovers of an earlier run with the same prefix are
#   removed first. Writes /run/titan_netns_hosts/PREFIX.{map,hostfile,env}. The names have a
#   hyphen, not an underscore: each is also its host's hostname (netns_agent.sh), and Open MPI
#   rejects a node name with an underscore (-H titan_h0: "illegal character", then orted crashes).
# down: removes all that up made for PREFIX (ending, by id, any process still inside one of its
#   namespaces, such as an orphaned orted). Safe to repeat, and after an interrupted run.
# run: up, then CMD with the variables below exported, then down, whether CMD succeeds, fails or
#   is interrupted (SIGINT/SIGTERM are passed on to CMD first). Exits with CMD's status.
#     TITAN_NETNS_HOSTS     the hosts' addresses, comma-separated (10.77.0.2,10.77.0.3): for -H
#     TITAN_NETNS_NAMES     the namespaces, also the hostnames (titan-h0,titan-h1): -H takes
#                           these as well
#     TITAN_NETNS_HOSTFILE  an Open MPI hostfile of the addresses (one slot each; -H A:2,B:2 or
#                           --oversubscribe for more)
#     TITAN_NETNS_AGENT     scripts/netns_agent.sh, the launch agent (ssh's stand-in)
#     TITAN_NETNS_SUBNET    10.77.0.0/24
#     TITAN_NETNS_VETHS     the root-side veths (titan-v0,titan-v1): byte counters, link down
#     TITAN_NETNS_MPI_ARGS  the mpirun options for these hosts (use it unquoted: no word has a
#                           space). Only the first is needed for a job to run at all:
#       --mca plm_rsh_agent $TITAN_NETNS_AGENT  launch the daemons through the agent, not ssh
#       --bind-to none                 every "host" believes it owns all the cores: Open MPI's
#                                      default binding puts rank 0 of each host on the same core 0
#                                      (2 hosts x 1 rank ran at half speed)
#       --mca pml ob1                  the BTL path below even where UCX would be picked (pml ucx
#                                      is, on Mellanox hardware, and ignores --mca btl)
#       --mca btl tcp,vader,self       TCP between hosts, shared memory within one (no openib/ofi)
#       --mca btl_tcp_if_include SUBNET   ranks' TCP on the test subnet only
#       --mca oob_tcp_if_include SUBNET   daemons' TCP likewise (mpirun otherwise advertises every
#                                      address of this machine, which the hosts cannot reach)
# Examples (two hosts, one rank each; then two ranks on each of them):
#   scripts/netns_hosts.sh run -- bash -c 'mpirun $TITAN_NETNS_MPI_ARGS -H $TITAN_NETNS_HOSTS \
#       -np 2 hostname'
#   scripts/netns_hosts.sh run -- mpirun --mca plm_rsh_agent $PWD/scripts/netns_agent.sh \
#       --bind-to none --mca pml ob1 --mca btl tcp,vader,self \
#       --mca btl_tcp_if_include 10.77.0.0/24 --mca oob_tcp_if_include 10.77.0.0/24 \
#       -H 10.77.0.2:2,10.77.0.3:2 -np 4 hostname
# (as root Open MPI also wants OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1)
# A host cut off mid-run (ip link set PREFIX-v1 down): titan's watchdog ends the ranks after
# comm.timeout_seconds, but mpirun then waits on the unreachable daemon for as long as TCP does
# (minutes; the daemon is left behind, and `down` ends it). With
#   --mca oob_tcp_keepalive_time 2 --mca oob_tcp_keepalive_intvl 1 --mca oob_tcp_keepalive_probes 2
# mpirun finds the daemon lost in about 3 s ("ORTE has lost communication with a remote daemon")
# and ends the job itself (status 205).
# Needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN), iproute2's ip, and util-linux's unshare (for the
# per-host hostname). See scripts/netns_agent.sh for how a host is entered.
set -euo pipefail

self=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
state=${TITAN_NETNS_STATE:-/run/titan_netns_hosts}
hosts=2 prefix=titan net=10.77.0

die() { echo "netns_hosts: $*" >&2; exit 1; }
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2; exit 2; }

[[ $# -ge 1 ]] || usage
cmd=$1; shift
while [[ $# -gt 0 ]]; do
  case $1 in
    --hosts) hosts=${2:?}; shift 2 ;;
    --prefix) prefix=${2:?}; shift 2 ;;
    --net) net=${2:?}; shift 2 ;;
    --) shift; break ;;
    -h|--help) usage ;;
    *) die "unknown option $1 (see the top of $0)" ;;
  esac
done
case $cmd in up|down|run|env) ;; -h|--help|help) usage ;; *) die "unknown command '$cmd' (up, down, run, env)" ;; esac
[[ $cmd == run && $# -eq 0 ]] && die "run wants a command: $0 run -- CMD [ARG...]"
[[ $cmd != run && $# -gt 0 ]] && die "unexpected arguments: $*"
# Interface names are at most 15 characters: PREFIX-v253 must fit.
[[ $prefix =~ ^[A-Za-z][A-Za-z0-9]{0,9}$ ]] || die "--prefix: 1 to 10 letters or digits, a letter first"
[[ $hosts =~ ^[0-9]+$ && $hosts -ge 1 && $hosts -le 253 ]] || die "--hosts: 1 to 253"
[[ $net =~ ^([0-9]{1,3})\.([0-9]{1,3})\.([0-9]{1,3})$ ]] || die "--net: the first three octets of a /24, e.g. 10.77.0"

bridge=${prefix}-br
subnet=$net.0/24
ns_name() { echo "${prefix}-h$1"; }
veth_name() { echo "${prefix}-v$1"; }
host_addr() { echo "$net.$(($1 + 2))"; }

preflight() {
  [[ $(id -u) -eq 0 ]] || die "network namespaces need root (CAP_NET_ADMIN and CAP_SYS_ADMIN); run as root"
  command -v ip >/dev/null || die "'ip' (iproute2) is missing: apt-get install iproute2"
  command -v unshare >/dev/null ||
    echo "netns_hosts: warning: 'unshare' (util-linux) is missing: every host keeps this machine's hostname, and Open MPI's per-host session files would collide" >&2
  local err
  if ! err=$(ip netns add "${prefix}-probe" 2>&1); then
    die "cannot make a network namespace (ip netns add: $err); a container needs CAP_SYS_ADMIN and CAP_NET_ADMIN (e.g. docker run --privileged)"
  fi
  ip netns del "${prefix}-probe" 2>/dev/null || true
  if ! err=$(ip link add "${prefix}-probe" type bridge 2>&1); then
    die "cannot make a bridge (ip link add type bridge: $err)"
  fi
  ip link del "${prefix}-probe" 2>/dev/null || true
}

# Whether namespace $1 reaches address $2: by ping, or else by a TCP connection to a closed port,
# which a reachable host refuses at once.
reachable() {
  if command -v ping >/dev/null; then
    ip netns exec "$1" ping -c1 -W2 "$2" >/dev/null 2>&1
    return
  fi
  local out
  out=$(ip netns exec "$1" timeout 3 bash -c "exec 3<>/dev/tcp/$2/9" 2>&1) && return 0
  [[ $out == *"refused"* ]]
}

# Every namespace of this prefix, including those of an earlier run with more hosts.
our_namespaces() {
  ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${prefix}-(h[0-9]+|probe)\$" || true
}

down() {
  local ns pids=() link nns=0 nlinks=0
  for ns in $(our_namespaces); do
    # An orted or rank left behind (e.g. after SIGKILL of mpirun) keeps the namespace, and with
    # it the veth, alive after `ip netns del`: end it, by id, first.
    mapfile -t pids < <(ip netns pids "$ns" 2>/dev/null || true)
    if [[ ${#pids[@]} -gt 0 ]]; then
      echo "netns_hosts: ending processes left in $ns: ${pids[*]}" >&2
      kill -TERM "${pids[@]}" 2>/dev/null || true
      for _ in 1 2 3 4 5 6 7 8 9 10; do
        mapfile -t pids < <(ip netns pids "$ns" 2>/dev/null || true)
        [[ ${#pids[@]} -eq 0 ]] && break
        sleep 0.3
      done
      if [[ ${#pids[@]} -gt 0 ]]; then kill -KILL "${pids[@]}" 2>/dev/null || true; fi
    fi
    ip netns del "$ns" 2>/dev/null || true
    nns=$((nns + 1))
  done
  # The root-side ends (normally gone with their namespaces), then the bridge.
  for link in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | sed 's/@.*//' |
                grep -E "^${prefix}-(v[0-9]+|br|probe)\$" || true); do
    ip link del "$link" 2>/dev/null || true
    nlinks=$((nlinks + 1))
  done
  rm -f "$state/$prefix.map" "$state/$prefix.hostfile" "$state/$prefix.env"
  rmdir "$state" 2>/dev/null || true
  [[ $((nns + nlinks)) -gt 0 ]] &&
    echo "netns_hosts: down: removed $nns namespaces and $nlinks links of prefix '$prefix'" >&2
  return 0
}

up() {
  preflight
  down
  local route
  route=$(ip -4 route show "$subnet" 2>/dev/null || true)
  [[ -z $route ]] || die "$subnet is already routed here ($route); pick another --net"
  trap 'echo "netns_hosts: up failed; cleaning up" >&2; down' ERR
  ip link add "$bridge" type bridge
  ip addr add "$net.1/24" dev "$bridge"
  ip link set "$bridge" up
  local i ns veth addrs=() names=() veths=()
  mkdir -p "$state"
  : >"$state/$prefix.map"
  : >"$state/$prefix.hostfile"
  for ((i = 0; i < hosts; i++)); do
    ns=$(ns_name $i) veth=$(veth_name $i)
    ip netns add "$ns"
    ip link add "$veth" type veth peer name "${prefix}-p$i"
    ip link set "${prefix}-p$i" netns "$ns"
    ip -n "$ns" link set "${prefix}-p$i" name eth0
    ip -n "$ns" addr add "$(host_addr $i)/24" dev eth0
    ip -n "$ns" link set lo up
    ip -n "$ns" link set eth0 up
    ip link set "$veth" master "$bridge"
    ip link set "$veth" up
    # ADDRESS NAMESPACE HOSTNAME (what netns_agent.sh reads).
    echo "$(host_addr $i) $ns $ns" >>"$state/$prefix.map"
    echo "$(host_addr $i) slots=1" >>"$state/$prefix.hostfile"
    addrs+=("$(host_addr $i)") names+=("$ns") veths+=("$veth")
  done
  local IFS=,
  cat >"$state/$prefix.env" <<EOF
export TITAN_NETNS_PREFIX=$prefix
export TITAN_NETNS_STATE=$state
export TITAN_NETNS_HOSTS=${addrs[*]}
export TITAN_NETNS_NAMES=${names[*]}
export TITAN_NETNS_VETHS=${veths[*]}
export TITAN_NETNS_HOSTFILE=$state/$prefix.hostfile
export TITAN_NETNS_AGENT=$self/netns_agent.sh
export TITAN_NETNS_SUBNET=$subnet
export TITAN_NETNS_MPI_ARGS="--mca plm_rsh_agent $self/netns_agent.sh --bind-to none --mca pml ob1 --mca btl tcp,vader,self --mca btl_tcp_if_include $subnet --mca oob_tcp_if_include $subnet"
EOF
  unset IFS
  # Every host must reach the root namespace (where mpirun runs) and host 0 (where the ranks of
  # other hosts connect) before this returns.
  for ((i = 0; i < hosts; i++)); do
    for addr in "$net.1" "$(host_addr 0)"; do
      reachable "$(ns_name $i)" "$addr" ||
        { down; die "host $(ns_name $i) cannot reach $addr over the bridge $bridge"; }
    done
  done
  trap - ERR
  echo "netns_hosts: up: $hosts hosts on $subnet (bridge $bridge $net.1):" >&2
  sed 's/^/  /' "$state/$prefix.map" >&2
}

# run's traps: down on every exit; a signal is passed on to the command, which is waited for.
# shellcheck disable=SC2317  # (called from traps)
finish() {
  local rc=$?
  trap - EXIT INT TERM
  down
  exit "$rc"
}
# shellcheck disable=SC2317
process_tree() {  # a process and all its descendants
  local p
  echo "$1"
  for p in $(ps -o pid= --ppid "$1" 2>/dev/null); do process_tree "$p"; done
}
# shellcheck disable=SC2317
on_signal() {
  local sig=$1 rc=$2
  echo "netns_hosts: SIG$sig: stopping the command, then down" >&2
  if [[ -n ${child:-} ]]; then
    # The whole tree under the command, mpirun and its ranks included: a background child of a
    # script ignores SIGINT, and its own children would not see a signal sent to it alone.
    local pids
    pids=$(process_tree "$child")                   # before any of them ends and its children move
    # shellcheck disable=SC2086
    kill -TERM $pids 2>/dev/null || true
    wait "$child" 2>/dev/null || true
  fi
  exit "$rc"                                        # the EXIT trap runs down
}

case $cmd in
  up) up ;;
  down) [[ $(id -u) -eq 0 ]] || die "down needs root"; command -v ip >/dev/null || die "'ip' is missing"; down ;;
  env)
    [[ -f $state/$prefix.env ]] || die "no hosts of prefix '$prefix' are up ($state/$prefix.env missing)"
    cat "$state/$prefix.env" ;;
  run)
    child=
    trap finish EXIT
    trap 'on_signal INT 130' INT
    trap 'on_signal TERM 143' TERM
    up
    # shellcheck disable=SC1090
    source "$state/$prefix.env"
    # In the background, so that a signal reaches the traps at once rather than after CMD ends.
    "$@" <&0 &
    child=$!
    set +e
    wait "$child"
    rc=$?
    set -e
    child=
    exit "$rc" ;;
esac
