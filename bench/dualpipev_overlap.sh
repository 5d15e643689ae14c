#!/usr/bin/env bash
# DualPipeV's F&B pairs with expert parallelism (issue "Distributed training 3"): PP 2 x EP 2 on 4
# ranks (the deepseek_v3 debug model, f32, 4 micro-batches of 1 x 256 tokens per pipeline, 1 thread
# per rank), each overlapped pair run as a compute pair (the forward and the backward taking turns
# at every expert all-to-all, parallelism.pipeline_parallel_expert_parallel_overlap = true) against
# the same pairs one action after the other (false). Prints per setting the median step time and the
# exposed communication share (the most any rank spent blocked in a collective, over the step time;
# bench_distributed.cpp), the runs alternating ROUNDS times (default 3), and the ratios.
#   bench/dualpipev_overlap.sh [BUILD_DIR] [--section.key=value ...]
set -euo pipefail
source "$(dirname "$0")/ranks_one_thread.sh"
shift || true
bench=$build/bench/bench_distributed
common=(--config "$root/configs/deepseek_v3_debug.toml" --steps 4 --warmup 2 --training.seq_len=256
        --training.local_batch_size=4 --training.mixed_precision_param=float32 --lr_scheduler.warmup_steps=2
        --parallelism.pipeline_parallel_degree=2 --parallelism.pipeline_parallel_schedule=DualPipeV
        --parallelism.pipeline_parallel_microbatch_size=1 --parallelism.data_parallel_shard_degree=2
        --parallelism.expert_parallel_degree=2 "$@")
run() {
  local line
  line=$(mpirun --bind-to none -np 4 "$bench" "${common[@]}" \
         --parallelism.pipeline_parallel_expert_parallel_overlap="$1" | tail -1)
  echo "overlap $1: $line" >&2
  echo "$line"
}
rounds=${ROUNDS:-3}
lines=()
for ((i = 0; i < rounds; ++i)); do lines+=("$(run true)" "$(run false)"); done
python3 - "${lines[@]}" <<'PY'
import json, statistics, sys
runs = [json.loads(a) for a in sys.argv[1:]]
def summary(mine):
    return (statistics.median(m["seconds_per_step"] for m in mine), statistics.median(m["exposed_comm_share"] for m in mine),
            [round(m["seconds_per_step"], 3) for m in mine])
on, off = summary(runs[0::2]), summary(runs[1::2])
for name, (t, exposed, all_t) in (("pairs taking turns", on), ("pairs one after the other", off)):
    print(f"{name:26} {t:.3f} s/step (runs {all_t}), exposed communication {100 * exposed:.1f}% of the step")
print(f"taking turns / one after the other: step time {on[0] / off[0]:.3f}x, exposed share {on[1] / max(off[1], 1e-9):.3f}x")
PY
