"""Relation extraction with GPLinker (spec §3.1).

Three (Efficient) GlobalPointer modules on the encoder output:

* ``entity``: 2 heads (0 = subject, 1 = object), RoPE and the lower-triangle mask; cell (start, end) of a span;
* ``head_head`` and ``tail_tail``: one head per predicate, no RoPE, no triangle mask; cell (subject start, object
  start) and (subject end, object end).

A triple (s, p, o) is predicted when s and o are entity cells > 0 and both linking cells of p are > 0. Labels
are sparse cell indices, the loss is the sparse multilabel categorical cross-entropy with ``mask_zero``
(cell 0 = ``([CLS], [CLS])`` is padding), summed over heads, averaged over the batch, summed over the three
modules. Decoding gathers the linking scores of every subject x object pair at once (``nonzero`` on masked
logits, no loop over cells). A relation's score is the smallest ``sigmoid(2 * logit)`` of its four cells.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor, nn

from zhie.data.spo import SpoExample, Triple
from zhie.heads import EfficientGlobalPointer, GlobalPointer
from zhie.losses import global_pointer_loss
from zhie.metrics import span_prf
from zhie.spans import Span
from zhie.tasks.base import WindowedTask, sparse_cells
from zhie.tasks.ner import content_mask
from zhie.text import windows


@dataclass
class RelationConfig:
    predicates: list[str]
    variant: str = "egp"
    mode: str = "char"
    max_length: int = 256
    stride: int = 64
    head_size: int = 64
    # Decoding caps per window: an untrained or diverging model scores about half of all L² cells above 0, and
    # every subject x object x predicate combination of those would be a triple. Real data stays far below
    # (CMeIE train: at most 29 subjects, 29 objects and 29 triples in a text); above a cap the highest
    # scores are kept.
    max_spans: int = 128     # subjects, and objects, per window
    max_triples: int = 512   # triples per window

    def __post_init__(self):
        if self.variant not in ("gp", "egp"):
            raise ValueError(f"unknown GPLinker variant {self.variant!r}; use gp or egp")
        if not self.predicates:
            raise ValueError("no predicates: the training data has no triples")


@dataclass
class RelationLogits:
    entity: Tensor     # [b, 2, n, n]
    head_head: Tensor  # [b, predicates, n, n]
    tail_tail: Tensor  # [b, predicates, n, n]


class RelationModel(nn.Module):
    def __init__(self, encoder: nn.Module, config: RelationConfig):
        super().__init__()
        self.encoder = encoder
        self.config = config
        cls = GlobalPointer if config.variant == "gp" else EfficientGlobalPointer
        hidden, heads, size = encoder.config.hidden_size, len(config.predicates), config.head_size
        self.entity = cls(hidden, 2, head_size=size, rope=True, tril_mask=True)
        self.head_head = cls(hidden, heads, head_size=size, rope=False, tril_mask=False)
        self.tail_tail = cls(hidden, heads, head_size=size, rope=False, tril_mask=False)

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> RelationLogits:
        hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        mask = content_mask(attention_mask)
        return RelationLogits(self.entity(hidden, attention_mask=mask), self.head_head(hidden, attention_mask=mask),
                              self.tail_tail(hidden, attention_mask=mask))


@dataclass
class Item:
    ids: list[int]
    entity: list[tuple[int, int, int]] = field(default_factory=list)     # (role, start, end) content positions
    head_head: list[tuple[int, int, int]] = field(default_factory=list)  # (predicate, subject start, object start)
    tail_tail: list[tuple[int, int, int]] = field(default_factory=list)  # (predicate, subject end, object end)


class RelationTask(WindowedTask):
    name = "re"
    config_class = RelationConfig
    model_class = RelationModel

    def __init__(self, config: RelationConfig, tokenizer):
        super().__init__(config, tokenizer)
        self.predicate_index = {p: i for i, p in enumerate(config.predicates)}
        self.stats = {"triples": 0, "triples_dropped": 0, "not_in_text": 0, "unknown_predicate": 0}

    # --------------------------------------------------------------------------------------- encoding
    def encode(self, examples: list[SpoExample]) -> list[Item]:
        size, stride = self.window
        items = []
        for ex in examples:
            enc = self.text_tokenizer(ex.text)
            located = []
            for t in ex.triples:
                self.stats["triples"] += 1
                if not t.located:
                    self.stats["not_in_text"] += 1
                    continue
                if t.predicate not in self.predicate_index:
                    self.stats["unknown_predicate"] += 1
                    continue
                s, o = enc.char_span_to_tokens(t.subject.start, t.subject.end), \
                    enc.char_span_to_tokens(t.object.start, t.object.end)
                if s is None or o is None:
                    self.stats["triples_dropped"] += 1
                    continue
                located.append((s[0], s[1] - 1, self.predicate_index[t.predicate], o[0], o[1] - 1))
            cuts = list(windows(len(enc), size, stride)) if len(enc) else []
            self.stats["triples_dropped"] += sum(not any(a <= min(sh, oh) and max(st, ot) < b for a, b in cuts)
                                                 for sh, st, _, oh, ot in located)
            for a, b in cuts:
                item = Item(enc.ids[a:b])
                for sh, st, p, oh, ot in located:
                    if a <= min(sh, oh) and max(st, ot) < b:
                        item.entity += [(0, sh - a, st - a), (1, oh - a, ot - a)]
                        item.head_head.append((p, sh - a, oh - a))
                        item.tail_tail.append((p, st - a, ot - a))
                items.append(item)
        return items

    def collate(self, items: list[Item]) -> dict[str, Tensor]:
        batch = self.collate_inputs(items)
        n, r = batch["input_ids"].shape[1], len(self.config.predicates)
        batch["entity_labels"] = sparse_cells([it.entity for it in items], 2, n)
        batch["head_head_labels"] = sparse_cells([it.head_head for it in items], r, n)
        batch["tail_tail_labels"] = sparse_cells([it.tail_tail for it in items], r, n)
        return batch

    def loss(self, model: RelationModel, batch: dict[str, Tensor]) -> Tensor:
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
        return sum(global_pointer_loss(getattr(logits, name), batch[f"{name}_labels"], mask_zero=True,
                                       reduction="sum_heads_mean_batch")
                   for name in ("entity", "head_head", "tail_tail"))

    # --------------------------------------------------------------------------------------- decoding
    @torch.no_grad()
    def decode(self, model: RelationModel | None, logits: RelationLogits,
               attention_mask: Tensor | None = None) -> list[list[tuple[int, int, int, int, int, float]]]:
        """Logits (already masked) -> per row ``(subject start, subject end, predicate, object start,
        object end, score)``, content positions with inclusive ends."""
        rows = []
        cap_spans, cap_triples = self.config.max_spans, self.config.max_triples
        for b in range(logits.entity.shape[0]):
            ent = logits.entity[b].float()
            subjects, objects = _top_cells(ent[0], cap_spans), _top_cells(ent[1], cap_spans)
            if not len(subjects) or not len(objects):
                rows.append([])
                continue
            hh = logits.head_head[b].float()[:, subjects[:, 0, None], objects[None, :, 0]]  # [R, S, O]
            tt = logits.tail_tail[b].float()[:, subjects[:, 1, None], objects[None, :, 1]]
            hits = ((hh > 0) & (tt > 0)).nonzero()
            if not len(hits):
                rows.append([])
                continue
            p, si, oi = hits.unbind(1)
            s_score = ent[0][subjects[si, 0], subjects[si, 1]]
            o_score = ent[1][objects[oi, 0], objects[oi, 1]]
            score = torch.sigmoid(2 * torch.stack([s_score, o_score, hh[p, si, oi], tt[p, si, oi]])).min(0).values
            if len(score) > cap_triples:
                keep = score.topk(cap_triples).indices.sort().values
                p, si, oi, score = p[keep], si[keep], oi[keep], score[keep]
            rows.append([(sh - 1, st - 1, pp, oh - 1, ot - 1, sc) for sh, st, pp, oh, ot, sc in zip(
                subjects[si, 0].tolist(), subjects[si, 1].tolist(), p.tolist(), objects[oi, 0].tolist(),
                objects[oi, 1].tolist(), score.tolist())])
        return rows

    def predict(self, model: RelationModel, texts: list[str], batch_size: int = 32,
                timings: dict | None = None) -> list[list[Triple]]:
        """Triples of each text, in input order; a triple found in several overlapping windows is kept once."""
        found: list[dict] = [{} for _ in texts]
        for i, (a, _), enc, row in self.window_rows(model, texts, batch_size, timings):
            for sh, st, p, oh, ot, score in row:
                key = (*enc.token_span_to_chars(a + sh, a + st + 1), p, *enc.token_span_to_chars(a + oh, a + ot + 1))
                found[i][key] = max(score, found[i].get(key, 0.0))
        return [[Triple(Span(s0, s1, "", text[s0:s1]), self.config.predicates[p], Span(o0, o1, "", text[o0:o1]),
                        score) for (s0, s1, p, o0, o1), score in sorted(spans.items())]
                for text, spans in zip(texts, found)]

    def evaluate(self, model: RelationModel, examples: list[SpoExample], batch_size: int = 32) -> dict:
        pred = self.predict(model, [ex.text for ex in examples], batch_size)
        return relation_metrics(examples, pred)


def _top_cells(logits: Tensor, cap: int) -> Tensor:
    """``(row, col)`` of the cells scoring > 0, at most ``cap`` of them (the highest), in row-major order."""
    cells = (logits > 0).nonzero()
    if len(cells) > cap:
        keep = logits[cells[:, 0], cells[:, 1]].topk(cap).indices.sort().values
        cells = cells[keep]
    return cells


def relation_metrics(gold: list[SpoExample], pred: list[list[Triple]]) -> dict:
    """Triple P/R/F1 on (subject text, predicate, object text) sets per text, plus entity F1 on located
    (start, end, role) spans."""
    tp = n_gold = n_pred = 0
    for ex, triples in zip(gold, pred, strict=True):
        g, p = {t.key() for t in ex.triples}, {t.key() for t in triples}
        tp, n_gold, n_pred = tp + len(g & p), n_gold + len(g), n_pred + len(p)
    precision = tp / n_pred if n_pred else 0.0
    recall = tp / n_gold if n_gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0

    def entities(triples):
        return [(t.subject.start, t.subject.end, "subject") for t in triples if t.subject.start >= 0] + \
               [(t.object.start, t.object.end, "object") for t in triples if t.object.start >= 0]

    ent = span_prf([entities(ex.triples) for ex in gold], [entities(t) for t in pred])
    return {"precision": precision, "recall": recall, "f1": f1, "entity_f1": ent["micro"]["f1"],
            "n_gold": n_gold, "n_pred": n_pred}


def train_relations(train_path, dev_path, *, out, schema=None, encoder: str = "e5-small", variant: str = "egp",
                    max_length: int = 256, keep_tokens: str = "auto", encoder_layers: int | None = None,
                    config=None, resume: bool = True, progress: bool = True) -> dict:
    """Train GPLinker; the best model on ``dev_path`` (triple F1) goes to ``out/best``."""
    from zhie.data.spo import read_schema, read_spo
    from zhie.tasks.base import prepare_encoder
    from zhie.training import TrainConfig, train

    config = config or TrainConfig()
    out = Path(out)
    train_examples, dev_examples = read_spo(train_path), read_spo(dev_path)
    predicates = read_schema(schema) if schema else \
        list(dict.fromkeys(t.predicate for ex in train_examples for t in ex.triples))
    enc, tokenizer = prepare_encoder(encoder, texts=[ex.text for ex in train_examples + dev_examples],
                                     keep_tokens=keep_tokens, layers=encoder_layers, seed=config.seed)
    task = RelationTask(RelationConfig(predicates, variant=variant, max_length=max_length), tokenizer)
    items = task.encode(train_examples)
    model = RelationModel(enc, task.config)
    out.mkdir(parents=True, exist_ok=True)
    summary = {"train": str(train_path), "examples": len(train_examples), "windows": len(items), **task.stats,
               "predicates": len(predicates), "encoder": encoder, "variant": variant}
    (out / "data_stats.json").write_text(json.dumps(summary, ensure_ascii=False, indent=2), encoding="utf-8")
    if progress:
        print(json.dumps(summary, ensure_ascii=False))

    def evaluate(m: RelationModel) -> dict:
        return {k: v for k, v in task.evaluate(m, dev_examples).items() if isinstance(v, float)}

    return train(model, items, collate=task.collate, loss_fn=task.loss, config=config, out_dir=out,
                 evaluate=evaluate, metric="f1", save_best=task.save, lengths=[len(it.ids) for it in items],
                 resume=resume, progress=progress)
