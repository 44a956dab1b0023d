"""MTMT benchmark (spec §10, issue 14): zero-shot cross-lingual NER, WikiANN English -> German.

    python benchmarks/mtmt.py --seeds 1 2 3                      # the full setting (a GPU)
    python benchmarks/mtmt.py --src-train 600 --tgt-train 600 --dev 300 --encoder-layers 3 --seeds 1   # a CPU

Systems, each scored by entity F1 on (a subsample of) WikiANN de dev:

* ``direct``: the English word-level recogniser (``zhie train ner --mode word --head softmax``) applied to German;
* ``tsl``: single-teacher distillation, the student from the recogniser alone (no similarity task, no weights);
* ``mtmt``: the full student (recogniser + similarity evaluator, α β γ weights); ``mtmt-no-alpha``, ``-no-beta``,
  ``-no-gamma``: one weight off;
* ``supervised``: a recogniser trained on the labelled German train subsample (the upper bound).

The German train split is used as unlabelled text only (its labels feed ``supervised`` and nothing else); de dev picks
each student's best evaluation (as ``zhie distill --dev``). Subsamples are the first N sentences of each split after a
shuffle with seed 0, the same for every seed. The encoder (e5-small unless ``--encoder``) is cut to
``--encoder-layers`` and its vocabulary pruned to the tokens of the sampled sentences (which leaves their tokenisation
unchanged), once, into ``OUT/encoder``. Each system and seed appends one JSON line to ``benchmarks/results/mtmt.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from datetime import date
from pathlib import Path

from common import DATA, RESULTS, append_result, machine, machine_lock, once

import zhie
from zhie import encoders
from zhie.core.files import replace_dir
from zhie.data import read_ner, write_ner_jsonl
from zhie.training import TrainConfig
from zhie.training.mtmt import distill

WIKIANN = DATA / "xner" / "wikiann"
STUDENTS = {"tsl": {"alpha": False, "beta": False, "gamma": False, "similarity": False}, "mtmt": {},
            "mtmt-no-alpha": {"alpha": False}, "mtmt-no-beta": {"beta": False}, "mtmt-no-gamma": {"gamma": False}}
SYSTEMS = ("direct", *STUDENTS, "supervised")
ORDER = ("tsl", "mtmt", "supervised", "mtmt-no-alpha", "mtmt-no-beta", "mtmt-no-gamma")  # after direct
RESULTS_FILE = RESULTS / "mtmt.jsonl"


def subsample(path: Path, n: int | None, out: Path) -> Path:
    examples = read_ner(path, "wikiann")
    order = list(range(len(examples)))
    random.Random(0).shuffle(order)
    write_ner_jsonl([examples[i] for i in order[:n]], out)
    return out


def prepare_encoder_dir(name: str, layers: int | None, files: list[Path], out: Path) -> Path:
    """``name`` cut to ``layers`` layers, its vocabulary pruned to the tokens of ``files``, saved in ``out`` whole
    (a directory filled aside, then moved: a run started beside the one writing it never loads half of it)."""
    if (out / "config.json").exists():
        return out
    model, tokenizer = encoders.load(name)
    if layers is not None:
        encoders.truncate_layers(model, layers)
    texts = [ex.text for f in files for ex in read_ner(f, "jsonl")]
    keep = {i for ids in tokenizer(texts, add_special_tokens=False)["input_ids"] for i in ids}
    model, tokenizer = encoders.prune_vocab(model, tokenizer, keep)
    out.parent.mkdir(parents=True, exist_ok=True)
    replace_dir(out, lambda tmp: (model.save_pretrained(tmp), tokenizer.save_pretrained(tmp)))
    return out


def f1_of(model_dir: Path, dev: Path) -> dict:
    metrics = zhie.load(model_dir).evaluate(read_ner(dev, "jsonl"))
    return {**metrics["micro"], "n_pred": metrics["n_pred"], "n_gold": metrics["n_gold"]}


def run_seed(args, seed: int, files: dict[str, Path], encoder: Path, base: dict) -> None:
    out = args.out / f"seed{seed}"
    teacher = TrainConfig(epochs=args.epochs, batch_size=args.batch_size, lr=args.lr, head_lr=args.lr, seed=seed,
                          save_every=args.save_every)
    word_ner = {"format": "jsonl", "mode": "word", "head": "softmax", "max_length": args.max_length}

    def record(system: str, metrics: dict, seconds: float, **extra) -> None:
        append_result("mtmt", {**base, "system": system, "seed": seed, **metrics, "train_s": seconds, **extra})

    def fit_and_score(task: str, train: Path, dev: Path, directory: Path, **options) -> dict:
        zhie.fit(task, train, dev, out=directory, encoder=str(encoder), config=teacher, resume=True, progress=False,
                 **options)
        return f1_of(directory, files["de_dev"]) if task == "ner" else {}

    rec = once(out / "recognizer", fit_and_score, "ner", files["en_train"], files["en_dev"], out / "recognizer",
               **word_ner)
    if "direct" in args.systems:
        record("direct", {k: v for k, v in rec.items() if k != "seconds"}, rec["seconds"])
    ev = once(out / "evaluator", fit_and_score, "xner-evaluator", files["en_train"], files["en_dev"],
              out / "evaluator", format="jsonl", max_length=args.max_length, pairs=args.evaluator_pairs,
              dev_pairs=min(args.evaluator_pairs, 1000))
    ev_metrics = once(out / "evaluator-dev", lambda: zhie.load(out / "evaluator").evaluate(
        read_ner(files["en_dev"], "jsonl")))
    for system in [x for x in ORDER if x in args.systems]:  # the ablations last: a cut-short run has the main rows
        if system == "supervised":
            sup = once(out / "supervised", fit_and_score, "ner", files["de_train"], files["de_dev"],
                       out / "supervised", **word_ner)
            record("supervised", {k: v for k, v in sup.items() if k != "seconds"}, sup["seconds"])
            continue
        student = TrainConfig(epochs=args.student_epochs, batch_size=args.batch_size, lr=args.student_lr,
                              head_lr=args.student_lr, seed=seed,
                              save_every=args.save_every)

        def distil_and_score(system=system, student=student) -> dict:
            distill(out / "recognizer", out / "evaluator", files["de_train"], out=out / system, dev=files["de_dev"],
                    format="jsonl", encoder=str(encoder), pairs=args.pairs, config=student, resume=True,
                    progress=False, **STUDENTS[system])
            return f1_of(out / system, files["de_dev"])

        result = once(out / system, distil_and_score)
        record(system, {k: v for k, v in result.items() if k != "seconds"}, result["seconds"],
               teachers_s=round(rec["seconds"] + ev["seconds"], 1), evaluator_f1=ev_metrics["f1"],
               evaluator_accuracy=ev_metrics["accuracy"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("runs/mtmt"))
    p.add_argument("--encoder", default="e5-small")
    p.add_argument("--encoder-layers", type=int, default=None, help="keep the encoder's first N layers (CPU runs)")
    p.add_argument("--src-train", type=int, default=None, help="English train sentences (default: all 20,000)")
    p.add_argument("--src-dev", type=int, default=1000, help="English dev sentences (the teachers' model selection)")
    p.add_argument("--tgt-train", type=int, default=None, help="German train sentences, as unlabelled text")
    p.add_argument("--dev", type=int, default=None, help="German dev sentences scored (default: all 10,000)")
    p.add_argument("--epochs", type=int, default=3, help="teachers' and the supervised model's epochs")
    p.add_argument("--student-epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=5e-5, help="teachers' learning rate")
    p.add_argument("--student-lr", type=float, default=5e-5, help="student encoder lr (its head: 1/1000 of it)")
    p.add_argument("--pairs", type=int, default=None, help="student pairs per epoch (default: one per target word)")
    p.add_argument("--evaluator-pairs", type=int, default=20_000)
    p.add_argument("--max-length", type=int, default=64)
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=SYSTEMS)
    p.add_argument("--save-every", type=int, default=None, help="checkpoint every N steps besides each epoch end")
    args = p.parse_args()

    data = args.out / "data"
    data.mkdir(parents=True, exist_ok=True)
    files = {"en_train": subsample(WIKIANN / "en/train", args.src_train, data / "en_train.jsonl"),
             "en_dev": subsample(WIKIANN / "en/dev", args.src_dev, data / "en_dev.jsonl"),
             "de_train": subsample(WIKIANN / "de/train", args.tgt_train, data / "de_train.jsonl"),
             "de_dev": subsample(WIKIANN / "de/dev", args.dev, data / "de_dev.jsonl")}
    encoder = prepare_encoder_dir(args.encoder, args.encoder_layers, list(files.values()), args.out / "encoder")
    base = {"encoder": args.encoder, "encoder_layers": args.encoder_layers, "src_train": args.src_train,
            "src_dev": args.src_dev, "tgt_train": args.tgt_train, "dev": args.dev, "epochs": args.epochs,
            "student_epochs": args.student_epochs, "pairs": args.pairs, "evaluator_pairs": args.evaluator_pairs,
            "lr": args.lr, "student_lr": args.student_lr, "max_length": args.max_length, "machine": machine(),
            "date": date.today().isoformat(),
            "command": "python " + " ".join(sys.argv)}
    start = len(RESULTS_FILE.read_text(encoding="utf-8").splitlines()) if RESULTS_FILE.exists() else 0
    for seed in args.seeds:
        run_seed(args, seed, files, encoder, base)
    summarise(start)


def summarise(start: int) -> None:
    """Mean ± std of F1 per system over the rows this run wrote."""
    rows = [json.loads(line) for line in RESULTS_FILE.read_text(encoding="utf-8").splitlines()]
    by_system: dict[str, list[float]] = {}
    for row in rows[start:]:
        by_system.setdefault(row["system"], []).append(100 * row["f1"])
    for system, f1s in by_system.items():
        std = statistics.stdev(f1s) if len(f1s) > 1 else 0.0
        print(f"{system:<15} F1 {statistics.mean(f1s):6.2f} ± {std:5.2f}  (n={len(f1s)})")


if __name__ == "__main__":
    with machine_lock():
        main()
