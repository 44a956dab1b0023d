"""The pipeline of a trained model and its task: what :func:`zhie.load` returns (``predict``, ``stream``,
``evaluate``, ``member``), and :func:`load_pipeline` for a torch model directory.

A task's own pipeline (a segmenter's ``segment``, a sentence encoder's ``encode``) subclasses :class:`Pipeline` in the
task's module, so the class lives in the tasks' layer; :mod:`zhie.deploy.pipeline` adds exports to ``zhie.load``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, ClassVar, Protocol

from zhie.precision import autocast
from zhie.tasks.batching import chunks
from zhie.tasks.modeldir import read_meta

if TYPE_CHECKING:
    from zhie.model import Model

CHUNK_LINES = 4096  # texts read and predicted at a time by Pipeline.stream (zhie predict's --chunk-lines)


class PipelineTask(Protocol):
    """What a pipeline, and a command over texts (:class:`zhie.tasks.cli_flags.TextCommand`), use of a task: every
    :class:`zhie.tasks.base.Task` has it. Declared here so that this module, below the task protocol, needs no
    import of it."""

    name: ClassVar[str]
    aliases: ClassVar[tuple[str, ...]]
    output_key: ClassVar[str]

    def predict(self, model: Model, texts: list[str], batch_size: int = 32, max_tokens: int | None = None) -> list:
        ...

    def evaluate(self, model: Model, examples: list, batch_size: int = 32, max_tokens: int | None = None) -> dict:
        ...


class Pipeline:
    """A trained model and its task: ``zhie.load(DIR).predict(texts)``; on the GPU if there is one.

    ``precision`` (``fp32``, ``bf16``, ``fp16``): the encoder's precision in ``predict`` and ``evaluate``
    (:mod:`zhie.precision`; decoding stays fp32). ``model``: a :class:`zhie.model.Model`, or an export's
    :class:`zhie.deploy.runtime.OnnxModel` (CPU, fp32).
    """

    def __init__(self, task: PipelineTask, model: Model, device: str | None = None, precision: str = "fp32") -> None:
        self.task, self.model = task, model
        if device is None:
            import torch

            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = str(device)
        try:
            self.model.to(self.device)
        except (RuntimeError, AssertionError) as err:  # torch: a device name it does not know, or no CUDA here
            raise ValueError(f"cannot put the model on the device {self.device!r} ({err}); use cpu, or cuda on a "
                             "machine with a GPU") from None
        self.precision = precision
        self.autocast()  # an unknown precision, or one the device lacks, fails here

    def autocast(self) -> contextlib.AbstractContextManager:
        """The context the model runs in: autocast to ``precision`` on the model's device (nothing for fp32)."""
        return autocast(self.precision, self.device)

    def predict(self, texts: list[str] | str, batch_size: int = 32, max_tokens: int | None = None) -> list:
        """One prediction per text, in input order (a single string counts as a list of one); the type of a
        prediction is the task's (see its ``predict``). ``max_tokens``: batches of at most that many padded tokens
        over length-sorted texts instead of ``batch_size`` texts."""
        with self.autocast():
            return self.task.predict(self.model, [texts] if isinstance(texts, str) else list(texts), batch_size,
                                     max_tokens=max_tokens)

    def stream(self, texts: Iterable[str], batch_size: int = 32, max_tokens: int | None = None,
               chunk_size: int = CHUNK_LINES) -> Iterator:
        """One prediction per text of ``texts`` (any iterable, read lazily: a file, a generator), in their order, as
        ``predict`` gives it, with memory bounded by ``chunk_size``: that many texts are read and predicted at a time
        (:func:`stream_predictions`). A blank text (empty, or only whitespace) gets the empty prediction: no entities,
        words or triples; a sentence encoder's vector of zeros."""
        return stream_predictions(lambda chunk: self.predict(chunk, batch_size, max_tokens), texts, chunk_size)

    def evaluate(self, examples: list, batch_size: int = 32, max_tokens: int | None = None) -> dict:
        with self.autocast():
            return self.task.evaluate(self.model, examples, batch_size, max_tokens=max_tokens)

    def member(self, name: str) -> Pipeline:
        """The pipeline of the member task ``name`` of a multi-task model (``zhie eval --task``); a single-task model
        is its own only member, under its task's name."""
        if name not in (self.task.name, *self.task.aliases):
            raise ValueError(f"this is a single-task {self.task.name} model; it has no member task {name!r}")
        return self


def stream_predictions(predict: Callable[[list[str]], Sequence], texts: Iterable[str], chunk_size: int) -> Iterator:
    """The streaming of :meth:`Pipeline.stream` (and of a pipeline's own ``stream`` with other options): ``predict``
    on each chunk of ``chunk_size`` texts (a list of texts -> one prediction per text, in order), every blank text
    given as "" (whose prediction is empty), then the chunk's predictions one by one; the next chunk is read only when
    they have been taken."""
    for chunk in chunks(texts, chunk_size):
        for i, text in enumerate(chunk):
            if not isinstance(text, str):
                raise TypeError(f"stream() predicts texts (str); got a {type(text).__name__} ({text!r:.40})")
            if not text.strip():
                chunk[i] = ""
        yield from predict(chunk)


def load_pipeline(path: str | os.PathLike, device: str | None = None, precision: str = "fp32") -> Pipeline:
    """The pipeline of the model directory ``path`` (written by ``zhie train``, or its run directory), its task found
    in the registry by ``zhie.json``: torch models only (:func:`zhie.load`, :func:`zhie.deploy.pipeline.load`, also
    load exports). For what trains from a saved model (a pre-training segmenter, distillation's teachers)."""
    from zhie import tasks

    cls = tasks.get(str(read_meta(path).get("task")))
    task, model = cls.load(path)
    return cls.pipeline_class(task, model, device, precision)

