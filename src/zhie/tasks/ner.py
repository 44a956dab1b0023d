"""Named-entity recognition, the ``ner`` task (:class:`NerTask`): reading, configuring, training windows, entities
from the windows' hits, metric, error report.

Beside it: the heads that ``--head`` names and the config that names one (:mod:`zhie.tasks.ner_heads`; a plug-in adds
a head with :func:`register_head`, also importable from here), and, per family of heads, how its labels are encoded,
its loss taken and its output decoded (:mod:`zhie.tasks.ner_labels`); the heads themselves, the decoders and the
losses live in ``zhie.heads``, ``zhie.core.decoding`` and ``zhie.losses``.

Token positions: model inputs are ``[CLS] content [SEP]``; content token ``t`` sits at position ``t + 1``.
Texts longer than ``max_length`` are cut into windows overlapping by ``overlap`` tokens (training: every window is
an example, for the taggers cut between entities; prediction: each entity is reported by the window that contains
it whole and most centrally, :func:`zhie.core.text.reporting_window`, which says what happens to longer entities).
"""

from __future__ import annotations

import os
from collections import Counter
from typing import TYPE_CHECKING

import numpy as np

from zhie.core.metrics import label_errors, prf_table, span_prf
from zhie.core.options import check_options
from zhie.core.spans import Span
from zhie.core.words import word_heads, word_ranges, word_spans, word_tags
from zhie.data import NerExample, read_ner
from zhie.tasks import register
from zhie.tasks.base import WindowedTask
from zhie.tasks.cli_flags import check_max_length
from zhie.tasks.modeldir import rename_weights
from zhie.tasks.ner_heads import NerConfig, ner_head, register_head
from zhie.tasks.ner_labels import NerWindow, SpanLabels, TagLabels, TokenSpan, WordLabels

if TYPE_CHECKING:
    from torch import Tensor, nn

# NerConfig, TagLabels and register_head live beside it; callers (README, benchmarks) import them from here too
__all__ = ["NerConfig", "NerTask", "TagLabels", "flatten_outermost", "is_nested", "overlap", "overlapping",
           "register_head"]


def flatten_outermost(spans: list[Span]) -> list[Span]:
    """Keep the outermost of nested or overlapping spans (longest first among those starting together)."""
    kept: list[Span] = []
    for span in sorted(spans, key=lambda s: (s.start, -s.end)):
        if not kept or span.start >= kept[-1].end:
            kept.append(span)
    return kept


def overlapping(spans: list[Span]) -> tuple[Span, Span] | None:
    """Two spans of ``spans`` that nest or overlap (the first such pair in start order), or None for flat spans."""
    ordered = sorted(spans, key=lambda s: (s.start, s.end))
    return next(((a, b) for a, b in zip(ordered, ordered[1:]) if b.start < a.end), None)


def is_nested(spans: list[Span]) -> bool:
    return overlapping(spans) is not None


def overlap(spans: list[Span]) -> str:
    """What :func:`overlapping` finds, in words: ``'青山市大学' [0, 5) ORG and '青山市' [0, 3) LOC overlap``."""
    pair = overlapping(spans)
    return "" if pair is None else " and ".join(f"{s.text!r} [{s.start}, {s.end}) {s.label}" for s in pair) + " overlap"


@register
class NerTask(WindowedTask):
    """Entities of a text: ``predict`` returns, per text, a sorted list of :class:`zhie.core.spans.Span` with
    ``label`` and ``score`` (nested spans for GP/EGP models trained on nested data)."""

    item_types = (NerWindow,)  # its training items (stored teacher outputs load with them allowed)
    name = "ner"
    help = "named-entity recognition (softmax, crf, gp, egp heads)"
    config_class = NerConfig
    output_key = "entities"

    def __init__(self, config: NerConfig, tokenizer):
        super().__init__(config, tokenizer)
        self.head_spec = ner_head(config.head)  # what builds the head and how its output is read
        labeling = WordLabels if config.words else SpanLabels if self.head_spec.output == "span" else TagLabels
        self.labeling = labeling(config)
        self.cut_at_right_edge = self.labeling.cut_at_right_edge
        self.label_index = {label: i for i, label in enumerate(config.labels)}
        self.stats = {"spans_dropped": 0, "windows": 0}

    # --------------------------------------------------------------------------------------- data and config
    @classmethod
    def read(cls, path: str | os.PathLike, format: str = "auto") -> list[NerExample]:
        return read_ner(path, format)

    @classmethod
    def configure(cls, examples: list[NerExample], *, encoder: str, **options) -> NerConfig:
        """The config of the entity types of ``examples`` and ``options``, :class:`NerConfig`'s option fields (the
        flags of ``zhie train ner``)."""
        labels = sorted({s.label for ex in examples for s in ex.spans})
        if not labels:
            raise ValueError(f"no entity types: none of the {len(examples)} training examples has an entity; "
                             "check --train (a test split has no labels) and --format")
        options = check_options(NerConfig, options)
        if options.get("mode") == "word":  # the flag's name for word-level tagging, which reads sub-word tokens
            options = {**options, "mode": "subword", "words": True}
        config = NerConfig(labels, **options)
        check_max_length(config.max_length)
        return config

    # --------------------------------------------------------------------------------------- encoding
    def check_flat(self, examples: list[NerExample]) -> list[NerExample]:
        """Taggers need flat spans: refuse nested data (or keep the outermost spans with ``flatten``)."""
        if self.head_spec.output == "span":
            return examples
        nested = {i for i, ex in enumerate(examples) if is_nested(ex.spans)}
        if not nested:
            return examples
        if not self.config.flatten:
            first = examples[min(nested)]
            where = f"#{min(nested) + 1}, {first.text[:40]!r}" if first.source is None else first.source
            raise ValueError(
                f"the training data has nested or overlapping entities in {len(nested)} example(s) (first: "
                f"{where}: {overlap(first.spans)}); the {self.config.head} head tags each character once and cannot "
                "represent them. Use --head gp or --head egp, or --flatten to keep the outermost spans.")
        self.stats["flattened_examples"] = len(nested)
        return [NerExample(ex.text, flatten_outermost(ex.spans)) if i in nested else ex
                for i, ex in enumerate(examples)]

    def encode(self, examples: list[NerExample]) -> list[NerWindow]:
        """Training windows of at most ``max_length - 2`` content tokens."""
        size, overlap = self.window
        items = []
        for ex in self.check_flat(examples):
            enc = self.text_tokenizer(ex.text)
            token_spans = []
            for span in ex.spans:
                tokens = enc.char_span_to_tokens(span.start, span.end)
                if tokens is None or span.label not in self.label_index:
                    self.stats["spans_dropped"] += 1
                    continue
                token_spans.append((tokens[0], tokens[1] - 1, self.label_index[span.label]))
            cuts = self.labeling.cuts(len(enc), token_spans, size, overlap) if len(enc) else []
            self.stats["spans_dropped"] += sum(not any(a <= s and e < b for a, b in cuts) for s, e, _ in token_spans)
            head_tags = self.head_tags(ex, enc) if self.config.words else None
            for a, b in cuts:
                inside = [(s - a, e - a, k) for s, e, k in token_spans if a <= s and e < b]
                tags = head_tags[a:b] if head_tags is not None else self.labeling.tags(inside, b - a)
                items.append(NerWindow(enc.ids[a:b], inside, tags))
        self.stats["windows"] += len(items)
        self.labeling.observe(items)
        return items

    def head_tags(self, example: NerExample, encoding) -> list[int]:
        """Word-level tagging: each word's tag id on its first sub-word, ``IGNORE`` on every other token."""
        from zhie.heads.tagger import IGNORE

        ranges = word_ranges(example.text)
        tags = [IGNORE] * len(encoding)
        for head, tag in zip(word_heads(encoding, ranges), word_tags(ranges, example.spans)):
            if head >= 0:
                tags[head] = self.labeling.tag_index[tag]
        return tags

    def collate(self, items: list[NerWindow]) -> dict[str, Tensor]:
        batch = self.collate_inputs(items)
        batch["labels"] = self.labeling.labels(items, batch["input_ids"].shape[1])
        return batch

    # --------------------------------------------------------------------------------------- model
    def build_heads(self, hidden_size: int) -> dict[str, nn.Module]:
        return {self.head_name: self.labeling.build_head(hidden_size)}

    def head_loss(self, head: nn.Module, output: Tensor, batch: dict[str, Tensor]) -> Tensor:
        return self.labeling.loss(head, output, batch["labels"])

    def prior_loss(self, items: list[NerWindow], batch_size: int) -> float:
        return self.labeling.prior(items)

    def pseudo_example(self, text: str, prediction: list[Span]) -> NerExample:
        return NerExample(text, list(prediction))

    def soft_targets(self, output: Tensor, batch: dict[str, Tensor], temperature: float) -> list:
        return self.labeling.soft_targets(output, batch, temperature)

    def soft_batch(self, batch: dict[str, Tensor], targets: list) -> dict[str, Tensor]:
        return self.labeling.soft_batch(batch, targets)

    def soft_loss(self, output: Tensor, batch: dict[str, Tensor], temperature: float) -> Tensor:
        return self.labeling.soft_loss(output, batch, temperature)

    def decode(self, model, outputs: dict, attention_mask: np.ndarray) -> list[list[TokenSpan]]:
        """Head output (numpy) -> per row the entities over the window's content token positions."""
        weights = model.head_weights(self.head_name) if self.head_spec.crf else None
        return self.labeling.decode(outputs[self.head_name], attention_mask, weights)

    def surprise(self, model, outputs: dict, attention_mask: np.ndarray) -> np.ndarray:
        """``-log P`` of each row's decoded entities (tags), in nats (:mod:`zhie.tasks.ner_labels`, ``surprise``)."""
        weights = model.head_weights(self.head_name) if self.head_spec.crf else None
        return self.labeling.surprise(outputs[self.head_name], attention_mask, weights)

    def from_hits(self, texts: list[str], hits) -> list[list[Span]]:
        """Entities of each text, in input order (long texts through overlapping windows)."""
        if self.config.words:
            return self.word_entities(texts, hits)
        found: list[dict[tuple[int, int, str], float]] = [{} for _ in texts]
        for i, enc, a, hit in hits:
            start, end = enc.token_span_to_chars(a + hit.start, a + hit.end)
            key = (start, end, self.config.labels[hit.label])
            found[i][key] = max(hit.score, found[i].get(key, 0.0))
        # sorted by (start, end, label), each key once: the order of the spans, without comparing Span objects
        return [[Span(s, e, label, text[s:e], score) for (s, e, label), score in sorted(spans.items())]
                for text, spans in zip(texts, found)]

    def word_entities(self, texts: list[str], hits) -> list[list[Span]]:
        """Word-level tagging: each word takes the tag its first sub-word's hit carries (``O`` for a word without
        one), and the words' BIO tags become character spans (:func:`zhie.core.words.word_spans`)."""
        token_tags: list[dict[int, tuple[int, float]]] = [{} for _ in texts]
        encodings = {}
        for i, enc, a, hit in hits:
            token_tags[i][a + hit.start] = (hit.label, hit.score)
            encodings[i] = enc
        out = []
        for i, text in enumerate(texts):
            ranges = word_ranges(text)
            heads = word_heads(encodings[i], ranges) if i in encodings else [-1] * len(ranges)
            tag_scores = [token_tags[i].get(h, (0, 1.0)) for h in heads]
            tags = [self.config.tags[t] for t, _ in tag_scores]
            out.append(word_spans(text, ranges, tags, [p for _, p in tag_scores]))
        return out

    # --------------------------------------------------------------------------------------- metrics
    def score(self, examples: list[NerExample], predictions: list[list[Span]]) -> dict:
        return span_prf([ex.spans for ex in examples], predictions)

    def summary(self, metrics: dict) -> dict[str, float]:
        return {**metrics["micro"], "n_pred": metrics["n_pred"]}

    def report(self, metrics: dict) -> str:
        return prf_table(metrics)

    def unknown_labels(self, examples: list[NerExample]) -> Counter:
        return Counter(s.label for ex in examples for s in ex.spans if s.label not in self.label_index)

    def errors(self, example: NerExample, prediction: list[Span]) -> list[dict]:
        """Each predicted entity that is not gold (``false_positive``), gold one not predicted (``false_negative``) and
        entity predicted with another type than its gold one at the same offsets (``wrong_type``)."""
        kinds = {(True, False): "false_positive", (False, True): "false_negative", (False, False): "wrong_type"}
        found = label_errors([((s.start, s.end), s.label) for s in example.spans],
                             [((s.start, s.end), s.label) for s in prediction])
        return [{"kind": kinds[gold is None, predicted is None], "start": start, "end": end,
                 "span": example.text[start:end], "gold": gold, "predicted": predicted}
                for (start, end), gold, predicted in found]

    def describe(self) -> dict:
        c, about = self.config, super().describe()
        nested = ("nested entities: found (a span head scores every span)" if self.head_spec.output == "span" else
                  "flat entities only: the tagger gives each token one tag" +
                  (" (trained on the outermost of nested ones)" if c.flatten else ""))
        words = ["word-level tagging: one tag per whitespace-separated word, on its first sub-word"] if c.words else []
        return {**about, "summary": f"named-entity recognition with the {c.head} head",
                "metrics": ["precision", "recall", "f1"], "labels": {"title": "Entity types", "values": c.labels},
                "limits": [*about["limits"], nested, *words], **({"language": None} if c.words else {})}

    # --------------------------------------------------------------------------------------- old directories
    @classmethod
    def upgrade(cls, meta: dict, weights: dict[str, Tensor]) -> tuple[dict, dict[str, Tensor]]:
        """Format 1 kept the head as ``head.*`` and the CRF as ``crf.*``, and the window overlap as ``stride``."""
        meta = {**meta, "overlap": meta.get("stride", 32)}
        return meta, rename_weights(weights, {"head.": f"heads.{cls.name}.", "crf.": f"heads.{cls.name}.crf."})
