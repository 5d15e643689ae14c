#!/usr/bin/env bash
# MoE under tensor parallelism, the two schemes side by side (issue "Distributed training 2"): the
# DeepSeek-V3 debug model, 1 thread per rank, the same batch per TP group, f32.
#   fix         torchtitan-npu's MoE TP fix (moe_tp_scheme = "sequence"): each TP rank routes its own
#               sequence piece to whole routed experts; only the shared experts communicate over TP
#               (one all-gather, one reduce-scatter);
#   TorchTitan  v0.2's scheme ("gather"): the tokens all-gathered at the MoE input, every TP rank
#               routes all of them through its slice of every expert's hidden units, the partial
#               sums reduce-scattered.
# Two settings:
#   TP 2 on 2 ranks, no EP: the fix keeps the routed experts whole on both TP ranks and all-reduces
#     their gradients over TP once per step; TorchTitan's scheme splits them. Also the fix + EP 2
#     (the TP pair as expert-parallel group).
#   FSDP 2 x TP 2 on 4 ranks with expert parallelism, each rank holding a quarter of the routed
#     experts in both (the setting torchtitan-npu's fix is for, "TP extends EP"): the fix with EP 4
#     (every rank whole experts, each TP rank dispatching its own tokens) against TorchTitan's
#     expert-tensor parallelism, EP 2 over the FSDP pair x each expert's hidden units over TP 2
#     (every TP rank dispatching all the gathered tokens).
# Prints each run's JSON line (bench_distributed.cpp), then per run the MoE layers' bytes per step
# by collective (rank 0's) and the step time, and the ratios against TorchTitan's scheme.
#   bench/moe_tp.sh [BUILD_DIR] [--section.key=value ...]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}; shift || true
bench=$build/bench/bench_distributed
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
common=(--config "$root/configs/deepseek_v3_debug.toml" --steps 6 --warmup 2 --training.seq_len=256
        --training.mixed_precision_param=float32 --parallelism.tensor_parallel_degree=2 "$@")
cd "$root"
echo "host: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores"
# run NAME RANKS SCHEME EP SHARD LOCAL_BATCH: one JSON line
run() {
  local line
  line=$(OMP_NUM_THREADS=1 mpirun --bind-to none -np "$2" "$bench" "${common[@]}" --parallelism.moe_tp_scheme="$3" \
         --parallelism.expert_parallel_degree="$4" --parallelism.data_parallel_shard_degree="$5" \
         --training.local_batch_size="$6" | tail -1)
  echo "$1: $line" >&2
  echo "$line"
}
# Step times move by 10-15% from one run to the next on a shared 2-core machine: the runs of each
# setting alternate, ROUNDS times (default 3), and each configuration's median is reported.
rounds=${ROUNDS:-3}
lines=()
for ((i = 0; i < rounds; ++i)); do
  lines+=("$(run "TP 2, fix" 2 sequence 1 1 4)" "$(run "TP 2, TorchTitan" 2 gather 1 1 4)"
          "$(run "TP 2, fix + EP 2" 2 sequence 2 1 4)" "$(run "FSDP 2 x TP 2, fix + EP 4" 4 sequence 4 2 2)"
          "$(run "FSDP 2 x TP 2, TorchTitan EP 2 x expert TP 2" 4 gather 2 2 2)")
done
python3 - "$rounds" "${lines[@]}" <<'PY'
import json, statistics, sys
rounds, runs = int(sys.argv[1]), [json.loads(a) for a in sys.argv[2:]]
r = []
for k in range(5):  # per configuration: the first run's traffic (the same every run), the median step time
    mine = runs[k::5]
    x = dict(mine[0])
    x["seconds_per_step"] = statistics.median(m["seconds_per_step"] for m in mine)
    x["tokens_per_second"] = statistics.median(m["tokens_per_second"] for m in mine)
    x["all_seconds"] = [round(m["seconds_per_step"], 3) for m in mine]
    r.append(x)
layers = r[0]["model_dims"]["n_layers"] - r[0]["model_dims"]["n_dense_layers"]
# The runs of a setting differ only in the MoE layers: TP's all-gather + reduce-scatter around
# them (per layer and micro-batch; the attention's pairs are the same in both), EP's all-to-alls,
# the replicated weights' gradients over TP, and FSDP (the experts' shards, where any).
def parts(x):
    t = x["traffic_by_group"]
    act = t.get("tp all_gather", 0) + t.get("tp reduce_scatter", 0)
    a2a = sum(v for k, v in t.items() if k.startswith("ep "))
    grad = t.get("tp all_reduce", 0)
    fsdp = sum(v for k, v in t.items() if k.startswith("fsdp ") or k.startswith("efsdp "))
    return act, a2a, grad, fsdp
def report(title, runs):
    print(title)
    base = runs["TorchTitan"]
    bt = sum(parts(base))
    for name, x in runs.items():
        act, a2a, grad, fsdp = parts(x)
        total = act + a2a + grad + fsdp
        print(f"  {name}: {x['seconds_per_step']:.3f} s/step ({x['seconds_per_step'] / base['seconds_per_step']:.3f}x "
              f"TorchTitan's), {x['tokens_per_second']:.0f} tokens/s; bytes/step {total / 1e6:.2f} MB "
              f"({total / bt:.3f}x): TP activations {act / 1e6:.2f}, EP all-to-all {a2a / 1e6:.2f} "
              f"({a2a / layers / 1e6:.2f} per MoE layer), TP gradient all-reduce {grad / 1e6:.2f}, FSDP {fsdp / 1e6:.2f}; "
              f"step times {x['all_seconds']}")
print(f"median of {rounds} alternating runs per configuration")
report("TP 2 (2 ranks, 4 x 256 tokens per step):", {"fix": r[0], "TorchTitan": r[1], "fix + EP 2": r[2]})
report("FSDP 2 x TP 2 with EP, a quarter of the experts per rank (4 ranks, 4 x 256 tokens per step):",
       {"fix + EP 4": r[3], "TorchTitan": r[4]})
PY
