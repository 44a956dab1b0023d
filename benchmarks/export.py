"""Dev F1 and CPU prediction speed of one NER model run by torch and by onnxruntime exports of it: fp32 and the int8
variants of ``zhie export`` (issue 25 item 3), in one process with the same threads and batch size.

    python benchmarks/export.py --model runs/cluener-gp/best --dataset cluener      # a trained model
    python benchmarks/export.py --dataset cmeee --model runs/cmeee-gp/best --variants int8 int8-static
    python benchmarks/export.py --train-sentences 2000 --epochs 3                   # or train a tiny one first

A variant is ``fp32`` or ``int8`` followed by any of ``-per-channel``, ``-reduce-range`` (7-bit weights),
``-keep-embeddings`` (the embedding tables stay fp32), ``-keep-last-layer`` (the encoder's last layer stays fp32:
``layer.N.`` with N from the model's config), ``-static`` (static quantisation calibrated on the first
``--calibration-texts`` training texts) and ``-batch-scales`` (dynamic, one activation scale per run instead of one
per token), each the flag of ``zhie export`` of the same name: ``int8-static-per-channel`` is ``zhie export MODEL --out
OUT --quantize int8 --calibrate TRAIN --per-channel``.

One row per variant and one for torch go to ``results/export.jsonl``: dataset, variant, dev micro F1 and its difference
to torch's, sentences/s over ``--repeats`` timed passes of the dev texts (the F1 pass before them is the untimed
warm-up), the dev sentences whose spans (and those whose scores) differ from their own predicted one at a time, the size
of ``model.onnx`` in MB (torch: its ``model.safetensors``), the seconds the export took, the model, the machine, the
date and the load average (1, 5, 15 min) when the row was measured. Each export is removed once measured.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import tempfile
import time
from datetime import date
from pathlib import Path

import torch
from common import append_result, machine, machine_lock
from ner import dataset_files

import zhie
from zhie.data import read_ner
from zhie.deploy.export import export
from zhie.deploy.runtime import load_export
from zhie.training import TrainConfig

DATASETS = ("cluener", "peoples_daily", "cmeee")
DEFAULT_VARIANTS = ("fp32", "int8", "int8-per-channel", "int8-keep-embeddings", "int8-keep-last-layer", "int8-static",
                    "int8-reduce-range", "int8-per-channel-reduce-range")
SUFFIXES = ("per-channel", "reduce-range", "keep-embeddings", "keep-last-layer", "keep-heads", "static", "batch-scales")


def variant_options(variant: str, calibration: list[str], layers: int) -> dict:
    """The keywords of :func:`zhie.deploy.export.export` for ``variant`` (see the module's doc); ``layers``: the
    encoder's."""
    if variant == "fp32":
        return {}
    if not variant.startswith("int8"):
        raise SystemExit(f"unknown variant {variant!r}: fp32, or int8 with any of -{', -'.join(SUFFIXES)}")
    options: dict = {"quantize": "int8"}
    rest = variant[len("int8"):]
    while rest:
        suffix = next((s for s in SUFFIXES if rest.startswith(f"-{s}")), None)
        if suffix is None:
            raise SystemExit(f"variant {variant!r}: {rest!r} is none of -{', -'.join(SUFFIXES)}")
        rest = rest[len(suffix) + 1:]
        if suffix == "per-channel":
            options["per_channel"] = True
        elif suffix == "reduce-range":
            options["reduce_range"] = True
        elif suffix == "batch-scales":
            options["batch_scales"] = True
        elif suffix == "static":
            options["calibration"] = calibration
        else:
            pattern = {"keep-embeddings": "embeddings", "keep-heads": "heads."}.get(suffix, f"layer.{layers - 1}.")
            options["keep_fp32"] = (*options.get("keep_fp32", ()), pattern)
    return options


def train_tiny(dataset: str, out: Path, sentences: int, epochs: int) -> Path:
    """A tiny-encoder GP model on the first ``sentences`` training sentences of ``dataset`` (minutes on two cores)."""
    from zhie.data import write_ner_jsonl

    train, dev = dataset_files(dataset, out)
    out.mkdir(parents=True, exist_ok=True)
    write_ner_jsonl(read_ner(train)[:sentences], out / "train.jsonl")
    config = TrainConfig(epochs=epochs, batch_size=32, lr=1e-3, head_lr=1e-3, warmup=0.05, seed=0, eval_every=10**9)
    zhie.fit("ner", out / "train.jsonl", dev, out=out / "run", encoder="tiny", head="gp", max_length=128,
             config=config, resume=False, progress=False)
    return out / "run" / "best"


def measure(pipe, dev: list, batch_size: int, repeats: int) -> dict:
    """Dev micro F1 (an untimed pass, the warm-up), then sentences/s over ``repeats`` timed passes, and the dev
    sentences whose spans (or scores) at ``batch_size`` differ from their own when predicted one at a time."""
    f1 = pipe.evaluate(dev, batch_size=batch_size)["micro"]["f1"]
    texts = [ex.text for ex in dev]
    load = os.getloadavg()
    start = time.perf_counter()
    for _ in range(repeats):
        batched = pipe.predict(texts, batch_size=batch_size)
    speed = repeats * len(texts) / (time.perf_counter() - start)
    alone = pipe.predict(texts, batch_size=1)
    spans = [[(s.start, s.end, s.label) for s in p] for p in (*batched, *alone)]
    scores = [[s.score for s in p] for p in (*batched, *alone)]
    n = len(texts)
    return {"dev_f1": round(f1, 4), "sentences_per_s": round(speed, 1), "load_avg": [round(x, 2) for x in load],
            "spans_changed_by_batching": sum(spans[i] != spans[n + i] for i in range(n)),
            "scores_changed_by_batching": sum(scores[i] != scores[n + i] for i in range(n))}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="a NER model directory trained on --dataset (default: train a tiny "
                                                 "one on its first --train-sentences sentences)")
    p.add_argument("--dataset", default="cluener", choices=DATASETS, help="whose dev set is scored, and whose "
                                                                         "training texts calibrate -static")
    p.add_argument("--variants", nargs="+", default=list(DEFAULT_VARIANTS), metavar="VARIANT",
                   help=f"fp32, or int8 with any of -{', -'.join(SUFFIXES)} (default: {' '.join(DEFAULT_VARIANTS)})")
    p.add_argument("--calibration-texts", type=int, default=200, help="training texts that calibrate -static")
    p.add_argument("--train-sentences", type=int, default=2000)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--dev-limit", type=int, default=None, help="only the first N dev sentences")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--threads", type=int, default=2, help="torch and onnxruntime intra-op threads")
    p.add_argument("--repeats", type=int, default=1, help="timed passes over the dev texts")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    work = Path(tempfile.mkdtemp(prefix="zhie-export-bench-"))
    try:
        run(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run(args, work: Path) -> None:
    train, dev_file = dataset_files(args.dataset, work / "data")
    model = Path(args.model) if args.model else train_tiny(args.dataset, work / "train", args.train_sentences,
                                                           args.epochs)
    dev = read_ner(dev_file)[: args.dev_limit]
    calibration = [ex.text for ex in read_ner(train)[: args.calibration_texts]]
    layers = zhie.load(model, device="cpu").model.encoder.config.num_hidden_layers
    options = {v: variant_options(v, calibration, layers) for v in args.variants}  # bad names fail before any run
    common = {"dataset": args.dataset, "model": str(model) if args.model else (
        f"tiny gp, {args.train_sentences} sentences x {args.epochs} epochs"), "dev_texts": len(dev),
        "batch_size": args.batch_size, "threads": args.threads, "repeats": args.repeats}

    def row(variant: str, measured: dict, **extra) -> dict:
        return {"dataset": args.dataset, "variant": variant, **measured, **extra, **common, "machine": machine(),
                "date": str(date.today())}

    torch_row = row("torch", measure(zhie.load(model, device="cpu"), dev, args.batch_size, args.repeats),
                    f1_minus_torch=0.0,
                    size_mb=round(sum(f.stat().st_size for f in model.glob("*.safetensors")) / 2**20, 1))
    append_result("export", torch_row)
    for variant, kwargs in options.items():
        start = time.perf_counter()
        out = export(model, work / variant, **kwargs)
        seconds = time.perf_counter() - start
        record = json.loads((out / "export.json").read_text(encoding="utf-8"))
        task, onnx_model = load_export(out, threads=args.threads)  # as zhie.load, with onnxruntime's threads set
        measured = measure(task.pipeline_class(task, onnx_model, "cpu"), dev, args.batch_size, args.repeats)
        append_result("export", row(
            variant, measured, f1_minus_torch=round(measured["dev_f1"] - torch_row["dev_f1"], 4),
            size_mb=round((out / "model.onnx").stat().st_size / 2**20, 1), export_s=round(seconds, 1),
            int8_max_abs_diff=record.get("int8_max_abs_diff"), fp32_weights=len(record.get("fp32_weights", [])),
            calibration_texts=record.get("calibration_texts")))
        del task, onnx_model
        gc.collect()
        shutil.rmtree(out)


if __name__ == "__main__":
    with machine_lock():
        main()
