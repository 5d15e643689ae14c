#!/usr/bin/env bash
# Ring attention, measured (issue "Distributed training 2"): the llama3 debug model at one
# sequence length on 1 rank x all threads and on CP 4 (4 ranks x 1 thread), one sequence per step.
# Prints each run's JSON line (bench_distributed.cpp) and:
#   the ring's bytes sent per rank and step against the schedule, n_layers x (c-1) x n x
#     (2 bytes + 4) with n = this rank's key and value elements (2 S/2c tokens x n_kv_heads x
#     2 head_dim): forward and backward send the keys and values (activation dtype), backward
#     their f32 gradients; with full activation checkpointing the forward runs twice;
#   the per-rank activation peak of CP 4 against the 1-rank run's, and tokens/s of both.
#   bench/ring_attention.sh [BUILD_DIR] [SEQ_LEN] [--section.key=value ...]   (default 8192)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}; shift || true
seq=${1:-8192}; shift || true
bench=$build/bench/bench_distributed
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
cores=$(nproc)
common=(--config "$root/configs/llama3_debug.toml" --steps 2 --warmup 1 --training.seq_len="$seq"
        --training.local_batch_size=1 --training.global_batch_size=1 "$@")
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
local_tokens = cp["local_batch_size"] * cp["seq_len"] / c
n = local_tokens * d["n_kv_heads"] * 2 * d["head_dim"]
forwards = 2 if cp["activation_checkpoint"] == "full" else 1
want = d["n_layers"] * (c - 1) * n * ((forwards + 1) * cp["compute_bytes"] + 4)
got = cp["traffic_by_group"].get("cp send", 0)
print(f"ring sends {got / 1e6:.2f} MB/step per rank, schedule {want / 1e6:.2f}: ratio {got / want:.4f}")
print(f"per-rank activation peak: CP {c} {cp['activation_peak_bytes_per_rank'] / 2**20:.1f} MiB, 1 rank "
      f"{one['activation_peak_bytes_per_rank'] / 2**20:.1f} MiB: {cp['activation_peak_bytes_per_rank'] / one['activation_peak_bytes_per_rank']:.3f}x")
print(f"tokens/s: 1 rank {one['tokens_per_second']:.0f}, CP {c} {cp['tokens_per_second']:.0f} "
      f"({cp['tokens_per_second'] / one['tokens_per_second']:.2f}x; exposed communication {cp['exposed_comm_share']:.1%})")
PY
