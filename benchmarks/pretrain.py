"""Pre-training studies (issue 12): small encoders MLM-trained by ``zhie pretrain``, then fine-tuned.

    python benchmarks/pretrain.py pretrain --family albert --steps 1500 --out runs/pt
    python benchmarks/pretrain.py finetune --encoder runs/pt/albert --task cluener --seeds 1 2 3 [--unshare]
    python benchmarks/pretrain.py plot --out runs/pt          # MLM curves of every run under --out

``pretrain`` builds one family at the "tiny" size of the seeds (BERT/ALBERT/RoFormerV2: 4 blocks, hidden 312, 12
heads, FFN 1248; ALBERT's factorised embedding 128; GAU-α: 8 GAU layers, hidden 312, e = 624, s = 128, which is
about the parameters of 4 transformer blocks) and MLM-trains it on ``../shared/data/corpus`` (wiki + medical) with
one recipe for all: char tokens, whole-word masking (rjieba) 15 % 80/10/10, packed sequences of ``--max-length``,
AdamW lr 5e-4, weight decay 0.01, linear decay, warm-up as ``zhie pretrain``'s default (none for RoFormerV2/GAU-α,
6 % for BERT/ALBERT, spec §6.4), the same steps × batch × length, i.e. the same tokens seen. ``finetune`` trains
CLUENER (GP), CMeEE (EGP) or CMeIE (GPLinker) on the encoder, optionally with ALBERT's sharing dropped
(``--unshare``: each layer its own copy of the shared weights, spec §9.2), and records dev F1 per epoch and seconds per
epoch. Rows go to ``benchmarks/results/pretrain.jsonl``; ``plot`` draws the held-out MLM curves into
``benchmarks/results/pretrain_mlm.png``.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from datetime import date
from pathlib import Path

from common import DATA, RESULTS, append_result, machine, machine_lock, peak_memory_mb

import zhie
from zhie.data import read_ner, write_ner_jsonl
from zhie.data.spo import read_spo
from zhie.training import TrainConfig
from zhie.training.pretrain import PretrainConfig, pretrain
from zhie.training.report import read_metrics

SIZES = {
    "bert": "new:bert:layers=4,hidden=312,heads=12,intermediate=1248",
    "albert": "new:albert:layers=4,hidden=312,heads=12,intermediate=1248,embedding=128",
    "roformer-v2": "new:roformer-v2:layers=4,hidden=312,heads=12,intermediate=1248",
    "gau-alpha": "new:gau-alpha:layers=8,hidden=312,intermediate=624,key_size=128",
    "e5-small": "e5-small",  # study c: continued pre-training (domain adaptation)
}
TASKS = {  # task, files, head options, the metric
    "cluener": ("ner", "ner/cluener/train.json", "ner/cluener/dev.json", {"head": "gp"}),
    "cmeee": ("ner", "ner/cmeee/train.json", "ner/cmeee/dev.json", {"head": "egp"}),
    "cmeie": ("re", "re/cmeie/train.jsonl", "re/cmeie/dev.jsonl", {"head": "gp"}),
}


def stamp(row: dict) -> dict:
    return {**row, "peak_memory_mb": peak_memory_mb(), "machine": machine(), "date": date.today().isoformat(),
            "command": "python " + " ".join(sys.argv)}


def cmd_pretrain(args) -> None:
    out = Path(args.out) / args.family
    config = PretrainConfig(steps=args.steps, batch_size=args.batch_size, max_length=args.max_length, lr=args.lr,
                            eval_every=args.eval_every, save_every=args.eval_every, seed=args.seed,
                            heldout=args.heldout, shuffle_buffer=args.shuffle_buffer)
    general = [DATA / "corpus/wiki.txt", DATA / "corpus/medical.txt"]
    corpus = general if args.corpus == "general" else medical_corpus(out)
    cpu, wall = time.process_time(), time.perf_counter()
    result = pretrain(corpus, SIZES[args.family], out, config=config, resume=args.resume,
                      time_limit_s=args.time_limit * 60 if args.time_limit else None, progress=not args.quiet)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    from zhie import encoders

    model, _ = encoders.load(out)
    append_result("pretrain", stamp({
        "study": "pretrain", "family": args.family, "corpus": args.corpus, "encoder": SIZES[args.family],
        "out": str(out),
        "parameters": sum(p.numel() for p in model.parameters()),
        "parameters_without_embeddings": sum(p.numel() for n, p in model.named_parameters() if "embed" not in n),
        "steps": result["step"], "tokens": result["tokens"], "batch_size": args.batch_size,
        "max_length": args.max_length, "lr": args.lr, "shuffle_buffer": args.shuffle_buffer,
        "heldout": result["heldout"],
        "history": [{"step": h["step"], "tokens": h["tokens"], "train_loss": h["train_loss"],
                     "heldout": h["dev"] or None, "tokens_per_s": h["tokens_per_s"]} for h in result["history"]],
        "tokens_per_s_wall": result["tokens"] / wall, "tokens_per_cpu_s": result["tokens"] / cpu}))


def medical_corpus(out: Path) -> list[Path]:
    """Study c's domain text: the corpus's medical part plus the CMeEE and CMeIE *training* texts (never dev)."""
    texts = [e.text for e in read_ner(DATA / "ner/cmeee/train.json")]
    texts += [e.text for e in read_spo(DATA / "re/cmeie/train.jsonl")]
    path = out.parent / "medical-task-texts.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(t.replace("\n", " ") for t in texts) + "\n", encoding="utf-8")
    return [DATA / "corpus/medical.txt", path]


def _sample(items: list, n: int | None) -> list:
    if n is None or n >= len(items):
        return items
    order = list(range(len(items)))
    random.Random(0).shuffle(order)
    return [items[i] for i in sorted(order[:n])]


def task_files(task: str, out: Path, train_size: int | None, dev_size: int | None) -> tuple[Path, Path]:
    kind, train, dev, _ = TASKS[task]
    out.mkdir(parents=True, exist_ok=True)
    files = []
    for split, source, n in (("train", train, train_size), ("dev", dev, dev_size)):
        path = out / f"{task}.{split}"
        if kind == "ner":
            write_ner_jsonl(_sample(read_ner(DATA / source), n), path)
        else:
            lines = (DATA / source).read_text(encoding="utf-8").splitlines()
            path.write_text("\n".join(_sample(lines, n)) + "\n", encoding="utf-8")
        files.append(path)
    return files[0], files[1]


def cmd_finetune(args) -> None:
    kind, _, _, options = TASKS[args.task]
    if kind == "re":
        options = {**options, "schema": str(DATA / "re/cmeie/schema.json")}
    data = Path(args.out) / "data"
    train_file, dev_file = task_files(args.task, data, args.train_size, args.dev_size)
    for seed in args.seeds:
        name = f"{Path(args.encoder).name}-{'unshared' if args.unshare else 'shared'}-{args.task}-s{seed}"
        out = Path(args.out) / "finetune" / name
        config = TrainConfig(epochs=args.epochs, batch_size=args.batch_size, lr=args.lr, head_lr=args.head_lr,
                             seed=seed)
        cpu = time.process_time()
        result = zhie.fit(kind, train_file, dev_file, out=out, encoder=args.encoder, unshare_layers=args.unshare,
                          max_length=args.max_length, config=config, resume=False, progress=not args.quiet,
                          **options)
        cpu = time.process_time() - cpu
        history = read_metrics(out / "metrics.jsonl")
        elapsed = [h["elapsed_s"] for h in history]
        append_result("pretrain", stamp({
            "study": "finetune", "encoder": args.encoder, "unshared": args.unshare, "task": args.task,
            "head": options["head"], "seed": seed, "epochs": args.epochs, "train_size": args.train_size,
            "dev_size": args.dev_size, "batch_size": args.batch_size, "lr": args.lr, "head_lr": args.head_lr,
            "max_length": args.max_length, "f1_per_epoch": [h["dev"].get("f1") for h in history],
            "best_f1": result["best"].get("f1"),
            "epoch_s": [round(b - a, 1) for a, b in zip([0.0, *elapsed], elapsed)],
            "cpu_s_per_epoch": cpu / args.epochs}))


def cmd_plot(args) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rows = [json.loads(line) for line in (RESULTS / "pretrain.jsonl").read_text().splitlines()]
    rows = [r for r in rows if r["study"] == "pretrain" and (args.only is None or r["family"] in args.only)]
    fig = Figure(figsize=(10, 3.5), layout="constrained")
    FigureCanvasAgg(fig)
    loss_ax, acc_ax = fig.subplots(1, 2)
    for r in rows:
        steps = [h["step"] for h in r["history"]]
        loss_ax.plot(steps, [h["heldout"]["loss"] for h in r["history"]], marker="o", ms=3, label=r["family"])
        acc_ax.plot(steps, [h["heldout"]["accuracy"] for h in r["history"]], marker="o", ms=3, label=r["family"])
    loss_ax.set(title="held-out MLM loss", xlabel="step", ylabel="loss")
    acc_ax.set(title="held-out MLM accuracy", xlabel="step", ylabel="accuracy")
    for ax in (loss_ax, acc_ax):
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    fig.savefig(RESULTS / "pretrain_mlm.png", dpi=100)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    pt = sub.add_parser("pretrain")
    pt.add_argument("--family", required=True, choices=sorted(SIZES))
    pt.add_argument("--steps", type=int, default=1500)
    pt.add_argument("--batch-size", type=int, default=16)
    pt.add_argument("--max-length", type=int, default=128)
    pt.add_argument("--lr", type=float, default=5e-4)
    pt.add_argument("--eval-every", type=int, default=250)
    pt.add_argument("--heldout", type=int, default=500)
    pt.add_argument("--seed", type=int, default=0)
    pt.add_argument("--corpus", default="general", choices=("general", "medical"),
                    help="general: wiki + medical; medical: medical + CMeEE/CMeIE training texts (study c)")
    pt.add_argument("--shuffle-buffer", type=int, default=2000, help="sequences (the first batch waits for it)")
    pt.add_argument("--time-limit", type=float, default=None, help="minutes; resume later with --resume")
    pt.add_argument("--resume", action="store_true")
    ft = sub.add_parser("finetune")
    ft.add_argument("--encoder", required=True)
    ft.add_argument("--task", default="cluener", choices=sorted(TASKS))
    ft.add_argument("--unshare", action="store_true", help="ALBERT: drop the layer sharing before fine-tuning")
    ft.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ft.add_argument("--epochs", type=int, default=3)
    ft.add_argument("--batch-size", type=int, default=32)
    ft.add_argument("--lr", type=float, default=2e-4)
    ft.add_argument("--head-lr", type=float, default=2e-3)
    ft.add_argument("--max-length", type=int, default=128)
    ft.add_argument("--train-size", type=int, default=None)
    ft.add_argument("--dev-size", type=int, default=None)
    pl = sub.add_parser("plot")
    pl.add_argument("--only", nargs="*", default=None, help="families to draw")
    for q in (pt, ft, pl):
        q.add_argument("--out", default="runs/pt")
        q.add_argument("--quiet", action="store_true")
    args = p.parse_args()
    {"pretrain": cmd_pretrain, "finetune": cmd_finetune, "plot": cmd_plot}[args.command](args)


if __name__ == "__main__":
    with machine_lock():
        main()
