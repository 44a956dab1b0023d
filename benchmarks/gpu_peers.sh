#!/usr/bin/env bash
# Peers side by side with roofline figures on one GPU machine, nothing else running on the GPU: zhie's CRF
# against pytorch-crf, prediction against HF pipeline("token-classification"), GP training tokens/s against a plain HF
# Trainer (bert4torch's environment is not carried to the device: its comparison runs on the CPU only).
#   python benchmarks/device_pack.py            # here
#   bash benchmarks/gpu_peers.sh                # there; results in $ZHIE_RESULTS (default benchmarks/results)
R=runs/gpu-peers
source "$(dirname "$0")/gpu_env.sh"
P="python3 benchmarks/peers.py --encoder $E"
$P crf --repeats 20
$P predict --texts 1343 --batch-size 64
$P train --sentences 2000 --steps 60 --warmup 10 --batch-size 32 --frameworks zhie hf_trainer
python3 benchmarks/roofline.py --device cuda
