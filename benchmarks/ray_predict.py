"""Ray Data batch prediction: texts/s of ``zhie predict MODEL --ray`` with 1 and 2 local workers (CPU, or one GPU each
when the machine has GPUs), against plain ``zhie predict`` in one process on the same input.

    python benchmarks/ray_predict.py --texts 4000 --workers 1 2

The input is ``--shards`` JSONL files of zhie's demo sentences; the model a tiny GP model (zhie's ``tiny`` encoder,
2 layers, hidden 64) trained here for one epoch, unless ``--model`` names one. Each run starts its own local Ray
instance (``ray.init(num_cpus=...)``) and the time covers reading, prediction and writing, not Ray's start (measured
on its own as ``ray_start_s``): ``texts/s = texts / seconds``. Each worker gets ``--cpus-per-worker`` CPUs and runs
torch with that many threads; the single-process row uses the same thread count as one worker. One JSON line per
setting in ``results/ray_predict.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

from common import append_result, machine, machine_lock
from stream import tiny_model

from zhie import demo


def write_shards(directory: Path, texts: int, shards: int) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    sentences = [ex.text for ex in demo.make_corpus(997, seed=11)]
    for s in range(shards):
        lines = [json.dumps({"text": sentences[i % len(sentences)]}, ensure_ascii=False)
                 for i in range(s, texts, shards)]
        (directory / f"part-{s:03d}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")


def timed_ray(model: Path, shards: Path, out: Path, workers: int, args) -> dict:
    import ray

    from zhie.deploy.ray_predict import predict_files

    start = time.perf_counter()
    ray.init(num_cpus=max(workers * args.cpus_per_worker, 1) + 1, include_dashboard=False, log_to_driver=False)
    ray_start = time.perf_counter() - start
    try:
        start = time.perf_counter()
        predict_files(str(model), [str(shards)], str(out), workers=workers, cpus_per_worker=args.cpus_per_worker,
                      batch_size=args.batch_size, rows=args.rows)
        seconds = time.perf_counter() - start
    finally:
        ray.shutdown()
    rows = sum(len(f.read_text(encoding="utf-8").splitlines()) for f in out.iterdir())
    if rows != args.texts:
        raise SystemExit(f"{out}: {rows} rows for {args.texts} texts")
    shutil.rmtree(out)
    return {"mode": f"ray, {workers} worker(s)", "workers": workers, "seconds": round(seconds, 2),
            "ray_start_s": round(ray_start, 2)}


def timed_single(model: Path, shards: Path, out: Path, args) -> dict:
    import torch

    from zhie.cli import main

    torch.set_num_threads(int(args.cpus_per_worker))
    start = time.perf_counter()
    code = main(["predict", str(model), "--input", *map(str, sorted(shards.iterdir())), "--output", str(out),
                 "--batch-size", str(args.batch_size)])
    seconds = time.perf_counter() - start
    if code != 0:
        raise SystemExit("zhie predict failed")
    out.unlink()
    return {"mode": "zhie predict, one process", "workers": 1, "seconds": round(seconds, 2)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--texts", type=int, default=4000)
    p.add_argument("--shards", type=int, default=8)
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    p.add_argument("--cpus-per-worker", type=float, default=1.0)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--rows", type=int, default=500, help="rows per Ray batch (zhie predict --chunk-lines)")
    p.add_argument("--model", default=None, help="a trained model directory (default: a tiny GP model trained here)")
    p.add_argument("--work", default=None, help="directory for the model and the input (default: a new one)")
    args = p.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(int(args.cpus_per_worker))  # Ray's workers: one torch thread per CPU
    work = Path(args.work or tempfile.mkdtemp(prefix="zhie-ray-"))
    model = Path(args.model) if args.model else tiny_model(work)
    shards = work / "in"
    if not shards.exists():
        write_shards(shards, args.texts, args.shards)
    runs = [timed_single(model, shards, work / "single.jsonl", args)]
    runs += [timed_ray(model, shards, work / f"out-{w}", w, args) for w in args.workers]
    for run in runs:
        append_result("ray_predict", {**run, "texts": args.texts, "texts_per_s": round(args.texts / run["seconds"], 1),
                                      "shards": args.shards, "cpus_per_worker": args.cpus_per_worker,
                                      "batch_size": args.batch_size, "rows_per_ray_batch": args.rows,
                                      "model": args.model or "tiny GP (2 layers, hidden 64), 1 epoch on demo sentences",
                                      "machine": machine(), "date": date.today().isoformat(),
                                      "command": "python benchmarks/ray_predict.py " + " ".join(sys.argv[1:])})


if __name__ == "__main__":
    with machine_lock():
        main()
