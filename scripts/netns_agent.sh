#!/usr/bin/env bash
# An Open MPI launch agent (what ssh is to a real cluster) for the "hosts" that
# scripts/netns_hosts.sh makes out of Linux network namespaces. Give it to mpirun in place of ssh:
#   mpirun --mca plm_rsh_agent "$PWD/scripts/netns_agent.sh" -H 10.77.0.2,10.77.0.3 -np 2 hostname
# (scripts/netns_hosts.sh run -- ... exports the whole set of options as $TITAN_NETNS_MPI_ARGS.)
#
# Open MPI 4.1 (plm rsh) calls it as it would call ssh (argv logged with Open MPI 4.1.4):
#   netns_agent.sh [the words of plm_rsh_args] HOST WORD...
# e.g. netns_agent.sh 10.77.0.3 ' orted' -mca ess '"env"' -mca ess_base_jobid '"319750144"' ...
#        -mca orte_hnp_uri '"319750144.0;tcp://192.0.2.2,10.77.0.1:50313;tcp6://[fd00::2]:51255"'
#        --mca plm_rsh_agent '"/.../netns_agent.sh"' -mca plm '"rsh"' --tree-spawn ...
# No options come before HOST unless plm_rsh_args is set (--mca plm_rsh_args "-o BatchMode=yes
# -T": those words); with --prefix the first WORD becomes "PATH=/usr/bin:$PATH ; export PATH ;
# LD_LIBRARY_PATH=... ; ... /usr/bin/orted". Options are skipped the way ssh reads them (-x, -T,
# -o VALUE, -oVALUE, -p VALUE, ...); the first other word is HOST (user@ dropped), and the WORDs
# are ONE shell command line, joined by spaces and run by bash, as sshd would: the values carry
# literal double quotes and ';' that only a shell undoes.
# With tree spawn (on by default; it takes effect beyond routed_radix hosts, 64, or with
# --mca routed_radix 1) an orted launches the next ones through this same agent, from inside its
# host's namespaces; that works because namespaces are named globally (/run/netns) and the file
# system is shared.
#
# HOST (an address or a name) is mapped to its namespace by, in turn:
#   1. a namespace of that name (ip netns list);
#   2. the map that netns_hosts.sh up writes (${TITAN_NETNS_STATE:-/run/titan_netns_hosts}/*.map,
#      lines "ADDRESS NAMESPACE HOSTNAME");
#   3. the namespace in which HOST is the address of an interface.
# The command runs in that network namespace and in a UTS namespace of its own whose hostname is
# the map's HOSTNAME, or else the namespace's name (unshare --uts). Open MPI names its session
# directory (/tmp/ompi.HOSTNAME.UID) and the files in it after the host name: without this, the
# orteds of two hosts share one directory and one of them crashes writing its hwloc topology
# (SIGSEGV in hwloc_shmem_topology_write, "ORTE was unable to reliably start one or more daemons").
# TITAN_NETNS_AGENT_LOG=FILE appends every call's argv (one quoted word a line) to FILE.
set -euo pipefail

die() { echo "netns_agent: $*" >&2; exit 255; }   # 255: what ssh returns when it cannot connect

if [[ -n ${TITAN_NETNS_AGENT_LOG:-} ]]; then
  # One write per call, so that concurrent calls do not interleave.
  log=$(printf -- '--- %s pid %d netns %s uts %s argc %d' "$(date +%T.%N)" $$ \
          "$(ip netns identify $$ 2>/dev/null || true)" "$(hostname)" $#
        for a in "$@"; do printf '\n  %q' "$a"; done)
  printf '%s\n' "$log" >>"$TITAN_NETNS_AGENT_LOG" 2>/dev/null || true
fi

# ssh's options: those taking a value, and those that stand alone (see ssh(1)).
while [[ $# -gt 0 ]]; do
  case $1 in
    --) shift; break ;;
    -[BbcDEeFIiJLlmOoPpQRSWw]) [[ $# -ge 2 ]] || die "option $1 wants a value"; shift 2 ;;
    -[BbcDEeFIiJLlmOoPpQRSWw]?*) shift ;;          # -oBatchMode=yes, -p22: value attached
    -[46AaCfGgKkMNnqsTtVvXxYy]*) shift ;;           # flags, alone or bundled (-xT)
    -*) die "unknown ssh option $1" ;;
    *) break ;;
  esac
done
[[ $# -ge 1 ]] || die "no host given (usage: $0 [ssh options] HOST [command...])"
host=$1; shift
host=${host#*@}                                    # user@host: the user is root either way
[[ $(id -u) -eq 0 ]] || die "must run as root (ip netns exec)"

state=${TITAN_NETNS_STATE:-/run/titan_netns_hosts}
ns='' name=''
if ip netns list 2>/dev/null | awk '{print $1}' | grep -qxF -- "$host"; then
  ns=$host
  name=$(cat "$state"/*.map 2>/dev/null | awk -v h="$host" '$2 == h { print $3; exit }' || true)
fi
if [[ -z $ns ]]; then
  for map in "$state"/*.map; do
    [[ -f $map ]] || continue
    read -r ns name < <(awk -v h="$host" '$1 == h || $2 == h || $3 == h { print $2, $3; exit }' \
      "$map") || true
    [[ -n $ns ]] && break
  done
fi
if [[ -z $ns ]]; then
  for n in $(ip netns list 2>/dev/null | awk '{print $1}'); do
    if ip -n "$n" -4 -o addr show 2>/dev/null | awk '{print $4}' | grep -q "^${host//./\\.}/"; then
      ns=$n; break
    fi
  done
fi
[[ -n $ns ]] || die "no network namespace for host '$host' (is scripts/netns_hosts.sh up?)"
name=${name:-$ns}

if [[ $# -eq 0 ]]; then
  cmd='exec bash -l'                                # ssh HOST with no command: a shell
else
  cmd="$*"                                          # sshd: the words, joined by spaces, to a shell
fi
if command -v unshare >/dev/null; then
  # The hostname is set inside the new UTS namespace, then the command line replaces that shell.
  # shellcheck disable=SC2016  # ($1 and $2 are the inner shell's)
  exec ip netns exec "$ns" unshare --uts bash -c 'hostname "$1" && exec bash -c "$2"' \
    netns_agent "$name" "$cmd"
fi
echo "netns_agent: unshare missing: '$ns' keeps this machine's hostname" >&2
exec ip netns exec "$ns" bash -c "$cmd"
