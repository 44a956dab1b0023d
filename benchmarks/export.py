"""CPU prediction throughput and dev F1 of one CLUENER NER model three ways, in one process with the same threads and
batch size: torch, onnxruntime fp32 and onnxruntime int8 (``zhie export``, ``--quantize int8``).

    python benchmarks/export.py --model runs/cluener-gp/best          # a trained CLUENER model
    python benchmarks/export.py --train-sentences 2000 --epochs 3     # or train a tiny one first (bounded, CPU)

Each row goes to ``results/export.jsonl``: texts/s over ``--repeats`` passes of the dev texts (the first pass of each
runtime is a warm-up, not timed), dev micro F1, and F1 loss of int8 against fp32.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from datetime import date
from pathlib import Path

import torch
from common import DATA, append_result, machine, machine_lock

import zhie
from zhie.data import read_ner
from zhie.deploy.export import export
from zhie.deploy.runtime import load_export
from zhie.training import TrainConfig

CLUENER = DATA / "ner" / "cluener"


def train_tiny(out: Path, sentences: int, epochs: int) -> Path:
    """A tiny-encoder GP model on the first ``sentences`` CLUENER training sentences (minutes on two cores)."""
    from zhie.data import write_ner_jsonl

    out.mkdir(parents=True, exist_ok=True)
    write_ner_jsonl(read_ner(CLUENER / "train.json")[:sentences], out / "train.jsonl")
    config = TrainConfig(epochs=epochs, batch_size=32, lr=1e-3, warmup=0.05, seed=0, eval_every=10**9)
    zhie.fit("ner", out / "train.jsonl", CLUENER / "dev.json", out=out / "run", encoder="tiny", head="gp",
             max_length=128, config=config, resume=False, progress=False)
    return out / "run" / "best"


def measure(pipe, texts: list[str], batch_size: int, repeats: int) -> float:
    """Texts per second over ``repeats`` timed passes, after one untimed pass."""
    pipe.predict(texts[: 4 * batch_size], batch_size=batch_size)
    start = time.perf_counter()
    for _ in range(repeats):
        pipe.predict(texts, batch_size=batch_size)
    return repeats * len(texts) / (time.perf_counter() - start)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="a CLUENER NER model directory (default: train a tiny one)")
    p.add_argument("--train-sentences", type=int, default=2000)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--dev-limit", type=int, default=None, help="only the first N dev sentences")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--threads", type=int, default=2, help="torch and onnxruntime intra-op threads")
    p.add_argument("--repeats", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    work = Path(tempfile.mkdtemp(prefix="zhie-export-bench-"))
    model = Path(args.model) if args.model else train_tiny(work / "train", args.train_sentences, args.epochs)
    dev = read_ner(CLUENER / "dev.json")[: args.dev_limit]
    texts = [ex.text for ex in dev]
    runs = {"torch": model, "onnxruntime fp32": export(model, work / "fp32"),
            "onnxruntime int8": export(model, work / "int8", quantize="int8")}
    rows = {}
    for name, directory in runs.items():
        if name == "torch":
            pipe = zhie.load(directory, device="cpu")
        else:  # as zhie.load, with onnxruntime's threads set
            task, onnx_model = load_export(directory, threads=args.threads)
            pipe = task.pipeline_class(task, onnx_model, "cpu")
        f1 = pipe.evaluate(dev, batch_size=args.batch_size)["micro"]["f1"]
        rows[name] = {"runtime": name, "texts_per_s": round(measure(pipe, texts, args.batch_size, args.repeats), 1),
                      "dev_f1": round(f1, 4)}
    for row in rows.values():
        append_result("export", {**row, "int8_f1_loss": round(rows["onnxruntime fp32"]["dev_f1"] - row["dev_f1"], 4),
                                 "model": str(args.model or f"tiny gp, {args.train_sentences} sentences x "
                                                            f"{args.epochs} epochs"),
                                 "dev_texts": len(texts), "batch_size": args.batch_size, "threads": args.threads,
                                 "machine": machine(), "date": str(date.today())})


if __name__ == "__main__":
    with machine_lock():
        main()
