#!/usr/bin/env bash
# MoE under tensor parallelism, the two schemes in one run (issue "Distributed training 2"): the
# DeepSeek-V3 debug model at TP 2 x 1 thread, the same batch,
#   sequence  torchtitan-npu's MoE TP fix: each rank routes its own sequence piece to whole routed
#             experts; only the shared experts communicate (one all-gather, one reduce-scatter);
#   gather    TorchTitan v0.2's scheme: the tokens all-gathered at the MoE input, every rank routes
#             all of them through its half of every expert's hidden units, the sum reduce-scattered.
# Prints each run's JSON line (bench_distributed.cpp), then per scheme the TP bytes per step and per
# MoE layer and the step time, and the ratio of the two.
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
for scheme in sequence gather; do
  out[$scheme]=$(OMP_NUM_THREADS=1 mpirun --bind-to none -np 2 "$bench" "${common[@]}" --parallelism.moe_tp_scheme=$scheme | tail -1)
  echo "$scheme: ${out[$scheme]}"
done
python3 - "${out[sequence]}" "${out[gather]}" <<'PY'
import json, sys
runs = {"sequence (MoE TP fix)": json.loads(sys.argv[1]), "gather (TorchTitan)": json.loads(sys.argv[2])}
for name, r in runs.items():
    t = r["traffic_by_group"]
    tp = sum(v for k, v in t.items() if k.startswith("tp "))
    print(f"{name}: {r['seconds_per_step']:.3f} s/step, {r['tokens_per_second']:.0f} tokens/s; TP bytes/step {tp / 1e6:.2f} MB "
          f"(" + ", ".join(f"{k} {v / 1e6:.2f}" for k, v in sorted(t.items()) if k.startswith("tp ")) + ")")
a, b = runs["sequence (MoE TP fix)"], runs["gather (TorchTitan)"]
act = lambda r: r["traffic_by_group"].get("tp all_gather", 0) + r["traffic_by_group"].get("tp reduce_scatter", 0)
grad = lambda r: r["traffic_by_group"].get("tp all_reduce", 0)
layers = a["model_dims"]["n_layers"] - a["model_dims"]["n_dense_layers"]
# The two schemes differ only in the MoE layers: activations move per layer and micro-batch, the
# replicated weights' gradients once per step (the fix keeps the routed experts whole on every TP
# rank without expert parallelism, so their gradients are all-reduced over TP).
print(f"activation traffic (all-gather + reduce-scatter), MoE layers: fix {act(a) / 1e6:.2f} MB, TorchTitan "
      f"{act(b) / 1e6:.2f} MB per step: {act(a) / act(b):.3f}x")
print(f"gradient all-reduce per step (replicated weights): fix {grad(a) / 1e6:.2f} MB, TorchTitan {grad(b) / 1e6:.2f} MB")
print(f"step time: fix {a['seconds_per_step']:.3f} s, TorchTitan {b['seconds_per_step']:.3f} s: "
      f"{a['seconds_per_step'] / b['seconds_per_step']:.3f}x ({(b['seconds_per_step'] - a['seconds_per_step']) / layers * 1e3:.1f} "
      f"ms per MoE layer and step over {layers} layers)")
PY
