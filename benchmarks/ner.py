"""NER benchmark: train one head on one dataset, then measure dev F1, speed, memory and decoding share.

    python benchmarks/ner.py --dataset cluener --head egp --epochs 1 --out runs/bench
    python benchmarks/ner.py --dataset cluener --compare-hf --model runs/bench/cluener-egp

Each run appends one JSON line to ``benchmarks/results/ner.jsonl`` (the tables of RESULTS.md are made from it).
Datasets are read from ../shared/data; People's Daily is split here into a fixed 80% / 20% of ``example.dev``
(shuffled with seed 0). CRF/softmax runs flatten nested spans to the outermost (CMeEE; one CLUENER record).
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

import torch
from common import DATA, append_result, machine, machine_lock, peak_memory_mb, trained_with
from roofline import flops_per_token, matmul_peak, roofline, window_tokens

import zhie
from zhie.data import read_ner, write_ner_jsonl
from zhie.precision import PRECISIONS
from zhie.training import TrainConfig
from zhie.training.report import read_metrics

DATA = DATA / "ner"
DATASETS = ["cluener", "peoples_daily", "cmeee"]


def dataset_files(name: str, out: Path) -> tuple[Path, Path]:
    if name == "cluener":
        return DATA / "cluener/train.json", DATA / "cluener/dev.json"
    if name == "cmeee":
        return DATA / "cmeee/train.json", DATA / "cmeee/dev.json"
    if name == "peoples_daily":
        examples = read_ner(DATA / "peoples_daily/example.dev", "conll")
        order = list(range(len(examples)))
        random.Random(0).shuffle(order)
        cut = int(0.8 * len(examples))
        out.mkdir(parents=True, exist_ok=True)
        train, dev = out / "pd_train.jsonl", out / "pd_test.jsonl"
        write_ner_jsonl([examples[i] for i in order[:cut]], train)
        write_ner_jsonl([examples[i] for i in order[cut:]], dev)
        return train, dev
    raise SystemExit(f"unknown dataset {name}")


def prediction_speed(model_dir: Path, texts: list[str], batch_size: int) -> dict:
    """Sentences/s, the shares of the encoder and of decoding, and the encoder's roofline figures (fp32 FLOPs over
    the windows' real tokens against the device's fp32 matmul peak measured here, benchmarks/roofline.py)."""
    pipe = zhie.load(model_dir)
    pipe.predict(texts[:batch_size], batch_size=batch_size)  # warm-up
    timings: dict = {}
    start = time.perf_counter()
    pipe.task.predict(pipe.model, texts, batch_size, timings=timings)
    total = time.perf_counter() - start
    tokens = window_tokens(pipe.task, texts)
    peak = matmul_peak(next(pipe.model.parameters()).device)
    return {"predict_sent_per_s": len(texts) / total, "decode_share": timings["decode_s"] / total,
            "model_share": timings["model_s"] / total, "predict_tokens_per_s": sum(tokens) / total,
            **roofline(flops_per_token(pipe.model.encoder.config, tokens), sum(tokens) / total, peak)}


def cli_command(args, train_file: Path, dev_file: Path, out: Path) -> list[str]:
    """``zhie train ner`` with this run's settings, as a user would type it: the flags whose values differ from
    ``zhie train``'s defaults only (so a run with no --lr/--head-lr/--batch-size trains with zhie's defaults)."""
    command = [sys.executable, "-m", "zhie", "train", "ner", "--train", str(train_file), "--dev", str(dev_file),
               "--out", str(out), "--head", args.head, "--epochs", str(args.epochs), "--seed", str(args.seed),
               "--encoder", args.encoder, "--max-length", str(args.max_length)]
    given = {"--lr": args.lr, "--head-lr": args.head_lr, "--encoder-layers": args.encoder_layers,
             "--max-steps": args.max_steps, "--ema": args.ema, "--adversarial": args.adversarial,
             "--adv-epsilon": args.adv_epsilon, "--rdrop": args.rdrop, "--llrd": args.llrd,
             "--precision": args.precision,
             "--crf-lr-multiplier": args.crf_lr_multiplier if args.head == "crf" else None}
    if args.batch_size != TrainConfig.batch_size:
        given["--batch-size"] = args.batch_size
    command += [str(v) for flag, value in given.items() if value is not None for v in (flag, value)]
    if args.head in ("crf", "softmax"):
        command.append("--flatten")
    if not args.gp_prior_init:
        command.append("--no-gp-prior-init")
    return command + (["--quiet"] if args.quiet else [])


def options(args) -> dict:
    """The training options of issue 17 that this run sets (left out: zhie's defaults)."""
    names = ("ema", "adversarial", "adv_epsilon", "rdrop", "llrd", "precision")
    return {name: getattr(args, name) for name in names if getattr(args, name) is not None}


def run(args) -> dict:
    out = Path(args.out) / f"{args.dataset}-{args.head}"
    train_file, dev_file = dataset_files(args.dataset, Path(args.out))
    config = TrainConfig(epochs=args.epochs, batch_size=args.batch_size, lr=args.lr, head_lr=args.head_lr,
                         seed=args.seed, max_steps=args.max_steps, save_every=args.save_every, **options(args))
    start = time.time()
    if args.cli:
        subprocess.run(cli_command(args, train_file, dev_file, out), check=True)
        # the model's record holds the dev metrics of the evaluation that saved it; their summary is the micro average
        result = {"best": json.loads((out / "best" / "training.json").read_text(encoding="utf-8"))["dev"]["micro"]}
    else:
        result = zhie.fit("ner", train_file, dev_file, out=out, encoder=args.encoder, head=args.head,
                          max_length=args.max_length, flatten=args.head in ("crf", "softmax"),
                          crf_lr_multiplier=args.crf_lr_multiplier, gp_prior_init=args.gp_prior_init,
                          encoder_layers=args.encoder_layers, config=config,
                          resume=True, progress=not args.quiet)
    train_s = time.time() - start
    history = read_metrics(out / "metrics.jsonl")
    dev_texts = [ex.text for ex in read_ner(dev_file)]
    row = {
        "dataset": args.dataset, "head": args.head, "encoder": args.encoder,
        "encoder_layers": args.encoder_layers or "all", "epochs": args.epochs, "max_length": args.max_length,
        **trained_with(out),
        "crf_lr_multiplier": args.crf_lr_multiplier if args.head == "crf" else None, "seed": args.seed,
        "options": options(args), "trained_by": "zhie train" if args.cli else "zhie.fit",
        "dev_f1": result["best"].get("f1"), "dev_precision": result["best"].get("precision"),
        "dev_recall": result["best"].get("recall"), "f1_per_epoch": [h["dev"].get("f1") for h in history],
        "train_tokens_per_s": sum(h["tokens_per_s"] for h in history) / len(history), "train_s": round(train_s),
        **prediction_speed(out, dev_texts, args.eval_batch_size),
        "peak_memory_mb": peak_memory_mb(), "machine": machine(), "date": date.today().isoformat(),
        "command": "python " + " ".join(sys.argv),
    }
    return row


def compare_hf(args) -> dict:
    """zhie's prediction throughput against HF pipeline("token-classification") on the same encoder."""
    from transformers import AutoModelForTokenClassification, pipeline

    model_dir = Path(args.model)
    pipe = zhie.load(model_dir)
    texts = [ex.text for ex in read_ner(dataset_files(args.dataset, Path(args.out))[1])][: args.n]
    hf_model = AutoModelForTokenClassification.from_pretrained(model_dir / "best" if (model_dir / "best").exists()
                                                               else model_dir, num_labels=2 * len(pipe.labels) + 1)
    hf = pipeline("token-classification", model=hf_model, tokenizer=pipe.task.tokenizer,
                  device=0 if torch.cuda.is_available() else -1,
                  aggregation_strategy="simple")
    hf(texts[:8], batch_size=args.eval_batch_size)
    start = time.perf_counter()
    hf(texts, batch_size=args.eval_batch_size)
    hf_rate = len(texts) / (time.perf_counter() - start)
    pipe.predict(texts[:8], batch_size=args.eval_batch_size)
    start = time.perf_counter()
    pipe.predict(texts, batch_size=args.eval_batch_size)
    zhie_rate = len(texts) / (time.perf_counter() - start)
    return {"dataset": args.dataset, "compare": "hf_pipeline", "model": str(model_dir), "texts": len(texts),
            "zhie_sent_per_s": zhie_rate, "hf_pipeline_sent_per_s": hf_rate, "speedup": zhie_rate / hf_rate,
            "batch_size": args.eval_batch_size, "machine": machine(), "date": date.today().isoformat(),
            "command": "python " + " ".join(sys.argv)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", required=True, choices=DATASETS)
    p.add_argument("--head", default="gp", choices=["softmax", "crf", "gp", "egp"])
    p.add_argument("--encoder", default="e5-small")
    p.add_argument("--encoder-layers", type=int, default=None)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--max-steps", type=int, default=None)
    p.add_argument("--batch-size", type=int, default=TrainConfig.batch_size)
    p.add_argument("--eval-batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=None, help="default: zhie train's (2e-4 for e5-small)")
    p.add_argument("--head-lr", type=float, default=None, help="default: zhie train's (10 x --lr)")
    p.add_argument("--crf-lr-multiplier", type=float, default=100.0)
    p.add_argument("--no-gp-prior-init", dest="gp_prior_init", action="store_false",
                   help="gp: bert4keras's zero start, as the GP rows before 2026-11-23 were trained")
    p.add_argument("--max-length", type=int, default=256)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--ema", type=float, default=None, help="EMA decay (e.g. 0.999)")
    p.add_argument("--adversarial", choices=["fgm", "pgd"], default=None)
    p.add_argument("--adv-epsilon", type=float, default=None)
    p.add_argument("--rdrop", type=float, default=None, help="R-Drop alpha (taggers)")
    p.add_argument("--llrd", type=float, default=None, help="layer-wise lr decay")
    p.add_argument("--precision", choices=PRECISIONS, default=None)
    p.add_argument("--save-every", type=int, default=None,
                   help="checkpoint every N steps (besides each epoch end), so that a stopped run loses less")
    p.add_argument("--out", default="runs/bench")
    p.add_argument("--compare-hf", action="store_true", help="throughput against HF pipeline (needs --model)")
    p.add_argument("--speed", action="store_true", help="prediction speed of --model on the dev set")
    p.add_argument("--model", default=None)
    p.add_argument("--n", type=int, default=1000, help="texts for --compare-hf")
    p.add_argument("--cli", action="store_true",
                   help="train through `zhie train ner` (as a user would; no --save-every there: it checkpoints at "
                        "each epoch end) instead of zhie.fit")
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args()
    if args.speed:  # prediction speed of a trained model alone (training runs in parallel share the device)
        texts = [ex.text for ex in read_ner(dataset_files(args.dataset, Path(args.out))[1])]
        row = {"dataset": args.dataset, "speed": True, "model": args.model,
               **prediction_speed(Path(args.model), texts, args.eval_batch_size), "machine": machine(),
               "date": date.today().isoformat(), "command": "python " + " ".join(sys.argv)}
    else:
        row = compare_hf(args) if args.compare_hf else run(args)
    append_result("ner", row)


if __name__ == "__main__":
    with machine_lock():
        main()
