#!/usr/bin/env bash
# FSDP's all-gather bytes per step per low-precision recipe (docs/precision.md, "FP8 all-gather
# under FSDP"): llama3 debug on FSDP 2 (one thread per rank), bf16 mixed precision, seq_len 128,
# each rank's bytes sent on the FSDP group per step from the communication counters
# (bench_distributed's "fsdp all_gather"), and the ratio against plain bf16.
#   bench/fp8_all_gather.sh [BUILD_DIR] [--section.key=value ...]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}; shift || true
bench=$build/bench/bench_distributed
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
common=(--config "$root/configs/llama3_debug.toml" --steps 4 --warmup 1 --training.seq_len=128
        --training.mixed_precision_param=bfloat16 --parallelism.data_parallel_shard_degree=2 "$@")
cd "$root"
f8=--model.converters=quantize.linear.float8
mx=--model.converters=quantize.linear.mx
declare -a names=("bf16" "fp8_blockwise" "fp8_blockwise + FP8 all-gather" "mxfp8" "mxfp4")
declare -a args=("" "$f8" "$f8 --quantize.linear.float8.enable_fsdp_float8_all_gather=true" "$mx"
                 "$mx --quantize.linear.mx.recipe_name=mxfp4")
base=""
printf "%-32s %16s %8s\n" recipe "all-gather B/step" "vs bf16"
for i in "${!names[@]}"; do
  # shellcheck disable=SC2086
  out=$(OMP_NUM_THREADS=1 mpirun -np 2 "$bench" "${common[@]}" ${args[$i]} | tail -1)
  bytes=$(python3 -c 'import json,sys; print(int(json.loads(sys.argv[1])["traffic_by_group"]["fsdp all_gather"]))' "$out")
  base=${base:-$bytes}
  printf "%-32s %16d %8.3f\n" "${names[$i]}" "$bytes" "$(python3 -c "print($bytes / $base)")"
done
