#!/usr/bin/env bash
# Training across two hosts made of network namespaces (scripts/netns_hosts.sh): ranks on
# different hosts talk TCP over veth pairs, ranks on one host shared memory. Checks, against one
# rank on one host:
#   1. FSDP 2, one rank per host: the same losses, bit for bit; every byte crosses hosts
#   2. HSDP 2 x 2 on 2 hosts x 2 ranks, dp_replicate across hosts, dp_shard within each: the same
#      losses; bytes cross hosts and stay local
#   3. HSDP's checkpoint resumes on one host (1 rank) and continues with the same losses
#   4. deepseek_v32 debug with EP 2 across hosts (both DSA stages): losses within 1e-5 relative
#   5. a host's link taken down mid-run: the watchdog ends the job within comm.timeout_seconds
#      (+ its grace), with flight-recorder dumps and the unreachable ranks named; no hang
#   tests/multihost/multihost_test.sh [TITAN_BINARY]
# Needs root (network namespaces). Where it cannot make them it fails, saying why.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
titan=${1:-$root/build/titan}
titan=$(cd "$(dirname "$titan")" && pwd)/$(basename "$titan")
cd "$root"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE \
  OMP_PROC_BIND=false
if [[ -z ${TITAN_NETNS_HOSTS:-} ]]; then
  [[ $(id -u) -eq 0 ]] || { echo "multihost: FAILED: network namespaces need root (CI runs as root)" >&2; exit 1; }
  command -v ip >/dev/null || { echo "multihost: FAILED: iproute2's ip is missing (scripts/setup.sh installs it)" >&2; exit 1; }
  exec scripts/netns_hosts.sh run --hosts 2 --prefix titanmh -- "$0" "$titan"
fi
IFS=, read -r host_a host_b <<<"$TITAN_NETNS_HOSTS"
IFS=, read -r _ veth_b <<<"$TITAN_NETNS_VETHS"
# shellcheck disable=SC2206  # the harness's options have no spaces
mpi=(mpirun $TITAN_NETNS_MPI_ARGS)
scripts/prepare_data.sh "$titan" >/dev/null
work=$(mktemp -d /tmp/titan_multihost.XXXXXX)
trap 'rm -rf "$work"' EXIT
fail() { echo "multihost: FAILED: $*" >&2; exit 1; }

# step -> loss of a run's metrics (the last line logged for a step wins).
losses() {
  awk '/"kind":"train"/ { match($0, /"step":[0-9]+/); s = substr($0, RSTART + 7, RLENGTH - 7)
                          match($0, /"loss":[^,}]+/); l[s] = substr($0, RSTART + 7, RLENGTH - 7) }
       END { for (s in l) print s, l[s] }' "$1/metrics.jsonl" | sort -n
}
# Sum over the logged steps of a metrics key (0 when absent).
total() {
  awk -v k="\"$2\":" '/"kind":"train"/ { i = index($0, k); if (i) { v = substr($0, i + length(k)); sub(/[,}].*/, "", v); t += v } }
                      END { printf "%.0f\n", t }' "$1/metrics.jsonl"
}
same_losses() {  # $1 reference run, $2 run, $3 first step compared, $4 relative tolerance (0: bit for bit)
  join <(losses "$1") <(losses "$2") | awk -v first="$3" -v tol="$4" -v what="$2" '
    $1 >= first { n++; d = $2 - $3; if (d < 0) d = -d; r = d / ($2 < 0 ? -$2 : $2)
                  if ((tol == 0 && $2 != $3) || r > tol) { printf "step %d: %s vs %s (%s)\n", $1, $2, $3, what; bad++ } }
    END { if (n == 0) { print "no steps to compare in " what; exit 1 } exit bad > 0 }'
}

llama=(train --config configs/llama3_debug.toml --training.steps=6 --training.local_batch_size=1
       --training.global_batch_size=4 --training.seq_len=64 --metrics.log_freq=1 --validation.enable=false
       --checkpoint.enable=true --checkpoint.interval=3 --checkpoint.keep_latest_k=0 --metrics.enable_plots=false)

echo "multihost: hosts $host_a and $host_b"
"$titan" "${llama[@]}" --job.dump_folder="$work/one" >"$work/one.log" 2>&1 || { cat "$work/one.log"; fail "1-rank run"; }

"${mpi[@]}" -H "$host_a,$host_b" -np 2 "$titan" "${llama[@]}" --job.dump_folder="$work/fsdp" \
  --parallelism.data_parallel_shard_degree=2 >"$work/fsdp.log" 2>&1 || { cat "$work/fsdp.log"; fail "FSDP 2 across hosts"; }
same_losses "$work/one" "$work/fsdp" 1 0 || fail "FSDP 2 across 2 hosts differs from 1 rank"
cross=$(total "$work/fsdp" comm_bytes_cross_host) local=$(total "$work/fsdp" comm_bytes_local)
[[ $cross -gt 0 && $local -eq 0 ]] || fail "FSDP 2, a rank per host: $cross bytes crossed hosts and $local stayed (want all crossing)"
echo "multihost: FSDP 2 across 2 hosts = 1 rank, bit for bit; $cross bytes crossed hosts, $local stayed local"

"${mpi[@]}" -H "$host_a:2,$host_b:2" -np 4 "$titan" "${llama[@]}" --job.dump_folder="$work/hsdp" \
  --parallelism.data_parallel_replicate_degree=2 --parallelism.data_parallel_shard_degree=2 \
  >"$work/hsdp.log" 2>&1 || { cat "$work/hsdp.log"; fail "HSDP 2 x 2 across hosts"; }
same_losses "$work/one" "$work/hsdp" 1 0 || fail "HSDP 2 x 2 on 2 hosts differs from 1 rank"
cross=$(total "$work/hsdp" comm_bytes_cross_host) local=$(total "$work/hsdp" comm_bytes_local)
[[ $cross -gt 0 && $local -gt 0 ]] || fail "HSDP 2 x 2: $cross bytes crossed hosts, $local stayed local (want both)"
echo "multihost: HSDP 2 x 2 on 2 hosts x 2 ranks = 1 rank, bit for bit; $cross bytes crossed hosts, $local stayed local"

mkdir -p "$work/resumed/checkpoint"
cp -r "$work/hsdp/checkpoint/step-3" "$work/resumed/checkpoint/"
"$titan" "${llama[@]}" --job.dump_folder="$work/resumed" >"$work/resumed.log" 2>&1 || { cat "$work/resumed.log"; fail "resume on one host"; }
grep -q "resumed from .*step-3" "$work/resumed.log" || fail "the 1-rank run did not resume from HSDP's step 3"
same_losses "$work/one" "$work/resumed" 4 0 || fail "HSDP's checkpoint resumed on 1 rank differs"
echo "multihost: HSDP's step-3 checkpoint resumed on one rank of one host: steps 4-6 bit for bit"

v32=(train --config configs/deepseek_v32_debug.toml --training.steps=4 --training.local_batch_size=1
     --training.global_batch_size=2 --training.seq_len=64 --metrics.log_freq=1 --dsa.warmup_steps=2 --dsa.topk=16
     --validation.enable=false --checkpoint.enable=false --metrics.enable_plots=false --metrics.enable_tensorboard=false
     --profiling.enable_profiling=false --profiling.enable_memory_snapshot=false --training.mixed_precision_param=float32)
"$titan" "${v32[@]}" --job.dump_folder="$work/v32_one" >"$work/v32_one.log" 2>&1 || { cat "$work/v32_one.log"; fail "deepseek_v32 1 rank"; }
"${mpi[@]}" -H "$host_a,$host_b" -np 2 "$titan" "${v32[@]}" --job.dump_folder="$work/v32_ep" \
  --parallelism.data_parallel_shard_degree=2 --parallelism.expert_parallel_degree=2 \
  >"$work/v32_ep.log" 2>&1 || { cat "$work/v32_ep.log"; fail "deepseek_v32 EP 2 across hosts"; }
same_losses "$work/v32_one" "$work/v32_ep" 1 1e-5 || fail "deepseek_v32 EP 2 across hosts differs from 1 rank"
echo "multihost: deepseek_v32 EP 2 across 2 hosts = 1 rank within 1e-5 (dense warm-up and sparse steps)"

# A link goes down: rank 1's host is cut off after step 4 of a job under `titan launch` (the
# hosts and Open MPI's options through its environment). The watchdog (5 s) ends the ranks it can
# reach, with dumps, naming the rank that did not answer; mpirun, which would wait for the lost
# host's daemon forever (Open MPI 4.1), is ended by the supervisor; once the link is back the job
# restarts from its last checkpoint and finishes.
export OMPI_MCA_plm_rsh_agent=$TITAN_NETNS_AGENT OMPI_MCA_orte_default_hostfile=$TITAN_NETNS_HOSTFILE \
  OMPI_MCA_pml=ob1 OMPI_MCA_btl=tcp,vader,self OMPI_MCA_btl_tcp_if_include=$TITAN_NETNS_SUBNET \
  OMPI_MCA_oob_tcp_if_include=$TITAN_NETNS_SUBNET
"$titan" launch -np 2 --max-restarts 3 -- "${llama[@]}" --job.dump_folder="$work/cut" \
  --parallelism.data_parallel_shard_degree=2 --training.steps=60 --comm.timeout_seconds=5 >"$work/cut.log" 2>&1 &
job=$!
for _ in $(seq 900); do grep -q '"step":4,' "$work/cut/metrics.jsonl" 2>/dev/null && break; sleep 0.1; done
grep -q '"step":4,' "$work/cut/metrics.jsonl" || { kill "$job"; cat "$work/cut.log"; fail "the run never reached step 4"; }
grep -q '"step":60,' "$work/cut/metrics.jsonl" && { cat "$work/cut.log"; fail "the run ended before the link could be cut"; }
ip link set "$veth_b" down
cut_at=$(date +%s.%N)
for _ in $(seq 900); do grep -q "restart 1 of 3" "$work/cut.log" && break; sleep 0.1; done
noticed=$(awk -v a="$cut_at" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
ip link set "$veth_b" up
grep -q "restart 1 of 3" "$work/cut.log" || { kill "$job"; cat "$work/cut.log"; fail "no restart 90 s after the link went down"; }
grep -q "did not answer (hung or dead): rank 1" "$work/cut.log" || { kill "$job"; cat "$work/cut.log"; fail "the watchdog did not name the cut-off rank"; }
ls "$work/cut/comm_traces/"rank0.json >/dev/null 2>&1 || { kill "$job"; fail "no flight-recorder dump in $work/cut/comm_traces"; }
for _ in $(seq 1800); do kill -0 "$job" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$job" 2>/dev/null; then kill "$job"; cat "$work/cut.log"; fail "the job did not finish within 180 s of the link coming back"; fi
status=0; wait "$job" || status=$?
[[ $status -eq 0 ]] || { cat "$work/cut.log"; fail "titan launch ended with status $status"; }
grep -E "did not answer|\[launch\]" "$work/cut.log" | cut -c1-200
echo "multihost: link down -> the watchdog named rank 1 and the job was restarting ${noticed} s later; with the link back it finished"
echo "multihost: all checks passed"
