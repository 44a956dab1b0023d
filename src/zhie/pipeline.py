"""Load a saved model directory and use it: ``zhie.load(DIR).predict(texts)`` / ``.segment(texts)`` /
``.encode(texts)``."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from zhie.data import NerExample
from zhie.spans import Span
from zhie.tasks.base import read_meta


class Pipeline:
    """A trained model and its task, on the GPU if there is one."""

    def __init__(self, path: str | os.PathLike, device: str | None = None):
        self.path = Path(path)
        self.task, self.model = self.task_class().load(path)
        self.model.to(device or ("cuda" if torch.cuda.is_available() else "cpu"))

    @staticmethod
    def task_class():
        raise NotImplementedError

    def evaluate(self, examples: list, batch_size: int = 32) -> dict:
        return self.task.evaluate(self.model, examples, batch_size)


class NerPipeline(Pipeline):
    """A trained NER model: ``predict(texts)`` returns one list of :class:`Span` per text."""

    def __init__(self, path: str | os.PathLike, device: str | None = None):
        super().__init__(path, device)
        self.labels = getattr(self.task.config, "labels", None)

    @staticmethod
    def task_class():
        from zhie.tasks.ner import NerTask

        return NerTask

    def predict(self, texts: list[str] | str, batch_size: int = 32) -> list[list[Span]]:
        if isinstance(texts, str):
            texts = [texts]
        return self.task.predict(self.model, list(texts), batch_size)

    def evaluate(self, examples: list[NerExample], batch_size: int = 32) -> dict:
        return self.task.evaluate(self.model, examples, batch_size)


class CwsPipeline(NerPipeline):
    """A trained segmenter: ``segment(texts)`` returns the words of each text (they join back to the text)."""

    @staticmethod
    def task_class():
        from zhie.tasks.cws import CwsTask

        return CwsTask

    def segment_spans(self, texts: list[str] | str, batch_size: int = 32) -> list[list[Span]]:
        if isinstance(texts, str):
            texts = [texts]
        return self.task.segment(self.model, list(texts), batch_size)

    def segment(self, texts: list[str] | str, batch_size: int = 32) -> list[list[str]]:
        return [[s.text for s in spans] for spans in self.segment_spans(texts, batch_size)]


class RelationPipeline(NerPipeline):
    """A trained GPLinker model: ``predict(texts)`` returns one list of :class:`zhie.data.spo.Triple` per text."""

    @staticmethod
    def task_class():
        from zhie.tasks.relation import RelationTask

        return RelationTask


class SentencePipeline(Pipeline):
    """A trained sentence encoder: ``encode(texts)`` returns a numpy array of vectors, ``similarity(a, b)``
    the cosine of sentence pairs."""

    @staticmethod
    def task_class():
        from zhie.tasks.similarity import StsTask

        return StsTask

    def encode(self, texts: list[str] | str, batch_size: int = 64, normalize: bool = True) -> np.ndarray:
        """``[n, hidden]`` float32 (one row for a single string: ``[1, hidden]``), in input order."""
        if isinstance(texts, str):
            texts = [texts]
        return self.task.embed(self.model, list(texts), batch_size, normalize)

    def similarity(self, a: list[str] | str, b: list[str] | str, batch_size: int = 64) -> np.ndarray:
        """``[n]`` cosines of ``a[i]`` and ``b[i]`` (a single string counts as a list of one)."""
        a, b = [a] if isinstance(a, str) else list(a), [b] if isinstance(b, str) else list(b)
        if len(a) != len(b):
            raise ValueError(f"similarity needs as many texts in a as in b, got {len(a)} and {len(b)}")
        return (self.encode(a, batch_size) * self.encode(b, batch_size)).sum(1)


PIPELINES = {"ner": NerPipeline, "cws": CwsPipeline, "re": RelationPipeline, "sts": SentencePipeline}


def load(path: str | os.PathLike, device: str | None = None):
    """The pipeline for the model saved in ``path`` (a directory written by ``zhie train``)."""
    meta = read_meta(path)
    if meta.get("task") not in PIPELINES:
        raise ValueError(f"{path}: unknown task {meta.get('task')!r}")
    return PIPELINES[meta["task"]](path, device)
