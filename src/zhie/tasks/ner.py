"""Named-entity recognition: label encoding, heads, loss, vectorised decoding, metric.

Over 400 lines: one task whose parts all turn on :class:`NerConfig`'s head: the head registry, the span and tag label
encodings (each the inverse of its decoder) and the task's protocol methods read best side by side; the heads
themselves, the decoders and the losses live in ``zhie.heads``, ``zhie.core.decoding`` and ``zhie.losses``.

Heads (spec §1, §2, §8), in two families with one output type each:

* span heads ``gp`` / ``egp`` — (Efficient) GlobalPointer: span logits ``[b, types, n, n]``, trained with the
  sparse multilabel categorical cross-entropy on index labels; a span is predicted where its masked logit is > 0
  (:func:`zhie.core.decoding.span_cells`, at most ``max_spans`` per window). Flat and nested data (:class:`SpanLabels`).
* taggers ``crf`` / ``softmax`` — emissions ``[b, n, tags]`` over BIO tags (O = 0, B-c = 2c+1, I-c = 2c+2); the
  CRF decodes with Viterbi restricted to valid BIO paths (:mod:`zhie.core.decoding`). Flat data only: nested spans are
  refused, unless ``flatten`` keeps the outermost ones (:class:`TagLabels`).
* word-level tagging (``--mode word``: ``words=True`` on sub-word tokens, softmax head; :class:`WordLabels`,
  :mod:`zhie.core.words`) — one BIO tag per whitespace-separated word, on its first sub-word; the other sub-words and
  the special tokens carry no loss and no prediction (spec §10.2, the MTMT recogniser and student).

Heads are found by name in a registry (:func:`register_head`, :data:`NER_HEADS`), so that a plug-in adds one, of
either output type, without editing the task; ``HEADS``, ``SPAN_HEADS`` and ``TAGGER_HEADS`` name the registered ones.

Token positions: model inputs are ``[CLS] content [SEP]``; content token ``t`` sits at position ``t + 1``.
Texts longer than ``max_length`` are cut into windows overlapping by ``overlap`` tokens (training: every window is
an example, for the taggers cut between entities; prediction: each entity is reported by the window that contains
it whole and most centrally, :func:`zhie.core.text.reporting_window`, which says what happens to longer entities).

Entity scores: GP/EGP ``sigmoid(2 * logit)`` (the calibrated probability of the MCE loss, spec §0.2);
taggers: the mean over the entity's tokens of the softmax probability of their tags (for the CRF, of the
emission scores).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from zhie.core import decoding
from zhie.core.metrics import label_errors, prf_table, span_prf
from zhie.core.options import check_options, option
from zhie.core.spans import BatchTagDecoder, Span, spans_to_tags
from zhie.core.text import windows
from zhie.core.words import word_heads, word_ranges, word_spans, word_tags
from zhie.data import NerExample, read_ner
from zhie.tasks import register
from zhie.tasks.base import WindowedTask
from zhie.tasks.batching import pad, sparse_cells
from zhie.tasks.cli_flags import check_max_length
from zhie.tasks.modeldir import rename_weights

if TYPE_CHECKING:
    from torch import Tensor, nn

# ------------------------------------------------------------------------------------------------- the head registry
HEAD_OUTPUTS = ("span", "tag")
HEAD_GROUP = "zhie.ner_heads"  # the entry-point group of a package's heads (a module that calls register_head)


@dataclass(frozen=True)
class NerHead:
    """A head of the ner task (and of cws's taggers), named by ``--head NAME``: what builds it and how its output is
    read. ``output``: ``"span"``, span logits ``[b, types, n, n]`` (:class:`SpanLabels`), or ``"tag"``, emissions
    ``[b, n, tags]`` over ``config.tags`` (:class:`TagLabels`)."""

    output: str
    build: Callable[[NerConfig, int], nn.Module]  # (config, the encoder's width) -> the module; imports torch inside
    crf: bool = False  # a tag head decoded by Viterbi over its CRF's transitions (its weights "crf.*"), not by argmax


NER_HEADS: dict[str, NerHead] = {}
_heads_discovered = False


def register_head(name: str, output: str, build: Callable[[NerConfig, int], nn.Module], crf: bool = False) -> NerHead:
    """Make ``--head name`` (``NerConfig.head``) build its module with ``build(config, hidden_size)``; ``output`` and
    ``crf`` as in :class:`NerHead`. A package's heads are found through the ``zhie.ner_heads`` entry points, modules
    that call this."""
    if output not in HEAD_OUTPUTS:
        raise ValueError(f"head {name!r}: output {output!r} is not one of {', '.join(HEAD_OUTPUTS)}")
    head = NerHead(output, build, crf)
    if NER_HEADS.get(name, head) != head:
        raise ValueError(f"NER head name {name!r} is taken")
    NER_HEADS[name] = head
    return head


def ner_head(name: str) -> NerHead:
    """The head registered as ``name`` (looking through the ``zhie.ner_heads`` entry points for one not yet known)."""
    if name not in NER_HEADS:
        _discover_heads()
    if name not in NER_HEADS:
        raise ValueError(f"unknown head {name!r}; choose one of {', '.join(NER_HEADS)}")
    return NER_HEADS[name]


def _discover_heads() -> None:
    global _heads_discovered
    if not _heads_discovered:
        _heads_discovered = True
        from importlib.metadata import entry_points  # ~16 ms to import: only where a plugin is looked for

        for entry in entry_points(group=HEAD_GROUP):
            entry.load()


class HeadNames:
    """The names of the registered heads (of one ``output``; None: all), in the order they were registered: a live
    view, so that a head registered later is a choice of ``--head`` and ``in`` it."""

    def __init__(self, output: str | None = None) -> None:
        self.output = output

    def __iter__(self) -> Iterator[str]:
        _discover_heads()
        return iter([name for name, head in NER_HEADS.items() if self.output in (None, head.output)])

    def __contains__(self, name: object) -> bool:
        return name in list(self)

    def __repr__(self) -> str:
        return repr(tuple(self))


def _softmax(config: NerConfig, hidden_size: int) -> nn.Module:
    from zhie.heads import SoftmaxTagger

    return SoftmaxTagger(hidden_size, len(config.tags), dropout=config.dropout)


def _crf(config: NerConfig, hidden_size: int) -> nn.Module:
    from zhie.heads import CrfTagger

    return CrfTagger(hidden_size, config.tags, config.scheme, dropout=config.dropout,
                     lr_multiplier=config.crf_lr_multiplier)


def _global_pointer(config: NerConfig, hidden_size: int) -> nn.Module:
    from zhie.heads import GlobalPointer

    return GlobalPointer(hidden_size, len(config.labels), head_size=config.head_size, mask_special=True)


def _efficient_global_pointer(config: NerConfig, hidden_size: int) -> nn.Module:
    from zhie.heads import EfficientGlobalPointer

    return EfficientGlobalPointer(hidden_size, len(config.labels), head_size=config.head_size, mask_special=True)


register_head("softmax", "tag", _softmax)
register_head("crf", "tag", _crf, crf=True)
register_head("gp", "span", _global_pointer)
register_head("egp", "span", _efficient_global_pointer)
HEADS, SPAN_HEADS, TAGGER_HEADS = HeadNames(), HeadNames("span"), HeadNames("tag")


# ------------------------------------------------------------------------------------------------- the config
@dataclass
class NerConfig:
    labels: list[str]
    head: str = option("gp", "span heads gp and egp (nested entities), taggers crf and softmax; a plug-in adds its own "
                             "(zhie.tasks.ner.register_head)", choices=HEADS)
    # --mode word is no config mode: it stands for sub-word tokens with words=True (NerTask.configure maps it)
    mode: str = option("char", "char: one token per character (Chinese); subword: the tokenizer's own tokens; word: "
                               "one tag per space-separated word, on its first sub-word (--head softmax)",
                       choices=("char", "subword", "word"))
    max_length: int = option(256, "tokens per window, [CLS] and [SEP] included")
    overlap: int = 32
    head_size: int = 64
    dropout: float = 0.1
    scheme: str = "BIO"  # tagger heads: BIO for entities, BMES for word segmentation
    flatten: bool = option(False, "crf/softmax heads: keep the outermost of nested entities instead of refusing")
    crf_lr_multiplier: float = option(100.0, "the CRF transitions learn at --lr times this (spec: >= 100x the "
                                             "encoder's rate)")
    gp_prior_init: bool = option(True, "gp: start the span logits at 0 as bert4keras does (how the GP rows of "
                                       "RESULTS.md before 2026-11-23 were trained) instead of at each type's prior "
                                       "logit (issue 17)")
    words: bool = False  # one tag per word on its first sub-word (--mode word: subword tokens, softmax head)
    # gp/egp decoding: at most this many spans per window (the highest scores). An early or diverged model scores most
    # of the n² cells above 0, and each would become a span; real data stays far below.
    max_spans: int = 1024

    def __post_init__(self):
        head = ner_head(self.head)  # an unknown head: the error names the registered ones
        if self.words and (self.head != "softmax" or self.mode != "subword"):
            raise ValueError(f"word-level tagging (--mode word) needs the softmax head, got --head {self.head}")
        if not self.labels:
            raise ValueError("no entity types: the training data has no entities")
        if self.scheme not in ("BIO", "BMES") or (self.scheme == "BMES" and head.output == "span"):
            raise ValueError(f"scheme {self.scheme!r} with head {self.head!r}: use BIO, or BMES with a tagger "
                             f"({', '.join(TAGGER_HEADS)})")

    @property
    def tags(self) -> list[str]:
        """Tags of the tagger heads: BIO O = 0, B-c = 2c+1, I-c = 2c+2; BMES S = 0, B = 1, M = 2, E = 3."""
        if self.scheme == "BMES":
            return ["S", "B", "M", "E"]
        return ["O"] + [f"{p}-{label}" for label in self.labels for p in "BI"]


@dataclass(frozen=True)
class TokenSpan:
    """A decoded entity: content tokens ``[start, end)`` of its window, label index, score."""

    start: int
    end: int
    label: int
    score: float

    @property
    def extent(self) -> tuple[int, int]:
        return self.start, self.end


@dataclass
class NerWindow:
    """One training window: its content token ids and gold spans as content-token ranges."""

    ids: list[int]
    spans: list[tuple[int, int, int]]  # (first token, last token inclusive, label index), content positions
    tags: list[int] = field(default_factory=list)


class SpanLabels:
    """GP/EGP: sparse span-cell labels, the multilabel categorical cross-entropy, ``nonzero`` decoding."""

    cut_at_right_edge = False

    def __init__(self, config: NerConfig) -> None:
        self.config = config
        self.prior_logits: list[float] | None = None  # set by NerTask.encode from the training windows

    def build_head(self, hidden_size: int) -> nn.Module:
        from zhie.heads import GlobalPointer

        head = ner_head(self.config.head).build(self.config, hidden_size)
        if isinstance(head, GlobalPointer) and self.prior_logits is not None and self.config.gp_prior_init:
            head.init_offsets(self.prior_logits)  # start at the prior, not at 0 (issue 17: else GP may collapse)
        return head

    def cuts(self, n: int, spans: list[tuple[int, int, int]], size: int, overlap: int) -> list[tuple[int, int]]:
        return windows(n, size, overlap)

    def tags(self, spans: list[tuple[int, int, int]], n: int) -> list[int]:
        return []

    def labels(self, items: list[NerWindow], n: int) -> Tensor:
        return sparse_cells([[(k, s, e) for s, e, k in it.spans] for it in items], len(self.config.labels), n)

    def loss(self, head: nn.Module, logits: Tensor, labels: Tensor) -> Tensor:
        from zhie.losses import global_pointer_loss

        return global_pointer_loss(logits, labels, mask_zero=True, reduction="mean")

    def prior(self, items: list[NerWindow]) -> float:
        """One logit per type; a window of n tokens has n(n+1)/2 valid cells (upper triangle)."""
        return self._prior(items)[0]

    def _prior(self, items: list[NerWindow]) -> tuple[float, list[float]]:
        from zhie.multitask.priors import multilabel_prior

        instances = []
        for it in items:
            n, positives = len(it.ids), Counter(k for _, _, k in set(it.spans))
            instances.append([(n * (n + 1) // 2 - positives[a], positives[a]) for a in range(len(self.config.labels))])
        return multilabel_prior(instances)

    def observe(self, items: list[NerWindow]) -> None:
        """Remember the training windows' prior logit per type (GP starts its cells there, :meth:`build_head`)."""
        if items:
            self.prior_logits = self._prior(items)[1]

    def decode(self, logits: np.ndarray, attention_mask: np.ndarray, weights: dict | None = None
               ) -> list[list[TokenSpan]]:
        """Masked span logits ``[b, types, n, n]`` -> per row its spans (at most ``max_spans``)."""
        rows: list[list[TokenSpan]] = [[] for _ in range(logits.shape[0])]
        for b, k, i, j, score in zip(*(a.tolist() for a in decoding.span_cells(logits, self.config.max_spans))):
            rows[b].append(TokenSpan(i - 1, j, k, score))
        return rows

    def soft_targets(self, logits: Tensor, batch: dict[str, Tensor], temperature: float) -> list:
        from zhie.losses.distill import soft_cells

        return soft_cells(logits, temperature)

    def soft_batch(self, batch: dict[str, Tensor], targets: list) -> dict[str, Tensor]:
        from zhie.losses.distill import stack_cells

        batch["soft_cells"], batch["soft_probs"] = stack_cells(targets)
        return batch

    def soft_loss(self, logits: Tensor, batch: dict[str, Tensor], temperature: float) -> Tensor:
        from zhie.losses.distill import dense_targets, span_soft_loss

        target = dense_targets(batch["soft_cells"], batch["soft_probs"], logits)
        return span_soft_loss(logits, target, temperature).mean()  # over batch x types, as global_pointer_loss


class TagLabels:
    """CRF/softmax: one tag per content token, the head's own loss and decoding, tags -> spans."""

    cut_at_right_edge = True

    def __init__(self, config: NerConfig) -> None:
        self.config = config
        self.crf = ner_head(config.head).crf  # decoded by Viterbi over the head's transitions (else argmax)
        self.tag_index = {tag: i for i, tag in enumerate(config.tags)}
        self.label_index = {label: i for i, label in enumerate(config.labels)}
        self.spans = BatchTagDecoder(config.tags, config.scheme)
        self.span_label = [self.label_index.get(label, 0) for label in self.spans.labels]  # BMES's "": 0
        self.constraints = decoding.CONSTRAINTS[config.scheme](config.tags)

    def build_head(self, hidden_size: int) -> nn.Module:
        return ner_head(self.config.head).build(self.config, hidden_size)

    def cuts(self, n: int, spans: list[tuple[int, int, int]], size: int, overlap: int) -> list[tuple[int, int]]:
        """Windows that end between entities: a cut entity's tokens would be learnt as O (only an entity longer
        than a window is cut)."""
        cuts, start = [], 0
        while start < n:
            end = min(start + size, n)
            crossing = [s for s, e, _ in spans if start < s < end <= e]
            if crossing:
                end = min(crossing)
            cuts.append((start, end))
            start = end
        return cuts

    def observe(self, items: list[NerWindow]) -> None:
        """Nothing to learn from the training windows before training."""

    def tags(self, spans: list[tuple[int, int, int]], n: int) -> list[int]:
        labels = self.config.labels
        tags = spans_to_tags([(s, e + 1, labels[k]) for s, e, k in spans], n, self.config.scheme)
        return [self.tag_index[t] for t in tags]

    def labels(self, items: list[NerWindow], n: int) -> Tensor:
        from zhie.heads.tagger import IGNORE

        return pad([[IGNORE, *it.tags, IGNORE] for it in items], IGNORE, n)

    def loss(self, head: nn.Module, emissions: Tensor, labels: Tensor) -> Tensor:
        return head.loss(emissions[:, 1:], labels[:, 1:])  # content tokens start at position 1

    def prior(self, items: list[NerWindow]) -> float:
        """The tags' Markov chain (CRF) or their entropy (softmax)."""
        from zhie.multitask.priors import crf_prior, softmax_tagging_prior

        tags = [it.tags for it in items]
        return crf_prior(tags) if self.crf else softmax_tagging_prior(tags)

    def soft_targets(self, emissions: Tensor, batch: dict[str, Tensor], temperature: float) -> list:
        """Each row's emissions over its own tokens (special ones included), fp16 (the temperature acts in the loss)."""
        import torch

        lengths = batch["attention_mask"].sum(1).tolist()
        return [emissions[b, :n].to(torch.float16).cpu() for b, n in enumerate(lengths)]

    def soft_batch(self, batch: dict[str, Tensor], targets: list) -> dict[str, Tensor]:
        import torch

        ids = batch["input_ids"]
        soft = torch.zeros((*ids.shape, targets[0].shape[-1]), dtype=torch.float16)
        for b, e in enumerate(targets):
            soft[b, :len(e)] = e
        batch["soft_emissions"] = soft
        return batch

    def soft_loss(self, emissions: Tensor, batch: dict[str, Tensor], temperature: float) -> Tensor:
        """Over the tokens that carry a tag (the hard loss's tokens)."""
        from zhie.heads.tagger import IGNORE
        from zhie.losses.distill import tag_soft_loss

        return tag_soft_loss(emissions, batch["soft_emissions"], batch["labels"] != IGNORE, temperature).mean()

    def decode(self, emissions: np.ndarray, attention_mask: np.ndarray, weights: dict | None = None
               ) -> list[list[TokenSpan]]:
        """Emissions ``[b, n, tags]`` -> per row its spans: the CRF's constrained Viterbi path (its transitions in
        ``weights``, the head's), or each token's argmax (softmax); spans for the whole batch in numpy."""
        lengths = attention_mask.sum(1) - 2
        emissions = emissions[:, 1:]
        if self.crf:
            trans, start, end = decoding.constrained(weights["crf.transitions"], weights.get("crf.start_transitions"),
                                                     weights.get("crf.end_transitions"), self.constraints)
            paths, _ = decoding.viterbi(emissions, lengths, trans, start, end)
        else:
            valid = np.arange(emissions.shape[1])[None, :] < lengths[:, None]
            paths = np.where(valid, emissions.argmax(-1), -1)
        probs = decoding.tag_probabilities(emissions, paths)
        lengths = lengths.tolist()
        cumulative = np.concatenate([np.zeros((len(probs), 1)), np.cumsum(probs, axis=1, dtype=np.float64)], axis=1)
        b, s, e, k = self.spans(paths, lengths)
        score = (cumulative[b, e] - cumulative[b, s]) / (e - s)  # the mean probability of the span's tags
        rows: list[list[TokenSpan]] = [[] for _ in lengths]
        for row, start, end, label, p in zip(b.tolist(), s.tolist(), e.tolist(), k.tolist(), score.tolist()):
            rows[row].append(TokenSpan(start, end, self.span_label[label], p))
        return rows


class WordLabels(TagLabels):
    """Word-level softmax tagging: tags on each word's first sub-word (the rest are ``IGNORE``: no loss), and per
    token argmax hits, from which :meth:`NerTask.from_hits` reads the words' tags (:mod:`zhie.core.words`)."""

    cut_at_right_edge = False  # a hit is one token: the window where it is most central reports it

    def decode(self, emissions: np.ndarray, attention_mask: np.ndarray, weights: dict | None = None
               ) -> list[list[TokenSpan]]:
        """One :class:`TokenSpan` per content token: ``label`` is its argmax tag id, ``score`` that tag's
        probability."""
        lengths = (attention_mask.sum(1) - 2).tolist()
        softmax = decoding.softmax(emissions[:, 1:])
        probs, tags = softmax.max(-1), softmax.argmax(-1)
        return [[TokenSpan(t, t + 1, tag, p) for t, (tag, p) in enumerate(zip(row_tags[:n], row_probs[:n]))]
                for row_tags, row_probs, n in zip(tags.tolist(), probs.tolist(), lengths)]

    def prior(self, items: list[NerWindow]) -> float:
        """The entropy of the tags of the words (the sub-words without a tag left out)."""
        from zhie.heads.tagger import IGNORE
        from zhie.multitask.priors import softmax_tagging_prior

        return softmax_tagging_prior([[t for t in it.tags if t != IGNORE] for it in items])


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
