#!/usr/bin/env bash
# Muon against AdamW on the same tokens (issue 38's convergence figure): the llama3 debug model and
# the DeepSeek-V4 debug model on the KJV corpus, a few learning rates each (Muon with
# match_rms_adamw shares AdamW's lr scale), each run's validation loss at the end, and every run's
# training loss in one PNG, a panel per model.
#   bench/muon_convergence.sh [BUILD_DIR] [--section.key=value ...]
#   (default: 150 steps of each config's batch (llama3 8 x 256 tokens, V4 4 x 256), warmup 10,
#    validation over 10 batches at the end; OUT=<folder> keeps the runs and the PNG there, else a
#    temporary folder that is printed. LLAMA3_RUNS / V4_RUNS: "OPTIMIZER LR" pairs separated by
#    ';' instead of the default sweeps, e.g. LLAMA3_RUNS="AdamW 2e-3;Muon 8e-3", the best of each)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}; shift || true
extra=("$@")
cd "$root"
echo "host: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc --all) cores; load $(cut -d' ' -f1-3 /proc/loadavg)"
scripts/prepare_data.sh "$build/titan" >/dev/null
out=${OUT:-$(mktemp -d "${TITAN_BENCH_DIR:-/var/tmp}/titan_bench_muon.XXXXXX")}
mkdir -p "$out"
steps=${STEPS:-150}
llama3_runs=${LLAMA3_RUNS:-"AdamW 8e-4;AdamW 2e-3;AdamW 4e-3;Muon 8e-4;Muon 2e-3;Muon 4e-3;Muon 8e-3"}
v4_runs=${V4_RUNS:-"AdamW 2e-3;AdamW 4e-3;AdamW 8e-3;Muon 2e-3;Muon 4e-3;Muon 8e-3;Muon 1.6e-2"}
chart=()

# sweep MODEL CONFIG "PANEL TITLE" "OPT LR;OPT LR;...": one run per pair, its validation loss, and
# the runs as one panel of the chart.
sweep() {
  local model=$1 config=$2 title=$3 runs=$4 run
  chart+=(--panel "$title")
  IFS=';' read -ra pairs <<<"$runs"
  for run in "${pairs[@]}"; do
    set -- $run
    local dir="$out/${model}_${1}_$2"
    rm -rf "$dir"
    local t0=$SECONDS
    "$build/titan" train --config "$config" --job.dump_folder="$dir" --training.steps=$steps \
      --lr_scheduler.warmup_steps=10 --checkpoint.enable=false --metrics.log_freq=1 --metrics.enable_plots=false \
      --metrics.enable_tensorboard=false --profiling.enable_profiling=false --profiling.enable_memory_snapshot=false \
      --validation.enable=true --validation.freq=$steps --validation.steps=10 \
      --optimizer.name="$1" --optimizer.lr="$2" ${extra[@]+"${extra[@]}"} >"$dir.log" 2>&1
    echo "$model $1 lr $2: $(grep -o 'validation loss [0-9.]*' "$dir.log" | tail -1) ($((SECONDS - t0)) s)"
    chart+=("$1 $2=$dir")
  done
}

sweep llama3 configs/llama3_debug.toml "llama3 debug (6.2M), $steps steps of 8 x 256 tokens" "$llama3_runs"
sweep deepseek_v4 configs/deepseek_v4_debug.toml "deepseek_v4 debug (2.5M), $steps steps of 4 x 256 tokens" "$v4_runs"
"$build/bench/compare_runs" "$out/muon_vs_adamw.png" "Muon vs AdamW on KJV, the same tokens per model" "${chart[@]}"
echo "plot: $out/muon_vs_adamw.png"
