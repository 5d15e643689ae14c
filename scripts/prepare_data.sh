#!/usr/bin/env bash
# Makes the default corpus every shipped config trains on: the King James Bible (Debian's
# bible-kjv, see scripts/prepare_corpus.sh) as data/kjv.txt, a byte-level BPE tokenizer of 2048
# tokens trained on it (data/kjv_tokenizer.json) and the tokenized train/ and val/ shards
# (data/kjv/). Each step runs only when its input is newer than its output.
#   scripts/prepare_data.sh [TITAN]   (TITAN: the titan binary, default build/titan)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
titan=${1:-$root/build/titan}
if [[ ! -x "$titan" ]]; then
  echo "prepare_data: $titan is missing; build it first (scripts/build.sh build)" >&2
  exit 1
fi

scripts/prepare_corpus.sh data/kjv.txt
if [[ ! -f data/kjv_tokenizer.json || data/kjv.txt -nt data/kjv_tokenizer.json ]]; then
  "$titan" tokenizer train --input data/kjv.txt --vocab-size 2048 --output data/kjv_tokenizer.json
fi
if [[ ! -f data/kjv/index.json || data/kjv_tokenizer.json -nt data/kjv/index.json ]]; then
  "$titan" data prepare --input data/kjv.txt --tokenizer data/kjv_tokenizer.json --output data/kjv
fi
