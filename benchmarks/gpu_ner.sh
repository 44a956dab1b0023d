#!/usr/bin/env bash
# The NER benchmarks on one GPU machine, all training runs in parallel (see benchmarks/device_pack.py), then
# prediction speed and the HF-pipeline comparison one model at a time on the otherwise idle GPU.
#   python benchmarks/device_pack.py            # here
#   bash benchmarks/gpu_ner.sh                  # there; results in $ZHIE_RESULTS (default benchmarks/results)
R=runs/gpu
source "$(dirname "$0")/gpu_env.sh"
train() { python3 benchmarks/ner.py --encoder $E --batch-size 32 --out $R --quiet "$@" > "$R/logs/$2-$4.log" 2>&1; }
for head in gp egp crf softmax; do
  train --dataset cluener --head $head --epochs ${CLUENER_EPOCHS:-6} &
  train --dataset peoples_daily --head $head --epochs ${PD_EPOCHS:-20} &
done
for head in gp egp crf; do train --dataset cmeee --head $head --epochs ${CMEEE_EPOCHS:-4} & done
wait
for d in cluener peoples_daily cmeee; do for head in gp egp crf softmax; do
  [ -d $R/$d-$head/best ] && python3 benchmarks/ner.py --dataset $d --speed --model $R/$d-$head --out $R
done; done
python3 benchmarks/ner.py --dataset cluener --compare-hf --model $R/cluener-gp --out $R --n 1343
