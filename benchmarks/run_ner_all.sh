#!/usr/bin/env bash
# Every NER benchmark run of RESULTS.md, one after another (CPU: 10-15 minutes each; see RESULTS.md).
# Defaults of benchmarks/ner.py: e5-small (vocabulary pruned to CJK/ASCII/punctuation), batch 16, encoder lr 2e-4,
# head lr 2e-3, CRF transitions at 100x the encoder lr, max length 256.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/bench}
for head in gp egp crf softmax; do
  python benchmarks/ner.py --dataset peoples_daily --head "$head" --epochs 3 --out "$OUT" --quiet
done
for head in gp egp crf softmax; do
  python benchmarks/ner.py --dataset cluener --head "$head" --epochs 1 --out "$OUT" --quiet
done
python benchmarks/ner.py --dataset cluener --compare-hf --model "$OUT/cluener-gp" --out "$OUT"
for head in gp egp crf; do
  python benchmarks/ner.py --dataset cmeee --head "$head" --epochs 2 --out "$OUT" --quiet
done
