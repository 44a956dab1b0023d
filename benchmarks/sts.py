"""Sentence-embedding benchmark: CoSENT against Sentence-BERT and cosine-MSE on STS-B and ATEC (train → valid).

    python benchmarks/sts.py --dataset stsb --loss cosent --epochs 5
    python benchmarks/sts.py --dataset stsb --baseline            # e5-small untrained: mean pooling, "query: "

Each run appends one JSON line to ``benchmarks/results/sts.jsonl`` with the valid Spearman after every epoch.
Data: ``$ZHIE_DATA/sts`` (default ../shared/data).
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import date
from pathlib import Path

import torch
from common import DATA, append_result, machine, machine_lock, peak_memory_mb

import zhie
from zhie.data.sts import read_pairs
from zhie.model import Model
from zhie.tasks.base import prepare_encoder
from zhie.tasks.similarity import SimilarityConfig, SimilarityTask
from zhie.training import TrainConfig
from zhie.training.report import read_metrics


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", required=True, choices=["stsb", "atec"])
    p.add_argument("--loss", default="cosent", choices=["cosent", "sbert", "cosine-mse"])
    p.add_argument("--baseline", action="store_true", help="evaluate the encoder without training")
    p.add_argument("--pooling", default="mean", choices=["cls", "mean", "first-last-avg"])
    p.add_argument("--encoder", default="e5-small")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=32, help="sentence pairs per batch")
    p.add_argument("--lr", type=float, default=2e-5)
    p.add_argument("--max-length", type=int, default=64)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--out", default="runs/bench")
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args()
    train_file, valid_file = DATA / "sts" / args.dataset / "train.data", DATA / "sts" / args.dataset / "valid.data"
    row = {"dataset": args.dataset, "encoder": args.encoder, "pooling": args.pooling, "max_length": args.max_length}
    if args.baseline:
        pairs = read_pairs(valid_file)
        encoder, tokenizer = prepare_encoder(args.encoder, texts=[], mode="subword")
        task = SimilarityTask(SimilarityConfig(pooling=args.pooling, max_length=args.max_length, prefix="query: "),
                              tokenizer)
        model = Model(encoder, task.build_heads(encoder.config.hidden_size))
        spearman = task.evaluate(model.to("cuda" if torch.cuda.is_available() else "cpu"), pairs)["spearman"]
        row.update({"loss": "none (untrained)", "spearman": spearman})
    else:
        out = Path(args.out) / f"sts-{args.dataset}-{args.loss}"
        config = TrainConfig(epochs=args.epochs, batch_size=args.batch_size, lr=args.lr, head_lr=args.lr,
                             seed=args.seed)
        start = time.time()
        result = zhie.fit("sts", train_file, valid_file, out=out, encoder=args.encoder, loss=args.loss,
                          pooling=args.pooling, max_length=args.max_length, config=config, resume=True,
                          progress=not args.quiet)
        history = read_metrics(out / "metrics.jsonl")
        row.update({"loss": args.loss, "epochs": args.epochs, "batch_size": args.batch_size, "lr": args.lr,
                    "spearman": result["best"]["spearman"], "spearman_epoch1": history[0]["dev"]["spearman"],
                    "spearman_per_epoch": [h["dev"]["spearman"] for h in history],
                    "train_tokens_per_s": sum(h["tokens_per_s"] for h in history) / len(history),
                    "train_s": round(time.time() - start), "peak_memory_mb": peak_memory_mb()})
    row.update({"machine": machine(), "date": date.today().isoformat(), "command": "python " + " ".join(sys.argv)})
    append_result("sts", row)


if __name__ == "__main__":
    with machine_lock():
        main()
