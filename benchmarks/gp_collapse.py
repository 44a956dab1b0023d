"""Why GlobalPointer sometimes learns nothing (issue 17, item 1): the issue's run, instrumented step by step.

The run: lines 301-500 of CLUENER ``train.json``, the ``tiny`` encoder (2-layer BERT, hidden 128), ``--head gp
--lr 3e-3 --epochs 30 --batch-size 16`` (every other setting as ``zhie train``: AdamW with weight decay 0.01, warm-up
10% then linear decay, gradient clipping at 1.0, seed 42), train-set F1. This script replays exactly the steps of
:func:`zhie.training.train` (same parameter groups, schedule, batches and dropout stream) and logs at every step:

* the loss and its two MCE parts (``pos = log(1 + sum_P e^-s)``, ``neg = log(1 + sum_N e^s)``, means over
  batch x types);
* logit statistics over the valid (unmasked) cells of the batch: mean, std, max, the share above 0; over the gold
  cells: mean, min, max, the share above 0;
* the gradient of the loss with respect to the logits, its L2 norm over the gold cells and over the negative cells;
* gradient norms (before clipping) of the head, of the encoder, and of the whole model;
* the q/k projection: mean L2 norm of q and k vectors (before RoPE), norm of the head's kernel; the encoder's output:
  mean token norm and the mean cosine between different tokens of a sentence (1.0 = every token looks the same);
* the learning rates.

Records: every step of the first 60 (the collapse happens there), then every ``--every`` steps and the last.

Every ``--eval-epochs`` epochs: train-set F1 (the pipeline's own decoding). One JSON line per variant (with the
per-step records) goes to ``results/gp_collapse.jsonl``.

    python benchmarks/gp_collapse.py                                    # the issue's run and the variants below
    python benchmarks/gp_collapse.py --variants base lr1e-3 --epochs 10
    python benchmarks/gp_collapse.py --variants lr1e-3 fixed_lr1e-3 --dev-sentences 1343 --name gp_collapse_dev
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from datetime import date
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import DATA, RESULTS, machine_lock  # noqa: E402

import zhie  # noqa: E402,F401
from zhie.data import read_ner  # noqa: E402
from zhie.heads import EfficientGlobalPointer, GlobalPointer  # noqa: E402
from zhie.heads.masking import masking_value  # noqa: E402
from zhie.losses import MASKED_LOGIT_THRESHOLD  # noqa: E402
from zhie.model import Model  # noqa: E402
from zhie.tasks.base import Evaluator, prepare_encoder, seeded  # noqa: E402
from zhie.tasks.ner import NerTask  # noqa: E402
from zhie.training import TrainConfig, build_param_groups, build_scheduler, epoch_batches  # noqa: E402

# name -> head, lr and the TrainConfig / head settings that differ from the run. "offsets": False builds GP
# as bert4keras does (zero q/k bias) - the state before the fix; every other GP variant starts at the prior
# (GlobalPointer.init_offsets, the fix).
VARIANTS: dict[str, dict] = {
    "base": {"head": "gp", "lr": 3e-3, "offsets": False},           # the run, before the fix
    "lr1e-3": {"head": "gp", "lr": 1e-3, "offsets": False},
    "egp": {"head": "egp", "lr": 3e-3},
    "egp_lr1e-3": {"head": "egp", "lr": 1e-3},
    "no_rope": {"head": "gp", "lr": 3e-3, "offsets": False, "rope": False},
    "enc_lr1e-3_head_lr3e-3": {"head": "gp", "lr": 1e-3, "head_lr": 3e-3, "offsets": False},
    "enc_lr3e-3_head_lr1e-3": {"head": "gp", "lr": 3e-3, "head_lr": 1e-3, "offsets": False},
    "warmup0": {"head": "gp", "lr": 3e-3, "warmup": 0.0, "offsets": False},
    "warmup30": {"head": "gp", "lr": 3e-3, "warmup": 0.3, "offsets": False},
    "fixed": {"head": "gp", "lr": 3e-3},                              # after the fix
    "fixed_lr1e-3": {"head": "gp", "lr": 1e-3},
}


def _round(value, digits: int = 4):
    """Floats to ``digits`` significant digits (the per-step records stay small)."""
    if isinstance(value, float) and math.isfinite(value) and value != 0:
        return round(value, digits - 1 - math.floor(math.log10(abs(value))))
    return value


def _cos_collapse(hidden: torch.Tensor, mask: torch.Tensor) -> float:
    """Mean cosine between different real tokens of the same sentence."""
    h = torch.nn.functional.normalize(hidden.float(), dim=-1)
    sim = h @ h.transpose(1, 2)  # [b, n, n]
    m = mask.bool()
    pair = m[:, :, None] & m[:, None, :] & ~torch.eye(m.shape[1], dtype=torch.bool)[None]
    return (sim[pair].mean()).item()


def run(name: str, spec: dict, examples: list, epochs: int, batch_size: int, seed: int, eval_epochs: int,
        every: int, dev: list | None = None) -> dict:
    head_kind = spec["head"]
    overrides = {k: spec[k] for k in ("head_lr", "max_grad_norm", "warmup", "weight_decay") if k in spec}
    config = TrainConfig(epochs=epochs, batch_size=batch_size, lr=spec["lr"], seed=seed,
                         **{"head_lr": spec["lr"], **overrides})
    cls = NerTask
    task_config = cls.configure(examples, encoder="tiny", head=head_kind)
    enc, tokenizer = prepare_encoder("tiny", texts=cls.texts(examples), mode="char", seed=seed)
    task = cls(task_config, tokenizer)
    items = task.encode(examples)
    with seeded(seed):
        heads = task.build_heads(enc.config.hidden_size)
        model = Model(enc, heads)
        objective = task.objective(enc.config.hidden_size)
    head = model.heads[task.head_name]
    if spec.get("offsets") is False and isinstance(head, GlobalPointer):
        torch.nn.init.zeros_(head.dense.bias)  # bert4keras's initial bias
    if spec.get("rope") is False:
        head.rope = False

    wrapper = torch.nn.Module()
    wrapper.model, wrapper.loss_fn = model, objective  # as zhie.training.session.Objective: same names
    groups = build_param_groups(wrapper, config)
    optimizer = torch.optim.AdamW(groups, lr=config.lr, weight_decay=config.weight_decay)
    n = len(items)
    steps_per_epoch = math.ceil(n / batch_size)
    total = steps_per_epoch * epochs
    scheduler = build_scheduler(optimizer, total, config.warmup)
    torch.manual_seed(seed)  # accelerate's set_seed(seed + rank) in the loop
    import random

    import numpy as np
    random.seed(seed)
    np.random.seed(seed)

    captured: dict = {}

    def grab_hidden(module, args, kwargs, output):  # registered on the head, removed after training
        captured["hidden"] = args[0] if args else kwargs["hidden"]
        captured["mask"] = args[1] if len(args) > 1 else kwargs.get("attention_mask")

    hook = head.register_forward_hook(grab_hidden, with_kwargs=True)
    lengths = [len(it.ids) for it in items]
    evaluator = Evaluator(task, examples)
    records, evals = [], []
    step = 0
    start = time.time()
    model.train()
    try:
        for epoch in range(epochs):
            for indices in epoch_batches(n, batch_size, seed=seed, epoch=epoch, lengths=lengths):
                batch = task.collate([items[j] for j in indices])
                outputs = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                heads=[task.head_name])
                logits = outputs[task.head_name]
                logits.retain_grad()
                loss = task.head_loss(head, logits, batch)
                loss.backward()
                rec = {"step": step}
                logged = step < 60 or step % every == 0 or step == total - 1  # every step while it collapses
                if logged:
                    rec.update(_stats(head, logits, batch, captured, model, task.head_name))
                    rec["lr_encoder"] = optimizer.param_groups[0]["lr"]
                    rec["lr_head"] = [g["lr"] for g in optimizer.param_groups if g["name"].startswith("head")][0]
                rec["loss"] = loss.item()
                params = [p for p in model.parameters() if p.grad is not None]
                if config.max_grad_norm is not None:
                    total_norm = torch.nn.utils.clip_grad_norm_(params, config.max_grad_norm)
                else:
                    total_norm = torch.nn.utils.get_total_norm([p.grad for p in params])
                rec["grad_norm_total"] = float(total_norm)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)
                step += 1
                if logged:
                    records.append({k: _round(v) for k, v in rec.items()})
            if (epoch + 1) % eval_epochs == 0 or epoch + 1 == epochs:
                model.eval()
                with torch.no_grad():
                    m = evaluator(model)
                model.train()
                evals.append({"epoch": epoch + 1, "step": step, "f1": m["f1"], "n_pred": m["n_pred"]})
                print(f"{name}: epoch {epoch + 1} step {step} f1 {m['f1']:.4f} n_pred {m['n_pred']} "
                      f"loss {records[-1]['loss']:.4f} ({time.time() - start:.0f} s)", flush=True)
    finally:
        hook.remove()
    dev_f1 = None
    if dev:
        model.eval()
        with torch.no_grad():
            dev_f1 = Evaluator(task, dev)(model)["f1"]
        print(f"{name}: dev F1 {dev_f1:.4f} on {len(dev)} dev sentences", flush=True)
    return {"variant": name, **spec, "epochs": epochs, "batch_size": batch_size, "seed": seed,
            "train_f1": evals[-1]["f1"], "evals": evals, "dev_f1": dev_f1, "dev_sentences": len(dev) if dev else 0,
            "seconds": round(time.time() - start, 1), "steps": records}


def _stats(head, logits, batch, captured, model, head_name) -> dict:
    s = logits.detach().float()
    g = logits.grad.detach().float()
    valid = s > MASKED_LOGIT_THRESHOLD
    b, h, n, _ = s.shape
    labels = batch["labels"]  # [b, heads, P], cells row * n + col, 0 = padding
    pos = torch.zeros(b, h, n * n, dtype=torch.bool)
    pos.scatter_(-1, labels, True)
    pos[..., 0] = False
    pos = pos.view(b, h, n, n) & valid
    neg = valid & ~pos
    # the two MCE parts, mean over batch x heads
    neg_part = torch.logsumexp(torch.cat([torch.where(neg, s, -math.inf).flatten(2), s.new_zeros(b, h, 1)], -1), -1)
    pos_part = torch.logsumexp(torch.cat([torch.where(pos, -s, -math.inf).flatten(2), s.new_zeros(b, h, 1)], -1), -1)
    hidden, mask = captured["hidden"].detach(), captured["mask"]
    out = {
        "pos_part": pos_part.mean().item(), "neg_part": neg_part.mean().item(),
        "logit_mean": s[valid].mean().item(), "logit_std": s[valid].std().item(), "logit_max": s[valid].max().item(),
        "frac_valid_gt0": (s[valid] > 0).float().mean().item(),
        "gold_mean": s[pos].mean().item() if pos.any() else None,
        "gold_min": s[pos].min().item() if pos.any() else None,
        "gold_max": s[pos].max().item() if pos.any() else None,
        "frac_gold_gt0": (s[pos] > 0).float().mean().item() if pos.any() else None,
        "grad_gold_norm": g[pos].norm().item(), "grad_neg_norm": g[neg].norm().item(),
        "grad_gold_sum": g[pos].sum().item(), "grad_neg_sum": g[neg].sum().item(),
        "n_gold": int(pos.sum()), "n_neg": int(neg.sum()),
        "hidden_norm": hidden[mask.bool()].norm(dim=-1).mean().item(),
        "hidden_cos": _cos_collapse(hidden, mask),
    }
    head_grads = [p.grad for p in model.heads[head_name].parameters() if p.grad is not None]
    enc_grads = [p.grad for p in model.encoder.parameters() if p.grad is not None]
    out["grad_norm_head"] = float(torch.nn.utils.get_total_norm(head_grads))
    out["grad_norm_encoder"] = float(torch.nn.utils.get_total_norm(enc_grads))
    with torch.no_grad():
        if isinstance(head, GlobalPointer):
            qk = head.dense(hidden).view(*hidden.shape[:2], head.heads, 2 * head.head_size)
            q, k = qk[..., : head.head_size], qk[..., head.head_size:]
        elif isinstance(head, EfficientGlobalPointer):
            p = head.dense(hidden)
            q, k = p[..., 0::2], p[..., 1::2]
        else:
            q = k = None
        if q is not None:
            m = mask.bool()
            out["q_norm"] = q[m].norm(dim=-1).mean().item()
            out["k_norm"] = k[m].norm(dim=-1).mean().item()
            out["kernel_norm"] = head.dense.weight.norm().item()
            out["bias_norm"] = head.dense.bias.norm().item()
    return out


def task_prior(examples: list, head: str) -> list[float] | None:
    """The prior logit per type that GP starts at (None for other heads)."""
    _, tokenizer = prepare_encoder("tiny", texts=NerTask.texts(examples), mode="char", seed=0)
    task = NerTask(NerTask.configure(examples, encoder="tiny", head=head), tokenizer)
    task.encode(examples)
    return getattr(task.labeling, "prior_logits", None)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--lines", default="301-500", help="1-based inclusive line range of CLUENER train.json")
    parser.add_argument("--eval-epochs", type=int, default=5)
    parser.add_argument("--every", type=int, default=10, help="after the first 60 steps, a record every N steps")
    parser.add_argument("--name", default="gp_collapse", help="results/NAME.jsonl")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dev-sentences", type=int, default=0,
                        help="also score the final model on the first N sentences of CLUENER dev.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    first, last = (int(x) for x in args.lines.split("-"))
    examples = read_ner(DATA / "ner/cluener/train.json")[first - 1:last]
    assert masking_value(torch.float32) == -1e12
    dev = read_ner(DATA / "ner/cluener/dev.json")[:args.dev_sentences] if args.dev_sentences else None
    for name in args.variants:
        row = run(name, VARIANTS[name], examples, args.epochs, args.batch_size, args.seed, args.eval_epochs,
                  args.every, dev)
        row.update({"lines": args.lines, "machine": f"{platform.machine()} CPU, {torch.get_num_threads()} threads",
                    "torch": torch.__version__, "date": date.today().isoformat(),
                    "prior_logits": task_prior(examples, VARIANTS[name]["head"])})
        summary = {k: v for k, v in row.items() if k != "steps"}
        RESULTS.mkdir(parents=True, exist_ok=True)
        with (RESULTS / f"{args.name}.jsonl").open("a", encoding="utf-8") as f:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
        print(json.dumps(summary, ensure_ascii=False))


if __name__ == "__main__":
    with machine_lock():
        main()
