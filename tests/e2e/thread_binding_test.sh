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
# titan launch's job runs on the CPUs titan launch was given. OpenMP binds titan launch's own
# thread to one core, a child inherits that, and so did every rank of the job, all on that core.
# A stand-in mpirun (TITAN_MPIRUN) records the CPUs and the environment the job would start with.
probe=$(mktemp -d)
trap 'rm -rf "$probe"' EXIT
cat >"$probe/mpirun" <<'STANDIN'
#!/usr/bin/env bash
{ taskset -pc $$ | sed 's/.*: //'; echo "TITAN_NO_REEXEC=${TITAN_NO_REEXEC:-unset}"; } >"$(dirname "$0")/seen"
STANDIN
chmod +x "$probe/mpirun"
env OMP_PROC_BIND=close OMP_PLACES=cores TITAN_MPIRUN="$probe/mpirun" "$titan" launch -np 2 -- train \
  --config "$root/configs/llama3_debug.toml" --checkpoint.enable=true --job.dump_folder="$probe/run" >"$probe/log" 2>&1 || true
mine=$(taskset -pc $$ | sed 's/.*: //')
if [[ ! -f $probe/seen ]]; then
  echo "FAIL: titan launch did not start its job:"; cat "$probe/log"; fail=1
elif [[ $(sed -n 1p "$probe/seen") != "$mine" || $(sed -n 2p "$probe/seen") != "TITAN_NO_REEXEC=unset" ]]; then
  echo "FAIL: titan launch's job starts on CPUs $(sed -n 1p "$probe/seen") (titan launch was given $mine)," \
    "with $(sed -n 2p "$probe/seen")"; fail=1
else
  echo "ok: titan launch's job starts on CPUs $mine, free to bind its ranks"
fi
((fail == 0)) && echo "thread_binding_test: passed"
exit $fail
