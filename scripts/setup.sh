#!/usr/bin/env bash
# Installs the Debian packages titan.cpp needs (idempotent: installs only what is missing).
#   scripts/setup.sh            everything: the binary, the tests, the fuzzers, the multi-host test
#   scripts/setup.sh --binary   what building and running the titan binary needs (scripts/main.sh)
set -euo pipefail
packages=(
  build-essential cmake ccache pkg-config
  libdnnl-dev libopenmpi-dev openmpi-bin
  libtomlplusplus-dev nlohmann-json3-dev libcli11-dev libfmt-dev libspdlog-dev
  libxxhash-dev libpcre2-dev
  libprotobuf-dev protobuf-compiler libboost-dev libcairo2-dev fonts-dejavu-core  # TensorBoard events, plots
  bible-kjv
)
if [[ "${1:-}" != "--binary" ]]; then
  packages+=(
    libgtest-dev libgmock-dev libbenchmark-dev
    clang libclang-rt-14-dev  # libFuzzer and its sanitizers (scripts/fuzz.sh)
    iproute2 util-linux  # network-namespace hosts for the multi-host test (ip, unshare)
  )
fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi
