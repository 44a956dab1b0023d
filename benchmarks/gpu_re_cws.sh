#!/usr/bin/env bash
# GPLinker (CMeIE) and the CWS CRF learning-rate study on one GPU machine, training runs in parallel, then
# GPLinker's memory and decoding measurements alone. Set-up as in benchmarks/gpu_ner.sh.
R=runs/gpu
source "$(dirname "$0")/gpu_env.sh"
for v in gp egp; do
  python3 benchmarks/relation.py --encoder $E --variant $v --epochs ${RE_EPOCHS:-8} --out $R --quiet > $R/logs/re-$v.log 2>&1 &
done
cws() { python3 benchmarks/cws_crf_lr.py --encoder $E --out $R/cws --epochs 3 "$@" > "$R/logs/cws$(echo "$@" | tr -d ' -').log" 2>&1; }
cws --run softmax --layers 1 &
for m in 1 10 100 1000; do cws --run crf --multiplier $m --layers 1 & done
for m in 1 1000; do cws --run crf --multiplier $m & done
wait
python3 benchmarks/relation.py --encoder $E --memory --batch-size 16
python3 benchmarks/relation.py --encoder $E --decode --per-cell-windows 30
