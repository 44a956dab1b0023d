"""Peak memory of streaming prediction: ``zhie predict MODEL --input FILE --output OUT`` on files of 10k and 1M lines,
or, with ``--api``, the Python API's ``Pipeline.stream`` over the lines of the file.

    python benchmarks/stream.py --sizes 10000 1000000
    python benchmarks/stream.py --api --sizes 2000 200000

Each run is a separate process (``python -m zhie.cli predict ...``); its peak resident set size comes from the kernel
(``os.wait4``'s ``ru_maxrss``, from a small launcher: ``common.run_measured``), its time from the wall clock, its
output is checked line for line (count and order).
The model is a tiny GP model (zhie's ``tiny`` encoder: 2 layers, hidden 64) trained here for one epoch on zhie's demo
sentences, unless ``--model`` names one; the input repeats the demo sentences, with one text in 100 a long one
(several windows). Streaming holds one chunk (``--chunk-lines``) at a time, so the peak should not grow with the
file. One JSON line per size in ``results/stream.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from datetime import date
from pathlib import Path

from common import append_result, machine, machine_lock, run_measured

import zhie
from zhie import demo
from zhie.training import TrainConfig


def tiny_model(work: Path) -> Path:
    if (work / "run" / "best").exists():
        return work / "run" / "best"
    train, dev = demo.write_corpus(work / "data", n_train=200, n_dev=40)
    zhie.fit("ner", train, dev, out=work / "run", encoder="tiny", head="gp", max_length=64,
             config=TrainConfig(epochs=1, batch_size=16, lr=2e-3, head_lr=2e-3, seed=0), resume=False, progress=False)
    return work / "run" / "best"


def write_input(path: Path, lines: int) -> None:
    sentences = [ex.text for ex in demo.make_corpus(997, seed=7)]
    long = "".join(sentences[:12])
    with path.open("w", encoding="utf-8") as f:
        for i in range(lines):
            f.write((long if i % 100 == 99 else sentences[i % len(sentences)]) + "\n")


# --api: a process that streams the file's lines through Pipeline.stream and writes one JSON line per prediction
API = """import dataclasses, json, sys, zhie
pipe = zhie.load(sys.argv[1])
with open(sys.argv[2], encoding="utf-8") as f, open(sys.argv[2], encoding="utf-8") as g, \\
        open(sys.argv[3], "w", encoding="utf-8") as out:
    predictions = pipe.stream((line.rstrip("\\n") for line in f), batch_size=int(sys.argv[5]),
                              chunk_size=int(sys.argv[4]))
    for text, entities in zip(g, predictions):
        row = {"text": text.rstrip("\\n"), "entities": [dataclasses.asdict(s) for s in entities]}
        out.write(json.dumps(row, ensure_ascii=False) + "\\n")
"""


def run(model: Path, lines: int, work: Path, args) -> dict:
    source, out = work / f"in-{lines}.txt", work / f"out-{lines}.jsonl"
    if not source.exists():
        write_input(source, lines)
    command = [sys.executable, "-m", "zhie.cli", "predict", str(model), "--input", str(source), "--output", str(out),
               "--chunk-lines", str(args.chunk_lines), "--batch-size", str(args.batch_size)]
    if args.api:
        command = [sys.executable, "-c", API, str(model), str(source), str(out), str(args.chunk_lines),
                   str(args.batch_size)]
    seconds, peak_mb = run_measured(command)
    with source.open(encoding="utf-8") as a, out.open(encoding="utf-8") as b:
        count = sum(1 for text, row in zip(a, b, strict=True) if json.loads(row)["text"] == text.rstrip("\n"))
    if count != lines:
        raise SystemExit(f"{out}: {count} of {lines} lines in input order")
    out.unlink()
    return {"lines": lines, "peak_rss_mb": round(peak_mb, 1), "rss_measured": "own", "seconds": round(seconds, 1),
            "lines_per_s": round(lines / seconds, 1), "chunk_lines": args.chunk_lines, "batch_size": args.batch_size,
            "model": args.model or "tiny GP (2 layers, hidden 64), trained 1 epoch on demo sentences",
            "torch_threads": os.environ.get("OMP_NUM_THREADS", "default"), "machine": machine(),
            "date": date.today().isoformat(),
            "command": "python benchmarks/stream.py " + " ".join(sys.argv[1:]),
            "run": "Pipeline.stream (python -c)" if args.api else " ".join(["zhie", *command[3:]])}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=[10_000, 1_000_000])
    p.add_argument("--model", default=None, help="a trained model directory (default: a tiny GP model trained here)")
    p.add_argument("--api", action="store_true", help="stream through the Python API, Pipeline.stream, not the CLI")
    p.add_argument("--chunk-lines", type=int, default=4096)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--work", default=None, help="directory for the model and the input files (default: a new one)")
    args = p.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="zhie-stream-"))
    work.mkdir(parents=True, exist_ok=True)
    model = Path(args.model) if args.model else tiny_model(work)
    for lines in args.sizes:
        append_result("stream", run(model, lines, work, args))


if __name__ == "__main__":
    with machine_lock():
        main()
