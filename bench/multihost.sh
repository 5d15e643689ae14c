#!/usr/bin/env bash
# Across hosts against one host (issue "Across machines"), on hosts made of network namespaces
# (scripts/netns_hosts.sh; needs root): the all-reduce's latency and bus bandwidth between 2 ranks
# over shared memory (one host) and over the veth TCP path (two hosts), and the step time of HSDP
# 2 x 2 (llama3 debug) on 2 hosts x 2 ranks against 4 ranks on one host. Same Open MPI options in
# both (TCP between hosts, shared memory within one).
#   bench/multihost.sh [BUILD_DIR]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
cd "$root"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE OMP_PROC_BIND=false
if [[ -z ${TITAN_NETNS_HOSTS:-} ]]; then exec scripts/netns_hosts.sh run --prefix titanbn -- "$0" "$build"; fi
echo "host: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc --all) cores; load $(cut -d' ' -f1-3 /proc/loadavg)"
IFS=, read -r a b <<<"$TITAN_NETNS_HOSTS"
# shellcheck disable=SC2206
mpi=(mpirun $TITAN_NETNS_MPI_ARGS)
scripts/prepare_data.sh "$build/titan" >/dev/null
echo "== all-reduce, 2 ranks: one host (shared memory) | two hosts (TCP over veth)"
"${mpi[@]}" -H "$a:2" -np 2 "$build/bench/bench_allreduce" > /tmp/titan_ar_local.jsonl
"${mpi[@]}" -H "$a,$b" -np 2 "$build/bench/bench_allreduce" > /tmp/titan_ar_cross.jsonl
paste -d' ' /tmp/titan_ar_local.jsonl /tmp/titan_ar_cross.jsonl | awk '
  function v(line, key,   i, s) { i = index(line, "\"" key "\": "); s = substr(line, i + length(key) + 4); sub(/[,}].*/, "", s); return s }
  { split($0, halves, "} {"); l = halves[1]; c = halves[2]
    printf "%10d B   local %9.1f us %7.3f GB/s   cross-host %9.1f us %7.3f GB/s   (%.1fx the time)\n",
      v(l, "bytes"), v(l, "median_us"), v(l, "bus_gbps"), v(c, "median_us"), v(c, "bus_gbps"), v(c, "median_us") / v(l, "median_us") }'
echo "== HSDP 2 x 2 (llama3 debug, 2 x 64 tokens per rank): 4 ranks on one host | 2 hosts x 2 ranks"
step=(--config configs/llama3_debug.toml --steps 8 --warmup 2 --parallelism.data_parallel_replicate_degree=2
      --parallelism.data_parallel_shard_degree=2 --training.local_batch_size=2 --training.seq_len=64)
one=$("${mpi[@]}" -H "$a:4" -np 4 "$build/bench/bench_distributed" "${step[@]}" | grep '^{')
two=$("${mpi[@]}" -H "$a:2,$b:2" -np 4 "$build/bench/bench_distributed" "${step[@]}" | grep '^{')
s1=$(sed -n 's/.*"seconds_per_step": *\([0-9.e+-]*\).*/\1/p' <<<"$one")
s2=$(sed -n 's/.*"seconds_per_step": *\([0-9.e+-]*\).*/\1/p' <<<"$two")
awk -v a="$s1" -v b="$s2" 'BEGIN { printf "seconds per step: one host %.4f, two hosts %.4f (%.2fx)\n", a, b, b / a }'
