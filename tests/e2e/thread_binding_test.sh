#!/usr/bin/env bash
# Ranks on one host never share a core, whatever OMP_NUM_THREADS says: each binds its threads to its
# own share of the host's CPUs (titan info prints the CPUs its threads may run on). They used to
# bind "close" from core 0 whenever OMP_NUM_THREADS was set, all of them onto the same cores.
#   tests/e2e/thread_binding_test.sh TITAN_BINARY
set -euo pipefail
titan=$1
root=$(cd "$(dirname "$0")/../.." && pwd)
cpus=$(nproc)
ranks=$((cpus < 4 ? cpus : 4))
((ranks >= 2)) || { echo "thread_binding_test: needs 2 CPUs, this machine has $cpus" >&2; exit 1; }
fail=0
for threads in 1 unset; do
  env=(OMP_PROC_BIND=close OMP_PLACES=cores)  # what scripts/test.sh exports: an abstract place name is no binding
  [[ $threads != unset ]] && env+=(OMP_NUM_THREADS="$threads")
  out=$(env "${env[@]}" "$root/scripts/mpirun.sh" -np "$ranks" "$titan" info 2>&1)
  mapfile -t sets < <(sed -n 's/^threads: .*, on CPUs \(.*\)$/\1/p' <<<"$out")
  if ((${#sets[@]} != ranks)); then
    echo "FAIL (OMP_NUM_THREADS=$threads): expected $ranks 'on CPUs' lines, got ${#sets[@]}:"; echo "$out"; fail=1; continue
  fi
  all=$(tr ',' '\n' <<<"$(IFS=,; echo "${sets[*]}")" | sort -n)
  if [[ $(uniq -d <<<"$all") != "" ]]; then
    echo "FAIL (OMP_NUM_THREADS=$threads): ranks share CPUs: ${sets[*]}"; fail=1
  else
    echo "ok (OMP_NUM_THREADS=$threads): $ranks ranks on CPUs ${sets[*]}"
  fi
done
# More threads than a rank's share: a warning that says so, and still no core shared.
out=$(OMP_NUM_THREADS=$((cpus + 1)) "$root/scripts/mpirun.sh" -np 2 "$titan" info 2>&1)
if ! grep -q "its threads will share cores" <<<"$out"; then echo "FAIL: no warning for $((cpus + 1)) threads per rank:"; echo "$out"; fail=1; fi
mapfile -t sets < <(sed -n 's/^threads: .*, on CPUs \(.*\)$/\1/p' <<<"$out")
all=$(tr ',' '\n' <<<"$(IFS=,; echo "${sets[*]}")" | sort -n)
if [[ ${#sets[@]} != 2 || $(uniq -d <<<"$all") != "" ]]; then echo "FAIL: oversubscribed ranks share CPUs: ${sets[*]}"; fail=1; fi
((fail == 0)) && echo "thread_binding_test: passed"
exit $fail
