"""Chinese word segmentation: BMES tagging with a CRF or softmax head, on the NER machinery.

Words are spans with label ``""``; tags are S = 0, B = 1, M = 2, E = 3 (spec §8.1) and the CRF decodes with
the BMES constraints (no S->M, B->S, B->B, ...). Training sentences longer than ``max_length`` are cut at word
boundaries. ``predict`` always returns a partition of the text: joining the words gives the input back exactly
(whitespace runs are pieces of their own).
"""

from __future__ import annotations

import os
from bisect import bisect_left
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from zhie.core.metrics import segmentation_prf
from zhie.core.options import check_options, option
from zhie.core.spans import Span
from zhie.data import NerExample, label_studio
from zhie.data.cws import read_segmented
from zhie.tasks import register
from zhie.tasks.base import Task, WindowedTask
from zhie.tasks.cli_flags import add_text_command, check_max_length, only_auto_format
from zhie.tasks.ner import NerTask
from zhie.tasks.ner_heads import TAGGER_HEADS, NerConfig
from zhie.tasks.pipeline import Pipeline

VOCAB_FILE = "train_words.txt"


@dataclass
class CwsConfig(NerConfig):
    """A segmenter's :class:`NerConfig`: the one label ``""`` (a word), BMES tags over characters, a tagger head."""

    labels: list[str] = field(default_factory=lambda: [""])
    head: str = option("crf", "the tagger: crf (Viterbi over BMES-constrained transitions) or softmax",
                       choices=TAGGER_HEADS)
    scheme: str = "BMES"


def partition(text: str, spans: list[Span]) -> list[Span]:
    """Non-overlapping spans covering ``text`` exactly: the first of overlapping spans wins, gaps become pieces."""
    out: list[Span] = []
    pos = 0
    for span in sorted(spans, key=lambda s: (s.start, -s.end)):
        if span.start < pos:
            continue
        if span.start > pos:
            out.append(Span(pos, span.start, "", text[pos:span.start]))
        out.append(span)
        pos = span.end
    if pos < len(text):
        out.append(Span(pos, len(text), "", text[pos:]))
    return out


def boundary_errors(text: str, gold: list[Span], predicted: list[Span]) -> list[dict]:
    """Where two segmentations of ``text`` disagree: each stretch from one word boundary both share to the next that
    is not one word on both sides, with its words on each side (``gold``, ``predicted``: joined by a space) and its
    ``kind``: ``split`` (one gold word cut into pieces), ``merged`` (gold words joined into one) or ``boundary``
    (several words on each side, cut elsewhere)."""
    shared = sorted({s.end for s in gold} & {s.end for s in predicted})
    sides: list[dict[int, list[Span]]] = [defaultdict(list), defaultdict(list)]
    for side, words in zip(sides, (gold, predicted)):
        for word in words:
            side[bisect_left(shared, word.end)].append(word)
    out = []
    for k in sorted(sides[0].keys() | sides[1].keys()):
        g, p = sides[0][k], sides[1][k]
        if len(g) == 1 and len(p) == 1:
            continue
        start, end = min(w.start for w in g + p), max(w.end for w in g + p)
        out.append({"kind": "split" if len(g) == 1 else "merged" if len(p) == 1 else "boundary", "start": start,
                    "end": end, "span": text[start:end], "gold": " ".join(w.text for w in g),
                    "predicted": " ".join(w.text for w in p)})
    return out


class SegmenterPipeline(Pipeline):
    """A trained segmenter: ``predict(texts)`` gives each text's words as spans, ``segment(texts)`` as strings
    (they join back to the text)."""

    def segment(self, texts: list[str] | str, batch_size: int = 32) -> list[list[str]]:
        return [[s.text for s in words] for words in self.predict(texts, batch_size)]


@register
class CwsTask(NerTask):
    """Words of a text: ``predict`` returns, per text, the :class:`zhie.core.spans.Span` of each word (label ``""``),
    a partition of the text."""

    name = "cws"
    help = "Chinese word segmentation (crf, softmax heads; BMES tags)"
    config_class = CwsConfig
    option_names = ("head", "max_length", "crf_lr_multiplier")  # characters, flat words: no --mode, --flatten
    output_key = "words"
    pipeline_class = SegmenterPipeline

    def __init__(self, config: NerConfig, tokenizer):
        super().__init__(config, tokenizer)
        self.train_vocab: set[str] = set()

    @classmethod
    def read(cls, path: str | os.PathLike, format: str = "auto") -> list[NerExample]:
        if label_studio.asked(path, format):
            return label_studio.read_words(path)
        only_auto_format(format, "segmented text (words separated by spaces) or a Label Studio export "
                                 "(--format label-studio)")
        return read_segmented(path)

    @classmethod
    def configure(cls, examples: list[NerExample], *, encoder: str, **options) -> CwsConfig:
        """The config of ``options``, the flags of ``zhie train cws`` (:data:`option_names`)."""
        config = CwsConfig(**check_options(CwsConfig, options, cls.option_names))
        check_max_length(config.max_length)
        return config

    def split_long(self, examples: list[NerExample]) -> list[NerExample]:
        """Cut sentences at word boundaries into pieces of at most ``max_length - 2`` characters.

        A single word longer than that (none in SXU) is itself cut into pieces of that length.
        """
        size, out = self.config.max_length - 2, []
        for ex in examples:
            words = [Span(a, min(a + size, w.end), "", ex.text[a:min(a + size, w.end)])
                     for w in ex.spans for a in range(w.start, w.end, size)]
            start, piece = 0, []
            for word in words:
                if word.end - start > size and piece:
                    out.append(self._piece(ex.text, start, piece))
                    start, piece = word.start, []
                piece.append(word)
            if piece:
                out.append(self._piece(ex.text, start, piece))
        return out

    @staticmethod
    def _piece(text: str, start: int, words: list[Span]) -> NerExample:
        end = words[-1].end
        return NerExample(text[start:end], [Span(w.start - start, w.end - start, "", w.text) for w in words])

    def encode(self, examples: list[NerExample]):
        """Training windows; the training vocabulary (for OOV recall) is taken from ``examples`` too."""
        self.train_vocab |= {s.text for ex in examples for s in ex.spans}
        return super().encode(self.split_long(examples))

    def from_hits(self, texts: list[str], hits) -> list[list[Span]]:
        return [partition(text, words) for text, words in zip(texts, super().from_hits(texts, hits))]

    def to_json(self, prediction: list[Span]) -> list[dict]:
        return [{"start": s.start, "end": s.end, "text": s.text} for s in prediction]

    def score(self, examples: list[NerExample], predictions: list[list[Span]]) -> dict:
        words = [[s.text for s in ex.spans] for ex in examples]
        return segmentation_prf([ex.spans for ex in examples], predictions, words, self.train_vocab)

    def summary(self, metrics: dict) -> dict[str, float]:
        return Task.summary(self, metrics)

    def report(self, metrics: dict) -> str:
        return Task.report(self, metrics)

    def errors(self, example: NerExample, prediction: list[Span]) -> list[dict]:
        """The stretches where the predicted word boundaries differ from the gold ones (:func:`boundary_errors`)."""
        return boundary_errors(example.text, example.spans, prediction)

    def describe(self) -> dict:
        about = WindowedTask.describe(self)
        return {**about, "summary": f"Chinese word segmentation with the {self.config.head} head (BMES tags)",
                "metrics": ["precision", "recall", "f1"],
                "limits": [*about["limits"], "the words of a text always join back to the text exactly"]}

    @classmethod
    def add_commands(cls, commands) -> None:
        add_text_command(commands, cls, "segment", "segment text into words with a trained cws model", plain=words_line)

    def save_files(self, directory: Path, prefix: str = "") -> None:
        """The training vocabulary (for OOV recall), one word a line."""
        (directory / f"{prefix}{VOCAB_FILE}").write_text("\n".join(sorted(self.train_vocab)), encoding="utf-8")

    def load_files(self, directory: Path, prefix: str = "") -> None:
        vocab_file = directory / f"{prefix}{VOCAB_FILE}"
        self.train_vocab = set(vocab_file.read_text(encoding="utf-8").split("\n")) if vocab_file.exists() else set()


def words_line(words: list) -> str:
    """``zhie segment``'s line of one text's words (:class:`Span`): separated by two spaces, whitespace left out."""
    return "  ".join(s.text for s in words if not s.text.isspace())
