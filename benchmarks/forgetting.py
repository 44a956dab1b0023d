"""Forgetting: a CLUENER model of 7 entity types extended with the other 3, against one model trained on all 10 at once
and against naive fine-tuning (issue 52, part 4; ``zhie train ner --from``, :mod:`zhie.training.extend`).

What it measures: per-type dev F1 (precision, recall) and the micro-F1 over the old types, the new types and all of
them, of four GP models on CLUENER's dev set (which labels all 10 types):

* ``old``: trained on the old types only;
* ``extend``: the old model extended with the new types by ``zhie.fit(..., from_model=OLD)`` (``zhie train ner
  --from``): the new types learn from the gold labels, the old ones from the old model's outputs on the same texts;
* ``extend`` with ``--old-types predictions`` (its line's ``model`` in ``eval``: ``extend-predictions``): the same,
  with the spans the old model predicts as the old types' labels instead of its probabilities (pseudo-labels);
* ``extend`` with ``--extend-lr LR`` (``extend-lrLR``): the same at another learning rate (the head's 10x it unless
  ``--head-lr``): the old model was trained at zhie's rate already, and an extension at the full rate trains its old
  types three more epochs from a restarted warm-up; ``eval`` scores it with ``--variant NAME=DIR``;
* ``naive``: the same start and steps with ``old_types="gold"`` (``--old-types gold``), what users are told to do:
  fine-tune the old model on the new data alone, whose silence on the old types is taken as "none";
* ``all-types``: a model trained on all 10 types at once (``--all-types MODEL``, e.g. the campaign's CLUENER 3-epoch GP
  teacher, ``benchmarks/ner.py --dataset cluener --head gp --epochs 3``).

The claim it tests: the extended model keeps the old types within 0.5 F1 of the all-at-once model, and naive
fine-tuning loses them (``benchmarks/report.py``'s ``forgetting`` table).

The design: the same texts, annotated twice. The first annotation pass labels the old types (``--new-types``' spans
removed from CLUENER train; every one of its 10,748 texts kept, also those left with no entity); the second pass over
the same texts adds the new types (only their spans kept). So the new data is not new text: what the extended model
gains over the old one comes from the new labels alone, and the all-at-once model saw exactly the union of the two
passes. The old model is chosen on CLUENER dev with the new types removed (its own annotation pass); ``extend`` and
``naive`` on the full dev set (zhie's docs: the dev set of a run that adds types labels every type). Every training
runs as ``benchmarks/ner.py`` trains: GP head, e5-small, zhie's default rates and batch, ``--max-length 256``, 3 epochs,
``--seed``; ``extend`` and ``naive`` take the old model's encoder, head and settings.

Each step is one process (and one campaign row); a training step runs in ``OUT/<step>/`` with ``resume=True`` and
``--save-every`` (zhie's exact resume: a step stopped by the end of a session continues), and a step whose result is
there (``OUT/<step>/done.json``) is not run again, only its lines written again. The steps after ``old`` take the old
model from ``--old`` (default ``OUT/old/best``), so that each can be a row of its own with its own ``--out``:

    python benchmarks/forgetting.py --step old --out runs/forgetting --seed 1 --save-every 100
    python benchmarks/forgetting.py --step extend --out runs/forgetting --seed 1 --save-every 100
    python benchmarks/forgetting.py --step naive --out runs/forgetting --seed 1 --save-every 100
    python benchmarks/forgetting.py --step extend --old-types predictions --out runs/forgetting --seed 1 \
        --save-every 100                                      # in OUT/extend-predictions/
    python benchmarks/forgetting.py --step extend --extend-lr 5e-5 --out runs/forgetting --seed 1 \
        --save-every 100                                      # in OUT/extend-lr5e-05/
    python benchmarks/forgetting.py --step eval --out runs/forgetting --all-types runs/bench/cluener-gp/best \
        --variant extend-lr5e-05=runs/forgetting/extend-lr5e-05/best

Each step appends its JSON lines to ``benchmarks/results/forgetting.jsonl`` (a training step one, with its dev F1 per
epoch; ``eval`` one per model, with the per-type and micro figures). Cost on this project's 2-core CPU: each training
step about as long as a 3-epoch e5-small CLUENER run (60-90 min; ``extend`` adds the old model's pass over the
training texts, a few minutes), ``eval`` a few minutes (1,343 dev texts through each model).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import date
from pathlib import Path

from common import append_result, machine, machine_lock, once, peak_memory_mb, trained_with
from ner import dataset_files

import zhie
from zhie.core.metrics import span_prf
from zhie.data import NerExample, read_ner, write_ner_jsonl
from zhie.tasks.modeldir import resolve_model_dir
from zhie.training import TrainConfig
from zhie.training.report import read_metrics

STEPS = ("old", "extend", "naive", "eval")
NEW_TYPES = ("book", "game", "movie")
MODELS = ("old", "extend", "extend-predictions", "naive", "all-types")  # eval's lines, in this order


def annotation_pass(examples: list[NerExample], labels) -> list[NerExample]:
    """Every text of ``examples``, with the entities of ``labels`` only (an annotation pass of those types)."""
    return [NerExample(ex.text, [s for s in ex.spans if s.label in labels]) for ex in examples]


def split_types(args, train: list[NerExample]) -> tuple[list[str], list[str]]:
    """The old and the new types (sorted): the new ones are ``--new-types``, the old ones the data's others."""
    found = sorted({s.label for ex in train for s in ex.spans})
    unknown = sorted(set(args.new_types) - set(found))
    if unknown:
        raise SystemExit(f"--new-types {' '.join(unknown)}: not a type of the training data ({', '.join(found)})")
    new = sorted(set(args.new_types))
    old = [label for label in found if label not in new]
    if not old:
        raise SystemExit("--new-types names every type of the data: the old model needs some types of its own")
    return old, new


def step_data(args, step: str, out: Path) -> tuple[Path, Path, list[str], list[str]]:
    """The training and dev files of ``step`` (the annotation passes written under ``out/data``), and the old and new
    types."""
    train_file, dev_file = dataset_files("cluener", out)
    train = read_ner(train_file)
    old, new = split_types(args, train)
    data = out / "data"
    data.mkdir(parents=True, exist_ok=True)
    if step == "old":  # the first annotation pass: the old types, on every text; its dev set likewise
        write_ner_jsonl(annotation_pass(train, old), data / "old-train.jsonl")
        write_ner_jsonl(annotation_pass(read_ner(dev_file), old), data / "old-dev.jsonl")
        return data / "old-train.jsonl", data / "old-dev.jsonl", old, new
    write_ner_jsonl(annotation_pass(train, new), data / "new-train.jsonl")  # the second pass, over the same texts
    return data / "new-train.jsonl", dev_file, old, new


def train_step(args, step: str, out: Path) -> dict:
    """Train ``step``'s model in ``out/step`` (resuming there) and describe the run."""
    train_file, dev_file, old, new = step_data(args, step, out)
    run = out / run_name(args, step)
    lr = args.extend_lr if step == "extend" and args.extend_lr is not None else args.lr
    config = TrainConfig(epochs=args.epochs, batch_size=args.batch_size, lr=lr, head_lr=args.head_lr,
                         seed=args.seed, save_every=args.save_every)
    start = time.time()
    if step == "old":
        result = zhie.fit("ner", train_file, dev_file, out=run, encoder=args.encoder, head="gp",
                          max_length=args.max_length, config=config, resume=True, progress=not args.quiet)
    else:  # the old model's encoder, head and settings; naive: every type taught by the new labels alone
        result = zhie.fit("ner", train_file, dev_file, out=run, from_model=old_model(args, out), head="gp",
                          max_length=args.max_length, old_types="gold" if step == "naive" else args.old_types,
                          config=config, resume=True, progress=not args.quiet)
    history = read_metrics(run / "metrics.jsonl")
    examples = read_ner(train_file)
    return {"dataset": "cluener", "step": step, "old_types": old, "new_types": new,
            "from": str(old_model(args, out)) if step != "old" else None,
            **({"old_targets": args.old_types} if step == "extend" else {}), "encoder": args.encoder, "head": "gp",
            "epochs": args.epochs, "max_length": args.max_length, "seed": args.seed, **trained_with(run),
            "train_texts": len(examples), "train_spans": sum(len(ex.spans) for ex in examples),
            "dev": str(dev_file), "dev_f1": result["best"].get("f1"), "dev_precision": result["best"].get("precision"),
            "dev_recall": result["best"].get("recall"), "f1_per_epoch": [h["dev"].get("f1") for h in history],
            "train_tokens_per_s": sum(h["tokens_per_s"] for h in history) / len(history),
            "train_s": round(time.time() - start), "teacher_targets": (run / "teacher" / "targets.pt").is_file(),
            "peak_memory_mb": peak_memory_mb(), **stamp(out)}


def run_name(args, step: str) -> str:
    """The directory of ``step`` under the run directory: for ``extend``, ``-predictions`` after it with ``--old-types
    predictions`` and ``-lrLR`` with ``--extend-lr LR`` (``extend-lr5e-05``); else the step's name."""
    if step != "extend":
        return step
    return (step + ("-predictions" if args.old_types == "predictions" else "")
            + (f"-lr{args.extend_lr:g}" if args.extend_lr is not None else ""))


def stamp(out: Path) -> dict:
    """Where and when a line was made, by which command, in which run directory."""
    return {"machine": machine(), "date": date.today().isoformat(), "command": "python " + " ".join(sys.argv),
            "run": str(out)}


def old_model(args, out: Path) -> Path:
    return Path(args.old) if args.old else out / "old" / "best"


def scores(model: Path, dev: list[NerExample], old: list[str], new: list[str], batch_size: int) -> dict:
    """Per-type dev P/R/F1 of ``model`` and the micro figures over the old types, the new ones and all of them."""
    pipe = zhie.load(model)
    predicted = pipe.predict([ex.text for ex in dev], batch_size=batch_size)
    gold = [ex.spans for ex in dev]

    def over(labels) -> dict:
        return span_prf([[s for s in g if s.label in labels] for g in gold],
                        [[s for s in p if s.label in labels] for p in predicted])

    everything = over({*old, *new})
    return {"types": list(pipe.task.config.labels), "per_type": everything["per_type"],
            "old_micro": over(set(old))["micro"], "new_micro": over(set(new))["micro"],
            "all_micro": everything["micro"]}


def evaluate(args, out: Path) -> dict:
    """The :func:`scores` on CLUENER dev of every model given, or found at its default place under ``out``
    (``OUT/<step>/best``; ``all-types`` only when given)."""
    train_file, dev_file = dataset_files("cluener", out)
    old, new = split_types(args, read_ner(train_file))
    dev = read_ner(dev_file)
    given = {"old": args.old, "extend": args.extended, "extend-predictions": args.extended_predictions,
             "naive": args.naive, "all-types": args.all_types}
    defaults = {"old": old_model(args, out), **{name: out / name / "best"
                                                for name in ("extend", "extend-predictions", "naive")}}
    paths = {}  # in MODELS' order
    for name in MODELS:
        if given[name]:
            paths[name] = Path(given[name])
        elif name in defaults and defaults[name].exists():
            paths[name] = defaults[name]
    for name, path in variants(args.variant):
        paths[name] = Path(path)
    if not paths:
        raise SystemExit(f"eval: no model to score (none given, none under {out}); name them with --old, --extended, "
                         "--extended-predictions, --naive, --all-types")
    lines = []
    for name in paths:
        lines.append({"dataset": "cluener", "step": "eval", "model": name, "path": str(paths[name]),
                      "old_types": old, "new_types": new, **scores(paths[name], dev, old, new, args.eval_batch_size),
                      "trained": trained_of(paths[name]), **stamp(out)})
    return {"lines": lines}


def variants(given: list[str]) -> list[tuple[str, str]]:
    """``--variant NAME=DIR`` values as ``(NAME, DIR)``, refused with the reason when one is not of that form or names
    one of :data:`MODELS` (given with its own option) or another variant."""
    pairs = []
    for value in given:
        name, sep, path = value.partition("=")
        if not sep or not name or not path:
            raise SystemExit(f"--variant {value}: give NAME=MODEL_DIR, e.g. extend-lr5e-05=RUN/extend-lr5e-05/best")
        if name in MODELS or name in dict(pairs):
            raise SystemExit(f"--variant {value}: {name} is named twice (--{name.replace('extend', 'extended')} "
                             "or another --variant); give each model one name")
        pairs.append((name, path))
    return pairs


def trained_of(model: Path) -> dict:
    """The seed, epochs, rates and batch that ``model`` was trained with (its ``training.json``)."""
    record = json.loads((resolve_model_dir(model) / "training.json").read_text(encoding="utf-8"))
    config = record["train_config"]
    return {k: config[k] for k in ("seed", "epochs", "batch_size", "lr", "head_lr")}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--step", required=True, choices=STEPS)
    p.add_argument("--new-types", nargs="+", default=list(NEW_TYPES), metavar="TYPE",
                   help="the types of the second annotation pass (default: %(default)s); the others are the old ones")
    p.add_argument("--out", default="runs/forgetting", help="the run directory: OUT/<step>/ for each step")
    p.add_argument("--old", default=None, metavar="MODEL_DIR",
                   help="extend, naive, eval: the old model (default: OUT/old/best)")
    p.add_argument("--extended", default=None, metavar="MODEL_DIR", help="eval: default OUT/extend/best")
    p.add_argument("--extended-predictions", default=None, metavar="MODEL_DIR",
                   help="eval: default OUT/extend-predictions/best (extend with --old-types predictions)")
    p.add_argument("--naive", default=None, metavar="MODEL_DIR", help="eval: default OUT/naive/best")
    p.add_argument("--variant", action="append", default=[], metavar="NAME=MODEL_DIR",
                   help="eval: another model to score, after the others, as model NAME (e.g. an extension with "
                        "--extend-lr: extend-lr5e-05=RUN/extend-lr5e-05/best); repeatable")
    p.add_argument("--all-types", default=None, metavar="MODEL_DIR",
                   help="eval: a model trained on all the types at once (left out of the table without it)")
    p.add_argument("--old-types", default="model", choices=("model", "predictions"),
                   help="extend: what teaches the old types, the old model's probabilities or its predicted spans "
                        "(zhie train ner --old-types)")
    p.add_argument("--extend-lr", type=float, default=None, metavar="LR",
                   help="extend: the extension's learning rate instead of --lr (the head's: --head-lr, or 10 x LR); "
                        "the run is OUT/extend-lrLR")
    p.add_argument("--encoder", default="e5-small", help="old: the encoder (the later steps take the old model's)")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=TrainConfig.batch_size)
    p.add_argument("--lr", type=float, default=None, help="default: zhie train's (2e-4 for e5-small)")
    p.add_argument("--head-lr", type=float, default=None, help="default: zhie train's (10 x --lr)")
    p.add_argument("--max-length", type=int, default=256)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--save-every", type=int, default=None,
                   help="checkpoint every N steps (besides each epoch end), so that a stopped run loses less")
    p.add_argument("--eval-batch-size", type=int, default=64)
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args(argv)
    if args.old_types != "model" and args.step != "extend":
        p.error(f"--old-types {args.old_types} is an option of --step extend (naive is --old-types gold by design)")
    if args.extend_lr is not None and args.step != "extend":
        p.error("--extend-lr is an option of --step extend (--lr sets every step's rate)")
    if args.variant and args.step != "eval":
        p.error("--variant is an option of --step eval")
    variants(args.variant)  # refused before anything is written
    out = Path(args.out)
    if args.step == "eval":
        lines = once(out / "eval", evaluate, args, out)["lines"]
    else:
        lines = [once(out / run_name(args, args.step), train_step, args, args.step, out)]
    for line in lines:  # a step run in an earlier session: its lines again, as they were
        append_result("forgetting", line)


if __name__ == "__main__":
    with machine_lock():
        main()
