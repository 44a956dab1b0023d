#!/usr/bin/env bash
# The campaign's ner.py rows (benchmarks/campaign.py) on a lent GPU machine: the rows of .devcarry/rows.txt, N at a
# time on the one GPU (CUDA MPS), each from .devcarry/tree (the code of the plan's commit), for at most SECONDS.
# Every finished row goes to $OUT/gpu_rows.jsonl (its results and per-epoch metrics), the logs to $OUT/logs.tar.gz.
# A row cut by the time limit restarts from zero at the next call (no checkpoints: 16 of them every few seconds
# would cost more than they save); rows finished in an earlier call on the same machine are not run again.
#   python benchmarks/device_pack.py --campaign c/                         # here
#   bash benchmarks/gpu_campaign.sh 16 540                                 # there (carry .devcarry), as often as needed
#   python benchmarks/campaign.py import /work/.device/N/gpu_rows.jsonl    # here, with the last call's file
# Every device call replaces the carried .devcarry, so what the rows write stays outside the repository (/root).
set -uo pipefail
N=${1:-16} LIMIT=${2:-540}
cd "$(dirname "$0")/../.devcarry" || exit 1
export RUNS=/root/campaign-runs E=/root/e5-small-pruned COMMIT=$(cat tree/COMMIT) PARALLEL=$N
mkdir -p "$RUNS" "$E" && cp e5-small-pruned/*.json "$E/"
[ -f "$E/model.safetensors" ] || python3 -c "
import lzma, shutil
with lzma.open('e5-small-pruned/model.safetensors.xz') as s, open('$E/model.safetensors', 'wb') as d:
    shutil.copyfileobj(s, d)" || exit 1
export PYTHONPATH=src:benchmarks ZHIE_DATA=$PWD/data OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1 \
  TOKENIZERS_PARALLELISM=false ZHIE_MACHINE_LOCK_HELD=1
nvidia-cuda-mps-control -d 2>/dev/null
row() {  # key, then the row's training options
  local key=$1; shift; local d=$RUNS/${key//\//__}
  grep -qs '"rc": 0' "$d/done.json" && return 0
  rm -rf "$d"; mkdir -p "$d/results"; local start=$(date +%s)
  (cd tree && ZHIE_RESULTS=$d/results python3 benchmarks/ner.py --quiet --out "$d" --encoder "$E" "$@" > "$d/log" 2>&1)
  local rc=$?
  python3 -c 'import json, sys; k, c, rc, s, n, a = sys.argv[1:]
print(json.dumps({"key": k, "commit": c, "rc": int(rc), "wall_s": int(s), "parallel": int(n), "args": a}))' \
    "$key" "$COMMIT" $rc $(( $(date +%s) - start )) "$PARALLEL" "$*" > "$d/done.json"
}
export -f row
timeout "$LIMIT" xargs -P "$N" -L 1 bash -c 'row "$@"' _ < rows.txt
python3 - <<'PY'
import json, os, pathlib
runs, out = pathlib.Path(os.environ["RUNS"]), pathlib.Path(os.environ.get("OUT", "."))
with (out / "gpu_rows.jsonl").open("w") as f:
    for done in sorted(runs.glob("*/done.json")):
        line = json.loads(done.read_text())
        line["results"] = [json.loads(l) for p in sorted((done.parent / "results").glob("*.jsonl"))
                           for l in p.read_text().splitlines()]
        line["metrics"] = [json.loads(l) for p in done.parent.glob("*/metrics.jsonl") for l in p.read_text().splitlines()]
        f.write(json.dumps(line) + "\n")
        print(line["key"], "exit", line["rc"], f"{line['wall_s']} s",
              " ".join(f"{m['dev']['f1']:.4f}" for m in line["metrics"] if "dev" in m))
PY
tar -czf "${OUT:-.}/logs.tar.gz" -C "$RUNS" --exclude='*.safetensors' --exclude='*.pt' --exclude='*.onnx' . 2>/dev/null
