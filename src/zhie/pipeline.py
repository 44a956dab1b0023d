"""Load a saved model directory and use it: ``zhie.load(DIR).predict(texts)``.

The task named in the directory's ``zhie.json`` decides the pipeline (:attr:`Task.pipeline_class`): every pipeline
has ``predict(texts)`` and ``evaluate(examples)``; segmenters add ``segment``, sentence encoders ``encode`` and
``similarity``.
"""

from __future__ import annotations

import os

from zhie import tasks
from zhie.tasks.base import Pipeline, read_meta

__all__ = ["Pipeline", "load"]


def load(path: str | os.PathLike, device: str | None = None) -> Pipeline:
    """The pipeline for the model saved in ``path`` (a directory written by ``zhie train``, or its run directory)."""
    meta = read_meta(path)
    cls = tasks.get(str(meta.get("task")))
    task, model = cls.load(path)
    return cls.pipeline_class(task, model, device)
