#!/usr/bin/env bash
# Convergence of the quantization recipes against bf16 mixed precision (issue 39, docs/precision.md):
# the same tokens and seed, STEPS steps of MODEL's debug config, one run per recipe, each under the
# shared build lock. Prints each run's final validation loss and mean step time; the loss curves
# are drawn by `titan plot --compare` from the runs' metrics.jsonl.
# Usage: scripts/quantize_convergence.sh [model: llama3 | deepseek_v32] [steps] [out folder]
set -euo pipefail
model=${1:-llama3}
steps=${2:-300}
out=${3:-outputs/quantize_convergence}
root=$(cd "$(dirname "$0")/.." && pwd)
titan=$root/build/titan
config=$root/configs/${model}_debug.toml
declare -A recipes=(
  [bf16]=""
  [fp8_blockwise]="--model.converters=quantize.linear.float8"
  [mxfp8]="--model.converters=quantize.linear.mx"
  [mxfp4]="--model.converters=quantize.linear.mx --quantize.linear.mx.recipe_name=mxfp4"
)
for name in bf16 fp8_blockwise mxfp8 mxfp4; do
  run=$out/${model}_$name
  rm -rf "$run"; mkdir -p "$out"
  # shellcheck disable=SC2086
  OMP_PROC_BIND=close OMP_PLACES=cores flock /tmp/titan-build.lock "$titan" train --config "$config" \
    --job.dump_folder="$run" --training.steps="$steps" --training.mixed_precision_param=bfloat16 \
    --checkpoint.enable=false --metrics.log_freq=10 --metrics.enable_jsonl=true \
    --validation.enable=true --validation.freq=50 --validation.steps=10 ${recipes[$name]} >"$run.log" 2>&1
  python3 - "$run/metrics.jsonl" "$name" <<'PY'
import json, sys
val, times = None, []
for line in open(sys.argv[1]):
    j = json.loads(line)
    if j.get("kind") == "validation": val = j["loss"]
    if j.get("kind") == "train" and "time_metrics/end_to_end(s)" in j: times.append(j["time_metrics/end_to_end(s)"])
t = sorted(times)[len(times) // 2] if times else float("nan")
print(f"{sys.argv[2]:>14}: final validation loss {val:.4f}, median step {t * 1000:.1f} ms")
PY
done
