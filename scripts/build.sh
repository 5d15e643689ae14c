#!/usr/bin/env bash
# Configures and builds titan.cpp. Usage: [TARGET=name] scripts/build.sh [build-dir] [extra cmake args...]
# TARGET builds one target (e.g. titan, the binary alone); unset, everything (tests, benchmarks).
# TITAN_BUILD_TESTS=OFF configures without the tests and benchmarks (and so without GoogleTest,
# which scripts/setup.sh --binary does not install); every call sets it, so a later call builds them.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}; shift || true
launcher=(); command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
# Paths relative to the checkout in ccache's keys (debug-info builds hash the working folder too),
# so a fresh clone elsewhere, as CI makes, reuses what any checkout on this machine compiled.
export CCACHE_BASEDIR="$root" CCACHE_NOHASHDIR=1
tests=${TITAN_BUILD_TESTS:-ON}
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-Release}" "${launcher[@]}" \
  -DTITAN_BUILD_TESTS="$tests" -DTITAN_BUILD_BENCH="$tests" "$@" >/dev/null
cmake --build "$build" -j "$(nproc)" ${TARGET:+--target "$TARGET"}
