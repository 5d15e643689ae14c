#!/usr/bin/env bash
# Muon against AdamW on the same tokens (issue 38's convergence figure): the llama3 debug model on
# the KJV corpus, a few learning rates each (Muon with match_rms_adamw shares AdamW's lr scale),
# each run's validation loss at the end, and every run's training loss in one PNG.
#   bench/muon_convergence.sh [BUILD_DIR] [--section.key=value ...]
#   (default: 150 steps of 8 x 256 tokens, warmup 10, validation over 10 batches at the end;
#    OUT=<folder> keeps the runs and the PNG there, else a temporary folder that is printed)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}; shift || true
extra=("$@")
cd "$root"
echo "host: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc --all) cores; load $(cut -d' ' -f1-3 /proc/loadavg)"
scripts/prepare_data.sh "$build/titan" >/dev/null
out=${OUT:-$(mktemp -d "${TITAN_BENCH_DIR:-/var/tmp}/titan_bench_muon.XXXXXX")}
mkdir -p "$out"
steps=150
runs=()
for run in "AdamW 8e-4" "AdamW 2e-3" "AdamW 4e-3" "Muon 8e-4" "Muon 2e-3" "Muon 4e-3" "Muon 8e-3"; do
  set -- $run
  dir="$out/${1}_$2"
  rm -rf "$dir"
  "$build/titan" train --config configs/llama3_debug.toml --job.dump_folder="$dir" --training.steps=$steps \
    --lr_scheduler.warmup_steps=10 --checkpoint.enable=false --metrics.log_freq=1 --metrics.enable_plots=false \
    --validation.enable=true --validation.freq=$steps --validation.steps=10 \
    --optimizer.name="$1" --optimizer.lr="$2" ${extra[@]+"${extra[@]}"} >"$dir.log" 2>&1
  echo "$1 lr $2: $(grep -o 'validation loss [0-9.]*' "$dir.log" | tail -1)"
  runs+=("$1 $2=$dir")
done
"$build/bench/compare_runs" "$out/muon_vs_adamw.png" "llama3 debug, KJV, $steps steps of 8 x 256 tokens" "${runs[@]}"
echo "plot: $out/muon_vs_adamw.png"
