#!/usr/bin/env bash
# The main job on a fresh machine: installs what is missing, builds, prepares the default corpus
# (the King James Bible from Debian's bible-kjv), trains a byte-level BPE tokenizer on it,
# trains the model of CONFIG (default: the Llama-3 debug model) and prints a generated sample.
#   scripts/main.sh [CONFIG] [--section.key=value ...]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
config=${1:-configs/llama3_debug.toml}
shift || true
scripts/setup.sh
scripts/build.sh "$root/build"
titan=$root/build/titan

scripts/prepare_corpus.sh data/kjv.txt
if [[ ! -f data/kjv_tokenizer.json || data/kjv.txt -nt data/kjv_tokenizer.json ]]; then
  "$titan" tokenizer train --input data/kjv.txt --vocab-size 2048 --output data/kjv_tokenizer.json
fi
if [[ ! -f data/kjv/index.json || data/kjv_tokenizer.json -nt data/kjv/index.json ]]; then
  "$titan" data prepare --input data/kjv.txt --tokenizer data/kjv_tokenizer.json --output data/kjv
fi

run=outputs/main
rm -rf "$run"
"$titan" train --config "$config" --job.dump_folder="$run" --training.dataset_path=data/kjv \
  --model.tokenizer_path=data/kjv_tokenizer.json --validation.enable=true "$@"
echo
echo "sample:"
"$titan" generate --checkpoint "$run/checkpoint" --prompt "And God said" --max-new-tokens 80 --seed 1
