"""zhie as a spaCy pipeline component (the ``spacy`` extra): ``nlp.add_pipe("zhie", config={"model": DIR})``.

Registered as the factory ``zhie`` with ``@Language.factory`` when this module is imported, which spaCy does through
the ``spacy_factories`` entry point of zhie's package; nothing else in zhie imports spaCy.

What it sets on a ``Doc``, by the model's task (its ``output_key``):

- NER (``entities``): ``doc.spans[spans_key]`` holds every predicted entity (nested and overlapping ones too), its
  ``attrs["scores"]`` their scores in the same order (as spaCy's ``spancat`` does); ``doc.ents`` the longest
  non-overlapping ones (``spacy.util.filter_spans``), replacing what ``doc.ents`` held.
- word segmentation (``words``): ``doc._.zhie_words``, the words as ``(start_char, end_char)`` pairs (exact, a
  partition of the text). The doc's tokens stay spaCy's: making them zhie's words would mean splitting the tokens of
  a segmenter (pkuseg, jieba) that cross a word boundary of zhie's.
- relations (``relations``): ``doc._.zhie_relations``, one dict per triple as ``zhie predict`` writes it
  (``{"subject": {"start", "end", "text"}, "predicate", "object": {...}, "score"}``), each mention with its
  ``"tokens": (start, end)`` too (``doc[start:end]`` is the mention on spaCy's tokens).
- sentence embeddings (``embedding``): ``doc._.zhie_vector``, which ``doc.vector`` returns and ``doc.similarity``
  compares by their cosine (``doc.user_hooks``; a ``DocBin`` keeps the extension, not the hooks).

Extension values are plain data (numbers, strings, tuples, lists, numpy arrays), never ``Span`` objects, so that a
doc still pickles (``nlp.pipe(n_process=2)``) and goes into a ``DocBin``. zhie's character offsets become spaCy
tokens with ``Doc.char_span(start, end, alignment_mode="expand")``: an offset inside a token takes the whole token,
and ``doc._.zhie_expanded`` counts the spans (entities, mentions) whose characters were not on token boundaries
(0 with ``spacy.blank("zh")``'s default char segmenter). ``nlp.pipe`` predicts each of its batches of docs in one
:meth:`zhie.tasks.pipeline.Pipeline.stream` call (``batch_size`` texts per forward pass).
"""

from __future__ import annotations

import logging

import numpy as np
from spacy.language import Language
from spacy.tokens import Doc, SpanGroup
from spacy.util import filter_spans, minibatch

from zhie.deploy.pipeline import load

logger = logging.getLogger(__name__)

for _name, _default in (("zhie_words", None), ("zhie_relations", None), ("zhie_vector", None), ("zhie_expanded", 0)):
    if not Doc.has_extension(_name):
        Doc.set_extension(_name, default=_default)

ANNOTATED = ("entities", "words", "relations", "embedding")  # the output keys of the tasks this component annotates


@Language.factory("zhie", default_config={"task": None, "spans_key": "zhie", "batch_size": 32, "device": None,
                                          "precision": "fp32"})
def make_zhie(nlp: Language, name: str, model: str, task: str | None, spans_key: str, batch_size: int,
              device: str | None, precision: str) -> ZhieComponent:
    """``model``: a zhie model directory (or run directory, or export); ``task``: a multi-task model's member;
    ``device``/``precision``: as :func:`zhie.load`'s; ``batch_size``: texts per forward pass."""
    return ZhieComponent(model, task=task, spans_key=spans_key, batch_size=batch_size, device=device,
                         precision=precision)


class ZhieComponent:
    """The ``zhie`` pipe: a zhie pipeline that annotates docs (see the module's docstring)."""

    def __init__(self, model: str, *, task: str | None = None, spans_key: str = "zhie", batch_size: int = 32,
                 device: str | None = None, precision: str = "fp32") -> None:
        self.pipeline = load(model, device=device, precision=precision)
        if task is not None:
            self.pipeline = self.pipeline.member(task)
        self.output_key = self.pipeline.task.output_key
        if self.output_key not in ANNOTATED:
            raise ValueError(f"{model}: the zhie spaCy component annotates ner, cws, re and similarity models, and "
                             f"this is a {self.pipeline.task.name} model; for a multi-task model, name its member in "
                             f"the config: {{\"model\": ..., \"task\": NAME}}, one component per member")
        self.spans_key, self.batch_size = spans_key, batch_size

    def __call__(self, doc: Doc) -> Doc:
        return next(self.pipe([doc]))

    def pipe(self, docs, batch_size: int = 128):
        """The docs, annotated, in order: each batch of ``batch_size`` docs is one ``Pipeline.stream`` call."""
        for batch in minibatch(docs, size=batch_size):
            predictions = self.pipeline.stream([doc.text for doc in batch], batch_size=self.batch_size,
                                               chunk_size=len(batch))
            for doc, prediction in zip(batch, predictions):
                self.annotate(doc, prediction)
                yield doc

    def annotate(self, doc: Doc, prediction) -> None:
        """Set one doc's annotations from its zhie prediction."""
        aligned = Aligned(doc)
        if self.output_key == "entities":
            spans = [(aligned.span(s.start, s.end, s.label), s.score) for s in prediction]
            spans = [(span, score) for span, score in spans if span is not None]
            doc.spans[self.spans_key] = SpanGroup(doc, name=self.spans_key, spans=[span for span, _ in spans],
                                                  attrs={"scores": [score for _, score in spans]})
            doc.ents = filter_spans(doc.spans[self.spans_key])
        elif self.output_key == "words":
            doc._.zhie_words = [(w.start, w.end) for w in prediction]
        elif self.output_key == "relations":
            relations = []
            for triple in prediction:
                relation = triple.to_dict()
                for role in ("subject", "object"):
                    span = aligned.span(relation[role]["start"], relation[role]["end"])
                    relation[role]["tokens"] = None if span is None else (span.start, span.end)
                relations.append(relation)
            doc._.zhie_relations = relations
        else:
            doc._.zhie_vector = prediction
            doc.user_hooks["vector"] = zhie_vector
            doc.user_hooks["similarity"] = cosine
        doc._.zhie_expanded = aligned.expanded


def zhie_vector(doc: Doc):
    """``doc.vector`` (a user hook): zhie's sentence vector of the doc."""
    return doc._.zhie_vector


def cosine(doc: Doc, other) -> float:
    """``doc.similarity(other)`` (a user hook): the cosine of the two vectors (0 where one is zeros: a blank text)."""
    norms = float(np.linalg.norm(doc.vector) * np.linalg.norm(other.vector))
    return float(doc.vector @ other.vector) / norms if norms else 0.0


class Aligned:
    """zhie's character spans on a doc's tokens (``Doc.char_span``, ``alignment_mode="expand"``), counting those that
    had to be expanded to token boundaries."""

    def __init__(self, doc: Doc) -> None:
        self.doc, self.expanded = doc, 0

    def span(self, start: int, end: int, label: str = ""):
        """The tokens that cover ``[start, end)``, or None (logged) for characters that no token holds (only
        whitespace)."""
        span = self.doc.char_span(start, end, label=label, alignment_mode="expand")
        if span is None or not len(span):
            logger.warning("zhie: %r at characters [%d, %d) covers no spaCy token; left out", self.doc.text[start:end],
                           start, end)
            return None
        self.expanded += (span.start_char, span.end_char) != (start, end)
        return span
