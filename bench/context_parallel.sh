#!/usr/bin/env bash
# DSA context parallelism, measured (issue "Distributed training 2"): the DeepSeek-V3.2 debug model's
# sparse stage at one sequence length on 1 rank x all threads and on CP 4 (4 ranks x 1 thread,
# FSDP over them), the same batch. Prints each run's JSON line (bench_distributed.cpp) and:
#   the per-rank activation peak of CP 4 against the 1-rank run's (target <= 0.35x);
#   the DSA all-gather + reduce-scatter bytes per step against the analytic minimum,
#     (c-1)/c x B x L x (d_c + d_r + d_I) x bytes per layer and direction (x2 forward with full AC);
#   those bytes against a ring over the un-absorbed K/V of the same layers (H x (d_qk + d_v) per
#     token; forward K/V, backward K/V again plus their f32 gradients; target <= 1/10).
#   bench/context_parallel.sh [BUILD_DIR] [SEQ_LEN] [--section.key=value ...]   (default 32768: minutes per step)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}; shift || true
seq=${1:-32768}; shift || true
bench=$build/bench/bench_distributed
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
cores=$(nproc)
# bench_distributed turns checkpoints off: the weights are a fresh init (the speed and bytes do not depend on them).
common=(--config "$root/configs/deepseek_v32_cpt_32k.toml" --steps 1 --warmup 1 --training.seq_len="$seq" "$@")
cd "$root"
echo "host: $(lscpu | sed -n 's/^Model name: *//p'), $cores cores; sequence $seq tokens"
one=$(OMP_NUM_THREADS=$cores "$bench" "${common[@]}" --parallelism.context_parallel_degree=1 | tail -1)
echo "1 rank x $cores threads: $one"
cp4=$(OMP_NUM_THREADS=1 mpirun --bind-to none -np 4 "$bench" "${common[@]}" --parallelism.context_parallel_degree=4 | tail -1)
echo "CP 4 x 1 thread: $cp4"
python3 - "$one" "$cp4" <<'PY'
import json, sys
one, cp = json.loads(sys.argv[1]), json.loads(sys.argv[2])
d, c = cp["model_dims"], cp["cp"]
tokens = cp["local_batch_size"] * cp["seq_len"]
b = cp["compute_bytes"]
row = d["kv_lora_rank"] + d["qk_rope_head_dim"] + d["index_head_dim"]
gathers = 2 if cp["activation_checkpoint"] == "full" else 1
minimum_ag = gathers * d["n_layers"] * (c - 1) / c * tokens * row * b
minimum_rs = d["n_layers"] * (c - 1) / c * tokens * row * b
t = cp["traffic_by_group"]
ag, rs = t.get("cp all_gather", 0), t.get("cp reduce_scatter", 0)
kv = d["n_heads"] * (d["qk_nope_head_dim"] + d["qk_rope_head_dim"] + d["v_head_dim"])
ring = d["n_layers"] * ((c - 1) / c * tokens * kv * b * 2 + tokens * kv * 4)
print(f"per-rank activation peak: CP {c} {cp['activation_peak_bytes_per_rank'] / 2**20:.1f} MiB, 1 rank "
      f"{one['activation_peak_bytes_per_rank'] / 2**20:.1f} MiB: {cp['activation_peak_bytes_per_rank'] / one['activation_peak_bytes_per_rank']:.3f}x (target <= 0.35x)")
print(f"DSA all-gather {ag / 1e6:.2f} MB/step, minimum {minimum_ag / 1e6:.2f}: ratio {ag / minimum_ag:.4f}")
print(f"DSA reduce-scatter {rs / 1e6:.2f} MB/step, minimum {minimum_rs / 1e6:.2f}: ratio {rs / minimum_rs:.4f}")
print(f"DSA CP bytes (forward + backward, no recompute) against a ring over the un-absorbed K/V: "
      f"{(minimum_rs * 2) / ring:.3f} (target <= 0.1); forward alone {row / kv:.3f}")
print(f"step time: 1 rank {one['seconds_per_step']:.1f} s, CP {c} {cp['seconds_per_step']:.1f} s")
PY
