"""Named-entity recognition: label encoding, model, loss, vectorised decoding, metric.

Heads (spec §1, §2, §8):

* ``gp`` / ``egp`` — (Efficient) GlobalPointer: one span-score matrix per entity type, trained with the
  sparse multilabel categorical cross-entropy on index labels; a span is predicted where its masked logit
  is > 0 (``nonzero`` on the logits, no loop over cells). Flat and nested data.
* ``crf`` / ``softmax`` — BIO taggers (O = 0, B-c = 2c+1, I-c = 2c+2) over the content tokens; the CRF
  decodes with batched Viterbi restricted to valid BIO paths. Flat data only: nested spans are refused,
  unless ``flatten=True`` keeps the outermost ones.

Token positions: model inputs are ``[CLS] content [SEP]``; content token ``t`` sits at position ``t + 1``.
Texts longer than ``max_length`` are cut into overlapping windows (training: every window is an example;
prediction: each entity is reported by the window that owns it, see :func:`zhie.text.owns`).

Entity scores: GP/EGP ``sigmoid(2 * logit)`` (the calibrated probability of the MCE loss, spec §0.2);
taggers: the mean over the entity's tokens of the softmax probability of their tags (for the CRF, of the
emission scores).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from zhie.data import NerExample
from zhie.heads import (
    CRF,
    EfficientGlobalPointer,
    GlobalPointer,
    SoftmaxTagger,
    bio_allowed_transitions,
    bmes_allowed_transitions,
)
from zhie.losses import global_pointer_loss
from zhie.metrics import span_prf
from zhie.spans import Span, spans_to_tags, tags_to_spans
from zhie.tasks.base import WindowedTask, pad, sparse_cells
from zhie.text import owns, windows

HEADS = ("softmax", "crf", "gp", "egp")
Hit = tuple[int, int, int, float]  # first token, last token (inclusive), label index, score
SPAN_HEADS = ("gp", "egp")


@dataclass
class NerConfig:
    labels: list[str]
    head: str = "gp"
    mode: str = "char"
    max_length: int = 256
    stride: int = 32
    head_size: int = 64
    dropout: float = 0.1
    scheme: str = "BIO"  # tagger heads: BIO for entities, BMES for word segmentation

    def __post_init__(self):
        if self.head not in HEADS:
            raise ValueError(f"unknown head {self.head!r}; choose one of {', '.join(HEADS)}")
        if not self.labels:
            raise ValueError("no entity types: the training data has no entities")
        if self.scheme not in ("BIO", "BMES") or (self.scheme == "BMES" and self.head in SPAN_HEADS):
            raise ValueError(f"scheme {self.scheme!r} with head {self.head!r}: use BIO, or BMES with crf/softmax")

    @property
    def tags(self) -> list[str]:
        """Tags of the tagger heads: BIO O = 0, B-c = 2c+1, I-c = 2c+2; BMES S = 0, B = 1, M = 2, E = 3."""
        if self.scheme == "BMES":
            return ["S", "B", "M", "E"]
        return ["O"] + [f"{p}-{label}" for label in self.labels for p in "BI"]


class NerModel(nn.Module):
    """Encoder + one NER head; ``forward`` returns the head's logits.

    Span heads: ``[batch, types, seq, seq]`` (masked); taggers: ``[batch, seq, tags]`` emissions.
    """

    def __init__(self, encoder: nn.Module, config: NerConfig):
        super().__init__()
        self.encoder = encoder
        self.config = config
        hidden = encoder.config.hidden_size
        if config.head in SPAN_HEADS:
            cls = GlobalPointer if config.head == "gp" else EfficientGlobalPointer
            self.head = cls(hidden, len(config.labels), head_size=config.head_size)
        else:
            self.head = SoftmaxTagger(hidden, len(config.tags), dropout=config.dropout)
        self.crf = CRF(len(config.tags)) if config.head == "crf" else None

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        if self.config.head in SPAN_HEADS:
            return self.head(hidden, attention_mask=content_mask(attention_mask))
        return self.head(hidden)


def entity_safe_cuts(n: int, spans: list[tuple[int, int, int]], size: int) -> list[tuple[int, int]]:
    """Consecutive training windows ``[a, b)`` of at most ``size`` tokens covering ``0..n``, each ending where no
    (flat) span ``(first, last, label)`` crosses it; only a span longer than ``size`` is cut."""
    cuts, start = [], 0
    while start < n:
        end = min(start + size, n)
        crossing = [s for s, e, _ in spans if start < s < end <= e]
        if crossing:
            end = min(crossing)
        cuts.append((start, end))
        start = end
    return cuts


def content_mask(attention_mask: Tensor) -> Tensor:
    """The attention mask without ``[CLS]`` (position 0) and ``[SEP]`` (the last real position)."""
    mask = attention_mask.clone()
    mask[:, 0] = 0
    mask[torch.arange(mask.shape[0], device=mask.device), attention_mask.sum(1) - 1] = 0
    return mask


def flatten_outermost(spans: list[Span]) -> list[Span]:
    """Keep the outermost of nested or overlapping spans (longest first among those starting together)."""
    kept: list[Span] = []
    for span in sorted(spans, key=lambda s: (s.start, -s.end)):
        if not kept or span.start >= kept[-1].end:
            kept.append(span)
    return kept


def is_nested(spans: list[Span]) -> bool:
    ordered = sorted(spans, key=lambda s: (s.start, s.end))
    return any(b.start < a.end for a, b in zip(ordered, ordered[1:]))


@dataclass
class Item:
    """One training window: model input ids and its gold spans as content-token ranges."""

    ids: list[int]
    spans: list[tuple[int, int, int]]  # (first token, last token inclusive, label index), content positions
    tags: list[int] = field(default_factory=list)


class NerTask(WindowedTask):
    """Label encoding, batching, loss, decoding and evaluation for one :class:`NerConfig`."""

    name = "ner"
    config_class = NerConfig
    model_class = NerModel

    def __init__(self, config: NerConfig, tokenizer):
        super().__init__(config, tokenizer)
        self.label_index = {label: i for i, label in enumerate(config.labels)}
        self.tag_index = {tag: i for i, tag in enumerate(config.tags)}
        if config.head == "crf":
            constraints = bmes_allowed_transitions if config.scheme == "BMES" else bio_allowed_transitions
            self.allowed = constraints(config.tags)
        self.stats = {"spans_dropped": 0, "windows": 0}

    # --------------------------------------------------------------------------------------- encoding
    def check_flat(self, examples: list[NerExample], flatten: bool, where: str = "the data") -> list[NerExample]:
        """Taggers need flat spans: refuse nested data (or keep the outermost spans with ``flatten``)."""
        if self.config.head in SPAN_HEADS:
            return examples
        nested = {i for i, ex in enumerate(examples) if is_nested(ex.spans)}
        if not nested:
            return examples
        if not flatten:
            raise ValueError(
                f"{where} has nested or overlapping entities in {len(nested)} example(s) (first: #{min(nested) + 1}, "
                f"{examples[min(nested)].text[:40]!r}); the {self.config.head} head tags each character once and "
                "cannot represent them. Use --head gp or --head egp, or --flatten to keep the outermost spans.")
        self.stats["flattened_examples"] = len(nested)
        return [NerExample(ex.text, flatten_outermost(ex.spans)) if i in nested else ex
                for i, ex in enumerate(examples)]

    def encode(self, examples: list[NerExample]) -> list[Item]:
        """Training items: one per window of ``max_length - 2`` content tokens."""
        size, stride = self.window
        items = []
        for ex in examples:
            enc = self.text_tokenizer(ex.text)
            token_spans = []
            for span in ex.spans:
                tokens = enc.char_span_to_tokens(span.start, span.end)
                if tokens is None or span.label not in self.label_index:
                    self.stats["spans_dropped"] += 1
                    continue
                token_spans.append((tokens[0], tokens[1] - 1, self.label_index[span.label]))
            if self.config.head in SPAN_HEADS:
                cuts = list(windows(len(enc), size, stride)) if len(enc) else []
            else:  # a tagger must not see an entity cut by a window edge: it would learn its tokens as O
                cuts = entity_safe_cuts(len(enc), token_spans, size)
            self.stats["spans_dropped"] += sum(not any(a <= s and e < b for a, b in cuts) for s, e, _ in token_spans)
            for a, b in cuts:
                inside = [(s - a, e - a, k) for s, e, k in token_spans if a <= s and e < b]
                items.append(Item(enc.ids[a:b], inside, self._tags(inside, b - a)))
        self.stats["windows"] += len(items)
        return items

    def _tags(self, spans: list[tuple[int, int, int]], n: int) -> list[int]:
        if self.config.head in SPAN_HEADS:
            return []
        labels = self.config.labels
        tags = spans_to_tags([(s, e + 1, labels[k]) for s, e, k in spans], n, self.config.scheme)
        return [self.tag_index[t] for t in tags]

    def collate(self, items: list[Item]) -> dict[str, Tensor]:
        batch = self.collate_inputs(items)
        n = batch["input_ids"].shape[1]
        if self.config.head in SPAN_HEADS:
            rows = [[(k, s, e) for s, e, k in it.spans] for it in items]
            batch["labels"] = sparse_cells(rows, len(self.config.labels), n)
        else:
            batch["labels"] = pad([[-100, *it.tags, -100] for it in items], -100, n)
        return batch

    # --------------------------------------------------------------------------------------- training
    def loss(self, model: NerModel, batch: dict[str, Tensor]) -> Tensor:
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
        labels = batch["labels"]
        if self.config.head in SPAN_HEADS:
            return global_pointer_loss(logits, labels, mask_zero=True, reduction="mean")
        if self.config.head == "softmax":
            return F.cross_entropy(logits.float().transpose(1, 2), labels, ignore_index=-100)
        tags, mask = labels[:, 1:], labels[:, 1:] != -100  # content tokens start at position 1
        crf = getattr(model, "module", model).crf  # under DDP the model arrives wrapped
        return -crf.log_likelihood(logits[:, 1:], tags.clamp(min=0), mask).mean()

    # --------------------------------------------------------------------------------------- decoding
    @torch.no_grad()
    def decode(self, model: NerModel, logits: Tensor, attention_mask: Tensor) -> list[list[Hit]]:
        """Logits -> per row ``(first, last_inclusive, label index, score)`` over content token positions."""
        rows: list[list[Hit]] = [[] for _ in range(logits.shape[0])]
        if self.config.head in SPAN_HEADS:
            hits = (logits > 0).nonzero().tolist()
            scores = torch.sigmoid(2 * logits.float()[logits > 0]).tolist()
            for (b, k, i, j), score in zip(hits, scores):
                rows[b].append((i - 1, j - 1, k, score))
            return rows
        lengths = (attention_mask.sum(1) - 2).tolist()
        emissions = logits[:, 1:].float()
        mask = torch.arange(emissions.shape[1], device=logits.device)[None, :] < torch.tensor(
            lengths, device=logits.device)[:, None]
        if model.crf is not None:
            allowed, start, end = (t.to(logits.device) for t in self.allowed)
            paths, _ = model.crf.viterbi(emissions, mask, allowed=allowed, allowed_start=start, allowed_end=end)
        else:
            paths = emissions.argmax(-1)
        probs = emissions.softmax(-1).gather(-1, paths.clamp(min=0).unsqueeze(-1)).squeeze(-1).tolist()
        tags = self.config.tags
        for b, (path, length) in enumerate(zip(paths.tolist(), lengths)):  # one device-to-host copy, no per-span sync
            for s, e, label in tags_to_spans([tags[t] for t in path[:length]], self.config.scheme):
                rows[b].append((s, e - 1, self.label_index.get(label, 0), sum(probs[b][s:e]) / (e - s)))
        return rows

    def predict(self, model: NerModel, texts: list[str], batch_size: int = 32,
                timings: dict | None = None) -> list[list[Span]]:
        """Entities of each text, in input order; long texts go through overlapping windows, each entity is
        reported by the window that owns its start (:func:`zhie.text.owns`)."""
        found: list[dict[tuple[int, int, str], float]] = [{} for _ in texts]
        stride = self.window[1]
        for i, (a, b), enc, row in self.window_rows(model, texts, batch_size, timings):
            for s, e, k, score in row:
                if s < 0 or e >= b - a or not owns((a, b), a + s, len(enc), stride):
                    continue
                start, end = enc.token_span_to_chars(a + s, a + e + 1)
                key = (start, end, self.config.labels[k])
                found[i][key] = max(score, found[i].get(key, 0.0))
        return [sorted(Span(s, e, label, text[s:e], score) for (s, e, label), score in spans.items())
                for text, spans in zip(texts, found)]

    def evaluate(self, model: NerModel, examples: list[NerExample], batch_size: int = 32) -> dict:
        pred = self.predict(model, [ex.text for ex in examples], batch_size)
        return span_prf([ex.spans for ex in examples], pred)


def train_ner(train_path, dev_path, *, out, encoder: str = "e5-small", head: str = "gp", format: str = "auto",
              mode: str = "char", max_length: int = 256, flatten: bool = False, keep_tokens: str = "auto",
              encoder_layers: int | None = None, config=None, resume: bool = True, progress: bool = True) -> dict:
    """Train an NER model on ``train_path``, keep the best on ``dev_path`` in ``out/best``; returns the summary."""
    import json

    from zhie.data import read_ner
    from zhie.tasks.base import prepare_encoder
    from zhie.training import TrainConfig, train

    config = config or TrainConfig()
    out = Path(out)
    train_examples, dev_examples = read_ner(train_path, format), read_ner(dev_path, format)
    labels = sorted({s.label for ex in train_examples for s in ex.spans})
    ner_config = NerConfig(labels, head=head, mode=mode, max_length=max_length)
    enc, tokenizer = prepare_encoder(encoder, texts=[ex.text for ex in train_examples + dev_examples], mode=mode,
                                     keep_tokens=keep_tokens, layers=encoder_layers, seed=config.seed)
    task = NerTask(ner_config, tokenizer)
    train_examples = task.check_flat(train_examples, flatten, str(train_path))
    items = task.encode(train_examples)
    model = NerModel(enc, ner_config)
    out.mkdir(parents=True, exist_ok=True)
    summary = {"train": str(train_path), "dev": str(dev_path), "examples": len(train_examples), **task.stats,
               "labels": labels, "encoder": encoder, "vocab": len(tokenizer),
               "encoder_layers": enc.config.num_hidden_layers, "head": head}
    (out / "data_stats.json").write_text(json.dumps(summary, ensure_ascii=False, indent=2), encoding="utf-8")
    if progress:
        print(json.dumps(summary, ensure_ascii=False))

    def evaluate(m: NerModel) -> dict:
        metrics = task.evaluate(m, dev_examples)
        return {**metrics["micro"], "n_pred": metrics["n_pred"]}

    return train(model, items, collate=task.collate, loss_fn=task.loss, config=config, out_dir=out,
                 evaluate=evaluate, metric="f1", save_best=task.save, lengths=[len(it.ids) for it in items],
                 resume=resume, progress=progress)
