#!/usr/bin/env bash
# What an async checkpoint save holds and what it costs the steps that run while it writes (issue
# 40): llama3 125M in f32 on one rank, 2 x 128 tokens, 9 steps, an async save after every second
# step (1.5 GB of masters and moments each), against the same run without saves; with AdamW in
# memory and with its moments swapped to a file. Per run: the largest per-step peak over steps
# 2..8 (metrics.jsonl peak_memory_bytes: total and temporaries, where the staging lives) and the
# mean step time of the steps that run while a save writes (3, 5, 7), and of the others.
#   bench/async_save_memory.sh BUILD_DIR [BEFORE_BUILD_DIR] [--section.key=value ...]
# BEFORE_BUILD_DIR: a build of the commit before streamed saves (its titan copies the state whole
# at the save's start; it does not know checkpoint.staging_mib), run the same way for comparison.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}; shift || true
before=""
if [[ $# -gt 0 && $1 != --* ]]; then before=$1; shift; fi
extra=("$@")
cd "$root"
echo "host: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc --all) cores; load $(cut -d' ' -f1-3 /proc/loadavg)"
scripts/prepare_data.sh "$build/titan" >/dev/null
work=$(mktemp -d /tmp/titan_bench_async_save.XXXXXX)
trap 'rm -rf "$work"' EXIT
run() {  # $1: titan binary, $2: name, rest: overrides
  "$1" train --config configs/llama3_125m.toml --job.dump_folder="$work/$2" --training.steps=9 \
    --training.seq_len=128 --training.local_batch_size=2 --training.mixed_precision_param=float32 \
    --lr_scheduler.warmup_steps=2 --metrics.log_freq=1 --validation.enable=false \
    --checkpoint.interval=2 --checkpoint.keep_latest_k=2 --checkpoint.last_save_model_only=true \
    --optimizer.swap_path="$work/swap" "${@:3}" "${extra[@]}" >/dev/null 2>&1 || { echo "$2: titan train failed"; return; }
  awk -v name="$2" '/"kind":"train"/ {
      match($0, /"step":[0-9]+/); step = substr($0, RSTART + 7, RLENGTH - 7) + 0
      if (step < 2 || step > 8) next
      match($0, /"step_seconds":[0-9.e+-]+/); s = substr($0, RSTART + 15, RLENGTH - 15) + 0
      match($0, /"total":[0-9.e+-]+/); t = substr($0, RSTART + 8, RLENGTH - 8) + 0
      match($0, /"temp":[0-9.e+-]+/); tmp = substr($0, RSTART + 7, RLENGTH - 7) + 0
      if (t > total) total = t
      if (tmp > temp) temp = tmp
      if (step % 2 == 1) { during += s; nd++ } else { other += s; no++ }
    } END { printf "%-26s %10.1f %10.1f %10.3f %10.3f\n", name, total / 1048576, temp / 1048576, during / nd, other / no }' \
    "$work/$2/metrics.jsonl"
}
printf "%-26s %10s %10s %10s %10s\n" "run" "peak MiB" "temp MiB" "s/step w" "s/step w/o"
for opt in memory swap; do
  o=(); [[ $opt == swap ]] && o=(--optimizer.swap=file --optimizer.swap_chunk_mb=64)
  run "$build/titan" "$opt: no saves" "${o[@]}" --checkpoint.enable=false
  [[ -n $before ]] && run "$before/titan" "$opt: async, before" "${o[@]}" --checkpoint.enable=true --checkpoint.async_mode=async
  run "$build/titan" "$opt: async, streamed" "${o[@]}" --checkpoint.enable=true --checkpoint.async_mode=async
done
echo "(s/step w: mean of steps 3, 5, 7, which run while the save of the step before writes; w/o: steps 2, 4, 6, 8)"
