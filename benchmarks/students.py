"""Students: distil a trained teacher into a smaller model with ``zhie distill student`` and record its dev F1 and
training time (speed is measured apart, on a quiet machine, through ``zhie predict``).

    python benchmarks/students.py --teacher runs/cluener-gp/best --dataset cluener --layers 4 --out runs/students
    python benchmarks/students.py --teacher T --dataset cluener --layers 4 --wiki-sentences 20000 --out runs/students
    python benchmarks/students.py --teacher T --student conv --width 256 --layers 4 --epochs 6 --out runs/conv
    python benchmarks/students.py --teacher T --student narrow --width 256 --layers 4 --epochs 6 --out runs/narrow

Datasets: those of ``benchmarks/ner.py`` (People's Daily: its fixed 80/20 split), and SXU word segmentation (its
train and test files; the teacher is a ``zhie train cws`` model). The unlabelled text the teacher
labels: the dataset's unlabelled test texts (CLUENER; the others have none), and with ``--wiki-sentences N`` the
first N sentences of ``corpus/wiki.txt`` (lines cut after 。！？, 8–120 characters; not in the dev set), with
``--medical-sentences N`` those of ``corpus/medical.txt`` (in-domain text for CMeEE), written to
``OUT/unlabelled.txt``. Each run appends one JSON line to ``benchmarks/results/students.jsonl``.
"""

from __future__ import annotations

import argparse
import re
import shlex
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

from common import DATA, append_result, machine, machine_lock, peak_memory_mb
from ner import DATASETS, dataset_files

from zhie.data.base import read_texts
from zhie.training import TrainConfig
from zhie.training.report import read_metrics
from zhie.training.rundir import CHECKPOINT
from zhie.training.student_models import STUDENTS
from zhie.training.students import dilation_list, distill_student
from zhie.training.teachers import TARGETS

UNLABELLED = {"cluener": "ner/cluener/test.json"}  # a set's own unlabelled texts (the others: --wiki-sentences)
CWS = {"sxu": ("cws/sxu/train.txt", "cws/sxu/test.txt")}  # word segmentation sets: (train, dev)


def files(dataset: str, out: Path) -> tuple[Path, Path]:
    """``(train, dev)`` of ``dataset``: a CWS set's files, else ``benchmarks/ner.py``'s."""
    return (DATA / CWS[dataset][0], DATA / CWS[dataset][1]) if dataset in CWS else dataset_files(dataset, out)


def corpus_sentences(name: str, n: int) -> list[str]:
    """The first ``n`` sentences of 8–120 characters of ``corpus/NAME.txt`` (its lines cut after 。！？)."""
    out: list[str] = []
    with open(DATA / f"corpus/{name}.txt", encoding="utf-8") as f:
        for line in f:
            out += [s.strip() for s in re.split(r"(?<=[。！？])", line) if 8 <= len(s.strip()) <= 120]
            if len(out) >= n:
                return out[:n]
    return out


def teachers(args, train: Path, dev: Path) -> list[Path]:
    """The teacher directories; with ``--train-teacher ARGS`` (one per ``--teacher``, in its order), one that does
    not exist (a fresh machine keeps no model of an earlier session), or whose run directory still holds a
    ``checkpoint.pt`` (a session stopped its training, and its ``best`` may be of an early epoch: the training resumes,
    and returns at once if it had finished; the campaign removes a finished row's checkpoints), is trained first, with
    its teacher row's arguments (the same seed gives the same model on the same machine), where the teacher row put it:
    a NER teacher by ``benchmarks/ner.py ARGS --out`` the directory two levels above it (``RUN/cluener-gp/best`` ->
    ``RUN``); a CWS teacher by ``zhie train cws --train TRAIN --dev DEV ARGS --out`` its parent (``RUN/best`` ->
    ``RUN``)."""
    if args.train_teacher and len(args.train_teacher) != len(args.teacher):
        raise SystemExit(f"error: {len(args.teacher)} --teacher and {len(args.train_teacher)} --train-teacher: give "
                         "one --train-teacher per --teacher, in the same order, or none")
    for teacher, train_args in zip(map(Path, args.teacher), args.train_teacher or [None] * len(args.teacher)):
        if train_args is None or (teacher.exists() and not (teacher.parent / CHECKPOINT).exists()):
            continue
        if args.dataset in CWS:
            command = [sys.executable, "-m", "zhie", "train", "cws", "--train", str(train), "--dev", str(dev),
                       *shlex.split(train_args), "--out", str(teacher.parent)]
        else:
            command = [sys.executable, str(Path(__file__).with_name("ner.py")), *shlex.split(train_args),
                       "--out", str(teacher.parents[1])]
        subprocess.run(command, check=True)
    return [Path(t) for t in args.teacher]


def stored_targets(run_dir: str | None) -> str | None:
    """``run_dir`` (``--targets-from``) when it holds an earlier distillation's stored teacher outputs, else None: the
    outputs are computed again (a fresh machine keeps no run of an earlier session; the same teachers, data and
    settings give the same outputs, so only the time differs, and the row records which happened)."""
    if run_dir is None or (Path(run_dir) / TARGETS).exists():
        return run_dir
    print(f"--targets-from {run_dir}: no stored teacher outputs there; the teacher labels the items again",
          file=sys.stderr)
    return None


def run(args) -> dict:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    train, dev = files(args.dataset, out)
    teacher_dirs = teachers(args, train, dev)
    unlabelled = out / "unlabelled.txt"
    own = read_texts(DATA / UNLABELLED[args.dataset]) if args.dataset in UNLABELLED else []
    texts = own + [t for name in ("wiki", "medical") if getattr(args, f"{name}_sentences")
                   for t in corpus_sentences(name, getattr(args, f"{name}_sentences"))]
    if not texts:
        raise SystemExit(f"{args.dataset} has no unlabelled texts of its own: give --wiki-sentences N or "
                         "--medical-sentences N")
    unlabelled.write_text("\n".join(texts) + "\n", encoding="utf-8")
    config = TrainConfig(epochs=args.epochs, batch_size=args.batch_size, lr=args.lr, head_lr=args.head_lr,
                         seed=args.seed, save_every=args.save_every, adversarial=args.adversarial, ema=args.ema)
    targets_from = stored_targets(args.targets_from)
    start = time.time()
    result = distill_student(teacher_dirs, train, out=out / "student", dev=dev,
                             unlabelled=[unlabelled], keep_layers=args.keep_layers, encoder_layers=args.layers,
                             student=args.student, width=args.width, ffn_width=args.ffn_width,
                             attention_heads=args.attention_heads,
                             dilations=args.dilations, bigrams=args.bigrams, head=args.head,
                             hard_weight=args.hard_weight, temperature=args.temperature,
                             hidden_weight=args.hidden_weight,
                             targets_from=targets_from, config=config,
                             progress=not args.quiet)
    history = read_metrics(out / "student" / "metrics.jsonl")
    return {"dataset": args.dataset, "teachers": [str(t) for t in teacher_dirs], "student": args.student,
            "layers": args.layers,
            "keep_layers": args.keep_layers if args.student == "cut" else None,
            "width": args.width if args.student in ("conv", "narrow") else None, "ffn_width": args.ffn_width,
            "attention_heads": args.attention_heads, "adversarial": args.adversarial, "ema": args.ema,
            "dilations": args.dilations, "bigrams": args.bigrams, "head": args.head,
            "targets_from": targets_from,
            "wiki_sentences": args.wiki_sentences, "medical_sentences": args.medical_sentences,
            "unlabelled_texts": len(texts), "hard_weight": args.hard_weight,
            "hidden_weight": args.hidden_weight,
            "temperature": args.temperature, "epochs": args.epochs, "batch_size": args.batch_size, "lr": args.lr,
            "head_lr": args.head_lr, "seed": args.seed, "dev_f1": result["best"].get("f1"),
            "f1_per_epoch": [h["dev"].get("f1") for h in history], "train_s": round(time.time() - start),
            "epoch_s": [h["elapsed_s"] for h in history],
            "train_tokens_per_s": sum(h["tokens_per_s"] for h in history) / max(1, len(history)),
            "peak_memory_mb": peak_memory_mb(), "machine": machine(), "date": date.today().isoformat(),
            "command": "python " + " ".join(sys.argv)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--teacher", action="append", required=True, help="teacher model directory; repeat: ensemble")
    p.add_argument("--train-teacher", action="append", default=None, metavar="ARGS",
                   help="the arguments that train a --teacher that does not exist: benchmarks/ner.py's (into the "
                        "directory two levels above it: RUN/cluener-gp/best is trained with --out RUN), or for a CWS "
                        "set zhie train cws's besides --train, --dev and --out (RUN/best: --out RUN); one per "
                        "--teacher")
    p.add_argument("--dataset", default="cluener", choices=[*DATASETS, *CWS])
    p.add_argument("--layers", type=int, required=True)
    p.add_argument("--keep-layers", default="spread")
    p.add_argument("--student", default="cut", choices=list(STUDENTS))
    p.add_argument("--width", type=int, default=256, help="--student conv: channels per block; narrow: hidden size")
    p.add_argument("--ffn-width", type=int, default=None, help="--student cut: feed-forward neurons kept per layer")
    p.add_argument("--attention-heads", type=int, default=None, help="--student cut: attention heads kept per layer")
    p.add_argument("--dilations", type=dilation_list, default=None, help="--student conv: e.g. 1,2,4,8")
    p.add_argument("--bigrams", type=int, default=0, help="--student conv or cut: rows of the hashed bigram table")
    p.add_argument("--head", default=None,
                   help="another head of the teacher's output type, fresh: egp for a gp teacher (default: the "
                        "teacher's)")
    p.add_argument("--wiki-sentences", type=int, default=0, help="the first N sentences of corpus/wiki.txt")
    p.add_argument("--medical-sentences", type=int, default=0,
                   help="the first N sentences of corpus/medical.txt (patients' questions, doctors' answers)")
    p.add_argument("--targets-from", default=None,
                   help="an earlier run's student directory: reuse its teacher outputs (where it has none, they are "
                        "computed)")
    p.add_argument("--hard-weight", type=float, default=0.5)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--hidden-weight", type=float, default=0.0, help="the hidden-state loss's weight (0: off)")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--head-lr", type=float, default=None)
    p.add_argument("--adversarial", default=None, choices=["fgm", "pgd"], help="the student's adversarial training")
    p.add_argument("--ema", type=float, default=None, help="the EMA decay of the student's weights (zhie's --ema)")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--save-every", type=int, default=None)
    p.add_argument("--out", required=True)
    p.add_argument("--quiet", action="store_true")
    append_result("students", run(p.parse_args()))


if __name__ == "__main__":
    with machine_lock():
        main()
