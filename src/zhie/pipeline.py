"""Load a saved model directory and use it: ``zhie.load(DIR).predict(texts)`` / ``.segment(texts)``."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from zhie.data import NerExample
from zhie.spans import Span
from zhie.tasks.base import read_meta


class NerPipeline:
    """A trained NER model: ``predict(texts)`` returns one list of :class:`Span` per text."""

    def __init__(self, path: str | os.PathLike, device: str | None = None):
        self.path = Path(path)
        self.task, self.model = self.task_class().load(path)
        self.model.to(device or ("cuda" if torch.cuda.is_available() else "cpu"))
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


PIPELINES = {"ner": NerPipeline, "cws": CwsPipeline, "re": RelationPipeline}


def load(path: str | os.PathLike, device: str | None = None):
    """The pipeline for the model saved in ``path`` (a directory written by ``zhie train``)."""
    meta = read_meta(path)
    if meta.get("task") not in PIPELINES:
        raise ValueError(f"{path}: unknown task {meta.get('task')!r}")
    return PIPELINES[meta["task"]](path, device)
