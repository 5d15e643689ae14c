#!/usr/bin/env bash
# Configures and builds titan.cpp. Usage: [TARGET=name] scripts/build.sh [build-dir] [extra cmake args...]
# TARGET builds one target (e.g. titan, the binary alone); unset, everything (tests, benchmarks).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}; shift || true
launcher=(); command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-Release}" "${launcher[@]}" "$@" >/dev/null
cmake --build "$build" -j "$(nproc)" ${TARGET:+--target "$TARGET"}
