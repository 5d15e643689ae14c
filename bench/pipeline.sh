#!/usr/bin/env bash
# Pipeline bubbles of every schedule at PP 2 (2 ranks x 1 thread; issue "Distributed training 3"):
# measured against the simulator fed with this run's per-stage costs, and the closed form.
#   bench/pipeline.sh [BUILD_DIR] [--section.key=value ...]   (default: llama3 debug, f32, 8 micro-batches of 1 x 256 tokens)
set -euo pipefail
source "$(dirname "$0")/ranks_one_thread.sh"
shift || true
out=$(mktemp)
trap 'rm -f "$out"' EXIT
mpirun -np 2 "$build/bench/bench_pipeline" --steps 8 --warmup 2 --training.seq_len=256 --training.local_batch_size=8 \
  --training.mixed_precision_param=float32 --lr_scheduler.warmup_steps=2 "$@" | grep '^{' > "$out"
python3 - "$out" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print(f"{'schedule':16} {'step ms':>8} {'measured':>9} {'replayed':>9} {'ratio':>6} {'stage means':>11} {'ratio':>6}"
      f" {'closed':>7} {'in flight':>9} {'waiting':>8} {'sending':>8} {'other':>6}")
for r in rows:
    print(f"{r['schedule']:16} {r['step_ms']:8.0f} {r['bubble_measured']:9.3f} {r['bubble_replayed']:9.3f} "
          f"{r['measured_over_replayed']:6.2f} {r['bubble_simulated']:11.3f} {r['measured_over_simulated']:6.2f} "
          f"{r['bubble_closed_form']:7.3f} {r['peak_in_flight']:9d}"
          f" {r['waiting_share']:8.3f} {r['sending_share']:8.3f} {r['other_share']:6.3f}")
print(f"simulated with each stage's measured F / B (or I, W) and, per transfer, {rows[0]['transfer_ms']:.3f} ms "
      f"on the wire (ping-pong) + {rows[0]['send_ms']:.3f} ms of the sender's hand-over (measured)")
PY
