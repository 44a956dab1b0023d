"""GPLinker benchmark on CMeIE: dev triple F1 and speed, label memory, and decoding an untrained model.

    python benchmarks/relation.py --variant egp --epochs 3               # train, dev F1, tokens/s, memory
    python benchmarks/relation.py --memory --batch-size 16               # sparse vs dense labels, max length 256
    python benchmarks/relation.py --decode --per-cell-windows 50         # vectorised vs per-cell decoding

Each run appends one JSON line to ``benchmarks/results/relation.jsonl``. Data: ``$ZHIE_DATA/re/cmeie``
(default ../shared/data). ``--memory`` and ``--decode`` use e5-small with freshly initialised heads.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import date
from pathlib import Path
from types import SimpleNamespace

import torch
from common import DATA, append_result, machine, machine_lock, peak_memory_mb, trained_with

import zhie
from zhie.core.text import windows
from zhie.data.spo import read_schema, read_spo
from zhie.losses import multilabel_categorical_crossentropy
from zhie.model import Model
from zhie.tasks.base import prepare_encoder, seeded
from zhie.tasks.relation import RelationConfig, RelationTask
from zhie.training import TrainConfig
from zhie.training.report import read_metrics

CMEIE = DATA / "re" / "cmeie"
HEADS = ("entity", "head_head", "tail_tail")


def untrained(args):
    """e5-small (pruned to the data's characters) with freshly initialised GPLinker heads, on the GPU if any."""
    train, dev = read_spo(CMEIE / "train.jsonl"), read_spo(CMEIE / "dev.jsonl")
    enc, tokenizer = prepare_encoder(args.encoder, texts=[ex.text for ex in train + dev], seed=args.seed)
    task = RelationTask(RelationConfig(read_schema(CMEIE / "schema.json"), head=args.variant,
                                       max_length=args.max_length), tokenizer)
    with seeded(args.seed):
        model = Model(enc, task.build_heads(enc.config.hidden_size))
    model.to("cuda" if torch.cuda.is_available() else "cpu")
    return task, model, train, dev


def train_run(args) -> dict:
    out = Path(args.out) / f"cmeie-{args.variant}"
    config = TrainConfig(epochs=args.epochs, batch_size=args.batch_size, lr=args.lr, head_lr=args.head_lr,
                         seed=args.seed, max_steps=args.max_steps, ema=args.ema)
    start = time.time()
    result = zhie.fit("re", CMEIE / "train.jsonl", CMEIE / "dev.jsonl", out=out, schema=CMEIE / "schema.json",
                      encoder=args.encoder, head=args.variant, max_length=args.max_length,
                      config=config, resume=True, progress=not args.quiet)
    history = read_metrics(out / "metrics.jsonl")
    return {"run": "train", "variant": args.variant, "epochs": args.epochs, **trained_with(out),
            "ema": args.ema, "max_length": args.max_length,
            **{f"dev_{k}": result["best"].get(k) for k in ("f1", "precision", "recall", "entity_f1")},
            "f1_per_epoch": [h["dev"].get("f1") for h in history],
            "train_tokens_per_s": sum(h["tokens_per_s"] for h in history) / len(history),
            "train_s": round(time.time() - start), "peak_memory_mb": peak_memory_mb(),
            "data_stats": json.loads((out / "data_stats.json").read_text())}


def dense_loss(logits, batch) -> torch.Tensor:
    """The same loss with dense 0/1 labels [b, heads, n, n]: what GPLinker would cost without sparse labels."""
    total = 0
    for name in HEADS:
        y_pred = getattr(logits, name).flatten(2).float()
        index = batch[f"{name}_labels"]  # [b, heads, k] flattened cell indices, 0 = padding
        y_true = torch.zeros_like(y_pred).scatter_(2, index, 1.0)
        y_true[:, :, 0] = 0
        y_pred = torch.cat([torch.full_like(y_pred[:, :, :1], -1e12), y_pred[:, :, 1:]], 2)  # mask_zero
        total = total + multilabel_categorical_crossentropy(y_pred, y_true).sum(1).mean()
    return total


def memory_run(args) -> dict:
    """Peak memory of one training step on the longest training windows, sparse labels against dense ones."""
    task, model, train, _ = untrained(args)
    items = sorted(task.encode(train), key=lambda it: -len(it.ids))[: args.batch_size]
    device = next(model.parameters()).device
    batch = {k: v.to(device) for k, v in task.collate(items).items()}
    n, heads = batch["input_ids"].shape[1], 2 + 2 * len(task.config.predicates)
    row = {"run": "memory", "variant": args.variant, "batch_size": args.batch_size, "tokens": n,
           "heads": heads, "sparse_label_mb": sum(batch[f"{h}_labels"].numel() * 8 for h in HEADS) / 2**20,
           "dense_label_mb": args.batch_size * heads * n * n * 4 / 2**20}
    def dense() -> torch.Tensor:
        return dense_loss(model(batch["input_ids"], batch["attention_mask"])["re"], batch)

    for name, loss_fn in (("sparse", lambda: task.loss(model, batch)), ("dense", dense)):
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        model.zero_grad(set_to_none=True)
        start = time.perf_counter()
        loss = loss_fn()
        loss.backward()
        if device.type == "cuda":
            torch.cuda.synchronize()
        row[f"{name}_loss"] = loss.item()
        row[f"{name}_step_s"] = time.perf_counter() - start
        if device.type == "cuda":
            row[f"{name}_peak_mb"] = torch.cuda.max_memory_allocated() / 2**20
    return row


def per_cell_decode(task: RelationTask, logits, b: int) -> list[tuple]:
    """The straightforward decoder: visit every cell in Python (with the same caps, so the outputs are equal)."""
    ent = logits.entity[b].float().tolist()
    hh, tt = logits.head_head[b].float().tolist(), logits.tail_tail[b].float().tolist()
    n, cap = len(ent[0]), task.config.max_spans

    def spans(m):
        cells = [(m[i][j], i, j) for i in range(n) for j in range(n) if m[i][j] > 0]
        return sorted((i, j) for _, i, j in sorted(cells, reverse=True)[:cap])

    def sig(x):
        return 1 / (1 + pow(2.718281828459045, -2 * x))

    subjects, objects = spans(ent[0]), spans(ent[1])
    out = []
    for p in range(len(hh)):
        for sh, st in subjects:
            for oh, ot in objects:
                if hh[p][sh][oh] > 0 and tt[p][st][ot] > 0:
                    score = min(sig(ent[0][sh][st]), sig(ent[1][oh][ot]), sig(hh[p][sh][oh]), sig(tt[p][st][ot]))
                    out.append((sh - 1, st - 1, p, oh - 1, ot - 1, score))
    out.sort(key=lambda t: -t[5])
    return sorted(out[: task.config.max_triples], key=lambda t: (t[2], t[0], t[1], t[3], t[4]))


def decode_run(args) -> dict:
    """Decode the dev set's windows with an untrained model: zhie's vectorised decoder against per-cell Python."""
    task, model, _, dev = untrained(args)
    model.eval()
    device = next(model.parameters()).device
    size, overlap = task.window
    encodings = [task.text_tokenizer(ex.text) for ex in dev]
    jobs = [enc.ids[a:b] for enc in encodings if len(enc) for a, b in windows(len(enc), size, overlap)]
    vector_s = model_s = 0.0
    per_cell_s, per_cell_windows, triples, same = 0.0, 0, 0, True
    with torch.no_grad():
        for start in range(0, len(jobs), args.eval_batch_size):
            chunk = jobs[start : start + args.eval_batch_size]
            batch = task.collate_inputs([SimpleNamespace(ids=ids) for ids in chunk])
            t0 = time.perf_counter()
            logits = model(batch["input_ids"].to(device), batch["attention_mask"].to(device))["re"]
            if device.type == "cuda":
                torch.cuda.synchronize()
            t1 = time.perf_counter()
            arrays = {f: getattr(logits, f).float().cpu().numpy() for f in ("entity", "head_head", "tail_tail")}
            rows = task.decode(model, {"re": arrays}, batch["attention_mask"].numpy())  # numpy: the copy counts
            t2 = time.perf_counter()
            model_s, vector_s = model_s + t1 - t0, vector_s + t2 - t1
            triples += sum(map(len, rows))
            for b in range(len(rows)):
                if per_cell_windows >= args.per_cell_windows:
                    break
                t3 = time.perf_counter()
                slow = per_cell_decode(task, logits, b)
                per_cell_s += time.perf_counter() - t3
                per_cell_windows += 1
                # equal up to the order of tied scores at the max_triples cut (fp32 against Python floats)
                fast_scores, slow_scores = sorted(t.score for t in rows[b]), sorted(t[5] for t in slow)
                same &= len(fast_scores) == len(slow_scores) and \
                    all(abs(x - y) < 1e-5 for x, y in zip(fast_scores, slow_scores))
    return {"run": "decode", "variant": args.variant, "windows": len(jobs), "triples_decoded": triples,
            "model_s": model_s, "vectorised_decode_s": vector_s, "per_cell_windows": per_cell_windows,
            "per_cell_decode_s": per_cell_s,
            "per_cell_extrapolated_s": per_cell_s / max(per_cell_windows, 1) * len(jobs),
            "speedup": per_cell_s / max(per_cell_windows, 1) * len(jobs) / vector_s,
            "outputs_equal": same, "max_spans": task.config.max_spans, "max_triples": task.config.max_triples}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variant", default="egp", choices=["gp", "egp"])
    p.add_argument("--memory", action="store_true", help="peak memory of one step, sparse vs dense labels")
    p.add_argument("--decode", action="store_true", help="decoding time of an untrained model on dev")
    p.add_argument("--encoder", default="e5-small")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--max-steps", type=int, default=None)
    p.add_argument("--batch-size", type=int, default=TrainConfig.batch_size)
    p.add_argument("--eval-batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=None, help="default: zhie train's (2e-4 for e5-small)")
    p.add_argument("--head-lr", type=float, default=None, help="default: zhie train's (10 x --lr)")
    p.add_argument("--ema", type=float, default=None)
    p.add_argument("--max-length", type=int, default=256)
    p.add_argument("--per-cell-windows", type=int, default=50, help="windows decoded by the per-cell decoder")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--out", default="runs/bench")
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args()
    row = memory_run(args) if args.memory else decode_run(args) if args.decode else train_run(args)
    row.update({"encoder": args.encoder, "machine": machine(), "date": date.today().isoformat(),
                "command": "python " + " ".join(sys.argv)})
    append_result("relation", row)


if __name__ == "__main__":
    with machine_lock():
        main()
