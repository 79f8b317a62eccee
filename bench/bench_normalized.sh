#!/usr/bin/env bash
# Qwen2's vocabulary (an NFC normalizer before a byte-level BPE): `prepare` with the default
# encoder (fastokens, its NFC run ahead by tokenizers) against `--encoder tokenizers` (where
# every such file ran before), side by side, rounds alternating; shards compared byte for byte.
#   bash bench/bench_normalized.sh CORPUS.jsonl WORKDIR [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
corpus=$1 work=$2 rounds=${3:-2}
tok=.vocabs/qwen2/tokenizer.json  # .ci/setup builds it (tests/published_vocabs.py)
mkdir -p "$work"
# a first run keeps the check's static half, as a user's second run has it
rm -rf "$work/warm" && .venv/bin/tokshard prepare --input "$corpus" --tokenizer "$tok" --out "$work/warm" --workers 2 >/dev/null
for round in $(seq "$rounds"); do
  for enc in auto tokenizers; do
    rm -rf "$work/out-$enc" && sync
    start=$(date +%s.%N)
    .venv/bin/tokshard prepare --input "$corpus" --tokenizer "$tok" --out "$work/out-$enc" --workers 2 --encoder "$enc" 2>/dev/null | tail -1
    echo "round $round --encoder $enc: $(echo "$(date +%s.%N) - $start" | bc) s wall"
  done
  cmp <(cat "$work"/out-auto/data/train/*.bin) <(cat "$work"/out-tokenizers/data/train/*.bin) && echo "round $round: shards byte-identical"
done
