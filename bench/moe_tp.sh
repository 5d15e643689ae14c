#!/usr/bin/env bash
# MoE under tensor parallelism, the two schemes in one run (issue "Distributed training 2"): the
# DeepSeek-V3 debug model at TP 2 x 1 thread, the same batch,
#   sequence  torchtitan-npu's MoE TP fix: each rank routes its own sequence piece to whole routed
#             experts; only the shared experts communicate (one all-gather, one reduce-scatter);
#   gather    TorchTitan v0.2's scheme: the tokens all-gathered at the MoE input, every rank routes
#             all of them through its half of every expert's hidden units, the sum reduce-scattered;
#   sequence + EP 2  the fix with the two TP ranks as an expert-parallel group (each holds half the
#             routed experts, rows exchanged by all-to-all; no expert gradient all-reduced over TP).
# Prints each run's JSON line (bench_distributed.cpp), then per run the bytes per step by
# collective and the step time, and the ratios against TorchTitan's scheme.
#   bench/moe_tp.sh [BUILD_DIR] [--section.key=value ...]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}; shift || true
bench=$build/bench/bench_distributed
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
common=(--config "$root/configs/deepseek_v3_debug.toml" --steps 6 --warmup 2 --training.seq_len=256
        --training.local_batch_size=4 --training.mixed_precision_param=float32 --parallelism.tensor_parallel_degree=2
        --parallelism.data_parallel_shard_degree=1 "$@")
cd "$root"
echo "host: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores"
declare -A out
for run in sequence gather sequence_ep; do
  scheme=${run%_ep}; ep=1; [ "$run" = sequence_ep ] && ep=2
  out[$run]=$(OMP_NUM_THREADS=1 mpirun --bind-to none -np 2 "$bench" "${common[@]}" --parallelism.moe_tp_scheme=$scheme \
              --parallelism.expert_parallel_degree=$ep | tail -1)
  echo "$run: ${out[$run]}"
done
python3 - "${out[sequence]}" "${out[gather]}" "${out[sequence_ep]}" <<'PY'
import json, sys
runs = {"fix": json.loads(sys.argv[1]), "TorchTitan": json.loads(sys.argv[2]), "fix + EP 2": json.loads(sys.argv[3])}
layers = runs["fix"]["model_dims"]["n_layers"] - runs["fix"]["model_dims"]["n_dense_layers"]
# The runs differ only in the MoE layers: activations move per layer and micro-batch (TP's
# all-gather + reduce-scatter, EP's all-to-alls), the replicated weights' gradients once per step
# (without EP the fix keeps the routed experts whole on every TP rank, so their gradients are
# all-reduced over TP; with EP each rank holds its own experts).
def parts(r):
    t = r["traffic_by_group"]
    act = t.get("tp all_gather", 0) + t.get("tp reduce_scatter", 0)
    a2a = sum(v for k, v in t.items() if k.startswith("ep "))
    grad = t.get("tp all_reduce", 0)
    return act, a2a, grad
base = runs["TorchTitan"]
for name, r in runs.items():
    act, a2a, grad = parts(r)
    total = act + a2a + grad
    bt = sum(parts(base))
    print(f"{name}: {r['seconds_per_step']:.3f} s/step ({r['seconds_per_step'] / base['seconds_per_step']:.3f}x TorchTitan's), "
          f"{r['tokens_per_second']:.0f} tokens/s; bytes/step {total / 1e6:.2f} MB ({total / bt:.3f}x): TP activations "
          f"{act / 1e6:.2f} (every layer's), EP all-to-all {a2a / 1e6:.2f} ({a2a / layers / 1e6:.2f} per MoE layer), "
          f"TP gradient all-reduce {grad / 1e6:.2f}")
PY
