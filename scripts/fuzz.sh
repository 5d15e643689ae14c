#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz/ (clang, ASan + UBSan) in a build folder of their own and
# runs each on a copy of its seed corpus, tests/fuzz/corpus/<target>/. Usage:
#   scripts/fuzz.sh [SECONDS_PER_TARGET (30)] [BUILD_DIR (build-fuzz)]
# Prints each target's executions and findings (crash, sanitizer report, uncaught exception,
# hang over 10 s, over 2 GB) and exits non-zero on any; a finding's input is kept in
# BUILD_DIR/fuzz-findings/<target>/ (replay it: BUILD_DIR/tests/fuzz/<target> <file>).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
seconds=${1:-30}
build=${2:-$root/build-fuzz}
targets=(fuzz_config fuzz_tokenizer fuzz_safetensors fuzz_shard fuzz_checkpoint_metadata fuzz_train_state)

launcher=(); command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
export CCACHE_BASEDIR="$root" CCACHE_NOHASHDIR=1
CC=clang CXX=clang++ cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTITAN_FUZZ=ON \
  -DTITAN_BUILD_TESTS=OFF -DTITAN_BUILD_BENCH=OFF "${launcher[@]}" >/dev/null
cmake --build "$build" -j "$(nproc)" --target fuzz_targets

failed=0
for t in "${targets[@]}"; do
  # libFuzzer adds what it finds to the first corpus folder: a scratch copy, so the committed
  # seeds stay the few small files they are.
  work=$build/fuzz-run/$t findings=$build/fuzz-findings/$t
  rm -rf "$work" "$findings"
  mkdir -p "$work" "$findings"
  cp "$root/tests/fuzz/corpus/$t/"* "$work/"
  dict=$root/tests/fuzz/json.dict
  [ "$t" = fuzz_config ] && dict=$root/tests/fuzz/toml.dict
  [ "$t" = fuzz_shard ] && dict=""  # binary: byte mutations find their way without one
  rc=0
  "$build/tests/fuzz/$t" "$work" -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 \
    ${dict:+-dict="$dict"} -artifact_prefix="$findings/" >"$build/fuzz-run/$t.log" 2>&1 || rc=$?
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$build/fuzz-run/$t.log" | tail -1)
  found=$(find "$findings" -type f | wc -l)
  if ((rc != 0 || found > 0)); then
    failed=1
    echo "$t: ${runs:-?} executions, FINDING (exit $rc): $(grep -m1 -E '^==[0-9]+==ERROR|runtime error|terminate called|^SUMMARY' "$build/fuzz-run/$t.log" || true)"
    find "$findings" -type f -printf '  input kept: %p\n'
    echo "  log: $build/fuzz-run/$t.log"
  else
    echo "$t: ${runs:-?} executions in ${seconds} s, 0 crashes"
  fi
done
exit "$failed"
