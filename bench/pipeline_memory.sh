#!/usr/bin/env bash
# Pipeline memory per rank (issue "Distributed training 3", issue 40): PP 2 x FSDP 2 under DualPipeV
# against 1F1B, and against PP 2 without FSDP, on the llama3 debug model (f32, 8 micro-batches of
# 1 x 256 tokens per pipeline). Each run's peak is the busiest rank's (bench_distributed.cpp): in all,
# parameters + gradients + optimizer state after a step, and activations; and its median step time
# and FSDP bytes per step. FSDP under PP by default works per micro-batch (pipeline_parallel_fsdp =
# "zero3": each micro-batch's gradients reduce-scattered as its weight gradient completes, units
# gathered per use); "per_step" is the old way: the stage's gradients unsharded until the step's
# last weight gradient (once in place; as the tree's partial sums with the tree sum), its
# parameters gathered from first use.
#   bench/pipeline_memory.sh [BUILD_DIR] [--section.key=value ...]
set -euo pipefail
source "$(dirname "$0")/ranks_one_thread.sh"
shift || true
bench=$build/bench/bench_distributed
common=(--config "$root/configs/llama3_debug.toml" --steps 3 --warmup 2 --training.seq_len=256
        --training.local_batch_size=8 --training.mixed_precision_param=float32 --lr_scheduler.warmup_steps=2
        --parallelism.pipeline_parallel_degree=2 --parallelism.pipeline_parallel_microbatch_size=1 "$@")
# run RANKS SCHEDULE SHARD [more overrides]: one JSON line
run() {
  mpirun --bind-to none -np "$1" "$bench" "${common[@]}" --parallelism.pipeline_parallel_schedule="$2" \
    --parallelism.data_parallel_shard_degree="$3" "${@:4}" | tail -1
}
pp_1f1b=$(run 2 1F1B 1)
pp_dualpipev=$(run 2 DualPipeV 1)
fsdp_1f1b=$(run 4 1F1B 2)
fsdp_dualpipev=$(run 4 DualPipeV 2)
fsdp_dualpipev_tree=$(run 4 DualPipeV 2 --parallelism.pipeline_parallel_gradient_sum=tree)
per_step=$(run 4 DualPipeV 2 --parallelism.pipeline_parallel_fsdp=per_step)
per_step_always=$(run 4 DualPipeV 2 --parallelism.pipeline_parallel_fsdp=per_step --parallelism.fsdp_reshard_after_forward=always)
per_step_tree=$(run 4 DualPipeV 2 --parallelism.pipeline_parallel_fsdp=per_step --parallelism.pipeline_parallel_gradient_sum=tree)
python3 - "$pp_1f1b" "$pp_dualpipev" "$fsdp_1f1b" "$fsdp_dualpipev" "$fsdp_dualpipev_tree" "$per_step" "$per_step_always" \
  "$per_step_tree" <<'PY'
import json, sys
names = ["PP 2, 1F1B", "PP 2, DualPipeV", "PP 2 x FSDP 2, 1F1B", "PP 2 x FSDP 2, DualPipeV",
         "  the same, tree sum", "  per_step (the old way)", "  per_step, reshard always", "  per_step, tree sum"]
runs = dict(zip(names, (json.loads(a) for a in sys.argv[1:])))
mb = lambda b: b / 2**20
print(f"{'layout':28} {'peak MiB':>9} {'params+grads+optim':>19} {'activations':>12} {'s/step':>7} "
      f"{'AG MiB/step':>12} {'RS MiB/step':>12}")
for name, r in runs.items():
    t = r["traffic"]
    print(f"{name:28} {mb(r['peak_bytes_per_rank']):9.1f} {mb(r['params_grads_optimizer_bytes_per_rank']):19.1f} "
          f"{mb(r['activation_peak_bytes_per_rank']):12.1f} {r['seconds_per_step']:7.3f} "
          f"{mb(t['all_gather']['bytes_per_step']):12.2f} {mb(t['reduce_scatter']['bytes_per_step']):12.2f}")
d = runs["PP 2 x FSDP 2, DualPipeV"]["peak_bytes_per_rank"]
for other in ["  per_step (the old way)", "PP 2 x FSDP 2, 1F1B", "PP 2, DualPipeV", "PP 2, 1F1B"]:
    print(f"PP 2 x FSDP 2 DualPipeV peak / {other.strip()}: {d / runs[other]['peak_bytes_per_rank']:.3f}")
PY
