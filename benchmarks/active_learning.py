"""Active learning, simulated with the gold labels as the annotator (issue 52, part 4): learning curves, dev F1
against the number of labelled sentences, for random selection against zhie's strategies (``zhie select``).

    python benchmarks/active_learning.py --dataset cluener --strategy uncertainty --seed 1 --out runs/al/cluener-s1
    python benchmarks/active_learning.py --dataset cluener --strategy random --seed 1 --out runs/al/cluener-s1
    python benchmarks/active_learning.py --dataset cmeee --strategy random --sizes full --out runs/al/cmeee-full
    python benchmarks/active_learning.py --dataset cluener --strategy uncertainty --seed 1 --teacher-labelled 2000 \\
        --out runs/al/cluener-s1                                    # + a model distilled on teacher-labelled text

What one run measures (one curve: a dataset, a strategy, a seed). The training set of ``--dataset`` (the files of
``benchmarks/ner.py``; its distinct texts) is the pool of unlabelled sentences, whose gold labels are revealed as they
are "annotated"; the dev set scores each model. ``--sizes`` are the cumulative labelled-set sizes (``full``: the whole
pool). The first size is the seed set, drawn at random with ``--seed`` (``zhie select --strategy random``'s draw:
the same for every strategy of a seed). At each later size the model of the size before scores the unlabelled rest of
the pool by ``--strategy`` and the (next size - current size) texts it picks are labelled: zhie's own selection code,
:func:`zhie.deploy.selection.uncertainties` and :func:`~zhie.deploy.selection.choose` with ``zhie select``'s
defaults (``random`` draws with a seed made of ``--seed`` and the size). The diversity strategies keep the picks
unlike each other and unlike the texts labelled before (``zhie select --labelled``).

Every round trains a fresh model from the pretrained encoder on its labelled set (the standard simulation, not a
warm start), through :func:`zhie.fit` as ``benchmarks/ner.py`` trains (batch 16, zhie's learning rates), for
``max(3, ceil(--min-steps x batch / n))`` epochs so that a small set still gets ``--min-steps`` steps, evaluated about
``--evals`` times (each epoch when there are no more epochs than that); its best dev F1 is the round's F1. With
``--teacher-labelled N`` the round's model also labels N unlabelled texts of the pool (a seeded draw from those not
labelled yet) and a fresh model of the same kind (``zhie distill student --student fresh``: the same encoder started
again) is distilled on the gold set plus those texts, with the same rates and epoch rule; both F1s are recorded.

Each round appends one JSON line to ``benchmarks/results/active_learning.jsonl`` (RESULTS.md's learning-curve table
and ``report.py --plot``'s figure are made from these lines and the campaign's).

Run directory (``--out``; the same for every strategy of a dataset and seed, so that they share the seed round):
``round-<first size>/`` is the seed round, ``<strategy>/round-<size>/`` the later ones; each holds ``labelled.json``
(the pool indices labelled so far, in the order they were added; written once, so a resumed run never selects again
differently), ``train.jsonl``, ``model/`` (resumable with ``--save-every``; its ``checkpoint.pt`` is removed once the
round is done), ``done.json`` (the round's result: a rerun skips the round and prints its line again) and
``distilled-N/``. ``settings.json`` refuses a run directory made with other settings. A run stopped by the end of a
session resumes exactly (zhie's ``checkpoint.pt``); a later run with more ``--sizes`` continues the curve.
``--train-sizes`` trains only some of the sizes (random and diversity, whose picks need no model: the labelled sets of
the sizes between are drawn as before, without training), so that a curve's later points can be added on a machine
that no longer has its earlier rounds.

Cost, in CPU minutes of the 2-core machine (e5-small, gp; the campaign's rates: ~0.15 CPU s per sentence x epoch of
CLUENER training, ~0.2 for CMeEE's longer texts, ~0.02-0.035 per sentence evaluated or scored): a round trains
9,600-12,000 sentence x epochs, ~28 CPU min on CLUENER (~32 at 4,000) and ~36 on CMeEE with its dev evaluations;
scoring the pool adds ~3 min to a round of the uncertainty strategies. A CLUENER curve 200..4,000 is ~2.6 CPU h (of
which the seed round, ~27 min, is shared by the strategies of a seed), a CMeEE curve 200..2,000 ~2.5 h, CMeEE's whole
pool (3 epochs) ~42 min; ``--teacher-labelled 2000`` adds ~30-50 min to a round. Disk: ~100 MB per round (its model).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from datetime import date
from pathlib import Path

import numpy as np
from common import append_result, machine, machine_lock, once, trained_with
from filelock import FileLock
from ner import dataset_files

import zhie
from zhie.core.files import atomic_write_text
from zhie.data import read_ner, write_ner_jsonl
from zhie.deploy.selection import STRATEGIES, choose, uncertainties
from zhie.training import TrainConfig
from zhie.training.report import read_metrics
from zhie.training.rundir import CHECKPOINT
from zhie.training.students import distill_student

DATASETS = ("cluener", "cmeee")
HEADS = ("gp", "egp", "crf", "softmax")
MIN_EPOCHS = 3
MODEL_FREE = ("random", "diversity")  # the strategies whose picks need no model: --train-sizes
SETTINGS = ("dataset", "seed", "head", "encoder", "max_length", "batch_size", "min_steps", "evals")  # of a run dir


def parse_sizes(text: str) -> list[str]:
    """``--sizes 200,500,full`` as ``["200", "500", "full"]``, checked once the pool is known (:func:`sizes_of`)."""
    sizes = [s.strip() for s in text.split(",") if s.strip()]
    if not sizes or not all(s == "full" or (s.isdigit() and int(s) > 0) for s in sizes):
        raise argparse.ArgumentTypeError(f"{text!r}: give labelled-set sizes separated by commas, e.g. 200,500,full")
    return sizes


def sizes_of(sizes: list[str], pool: int) -> list[int]:
    """The sizes as numbers (``full``: the pool), strictly increasing and at most the pool, or an error."""
    numbers = [pool if s == "full" else int(s) for s in sizes]
    if any(b <= a for a, b in zip(numbers, numbers[1:])) or numbers[-1] > pool:
        raise SystemExit(f"--sizes {','.join(sizes)}: give increasing sizes of at most the pool's {pool:,} texts")
    return numbers


def read_pool(path: Path) -> list:
    """The examples of the training file with distinct texts (the first of each), in file order: the pool."""
    seen, pool = set(), []
    for example in read_ner(path):
        if example.text not in seen:
            seen.add(example.text)
            pool.append(example)
    return pool


def round_seed(seed: int, size: int, purpose: int = 0) -> int:
    """A seed for one round's draw, made of the run's ``seed``, the round's ``size`` and what it draws."""
    return int(np.random.SeedSequence([seed, size, purpose]).generate_state(1)[0])


def epochs_for(n: int, args) -> int:
    """At least :data:`MIN_EPOCHS`, and enough for ``--min-steps`` steps of ``--batch-size`` on ``n`` items."""
    return max(MIN_EPOCHS, math.ceil(args.min_steps * args.batch_size / n))


def round_config(n: int, args, lr: float | None = None, head_lr: float | None = None) -> TrainConfig:
    """The training settings of a round of ``n`` items: :func:`epochs_for`, evaluated about ``--evals`` times."""
    epochs = epochs_for(n, args)
    steps = epochs * math.ceil(n / args.batch_size)
    eval_every = None if epochs <= args.evals else math.ceil(steps / args.evals)
    return TrainConfig(epochs=epochs, batch_size=args.batch_size, lr=lr, head_lr=head_lr, seed=args.seed,
                       save_every=args.save_every, eval_every=eval_every)


def check_settings(out: Path, args) -> None:
    """Write ``out/settings.json`` the first time; later runs (other strategies, sizes) must agree with it."""
    path, settings = out / "settings.json", {name: getattr(args, name) for name in SETTINGS}
    if path.exists():
        stored = json.loads(path.read_text(encoding="utf-8"))
        differ = [f"{k}: {stored.get(k)!r} there, {v!r} here" for k, v in settings.items() if stored.get(k) != v]
        if differ:
            raise SystemExit(f"{out} was made with other settings ({'; '.join(differ)}): give another --out")
        return
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(settings, indent=1))


# ------------------------------------------------------------------------------------------------- selection
def pick(texts: list[str], labelled: list[int], size: int, previous: Path | None, args) -> dict:
    """The labelled set of the round of ``size``: the seed set (``previous`` None: a random draw of ``--seed``), or
    ``labelled`` plus the texts that ``--strategy`` picks from the rest of the pool with the model of ``previous``."""
    start = time.perf_counter()
    if previous is None:
        return {"indices": choose(texts, size, "random", seed=args.seed).indices, "added": size, "strategy": "seed",
                "select_s": round(time.perf_counter() - start, 2)}
    taken = set(labelled)
    rest = [i for i in range(len(texts)) if i not in taken]
    budget, info = size - len(labelled), {}
    if budget == len(rest):  # the whole pool: nothing to choose
        chosen = list(range(len(rest)))
    else:
        scores = None
        if args.strategy.startswith("uncertainty"):
            scores = uncertainties(zhie.load(previous / "model"), [texts[i] for i in rest],
                                   batch_size=args.eval_batch_size)
        choice = choose([texts[i] for i in rest], budget, args.strategy, scores, seed=round_seed(args.seed, size),
                        labelled=[texts[i] for i in labelled])  # zhie select --labelled
        chosen, info["relaxed"] = choice.indices, choice.relaxed
        if scores is not None:
            info.update(uncertainty_picked=float(scores[chosen].mean()), uncertainty_rest=float(scores.mean()))
    return {"indices": labelled + [rest[k] for k in chosen], "added": budget, "strategy": args.strategy,
            "select_s": round(time.perf_counter() - start, 2), **info}


def labelled_set(directory: Path, texts: list[str], labelled: list[int], size: int, previous: Path | None,
                 args) -> dict:
    """``directory/labelled.json`` (:func:`pick`'s record), made and written once, with the round's training file."""
    path = directory / "labelled.json"
    if path.exists():
        return json.loads(path.read_text(encoding="utf-8"))
    record = pick(texts, labelled, size, previous, args)
    directory.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(record))
    return record


# ------------------------------------------------------------------------------------------------- training
def train_round(directory: Path, n: int, dev: Path, args) -> dict:
    """Train the round's model on ``directory/train.jsonl`` (``n`` sentences) into ``directory/model``."""
    config = round_config(n, args)
    start = time.time()
    result = zhie.fit("ner", directory / "train.jsonl", dev, out=directory / "model", encoder=args.encoder,
                      head=args.head, max_length=args.max_length, flatten=args.head in ("crf", "softmax"),
                      config=config, resume=True, progress=not args.quiet)
    best = result["best"]
    return {"dev_f1": best.get("f1"), "dev_precision": best.get("precision"), "dev_recall": best.get("recall"),
            "f1_per_eval": [h["dev"].get("f1") for h in read_metrics(directory / "model" / "metrics.jsonl")],
            "epochs": config.epochs, "eval_every": config.eval_every, "steps": result["steps"],
            **trained_with(directory / "model"), "train_s": round(time.time() - start), "machine": machine(),
            "date": date.today().isoformat()}


def distill_round(directory: Path, texts: list[str], record: dict, gold: dict, dev: Path, args) -> dict:
    """Distil a fresh model from the round's model on its gold set plus ``--teacher-labelled`` unlabelled texts of
    the pool (a seeded draw from those not labelled), with the round's rates, into ``directory/distilled-N``."""
    out, size = directory / f"distilled-{args.teacher_labelled}", len(record["indices"])
    taken = set(record["indices"])
    rest = [i for i in range(len(texts)) if i not in taken]
    k = min(args.teacher_labelled, len(rest))
    if k == 0:
        return {"distilled_f1": None, "unlabelled_texts": 0}
    draw = choose([texts[i] for i in rest], k, "random", seed=round_seed(args.seed, size, 1))
    drawn = [rest[j] for j in draw.indices]
    unlabelled = out / "unlabelled.jsonl"
    if not unlabelled.exists():
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(unlabelled, "".join(json.dumps({"text": texts[i]}, ensure_ascii=False) + "\n"
                                              for i in drawn))
    config = round_config(size + k, args, lr=gold["lr"], head_lr=gold["head_lr"])
    start = time.time()
    result = distill_student([directory / "model" / "best"], directory / "train.jsonl", out=out / "model", dev=dev,
                             unlabelled=[unlabelled], student="fresh", config=config, resume=True,
                             progress=not args.quiet)
    best = result["best"]
    return {"distilled_f1": best.get("f1"), "distilled_precision": best.get("precision"),
            "distilled_recall": best.get("recall"), "unlabelled_texts": k, "distill_epochs": config.epochs,
            "distill_s": round(time.time() - start)}


def run_round(directory: Path, pool: list, labelled: list[int], size: int, previous: Path | None, dev: Path,
              args) -> tuple[list[int], dict]:
    """One round: its labelled set, its model (skipped when ``done.json`` holds it), its distillation; its line."""
    texts = [example.text for example in pool]
    record = labelled_set(directory, texts, labelled, size, previous, args)
    if record["indices"][:len(labelled)] != labelled or len(record["indices"]) != size:
        raise SystemExit(f"{directory / 'labelled.json'} does not extend the round before it to {size} texts: this "
                         "run directory was made by another run; give another --out")
    if not (directory / "train.jsonl").exists():
        write_ner_jsonl([pool[i] for i in record["indices"]], directory / "train.jsonl")
    gold = once(directory, train_round, directory, size, dev, args)
    gold.pop("seconds", None)
    (directory / "model" / CHECKPOINT).unlink(missing_ok=True)  # done: only a resume needed it (~300 MB)
    row = {"dataset": args.dataset, "strategy": args.strategy, "seed": args.seed, "size": size, "pool": len(pool),
           "share": size / len(pool), "round": "seed" if previous is None else "selected", "added": record["added"],
           "select_s": record["select_s"],
           **{k: record[k] for k in ("uncertainty_picked", "uncertainty_rest", "relaxed") if k in record},
           "head": args.head, "encoder": args.encoder, "min_steps": args.min_steps, **gold,
           "teacher_labelled": args.teacher_labelled}
    if args.teacher_labelled:
        distilled = once(directory / f"distilled-{args.teacher_labelled}", distill_round, directory, texts, record,
                         gold, dev, args)
        distilled.pop("seconds", None)
        (directory / f"distilled-{args.teacher_labelled}" / "model" / CHECKPOINT).unlink(missing_ok=True)
        row.update(distilled)
    return record["indices"], {**row, "command": "python " + " ".join(sys.argv)}


def run(args) -> None:
    out = Path(args.out)
    train, dev = dataset_files(args.dataset, out)
    pool = read_pool(train)
    sizes = sizes_of(args.sizes, len(pool))
    trained = set(sizes_of(args.train_sizes, len(pool))) if args.train_sizes else set(sizes)
    if not trained <= set(sizes):
        raise SystemExit(f"--train-sizes {','.join(args.train_sizes)}: give sizes among --sizes "
                         f"{','.join(args.sizes)}")
    if trained != set(sizes) and args.strategy not in MODEL_FREE:
        raise SystemExit(f"--train-sizes: {args.strategy} picks each round's texts with the model of the round "
                         f"before, so every round is trained; only {' and '.join(MODEL_FREE)} can skip rounds")
    check_settings(out, args)
    labelled: list[int] = []
    previous = None
    for size in sizes:
        directory = out / f"round-{size}" if previous is None else out / args.strategy / f"round-{size}"
        if size not in trained:  # random and diversity draw the next texts without this round's model
            labelled = labelled_set(directory, [e.text for e in pool], labelled, size, previous, args)["indices"]
            previous = directory
            continue
        if previous is None:  # the seed round, shared by the strategies: one of them trains it, the others wait
            with FileLock(out / f".round-{size}.wait.lock"):
                labelled, row = run_round(directory, pool, labelled, size, previous, dev, args)
        else:
            labelled, row = run_round(directory, pool, labelled, size, previous, dev, args)
        append_result("active_learning", row)
        previous = directory


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", required=True, choices=DATASETS)
    p.add_argument("--strategy", required=True, choices=STRATEGIES)
    p.add_argument("--seed", type=int, default=1, help="the seed set's draw, random's draws and the trainings")
    p.add_argument("--sizes", type=parse_sizes, default=parse_sizes("200,500,1000,2000,4000"),
                   help="cumulative labelled-set sizes, the first the seed set (full: the whole pool)")
    p.add_argument("--train-sizes", type=parse_sizes, default=None,
                   help="train (and record) only these of --sizes, default every one: the labelled sets of the others "
                        "are drawn all the same (random and diversity only, whose picks need no model), so a curve's "
                        "later points can be added on a machine without its earlier rounds")
    p.add_argument("--head", default="gp", choices=HEADS)
    p.add_argument("--encoder", default="e5-small", help="e5-small, a local encoder directory, or tiny (smoke tests)")
    p.add_argument("--max-length", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=TrainConfig.batch_size)
    p.add_argument("--eval-batch-size", type=int, default=64, help="texts per batch when the pool is scored")
    p.add_argument("--min-steps", type=int, default=600,
                   help="train each round for max(3, ceil(N x batch / n)) epochs on its n sentences")
    p.add_argument("--evals", type=int, default=5, help="evaluations on dev per round (each epoch if fewer epochs)")
    p.add_argument("--teacher-labelled", type=int, default=0, metavar="N",
                   help="also distil a fresh model on the gold set + N teacher-labelled pool texts (0: off)")
    p.add_argument("--save-every", type=int, default=None, help="checkpoint every N steps (a stopped run resumes)")
    p.add_argument("--out", required=True, help="the run directory (shared by the strategies of a dataset and seed)")
    p.add_argument("--quiet", action="store_true")
    run(p.parse_args(argv))


if __name__ == "__main__":
    with machine_lock():
        main()
