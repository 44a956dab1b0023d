"""Depth studies of the seeds (issue 11 item 8), trained from scratch without warm-up on one fixed real task:
character-level word segmentation of SXU (BMES tags, softmax head), Adam at one constant learning rate for all,
no warm-up, no decay, no gradient clipping, no weight decay.

* DeepNet (spec §7): post-norm attention+FFN stacks (zhie's RoFormerV2 skeleton, Xavier-normal init) of N blocks,
  plain (``x <- Norm(x + F(x))``) and with DeepNorm (the paper's constants, and Su's Adam constants). Claim: without
  DeepNorm deep post-norm stacks fail without warm-up; with it they train.
* GAU without warm-up (spec §6.4): post-norm GAU stacks (squared_relu, Xavier init) of 2N layers (the same
  parameters and residual branches as N blocks). Claim: GAU trains tens of layers without warm-up because each GAU
  starts ~100x smaller than its input; ``branch_ratio`` = std(F(x)) / std(x) of the first residual branch at
  initialisation, on the first training batch, is reported for every run.

A run "diverged" when its loss became NaN/inf; it "did not train" when its final loss (mean of the last 10% of
steps) is above the loss of predicting the tag prior. Results: ``results/depth.jsonl`` (one row per run, with
the loss every step), ``results/depth.png``.

    python benchmarks/depth.py --depths 6 24 48 96 --hidden 64 --steps 300            # CPU
    python benchmarks/depth.py --depths 6 24 48 96 192 --hidden 256 --steps 2000       # GPU
    python benchmarks/depth.py --init-ratios        # GAU(x)/x at initialisation, LeCun / Xavier / Su init
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections import Counter
from datetime import date
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import DATA, RESULTS, machine, machine_lock  # noqa: E402

from zhie.core.spans import spans_to_tags, tags_to_spans  # noqa: E402
from zhie.data.cws import read_segmented  # noqa: E402
from zhie.encoders import build  # noqa: E402
from zhie.encoders.gau import GatedAttentionUnit, GAUAlphaConfig, RoFormerV2Config  # noqa: E402

VARIANTS = ("post-norm", "deepnorm-paper", "deepnorm-adam", "gau")
TAGS = ["B", "M", "E", "S"]


def load(path: Path, n: int, max_length: int, vocab: dict[str, int] | None = None):
    """The first ``n`` sentences of ``path`` (cut to ``max_length`` characters) -> ids, tags, vocab."""
    examples = [ex for ex in read_segmented(path) if ex.text][:n]
    if vocab is None:
        chars = Counter(c for ex in examples for c in ex.text)
        vocab = {"[PAD]": 0, "[UNK]": 1, **{c: i + 2 for i, (c, _) in enumerate(chars.most_common())}}
    rows = []
    for ex in examples:
        tags = spans_to_tags(ex.spans, len(ex.text), "BMES")
        rows.append(([vocab.get(c, 1) for c in ex.text][:max_length],
                     [TAGS.index(t) for t in tags][:max_length]))
    return rows, vocab


def batches(rows, size: int, generator: torch.Generator):
    while True:
        order = torch.randperm(len(rows), generator=generator).tolist()
        for i in range(0, len(order) - size + 1, size):
            chunk = [rows[j] for j in order[i:i + size]]
            n = max(len(ids) for ids, _ in chunk)
            ids = torch.tensor([r + [0] * (n - len(r)) for r, _ in chunk])
            tags = torch.tensor([t + [-100] * (n - len(t)) for _, t in chunk])
            yield ids, tags


def encoder_config(variant: str, blocks: int, hidden: int, vocab: int):
    sizes = dict(vocab_size=vocab, hidden_size=hidden, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                 initializer="xavier")
    if variant == "gau":
        return GAUAlphaConfig(num_hidden_layers=2 * blocks, intermediate_size=2 * hidden,
                              attention_key_size=min(128, hidden), normalization="squared_relu", **sizes)
    deepnorm = {"post-norm": None, "deepnorm-paper": "paper", "deepnorm-adam": "adam"}[variant]
    return RoFormerV2Config(num_hidden_layers=blocks, num_attention_heads=max(1, hidden // 32),
                            intermediate_size=4 * hidden, deepnorm=deepnorm, **sizes)


class Tagger(torch.nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        self.encoder = build(config)
        self.out = torch.nn.Linear(config.hidden_size, len(TAGS))

    def forward(self, ids):
        return self.out(self.encoder(input_ids=ids, attention_mask=ids != 0).last_hidden_state)


def branch_ratio(model: Tagger, ids: torch.Tensor) -> float:
    """std(F(x)) / std(x) of the first layer's first residual branch, at initialisation."""
    enc = model.encoder
    valid = ids != 0
    x = enc.embeddings(ids, torch.zeros_like(ids))
    layer = enc.encoder.layer[0]
    with torch.no_grad():
        branch = (layer.gau(x, valid) if hasattr(layer, "gau")
                  else layer.attention.output.dense(layer.attention.self(x, valid)))
    return (branch[valid].std() / x[valid].std()).item()


def word_f1(model: Tagger, rows, batch_size: int = 64) -> float:
    tp = n_pred = n_gold = 0
    model.eval()
    with torch.no_grad():
        for i in range(0, len(rows), batch_size):
            chunk = rows[i:i + batch_size]
            n = max(len(ids) for ids, _ in chunk)
            pred = model(torch.tensor([r + [0] * (n - len(r)) for r, _ in chunk])).argmax(-1).tolist()
            for (ids, tags), p in zip(chunk, pred):
                gold = set(tags_to_spans([TAGS[t] for t in tags], "BMES"))
                guess = set(tags_to_spans([TAGS[t] for t in p[:len(ids)]], "BMES"))
                tp, n_pred, n_gold = tp + len(gold & guess), n_pred + len(guess), n_gold + len(gold)
    model.train()
    return 2 * tp / max(1, n_pred + n_gold)


def run(variant: str, blocks: int, args, train, dev, vocab) -> dict:
    torch.manual_seed(args.seed)
    config = encoder_config(variant, blocks, args.hidden, len(vocab))
    model = Tagger(config).to(args.device)
    generator = torch.Generator().manual_seed(args.seed)
    stream = batches(train, args.batch_size, generator)
    first_ids, _ = next(batches(train, args.batch_size, torch.Generator().manual_seed(args.seed)))
    ratio = branch_ratio(model, first_ids.to(args.device))
    optimiser = torch.optim.Adam(model.parameters(), lr=args.lr)
    losses, start, status = [], time.perf_counter(), "trained"
    for _ in range(args.steps):
        ids, tags = (t.to(args.device) for t in next(stream))
        loss = F.cross_entropy(model(ids).flatten(0, 1), tags.flatten(), ignore_index=-100)
        if not math.isfinite(loss.item()):
            status = "diverged"
            break
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        losses.append(round(loss.item(), 4))
    tail = losses[-max(1, len(losses) // 10):]
    final = sum(tail) / len(tail) if losses else float("nan")
    if status == "trained" and final > args.prior_loss:
        status = "did not train"
    return {"variant": variant, "blocks": blocks, "layers": config.num_hidden_layers, "hidden": args.hidden,
            "params_m": round(sum(p.numel() for p in model.parameters()) / 1e6, 2), "lr": args.lr,
            "steps": args.steps, "batch_size": args.batch_size, "status": status, "final_loss": round(final, 4),
            "dev_word_f1": round(word_f1(model, dev), 4) if status != "diverged" else None,
            "branch_ratio": round(ratio, 4), "seconds": round(time.perf_counter() - start, 1),
            "machine": machine(), "date": date.today().isoformat(), "losses": losses}


def init_ratios(out: Path) -> None:
    """Spec §6.4's estimate: at initialisation a GAU (squared_relu, relu^2(QK^T)/(n s), s = 128) outputs ~1e-2 of
    its input for LeCun init and n = 512. std(GAU(x)) / std(x) for x ~ N(0, 1), three seeds, per init and length."""
    for init in ("lecun", "xavier", "su"):
        for hidden, n in ((768, 512), (768, 128), (256, 512)):
            ratios = []
            for seed in range(3):
                torch.manual_seed(seed)
                config = GAUAlphaConfig(hidden_size=hidden, intermediate_size=2 * hidden, attention_key_size=128,
                                        num_hidden_layers=24, normalization="squared_relu",
                                        initializer="su" if init == "su" else "xavier",
                                        attention_probs_dropout_prob=0.0)
                gau = GatedAttentionUnit(config)
                gau.reset_parameters(config)
                with torch.no_grad():
                    if init == "lecun":  # N(0, 1/fan_in), the derivation's assumption
                        gau.i_dense.weight.normal_(0, hidden ** -0.5)
                        gau.o_dense.weight.normal_(0, (2 * hidden) ** -0.5)
                    x = torch.randn(1, n, hidden)
                    ratios.append((gau(x, torch.ones(1, n, dtype=torch.bool)).std() / x.std()).item())
            row = {"study": "gau-init-ratio", "init": init, "hidden": hidden, "length": n, "key_size": 128,
                   "layers_for_su_init": 24, "ratios": [float(f"{r:.3g}") for r in ratios],
                   "date": date.today().isoformat()}
            with out.open("a", encoding="utf-8") as f:
                f.write(json.dumps(row) + "\n")
            print(json.dumps(row), flush=True)


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    depths = sorted({r["blocks"] for r in rows})
    fig, axes = plt.subplots(1, len(depths), figsize=(4 * len(depths), 3.2), sharey=True, squeeze=False)
    for ax, depth in zip(axes[0], depths):
        for r in rows:
            if r["blocks"] == depth:
                ax.plot(r["losses"], label=f"{r['variant']} ({r['status']})", linewidth=0.8)
        ax.set_title(f"{depth} blocks ({2 * depth} GAU layers)")
        ax.set_xlabel("step")
        ax.set_yscale("log")
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("training loss (BMES CE)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--depths", type=int, nargs="*", default=[6, 24, 48, 96])
    parser.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--train-sentences", type=int, default=4000)
    parser.add_argument("--dev-sentences", type=int, default=500)
    parser.add_argument("--max-length", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", default=str(RESULTS / "depth.jsonl"))
    parser.add_argument("--init-ratios", action="store_true", help="only measure GAU(x)/x at init (spec §6.4)")
    parser.add_argument("--plot-only", action="store_true", help="redraw the PNG from --out's rows")
    args = parser.parse_args()
    if args.plot_only:
        out = Path(args.out)
        plot([json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()], out.with_suffix(".png"))
        return
    if args.init_ratios:
        init_ratios(RESULTS / "depth_init.jsonl")
        return
    train, vocab = load(DATA / "cws" / "sxu" / "train.txt", args.train_sentences, args.max_length)
    dev, _ = load(DATA / "cws" / "sxu" / "test.txt", args.dev_sentences, args.max_length, vocab)
    prior = Counter(t for _, tags in train for t in tags)
    total = sum(prior.values())
    args.prior_loss = -sum(c / total * math.log(c / total) for c in prior.values())
    print(f"prior loss {args.prior_loss:.4f}; {len(train)} train, {len(dev)} dev sentences", flush=True)
    rows = []
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for blocks in args.depths:
        for variant in args.variants:
            row = run(variant, blocks, args, train, dev, vocab)
            row["prior_loss"] = round(args.prior_loss, 4)
            rows.append(row)
            with out.open("a", encoding="utf-8") as f:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
            print(json.dumps({k: v for k, v in row.items() if k != "losses"}), flush=True)
            plot(rows, out.with_suffix(".png"))


if __name__ == "__main__":
    with machine_lock():
        main()
