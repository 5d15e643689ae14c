#!/usr/bin/env bash
# Developer-only: titan's DDP and FSDP over 2 ranks against PyTorch's (gloo; DDP and FSDP2
# fully_shard) on the Llama-3 debugmodel, same cores, one run at a time; prints a table of the
# tokens/s and peak-memory-per-rank ratios. See reference/bench_distributed_torch.py.
#   reference/compare_distributed.sh [TITAN] [extra args: --dtypes float32,bfloat16 --repeats 3 --steps 10 ...]
# PYTHON: the interpreter with torch (default reference/.venv/bin/python, made by setup_venv.sh).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
titan=${1:-$here/../build/titan}; shift || true
python=${PYTHON:-$here/.venv/bin/python}
[[ -x "$titan" ]] || { echo "compare_distributed: $titan is missing; build it (TARGET=titan scripts/build.sh build)" >&2; exit 1; }
[[ -d "$here/../data/kjv" ]] || { echo "compare_distributed: data/kjv is missing; run scripts/prepare_data.sh" >&2; exit 1; }
# The profiler's warnings about blocks allocated before it started are expected (see the script).
exec "$python" "$here/bench_distributed_torch.py" compare --titan "$titan" "$@" \
  2> >(grep -v -e 'CPUAllocator.cpp' -e 'USDT:' -e 'DeviceProperties.cpp' >&2)
