#!/usr/bin/env bash
# Sentence-embedding benchmarks on one GPU machine (set-up as in benchmarks/gpu_ner.sh): the untrained
# baselines, then cosent / sbert / cosine-mse on STS-B and ATEC, all training runs in parallel. First, alone on
# the GPU: CLUENER crf and softmax trained for a few hundred steps and their prediction speed (decoding share).
R=runs/gpu3
source "$(dirname "$0")/gpu_env.sh"
for head in crf softmax; do
  python3 benchmarks/ner.py --encoder $E --batch-size 32 --dataset cluener --head $head --max-steps 300 --out $R \
    --quiet > $R/logs/ner-$head.log 2>&1 &
done
wait
for head in crf softmax; do python3 benchmarks/ner.py --dataset cluener --speed --model $R/cluener-$head --out $R; done
for d in stsb atec; do python3 benchmarks/sts.py --dataset $d --baseline --encoder $E; done
for loss in cosent sbert cosine-mse; do
  python3 benchmarks/sts.py --dataset stsb --loss $loss --epochs 5 --encoder $E --out $R --quiet > $R/logs/stsb-$loss.log 2>&1 &
  python3 benchmarks/sts.py --dataset atec --loss $loss --epochs ${ATEC_EPOCHS:-2} --encoder $E --out $R --quiet \
    > $R/logs/atec-$loss.log 2>&1 &
done
wait
tail -qn 1 $R/logs/*.log | cut -c1-300
