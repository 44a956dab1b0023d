#!/usr/bin/env bash
# Issue 17 on one lent GPU machine: the NER headline rows over 3 seeds, and the training options on CLUENER EGP (each
# alone, same budget, 3 seeds); STS-B CoSENT and SXU CRF over 3 seeds. `python benchmarks/report.py` then prints the
# mean ± std table of the NER rows (ner_seeds_table; the STS-B and SXU rows of sts.jsonl / cws_crf_lr.jsonl carry
# their seed in their command). Runs go in parallel on the GPU (MPS), as gpu_ner.sh.
#   python benchmarks/device_pack.py            # here
#   bash benchmarks/gpu_seeds.sh                # there; results in $ZHIE_RESULTS (default benchmarks/results)
R=runs/gpu-seeds
source "$(dirname "$0")/gpu_env.sh"
ner() { local name=$1; shift
  python3 benchmarks/ner.py --encoder $E --batch-size 32 --out "$R/$name" --quiet "$@" > "$R/logs/$name.log" 2>&1; }
for s in 1 2 3; do
  for head in egp gp crf; do ner cluener-$head-s$s --dataset cluener --head $head --epochs 6 --seed $s & done
  ner cmeee-egp-s$s --dataset cmeee --head egp --epochs 10 --head-lr 2e-4 --seed $s &
  ner pd-gp-s$s --dataset peoples_daily --head gp --epochs 20 --seed $s &
  wait
  for opt in "--ema 0.999" "--adversarial fgm" "--adversarial pgd" "--llrd 0.9"; do
    ner "cluener-egp-$(echo $opt | tr -d ' -.')-s$s" --dataset cluener --head egp --epochs 6 --seed $s $opt &
  done
  python3 benchmarks/sts.py --dataset stsb --loss cosent --encoder $E --seed $s --out "$R/stsb-s$s" --quiet \
    > "$R/logs/stsb-s$s.log" 2>&1 &
  python3 benchmarks/cws_crf_lr.py --run crf --multiplier 1000 --encoder $E --seed $s --out "$R/sxu-s$s" \
    > "$R/logs/sxu-s$s.log" 2>&1 &
  wait
done
