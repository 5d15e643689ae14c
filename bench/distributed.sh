#!/usr/bin/env bash
# The data- and tensor-parallel benchmarks of issues "Distributed training 1" and "2", one after
# another on this host:
#   1 rank x all threads        the baseline, at the same global batch
#   FSDP / DDP / TP over 2 ranks x 1 thread (and FSDP 4, HSDP 2 x 2 when the host has the cores)
# Prints each run's JSON line (bench_distributed.cpp) and a table of the ratios: tokens/s against
# the baseline, per-rank parameter + gradient + optimizer bytes against 1/N of the baseline's,
# the exposed communication share, and each collective's bytes per step against the plan's minimum.
#   bench/distributed.sh [BUILD_DIR] [--section.key=value ...]   (default: llama3 debug, f32, 8 x 256 tokens)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}; shift || true
bench=$build/bench/bench_distributed
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
cores=$(nproc)
common=(--config "$root/configs/llama3_debug.toml" --training.seq_len=256 --training.mixed_precision_param=float32 "$@")
cd "$root"
echo "host: $(lscpu | sed -n 's/^Model name: *//p'), $cores cores; load $(cut -d' ' -f1-3 /proc/loadavg)"
base=$(OMP_NUM_THREADS=$cores "$bench" "${common[@]}" --training.local_batch_size=8 | tail -1)
echo "1 rank x $cores threads: $base"
report() {  # NAME JSON
  python3 - "$1" "$2" "$base" <<'PY'
import json, sys
name, run, base = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
n = run["ranks"]
print(f"{name}: tokens/s {run['tokens_per_second']:.0f} = {run['tokens_per_second'] / base['tokens_per_second']:.2f}x "
      f"1 rank x {base['threads_per_rank']} threads; per-rank params+grads+optimizer "
      f"{run['params_grads_optimizer_bytes_per_rank'] / (base['params_grads_optimizer_bytes_per_rank'] / n if run['shard'] > 1 else base['params_grads_optimizer_bytes_per_rank']):.3f}x "
      f"{'1/N of ' if run['shard'] > 1 else ''}the baseline's; exposed communication {100 * run['exposed_comm_share']:.1f}% of the step")
for k, v in run["traffic"].items():
    if isinstance(v, dict) and v["minimum"] > 0:
        print(f"  {k:22s} {v['bytes_per_step'] / 1e6:9.3f} MB/step, minimum {v['minimum'] / 1e6:9.3f}: ratio {v['ratio']:.4f}")
PY
}
run() {  # NAME NP OVERRIDES...
  local name=$1 np=$2; shift 2
  local out
  out=$(OMP_NUM_THREADS=1 mpirun -np "$np" "$bench" "${common[@]}" "$@" | tail -1)
  echo "$name: $out"
  report "$name" "$out"
}
run "FSDP 2 x 1 thread" 2 --training.local_batch_size=4 --parallelism.data_parallel_shard_degree=2
run "DDP 2 x 1 thread" 2 --training.local_batch_size=4 --parallelism.data_parallel_replicate_degree=2 --parallelism.data_parallel_shard_degree=1
# Tensor parallel: both ranks read the same 8 sequences (issue "Distributed training 2": >= 0.8x).
run "TP 2 x 1 thread" 2 --training.local_batch_size=8 --parallelism.tensor_parallel_degree=2 --parallelism.data_parallel_shard_degree=1
if (( cores >= 4 )); then
  run "FSDP 4 x 1 thread" 4 --training.local_batch_size=2 --parallelism.data_parallel_shard_degree=4
  run "HSDP 2 x 2 x 1 thread" 4 --training.local_batch_size=2 --parallelism.data_parallel_replicate_degree=2 --parallelism.data_parallel_shard_degree=2
fi
