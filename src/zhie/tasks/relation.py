"""Relation extraction with GPLinker (spec §3.1).

The head (:class:`zhie.heads.GPLinkerHead`) is three (Efficient) GlobalPointer modules on the encoder output:

* ``entity``: 2 heads (0 = subject, 1 = object), RoPE and the lower-triangle mask; cell (start, end) of a span;
* ``head_head`` and ``tail_tail``: one head per predicate, no RoPE, no triangle mask; cell (subject start, object
  start) and (subject end, object end).

A triple (s, p, o) is predicted when s and o are entity cells > 0 and both linking cells of p are > 0. Labels
are sparse cell indices, the loss is the sparse multilabel categorical cross-entropy with ``mask_zero``
(cell 0 = ``([CLS], [CLS])`` is padding), summed over heads, averaged over the batch, summed over the three
modules. Decoding gathers the linking scores of every subject x object pair at once
(:func:`zhie.core.decoding.link_relations`, in numpy, no loop over cells). A relation's score is the smallest
``sigmoid(2 * logit)`` of its four cells.

Long texts go through overlapping windows; a triple is reported by the window that contains its extent (from the
first to the last token of its two mentions) whole and most centrally (:func:`zhie.core.text.reporting_window`).
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from zhie.core import decoding
from zhie.core.metrics import label_errors, prf_table, span_prf
from zhie.core.options import check_options, option
from zhie.core.spans import Span
from zhie.core.text import windows
from zhie.data import detect_format, label_studio
from zhie.data.doccano import read_doccano_relations
from zhie.data.spo import SpoExample, Triple, read_schema, read_spo
from zhie.tasks import register
from zhie.tasks.base import WindowedTask
from zhie.tasks.batching import sparse_cells
from zhie.tasks.cli_flags import check_max_length, only_auto_format
from zhie.tasks.modeldir import rename_weights

if TYPE_CHECKING:
    from torch import Tensor, nn

    from zhie.heads import RelationLogits

HEADS = ("gp", "egp")


@dataclass
class RelationConfig:
    predicates: list[str]
    head: str = option("egp", "GlobalPointer (gp) or Efficient GlobalPointer (egp) modules", choices=HEADS,
                       flags=("--head", "--variant"))
    mode: str = "char"
    max_length: int = option(256, "tokens per window, [CLS] and [SEP] included")
    overlap: int = 64
    head_size: int = 64
    # Decoding caps per window: an untrained or diverging model scores about half of all L² cells above 0, and
    # every subject x object x predicate combination of those would be a triple. Real data stays far below
    # (CMeIE train: at most 29 subjects, 29 objects and 29 triples in a text); above a cap the highest
    # scores are kept.
    max_spans: int = 128     # subjects, and objects, per window
    max_triples: int = 512   # triples per window

    def __post_init__(self):
        if self.head not in HEADS:
            raise ValueError(f"unknown GPLinker head {self.head!r}; use gp or egp")
        if not self.predicates:
            raise ValueError("no predicates: the training data has no triples")


@dataclass(frozen=True)
class TokenTriple:
    """A decoded triple: subject and object as content tokens ``(start, end)`` of its window (end exclusive)."""

    subject: tuple[int, int]
    predicate: int
    object: tuple[int, int]
    score: float

    @property
    def extent(self) -> tuple[int, int]:
        return min(self.subject[0], self.object[0]), max(self.subject[1], self.object[1])


@dataclass
class RelationWindow:
    """One training window: its content token ids and the cells of its triples."""

    ids: list[int]
    entity: list[tuple[int, int, int]] = field(default_factory=list)     # (role, start, end) content positions
    head_head: list[tuple[int, int, int]] = field(default_factory=list)  # (predicate, subject start, object start)
    tail_tail: list[tuple[int, int, int]] = field(default_factory=list)  # (predicate, subject end, object end)


@register
class RelationTask(WindowedTask):
    """Triples of a text: ``predict`` returns, per text, a list of :class:`zhie.data.spo.Triple` (subject and
    object as :class:`zhie.core.spans.Span` with exact offsets, predicate, score)."""

    item_types = (RelationWindow,)  # its training items (stored teacher outputs load with them allowed)
    name = "re"
    help = "relation extraction with GPLinker (triples)"
    config_class = RelationConfig
    output_key = "relations"

    def __init__(self, config: RelationConfig, tokenizer):
        super().__init__(config, tokenizer)
        self.predicate_index = {p: i for i, p in enumerate(config.predicates)}
        self.stats = {"triples": 0, "triples_dropped": 0, "not_in_text": 0, "unknown_predicate": 0, "windows": 0}

    @classmethod
    def add_arguments(cls, parser) -> None:
        # no config field: the predicates are read from it (else from the data)
        parser.add_argument("--schema", default=None,
                            help="schema.json (JSON lines with 'predicate'); default: from data")
        super().add_arguments(parser)  # RelationConfig's options

    @classmethod
    def read(cls, path: str | os.PathLike, format: str = "auto") -> list[SpoExample]:
        """CMeIE/DuIE JSON lines, doccano's relation export (``--format doccano``) or a Label Studio export
        (``--format label-studio``), the last two also detected."""
        detected = detect_format(path) if format == "auto" else format
        if detected == "doccano":
            return read_doccano_relations(path)
        if detected == "label-studio":
            return label_studio.read_triples(path)
        only_auto_format(format, "triples (CMeIE/DuIE JSON lines, doccano's relation export: --format doccano, or a "
                                 "Label Studio export: --format label-studio)")
        return read_spo(path)

    @classmethod
    def configure(cls, examples: list[SpoExample], *, encoder: str, schema=None, **options) -> RelationConfig:
        """The config of the predicates of ``schema`` (else of ``examples``) and ``options``, :class:`RelationConfig`'s
        option fields (the flags of ``zhie train re``)."""
        predicates = read_schema(schema) if schema else \
            list(dict.fromkeys(t.predicate for ex in examples for t in ex.triples))
        if not predicates:
            raise ValueError(f"no predicates: none of the {len(examples)} training examples has a triple and no "
                             "--schema names any; check --train and --schema")
        config = RelationConfig(predicates, **check_options(RelationConfig, options))
        check_max_length(config.max_length)
        return config

    def build_heads(self, hidden_size: int) -> dict[str, nn.Module]:
        from zhie.heads import GPLinkerHead

        c = self.config
        return {self.head_name: GPLinkerHead(hidden_size, len(c.predicates), c.head_size, efficient=c.head == "egp")}

    # --------------------------------------------------------------------------------------- encoding
    def encode(self, examples: list[SpoExample]) -> list[RelationWindow]:
        size, overlap = self.window
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
            cuts = windows(len(enc), size, overlap) if len(enc) else []
            self.stats["triples_dropped"] += sum(not any(a <= min(sh, oh) and max(st, ot) < b for a, b in cuts)
                                                 for sh, st, _, oh, ot in located)
            for a, b in cuts:
                item = RelationWindow(enc.ids[a:b])
                for sh, st, p, oh, ot in located:
                    if a <= min(sh, oh) and max(st, ot) < b:
                        item.entity += [(0, sh - a, st - a), (1, oh - a, ot - a)]
                        item.head_head.append((p, sh - a, oh - a))
                        item.tail_tail.append((p, st - a, ot - a))
                items.append(item)
        self.stats["windows"] += len(items)
        return items

    def collate(self, items: list[RelationWindow]) -> dict[str, Tensor]:
        batch = self.collate_inputs(items)
        n, r = batch["input_ids"].shape[1], len(self.config.predicates)
        batch["entity_labels"] = sparse_cells([it.entity for it in items], 2, n)
        batch["head_head_labels"] = sparse_cells([it.head_head for it in items], r, n)
        batch["tail_tail_labels"] = sparse_cells([it.tail_tail for it in items], r, n)
        return batch

    def head_loss(self, head: nn.Module, logits: RelationLogits, batch: dict[str, Tensor]) -> Tensor:
        from zhie.losses import global_pointer_loss

        return sum(global_pointer_loss(getattr(logits, name), batch[f"{name}_labels"], mask_zero=True,
                                       reduction="sum_heads_mean_batch")
                   for name in ("entity", "head_head", "tail_tail"))

    MATRICES = ("entity", "head_head", "tail_tail")

    def pseudo_example(self, text: str, prediction: list[Triple]) -> SpoExample:
        return SpoExample(text, list(prediction))

    def soft_targets(self, logits: RelationLogits, batch: dict[str, Tensor], temperature: float) -> list:
        """Per window, the stored soft cells of each of the three matrices (:func:`zhie.losses.distill.soft_cells`)."""
        from zhie.losses.distill import soft_cells

        return list(zip(*(soft_cells(getattr(logits, name), temperature) for name in self.MATRICES)))

    def soft_batch(self, batch: dict[str, Tensor], targets: list) -> dict[str, Tensor]:
        from zhie.losses.distill import stack_cells

        for k, name in enumerate(self.MATRICES):
            batch[f"{name}_soft_cells"], batch[f"{name}_soft_probs"] = stack_cells([t[k] for t in targets])
        return batch

    def soft_loss(self, logits: RelationLogits, batch: dict[str, Tensor], temperature: float) -> Tensor:
        """Summed over the matrices and their heads, averaged over the batch (as ``head_loss``)."""
        from zhie.losses.distill import dense_targets, span_soft_loss

        total = 0
        for name in self.MATRICES:
            out = getattr(logits, name)
            target = dense_targets(batch[f"{name}_soft_cells"], batch[f"{name}_soft_probs"], out)
            total = total + span_soft_loss(out, target, temperature).sum(1).mean()
        return total

    def prior_loss(self, items: list[RelationWindow], batch_size: int) -> float:
        """The sum of the three modules' priors (one logit per head): ``entity`` has n(n+1)/2 valid cells in a window
        of n tokens, ``head_head`` and ``tail_tail`` n² (no triangle mask)."""
        from zhie.multitask.priors import multilabel_prior

        total = 0.0
        for name, heads, triangle in (("entity", 2, True), ("head_head", len(self.config.predicates), False),
                                      ("tail_tail", len(self.config.predicates), False)):
            instances = []
            for it in items:
                n, positives = len(it.ids), Counter(k for k, _, _ in set(getattr(it, name)))
                cells = n * (n + 1) // 2 if triangle else n * n
                instances.append([(cells - positives[a], positives[a]) for a in range(heads)])
            total += multilabel_prior(instances, reduction="sum_heads_mean_batch")[0]
        return total

    # --------------------------------------------------------------------------------------- decoding
    def decode(self, model, outputs: dict, attention_mask: np.ndarray) -> list[list[TokenTriple]]:
        """Head output (numpy: ``{entity, head_head, tail_tail}``) -> per row the triples over the window's content
        token positions (:func:`zhie.core.decoding.link_relations`, with the caps of the config)."""
        logits, c = outputs[self.head_name], self.config
        return [[TokenTriple((sh - 1, st), pp, (oh - 1, ot), sc) for sh, st, pp, oh, ot, sc in zip(
                    subjects[si, 0].tolist(), subjects[si, 1].tolist(), p.tolist(), objects[oi, 0].tolist(),
                    objects[oi, 1].tolist(), score.tolist())]
                for subjects, p, si, oi, objects, score in decoding.link_relations(
                    logits["entity"], logits["head_head"], logits["tail_tail"], c.max_spans, c.max_triples)]

    def surprise(self, model, outputs: dict, attention_mask: np.ndarray) -> np.ndarray:
        """``-log P`` of each row's decoded cells of the three modules, in nats: every cell of ``entity``,
        ``head_head`` and ``tail_tail`` an independent Bernoulli of ``sigmoid(2 * logit)``, as the triples' scores
        read them (:func:`zhie.core.decoding.cell_surprise`)."""
        logits = outputs[self.head_name]
        return sum(decoding.cell_surprise(logits[name]) for name in ("entity", "head_head", "tail_tail"))

    def from_hits(self, texts: list[str], hits) -> list[list[Triple]]:
        """Triples of each text, in input order (long texts through overlapping windows)."""
        found: list[dict] = [{} for _ in texts]
        for i, enc, a, hit in hits:
            (s0, s1), (o0, o1) = hit.subject, hit.object
            key = (*enc.token_span_to_chars(a + s0, a + s1), hit.predicate, *enc.token_span_to_chars(a + o0, a + o1))
            found[i][key] = max(hit.score, found[i].get(key, 0.0))
        return [[Triple(Span(s0, s1, "", text[s0:s1]), self.config.predicates[p], Span(o0, o1, "", text[o0:o1]),
                        score) for (s0, s1, p, o0, o1), score in sorted(spans.items())]
                for text, spans in zip(texts, found)]

    def score(self, examples: list[SpoExample], predictions: list[list[Triple]]) -> dict:
        return relation_metrics(examples, predictions)

    def report(self, metrics: dict) -> str:
        table = prf_table({**metrics, "micro": {k: metrics[k] for k in ("precision", "recall", "f1")}}, "predicate")
        return f"{table}\nentity f1 {metrics['entity_f1']:.4f}"

    def unknown_labels(self, examples: list[SpoExample]) -> Counter:
        return Counter(t.predicate for ex in examples for t in ex.triples if t.predicate not in self.predicate_index)

    def errors(self, example: SpoExample, prediction: list[Triple]) -> list[dict]:
        """Each predicted triple that is not gold (``false_positive``), gold one not predicted (``false_negative``) and
        subject-object pair predicted with another predicate than its gold one (``wrong_type``), triples compared as
        the metric compares them (subject text, predicate, object text); the offsets are the predicted mentions'
        (the gold ones' for a false negative), ``start``/``end`` from the first mention to the end of the last."""
        gold = {(t.subject.text, t.object.text, t.predicate): t for t in example.triples}
        said = {(t.subject.text, t.object.text, t.predicate): t for t in prediction}
        kinds = {(True, False): "false_positive", (False, True): "false_negative", (False, False): "wrong_type"}
        out = []
        for (s, o), g, p in label_errors([((s, o), pr) for s, o, pr in gold], [((s, o), pr) for s, o, pr in said]):
            t = said[s, o, p] if p is not None else gold[s, o, g]
            mentions = [m for m in (t.subject, t.object) if m.start >= 0]
            start, end = (min(m.start for m in mentions), max(m.end for m in mentions)) if mentions else (-1, -1)
            out.append({"kind": kinds[g is None, p is None], "start": start, "end": end,
                        **{role: {"start": m.start, "end": m.end, "text": m.text}
                           for role, m in (("subject", t.subject), ("object", t.object))},
                        "gold": g, "predicted": p})
        return out

    def describe(self) -> dict:
        about = super().describe()
        return {**about, "summary": f"relation extraction (subject, predicate, object triples) with GPLinker on "
                                    f"{self.config.head} modules", "metrics": ["precision", "recall", "f1"],
                "labels": {"title": "Predicates", "values": self.config.predicates}}

    @classmethod
    def data_files(cls, train_path, dev_path, **options) -> dict[str, str]:
        schema = options.get("schema")
        return {**super().data_files(train_path, dev_path), **({"schema": str(schema)} if schema else {})}

    @classmethod
    def upgrade(cls, meta: dict, weights: dict[str, Tensor]) -> tuple[dict, dict[str, Tensor]]:
        """Format 1 kept the three modules at the top (``entity.*``, …) and named the head ``variant``."""
        meta = {**meta, "head": meta.get("variant", "egp"), "overlap": meta.get("stride", 64)}
        return meta, rename_weights(weights, {m: f"heads.{cls.name}.{m}" for m in ("entity.", "head_head.",
                                                                                     "tail_tail.")})


def relation_metrics(gold: list[SpoExample], pred: list[list[Triple]]) -> dict:
    """Triple P/R/F1 on (subject text, predicate, object text) sets per text, overall and per predicate
    (``per_type``, as :func:`zhie.core.metrics.span_prf` gives it), plus entity F1 on located (start, end, role)
    spans."""

    def keyed(triples):
        return [(s, o, p) for s, p, o in (t.key() for t in triples)]

    def entities(triples):
        return [(t.subject.start, t.subject.end, "subject") for t in triples if t.subject.start >= 0] + \
               [(t.object.start, t.object.end, "object") for t in triples if t.object.start >= 0]

    if len(gold) != len(pred):
        raise ValueError(f"gold has {len(gold)} examples but pred has {len(pred)}")
    triples = span_prf([keyed(ex.triples) for ex in gold], [keyed(t) for t in pred])
    ent = span_prf([entities(ex.triples) for ex in gold], [entities(t) for t in pred])
    return {**triples["micro"], "per_type": triples["per_type"], "entity_f1": ent["micro"]["f1"],
            "n_gold": triples["n_gold"], "n_pred": triples["n_pred"]}
