#!/usr/bin/env bash
# Installs what is missing, builds (Release and ASan+UBSan), and runs every test.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh"
"$root/scripts/build.sh" "$root/build"
export OMP_PROC_BIND=close OMP_PLACES=cores
(cd "$root/build" && ctest --output-on-failure -j 2)
# The sanitizer build runs the unit and gradient-check tests (the slow end-to-end ones stay in
# Release), so it builds only them (at -O1 -g1: CMakeLists.txt).
BUILD_TYPE=RelWithDebInfo TARGET=sanitizer_tests "$root/scripts/build.sh" "$root/build-asan" -DTITAN_SANITIZE=ON \
  -DTITAN_BUILD_BENCH=OFF
(cd "$root/build-asan" && ASAN_OPTIONS=detect_leaks=1 LSAN_OPTIONS=suppressions="$root/tests/lsan.supp" \
  ctest --output-on-failure -j 2 -L "unit|gradcheck")
# A short fuzz run of every input parser (tests/fuzz/: clang + libFuzzer, its own build folder).
"$root/scripts/fuzz.sh" 10
