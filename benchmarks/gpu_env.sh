# Sourced by benchmarks/gpu_*.sh on a GPU machine: environment, unpacked e5-small, run directory $R (set R
# before sourcing), CUDA MPS so that parallel runs share the GPU. See benchmarks/device_pack.py.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PYTHONPATH=src:benchmarks ZHIE_DATA=.gpu-pack/data OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
python3 benchmarks/device_pack.py --unpack || exit 1
E=.gpu-pack/e5-small-pruned
mkdir -p "$R/logs"
nvidia-cuda-mps-control -d 2>/dev/null
