#!/usr/bin/env bash
# GPLinker (CMeIE) and the CWS CRF learning-rate study on one lent GPU machine, training runs in parallel, then
# GPLinker's memory and decoding measurements alone. Set-up as in benchmarks/gpu_ner.sh.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=src:benchmarks ZHIE_DATA=.devcarry/data OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
python3 benchmarks/device_pack.py --unpack || exit 1
E=.devcarry/e5-small-pruned
R=runs/gpu
mkdir -p $R/logs
nvidia-cuda-mps-control -d 2>/dev/null
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
