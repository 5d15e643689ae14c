#!/usr/bin/env bash
# The swap optimizer against AdamW in memory (issue "Memory at scale"): the same llama3 125M run
# with its moments in memory and in a file streamed through two chunk buffers. Prints per run the
# mean step time (steps 2..N; metrics.jsonl step_seconds), the peak bytes of the optimizer-state
# category, and the ratios. The swap file is opened with O_DIRECT where the filesystem allows
# (the run's log says which): every step reads and writes the disk itself, the page cache neither
# serves the reads nor absorbs the writes, so the figure is what a disk-backed step costs.
#   bench/swap_optimizer.sh [BUILD_DIR] [--section.key=value ...]
#   (default: 10 steps of 2 x 512 tokens, bf16 mixed precision, 64 MiB chunks, swap in the run's folder)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}; shift || true
cd "$root"
echo "host: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc --all) cores; load $(cut -d' ' -f1-3 /proc/loadavg)"
scripts/prepare_data.sh "$build/titan" >/dev/null
work=$(mktemp -d "${TITAN_BENCH_DIR:-/var/tmp}/titan_bench_swap.XXXXXX")
trap 'rm -rf "$work"' EXIT
steps=10
run() {  # $1: name, rest: overrides
  "$build/titan" train --config configs/llama3_125m.toml --job.dump_folder="$work/$1" --training.steps=$steps \
    --training.seq_len=512 --training.local_batch_size=2 --training.global_batch_size=2 \
    --lr_scheduler.warmup_steps=2 --metrics.log_freq=1 --metrics.enable_plots=false \
    --validation.enable=false --checkpoint.enable=false "${@:2}" | grep -E "swapped to" >&2 || true
  awk -v name="$1" -v last=$steps '/"kind":"train"/ {
      match($0, /"step":[0-9]+/); step = substr($0, RSTART + 7, RLENGTH - 7) + 0
      match($0, /"optim":[0-9]+/); optim = substr($0, RSTART + 8, RLENGTH - 8) + 0
      if (step < 2 || step > last) next
      match($0, /"step_seconds":[0-9.e+-]+/); s = substr($0, RSTART + 15, RLENGTH - 15) + 0
      total += s; n++
    } END { printf "%s %.4f %d %d\n", name, total / n, optim, n }' "$work/$1/metrics.jsonl"
}
{
  run memory --optimizer.swap=none
  run swap --optimizer.swap=file "$@"
} | awk '{ name[NR] = $1; step[NR] = $2; optim[NR] = $3; n = $4 }
  END {
    printf "%-8s %12s %16s   (llama3 125M, mean of steps 2..%d)\n", "moments", "step s", "optimizer MiB", n + 1
    for (i = 1; i <= NR; i++) printf "%-8s %12.3f %16.1f\n", name[i], step[i], optim[i] / 1048576
    printf "swap / memory: step time %.3fx, optimizer memory %.3fx\n", step[2] / step[1], optim[2] / optim[1]
  }'
