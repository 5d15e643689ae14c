#!/usr/bin/env bash
# What a checkpoint costs the training loop (issue "Fault tolerance"): the same run without
# saves, with synchronous saves and with asynchronous ones every INTERVAL steps. Per run, the time
# of the steps that log (1..N-1) plus the time training was blocked in saves
# (metrics.jsonl: step_seconds + checkpoint_seconds), against the run without saves. An async
# save blocks only for the staging copy; its writer thread (and fsync) then competes with the
# steps that follow, which step_seconds includes.
#   bench/checkpoint.sh [BUILD_DIR] [--section.key=value ...]
#   (default: llama3 125M in f32 on one rank, 2 x 128 tokens, 13 steps, a save every 4: ~1.5 GB each)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}; shift || true
cd "$root"
echo "host: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc --all) cores; load $(cut -d' ' -f1-3 /proc/loadavg)"
scripts/prepare_data.sh "$build/titan" >/dev/null
work=$(mktemp -d /tmp/titan_bench_ckpt.XXXXXX)
trap 'rm -rf "$work"' EXIT
run() {  # $1: name, rest: overrides
  "$build/titan" train --config configs/llama3_125m.toml --job.dump_folder="$work/$1" --training.steps=13 \
    --training.seq_len=128 --training.local_batch_size=2 --training.mixed_precision_param=float32 \
    --lr_scheduler.warmup_steps=2 --metrics.log_freq=1 \
    --validation.enable=false --checkpoint.interval=4 --checkpoint.keep_latest_k=2 \
    --checkpoint.last_save_model_only=true "${@:2}" >/dev/null
  # Steps 2..12: the first step warms up, the last one's save is the final (synchronous) export.
  awk -v name="$1" '/"kind":"train"/ {
      match($0, /"step":[0-9]+/); step = substr($0, RSTART + 7, RLENGTH - 7) + 0
      if (step < 2 || step > 12) next
      match($0, /"step_seconds":[0-9.e+-]+/); s = substr($0, RSTART + 15, RLENGTH - 15) + 0
      c = 0; if (match($0, /"checkpoint_seconds":[0-9.e+-]+/)) c = substr($0, RSTART + 21, RLENGTH - 21) + 0
      steps += s; saves += c; n++
    } END { printf "%s %.4f %.4f %d\n", name, steps, saves, n }' "$work/$1/metrics.jsonl"
}
{
  run none --checkpoint.enable=false
  run sync --checkpoint.enable=true --checkpoint.async_mode=disabled
  run async --checkpoint.enable=true --checkpoint.async_mode=async
} | awk '{ name[NR] = $1; steps[NR] = $2; saves[NR] = $3; n = $4 }
  END {
    base = steps[1] + saves[1]
    printf "%-6s %10s %12s %10s %9s   (steps 2..12, saves after steps 4 and 8)\n", "saves", "steps s", "blocked s", "total s", "/ none"
    for (i = 1; i <= NR; i++)
      printf "%-6s %10.2f %12.2f %10.2f %9.3f\n", name[i], steps[i], saves[i], steps[i] + saves[i], (steps[i] + saves[i]) / base
  }'
