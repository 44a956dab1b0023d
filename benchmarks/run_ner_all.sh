#!/usr/bin/env bash
# Every NER benchmark run of RESULTS.md, one after another (CPU: tens of minutes each; see RESULTS.md).
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
