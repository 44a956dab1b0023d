"""The heads of the ner task (and of cws's taggers), found by name, and :class:`NerConfig`, whose ``head`` names one.

Heads (spec §1, §2, §8), in two families with one output type each:

* span heads ``gp`` / ``egp`` — (Efficient) GlobalPointer: span logits ``[b, types, n, n]``, trained with the
  sparse multilabel categorical cross-entropy on index labels; a span is predicted where its masked logit is > 0
  (:func:`zhie.core.decoding.span_cells`, at most ``max_spans`` per window). Flat and nested data
  (:class:`~zhie.tasks.ner_labels.SpanLabels`).
* taggers ``crf`` / ``softmax`` — emissions ``[b, n, tags]`` over BIO tags (O = 0, B-c = 2c+1, I-c = 2c+2); the
  CRF decodes with Viterbi restricted to valid BIO paths (:mod:`zhie.core.decoding`). Flat data only: nested spans are
  refused, unless ``flatten`` keeps the outermost ones (:class:`~zhie.tasks.ner_labels.TagLabels`).
* word-level tagging (``--mode word``: ``words=True`` on sub-word tokens, softmax head;
  :class:`~zhie.tasks.ner_labels.WordLabels`, :mod:`zhie.core.words`) — one BIO tag per whitespace-separated word, on
  its first sub-word; the other sub-words and the special tokens carry no loss and no prediction (spec §10.2, the MTMT
  recogniser and student).

Heads are found by name in a registry (:func:`register_head`, :data:`NER_HEADS`), so that a plug-in adds one, of
either output type, without editing the task; ``HEADS``, ``SPAN_HEADS`` and ``TAGGER_HEADS`` name the registered ones.
The modules themselves live in ``zhie.heads``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from zhie.core.options import option

if TYPE_CHECKING:
    from torch import nn

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
