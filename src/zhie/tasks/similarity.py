"""Sentence embeddings trained on sentence pairs: CoSENT, the Sentence-BERT softmax objective, cosine-MSE.

Pooling (spec §4): ``cls`` (the last layer's first token), ``mean`` (the last layer averaged over the tokens of
the sentence, special tokens included, as sentence-transformers and e5 do) or ``first-last-avg`` (the outputs
of the first and the last transformer layer averaged, then averaged over the tokens, as in BERT-whitening).
Training feeds a batch of B pairs as 2B sentences interleaved ``[a1, b1, a2, b2, …]`` (spec §4.1).

Losses, all in fp32: ``cosent`` (λ = 20, every pair of pairs in the batch), ``sbert`` (a classifier on
``[u; v; |u − v|]`` with cross-entropy, labels as classes; cosine at test time) and ``cosine-mse`` (the cosine
regressed on the label scaled to [0, 1] with the training set's label range). Evaluation: Spearman between
cosine and label.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from zhie.data.sts import Pair
from zhie.losses import cosent_loss, cosine_mse_loss, sbert_softmax_loss
from zhie.metrics import spearman
from zhie.tasks.base import Task, device_of, pad, sorted_batches

POOLINGS = ("cls", "mean", "first-last-avg")
LOSSES = ("cosent", "sbert", "cosine-mse")


@dataclass
class StsConfig:
    loss: str = "cosent"
    pooling: str = "cls"
    max_length: int = 64      # tokens per sentence, special tokens included
    prefix: str = ""          # put before every sentence (e5 models expect "query: ")
    scale: float = 20.0       # CoSENT's lambda
    num_classes: int = 0      # sbert: labels are the classes 0 .. num_classes - 1
    label_min: float = 0.0    # cosine-mse: targets are (label - label_min) / (label_max - label_min)
    label_max: float = 1.0

    def __post_init__(self):
        if self.loss not in LOSSES:
            raise ValueError(f"unknown loss {self.loss!r}; use one of {', '.join(LOSSES)}")
        if self.pooling not in POOLINGS:
            raise ValueError(f"unknown pooling {self.pooling!r}; use one of {', '.join(POOLINGS)}")
        if self.loss == "sbert" and self.num_classes < 2:
            raise ValueError("the sbert loss needs at least 2 label classes")
        if self.loss == "cosine-mse" and not self.label_max > self.label_min:
            raise ValueError("cosine-mse needs labels with more than one value")


def pool(output, attention_mask: Tensor, pooling: str) -> Tensor:
    """Sentence vectors ``[b, hidden]`` (fp32) from an encoder output (``hidden_states`` for first-last-avg)."""
    if pooling == "cls":
        return output.last_hidden_state[:, 0].float()
    hidden = output.last_hidden_state if pooling == "mean" else (output.hidden_states[1] + output.hidden_states[-1]) / 2
    mask = attention_mask.unsqueeze(-1).float()
    return (hidden.float() * mask).sum(1) / mask.sum(1).clamp(min=1)


class SentenceModel(nn.Module):
    def __init__(self, encoder: nn.Module, config: StsConfig):
        super().__init__()
        self.encoder = encoder
        self.config = config
        hidden = encoder.config.hidden_size
        self.classifier = nn.Linear(3 * hidden, config.num_classes) if config.loss == "sbert" else None

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """Sentence vectors ``[b, hidden]`` (fp32, not normalised)."""
        out = self.encoder(input_ids=input_ids, attention_mask=attention_mask,
                           output_hidden_states=self.config.pooling == "first-last-avg")
        return pool(out, attention_mask, self.config.pooling)


@dataclass
class Item:
    a: list[int]
    b: list[int]
    label: float


class StsTask(Task):
    name = "sts"
    config_class = StsConfig
    model_class = SentenceModel

    def token_ids(self, texts: list[str]) -> list[list[int]]:
        return self.tokenizer([self.config.prefix + t for t in texts], truncation=True,
                              max_length=self.config.max_length)["input_ids"]

    def encode(self, pairs: list[Pair]) -> list[Item]:
        a, b = self.token_ids([p.text_a for p in pairs]), self.token_ids([p.text_b for p in pairs])
        return [Item(x, y, p.label) for x, y, p in zip(a, b, pairs)]

    def _inputs(self, rows: list[list[int]]) -> dict[str, Tensor]:
        return {"input_ids": pad(rows, self.tokenizer.pad_token_id),
                "attention_mask": pad([[1] * len(r) for r in rows], 0)}

    def collate(self, items: list[Item]) -> dict[str, Tensor]:
        batch = self._inputs([ids for it in items for ids in (it.a, it.b)])
        batch["labels"] = torch.tensor([it.label for it in items], dtype=torch.float32)
        return batch

    def loss(self, model: SentenceModel, batch: dict[str, Tensor]) -> Tensor:
        c = self.config
        vectors = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
        u, v = vectors[0::2], vectors[1::2]  # the pairs were interleaved by collate
        if c.loss == "sbert":
            classifier = getattr(model, "module", model).classifier  # under DDP the model arrives wrapped
            return sbert_softmax_loss(u, v, batch["labels"].long(), classifier)
        cos = F.cosine_similarity(u, v, dim=-1)
        if c.loss == "cosent":
            return cosent_loss(cos, batch["labels"], c.scale)
        return cosine_mse_loss(cos, (batch["labels"] - c.label_min) / (c.label_max - c.label_min))

    @torch.no_grad()
    def embed(self, model: SentenceModel, texts: list[str], batch_size: int = 64, normalize: bool = True) -> np.ndarray:
        """``[len(texts), hidden]`` float32 sentence vectors, in input order (L2-normalised if ``normalize``)."""
        model.eval()
        device = device_of(model)
        ids = self.token_ids(texts)
        out = np.zeros((len(texts), model.encoder.config.hidden_size), dtype=np.float32)
        for batch_idx in sorted_batches([len(r) for r in ids], batch_size):
            batch = self._inputs([ids[i] for i in batch_idx])
            vectors = model(input_ids=batch["input_ids"].to(device), attention_mask=batch["attention_mask"].to(device))
            if normalize:
                vectors = F.normalize(vectors, dim=-1)
            out[batch_idx] = vectors.cpu().numpy()
        return out

    def evaluate(self, model: SentenceModel, pairs: list[Pair], batch_size: int = 64) -> dict:
        texts = list(dict.fromkeys(t for p in pairs for t in (p.text_a, p.text_b)))
        row = {t: i for i, t in enumerate(texts)}
        vectors = self.embed(model, texts, batch_size, normalize=True)
        cos = [float(vectors[row[p.text_a]] @ vectors[row[p.text_b]]) for p in pairs]
        return {"spearman": spearman(cos, [p.label for p in pairs]), "pairs": len(pairs)}


def train_sts(train_path, dev_path, *, out, encoder: str = "e5-small", loss: str = "cosent", pooling: str = "cls",
              max_length: int = 64, prefix: str | None = None, encoder_layers: int | None = None, config=None,
              resume: bool = True, progress: bool = True) -> dict:
    """Train sentence embeddings on ``train_path`` pairs; the best model on ``dev_path`` (Spearman) goes to
    ``out/best``. ``prefix`` defaults to ``"query: "`` for e5 encoders and to nothing otherwise."""
    import json

    from zhie.data.sts import read_pairs
    from zhie.tasks.base import prepare_encoder
    from zhie.training import TrainConfig, train

    config = config or TrainConfig()
    out = Path(out)
    train_pairs, dev_pairs = read_pairs(train_path), read_pairs(dev_path)
    labels = sorted({p.label for p in train_pairs})
    if loss == "sbert" and any(y != int(y) or y < 0 for y in labels):
        raise ValueError(f"{train_path}: the sbert loss needs labels 0, 1, 2, … (classes), got {labels[:5]}")
    if prefix is None:
        prefix = "query: " if "e5" in Path(str(encoder)).name.lower() else ""
    sts_config = StsConfig(loss=loss, pooling=pooling, max_length=max_length, prefix=prefix,
                           num_classes=int(labels[-1]) + 1 if loss == "sbert" else 0,
                           label_min=labels[0], label_max=labels[-1])
    texts = [t for p in train_pairs + dev_pairs for t in (p.text_a, p.text_b)]
    enc, tokenizer = prepare_encoder(encoder, texts=texts, mode="subword", layers=encoder_layers, seed=config.seed)
    task = StsTask(sts_config, tokenizer)
    items = task.encode(train_pairs)
    model = SentenceModel(enc, sts_config)
    out.mkdir(parents=True, exist_ok=True)
    summary = {"train": str(train_path), "dev": str(dev_path), "pairs": len(train_pairs), "labels": labels[:20],
               "encoder": encoder, "loss": loss, "pooling": pooling, "prefix": prefix}
    (out / "data_stats.json").write_text(json.dumps(summary, ensure_ascii=False, indent=2), encoding="utf-8")
    if progress:
        print(json.dumps(summary, ensure_ascii=False))

    def evaluate(m: SentenceModel) -> dict:
        return {"spearman": task.evaluate(m, dev_pairs)["spearman"]}

    # no length grouping: CoSENT ranks the pairs of a batch against each other, so batches are random (spec §4.1)
    return train(model, items, collate=task.collate, loss_fn=task.loss, config=config, out_dir=out,
                 evaluate=evaluate, metric="spearman", save_best=task.save, resume=resume, progress=progress)
