#!/usr/bin/env bash
# Convergence of the quantization recipes against bf16 mixed precision (issue 39, docs/precision.md):
# the same tokens and seed, STEPS steps of MODEL's debug config, one run per recipe (each under the
# shared build lock, one after another), then a table per recipe (final validation loss and its
# difference from bf16's, median step time past step 20, peak parameter / activation / optimizer
# bytes) and the loss curves in one PNG (`titan plot --compare`).
# Models with routed experts (deepseek_v32) add mxfp4_experts: FP8 blockwise linears with MXFP4
# routed experts (quantize.grouped_mm.mx).
# Usage: scripts/quantize_convergence.sh [model: llama3 | deepseek_v32] [steps] [out folder]
set -euo pipefail
model=${1:-llama3}
steps=${2:-300}
out=${3:-outputs/quantize_convergence}
root=$(cd "$(dirname "$0")/.." && pwd)
titan=$root/build/titan
config=$root/configs/${model}_debug.toml
# The config's own converters (deepseek_v32's "dsa_fused") stay on; each recipe adds its own.
base=$(sed -n 's/^converters = \[\(.*\)\]/\1/p' "$config" | tr -d '" ')
with=--model.converters=${base:+$base,}
declare -A recipes=(
  [bf16]=""
  [fp8_blockwise]="${with}quantize.linear.float8"
  [mxfp8]="${with}quantize.linear.mx"
  [mxfp4]="${with}quantize.linear.mx --quantize.linear.mx.recipe_name=mxfp4"
)
names=(bf16 fp8_blockwise mxfp8 mxfp4)
# A model with routed experts (deepseek_v32) adds DeepSeek-V4's recipe: FP8 blockwise linears and
# MXFP4 routed experts.
if [[ $model == deepseek* ]]; then
  recipes[mxfp4_experts]="${with}quantize.linear.float8,quantize.grouped_mm.mx --quantize.grouped_mm.mx.recipe_name=mxfp4"
  names+=(mxfp4_experts)
fi
mkdir -p "$out"
runs=()
for name in "${names[@]}"; do
  run=$out/${model}_$name
  runs+=("$run")
  [[ -n ${SKIP_DONE:-} && -f $run/metrics.jsonl ]] && continue
  rm -rf "$run"
  # shellcheck disable=SC2086
  OMP_PROC_BIND=close OMP_PLACES=cores flock /tmp/titan-build.lock "$titan" train --config "$config" \
    --job.dump_folder="$run" --training.steps="$steps" --training.mixed_precision_param=bfloat16 \
    --checkpoint.enable=false --metrics.log_freq=10 --metrics.enable_jsonl=true --metrics.enable_plots=false \
    --validation.enable=true --validation.freq=50 --validation.steps=10 ${recipes[$name]} >"$run.log" 2>&1
done
python3 - "${runs[@]}" <<'PY'
import json, statistics, sys
mib = 2**20
print("| run | final validation loss | vs bf16 | median step ms | params MiB | activations MiB | optimizer MiB |")
print("|---|---|---|---|---|---|---|")
base = None
for run in sys.argv[1:]:
    val, times, peak = None, [], {}
    for line in open(run + "/metrics.jsonl"):
        j = json.loads(line)
        if j.get("kind") == "validation": val = j["loss"]
        if j.get("kind") == "train":
            if j["step"] > 20: times.append(j["step_seconds"])
            for k, v in j.get("peak_memory_bytes", {}).items(): peak[k] = max(peak.get(k, 0), v)
    base = base or val
    print(f"| {run.split('/')[-1]} | {val:.4f} | {100 * (val - base) / base:+.2f}% | {statistics.median(times) * 1000:.0f} | "
          f"{peak['params'] / mib:.1f} | {peak['activations'] / mib:.1f} | {peak['optim'] / mib:.1f} |")
PY
"$titan" plot --compare "$out/${model}_loss.png" "${runs[@]}"
