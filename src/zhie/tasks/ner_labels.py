"""How each family of NER heads (:mod:`zhie.tasks.ner_heads`) is trained and read: :class:`SpanLabels` (GP/EGP),
:class:`TagLabels` (CRF/softmax taggers), :class:`WordLabels` (word-level tagging). Each encodes a training window's
spans as its head's labels (the inverse of its decoder), builds the head, takes its loss, its prior and its
distillation targets, and decodes the head's output, in numpy, into :class:`TokenSpan` over the window's content
tokens (content token ``t`` sits at position ``t + 1``, after ``[CLS]``).

Entity scores: GP/EGP ``sigmoid(2 * logit)`` (the calibrated probability of the MCE loss, spec §0.2);
taggers: the mean over the entity's tokens of the softmax probability of their tags (for the CRF, of the
emission scores).

How sure a head is of a window's whole prediction (``surprise``, for ``zhie select``: :mod:`zhie.deploy.selection`):
``-log P`` of what it decoded, in nats. GP/EGP: every cell an independent Bernoulli of ``sigmoid(2 * logit)``
(:func:`zhie.core.decoding.cell_surprise`); CRF: ``log Z - score(Viterbi path)`` over the constrained paths; softmax:
``-sum_t log max_tag p_t(tag)`` over the content tokens (the argmax path's probability).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from zhie.core import decoding
from zhie.core.spans import BatchTagDecoder, spans_to_tags
from zhie.core.text import windows
from zhie.tasks.batching import pad, sparse_cells
from zhie.tasks.ner_heads import NerConfig, ner_head

if TYPE_CHECKING:
    from torch import Tensor, nn


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

    def surprise(self, logits: np.ndarray, attention_mask: np.ndarray, weights: dict | None = None) -> np.ndarray:
        """``[b]``: ``-log P`` of each row's decoded cells (:func:`zhie.core.decoding.cell_surprise`)."""
        return decoding.cell_surprise(logits)

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

    def surprise(self, emissions: np.ndarray, attention_mask: np.ndarray, weights: dict | None = None) -> np.ndarray:
        """``[b]``: ``-log P`` of each row's decoded tag path: for the CRF ``log Z - score(best path)`` over the
        paths its constraints allow (:func:`zhie.core.decoding.crf_surprise`), for softmax ``-sum_t log max_tag
        p_t(tag)`` over the content tokens (word-level tagging: every sub-word's, the untagged ones too)."""
        lengths = attention_mask.sum(1) - 2
        emissions = emissions[:, 1:]
        if self.crf:
            return decoding.crf_surprise(emissions, lengths, *decoding.constrained(
                weights["crf.transitions"], weights.get("crf.start_transitions"), weights.get("crf.end_transitions"),
                self.constraints))
        x = np.asarray(emissions, dtype=np.float64)
        top = x.max(-1)
        log_best = -np.log(np.exp(x - top[..., None]).sum(-1))  # log of the largest softmax probability per token
        valid = np.arange(x.shape[1])[None, :] < lengths[:, None]
        return -np.where(valid, log_best, 0.0).sum(1)


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
