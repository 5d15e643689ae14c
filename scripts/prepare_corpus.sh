#!/usr/bin/env bash
# Writes the default training corpus, the King James Bible from the Debian package bible-kjv
# (installed by scripts/setup.sh), to data/kjv.txt (or the path given as $1).
#
# Form: one chapter per paragraph, which is what `titan data prepare` takes as one document
# in a .txt file. Each paragraph is a heading line ("Genesis 1", "Song of Solomon 2") followed
# by one verse per line without its number; a blank line separates chapters. 1189 chapters make
# enough documents for a validation split spread over the whole book (1% = 12 chapters).
#
# Idempotent: the file is regenerated (0.1 s) into a temporary name and replaces the old one
# only when the text differs, so its timestamp means "the content changed".
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/data/kjv.txt}

if ! command -v bible >/dev/null; then
  echo "prepare_corpus: the 'bible' program is missing; run scripts/setup.sh (it installs bible-kjv)" >&2
  exit 1
fi
mkdir -p "$(dirname "$out")"
tmp="$out.tmp.$$"
trap 'rm -f "$tmp"' EXIT

# `bible` pretty-prints a chapter as a heading line, then "  <n> <verse>" lines; -l with a huge
# width turns its line wrapping off so each verse stays on one line.
bible -l 1000000 Gen1:1-Rev22:21 | awk '
  /^  [0-9]+ / { sub(/^  [0-9]+ /, ""); print; verses++; next }
  /^$/         { next }
               { if (chapters++) print ""; print }
  END {
    if (verses != 31102 || chapters != 1189) {
      printf "prepare_corpus: expected 31102 verses in 1189 chapters, got %d in %d\n", verses, chapters > "/dev/stderr"
      exit 1
    }
  }' >"$tmp"

if [[ -f "$out" ]] && cmp -s "$tmp" "$out"; then
  echo "prepare_corpus: $out is up to date"
else
  mv "$tmp" "$out"
  echo "prepare_corpus: wrote $out ($(wc -c <"$out") bytes, 1189 chapters, 31102 verses)"
fi
