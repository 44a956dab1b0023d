"""The CRF learning-rate study (spec §8) on SXU word segmentation.

    python benchmarks/cws_crf_lr.py --run softmax --layers 1
    python benchmarks/cws_crf_lr.py --run crf --multiplier 1000 --layers 1
    python benchmarks/cws_crf_lr.py --run crf --multiplier 1 --train-limit 4000     # full e5-small

Each run trains on SXU train (or its first --train-limit sentences), scores the SXU test set after every epoch
(SIGHAN word P/R/F1, as the spec's table reports test F1 per epoch), and appends a JSON line to
``benchmarks/results/cws_crf_lr.jsonl`` with the F1 after epoch 1, the best F1 and the learned 4x4 transition
matrix (CRF runs), plus a heatmap PNG next to it and a check of the matrix's sense.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import date
from pathlib import Path

import torch
from common import DATA, RESULTS, append_result, machine, machine_lock
from safetensors.torch import load_file

import zhie
from zhie.data.cws import read_segmented, write_segmented
from zhie.training import TrainConfig
from zhie.training.report import read_metrics

SXU = DATA / "cws" / "sxu"
TAGS = ["S", "B", "M", "E"]


def sense(T: torch.Tensor) -> dict:
    """Does the matrix say what BMES means? Forbidden moves below every allowed one from the same tag."""
    i = {t: k for k, t in enumerate(TAGS)}
    forbidden = [("S", "M"), ("S", "E"), ("B", "S"), ("B", "B"), ("M", "S"), ("M", "B"), ("E", "M"), ("E", "E")]
    allowed = [("S", "S"), ("S", "B"), ("B", "M"), ("B", "E"), ("M", "M"), ("M", "E"), ("E", "S"), ("E", "B")]
    worst_allowed = {a: min(T[i[a], i[b]].item() for x, b in allowed if x == a) for a in TAGS}
    violations = [f"{a}->{b}" for a, b in forbidden if T[i[a], i[b]].item() >= worst_allowed[a]]
    return {"sensible": not violations, "violations": violations,
            "forbidden_mean": sum(T[i[a], i[b]].item() for a, b in forbidden) / len(forbidden),
            "allowed_mean": sum(T[i[a], i[b]].item() for a, b in allowed) / len(allowed)}


def heatmap(T: torch.Tensor, title: str, path: Path) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(3.6, 3.2))
    ax = fig.add_subplot()
    im = ax.imshow(T.numpy(), cmap="RdBu_r", vmin=-abs(T).max().item(), vmax=abs(T).max().item())
    ax.set_xticks(range(4), TAGS)
    ax.set_yticks(range(4), TAGS)
    ax.set_xlabel("to")
    ax.set_ylabel("from")
    for a in range(4):
        for b in range(4):
            ax.text(b, a, f"{T[a, b]:.2f}", ha="center", va="center", fontsize=8)
    ax.set_title(title, fontsize=9)
    fig.colorbar(im, ax=ax, shrink=0.8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", choices=["softmax", "crf"])
    p.add_argument("--plot", action="store_true", help="redraw every heatmap from the JSON lines, train nothing")
    p.add_argument("--multiplier", type=float, default=1.0, help="CRF lr = --lr x this")
    p.add_argument("--layers", type=int, default=None, help="keep only the first N e5-small layers (weak encoder)")
    p.add_argument("--encoder", default="e5-small")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-length", type=int, default=256)
    p.add_argument("--train-limit", type=int, default=None, help="train on the first N sentences only")
    p.add_argument("--out", default="runs/cws_study")
    p.add_argument("--seed", type=int, default=42)
    args = p.parse_args()
    if args.plot:
        for row in map(json.loads, (RESULTS / "cws_crf_lr.jsonl").read_text(encoding="utf-8").splitlines()):
            if "transitions" in row:
                heatmap(torch.tensor(row["transitions"]), f"CRF transitions, lr x{row['multiplier']:g}, {row['run']}",
                        RESULTS / f"cws_transitions_{row['run']}.png")
        return
    if not args.run:
        p.error("--run is required (or --plot)")
    RESULTS.mkdir(parents=True, exist_ok=True)

    name = f"{args.run}" + (f"-x{args.multiplier:g}" if args.run == "crf" else "") + \
        f"-{'L' + str(args.layers) if args.layers else 'full'}" + \
        (f"-n{args.train_limit}" if args.train_limit else "") + f"-lr{args.lr:g}"
    out = Path(args.out) / name
    train_file = SXU / "train.txt"
    if args.train_limit:
        out.mkdir(parents=True, exist_ok=True)
        train_file = out.parent / f"sxu_train_{args.train_limit}.txt"
        write_segmented(read_segmented(SXU / "train.txt")[: args.train_limit], train_file)
    config = TrainConfig(epochs=args.epochs, batch_size=args.batch_size, lr=args.lr, head_lr=args.lr, seed=args.seed)
    options = {"crf_lr_multiplier": args.multiplier} if args.run == "crf" else {}
    result = zhie.fit("cws", train_file, SXU / "test.txt", out=out, encoder=args.encoder, head=args.run,
                      max_length=args.max_length, encoder_layers=args.layers, config=config, progress=False, **options)
    history = read_metrics(out / "metrics.jsonl")
    row = {"run": name, "head": args.run, "multiplier": args.multiplier if args.run == "crf" else None,
           "encoder_layers": args.layers or "all", "lr": args.lr, "epochs": args.epochs,
           "train_sentences": args.train_limit or "all", "f1_epoch1": history[0]["dev"]["f1"],
           "best_f1": result["best"]["f1"], "f1_per_epoch": [h["dev"]["f1"] for h in history],
           "oov_recall_best": result["best"].get("oov_recall"),
           "tokens_per_s": sum(h["tokens_per_s"] for h in history) / len(history)}
    if args.run == "crf":
        T = load_file(str(out / "best" / "head.safetensors"))["crf.transitions"].float()
        row["transitions"] = [[round(v, 4) for v in r] for r in T.tolist()]
        row.update(sense(T))
        heatmap(T, f"CRF transitions, lr x{args.multiplier:g}, {name}", RESULTS / f"cws_transitions_{name}.png")
    row.update({"machine": machine(), "date": date.today().isoformat(), "command": "python " + " ".join(sys.argv)})
    append_result("cws_crf_lr", row)


if __name__ == "__main__":
    with machine_lock():
        main()
