"""Load a saved model directory and use it: ``zhie.load(DIR).predict(texts)``.

The task named in the directory's ``zhie.json`` decides the pipeline (:attr:`Task.pipeline_class`): every pipeline
has ``predict(texts)`` and ``evaluate(examples)``; segmenters add ``segment``, sentence encoders ``encode`` and
``similarity``.
"""

from __future__ import annotations

import os

from zhie import tasks
from zhie.deploy.runtime import is_export
from zhie.tasks.modeldir import read_meta, resolve_model_dir
from zhie.tasks.pipeline import Pipeline, load_pipeline

__all__ = ["Pipeline", "load"]


def load(path: str | os.PathLike, device: str | None = None, precision: str = "fp32", threads: int | None = None
         ) -> Pipeline:
    """The pipeline for the model saved in ``path`` (a directory written by ``zhie train``, or its run directory), or
    for an export directory written by ``zhie export``, which runs on onnxruntime on the CPU
    (:mod:`zhie.deploy.runtime`).

    ``precision``: ``fp32``, or ``bf16`` / ``fp16`` for the encoder under autocast (:mod:`zhie.precision`; on the CPU
    too, where it saves memory more than time); an export runs in fp32 only, without torch.

    ``threads``: the CPU threads of an export (None: every CPU this process may use; see
    :class:`zhie.deploy.runtime.OnnxModel`). A process that shares the machine with others, a Ray actor given a part
    of its CPUs, sets it. A torch model's threads are torch's, process-wide: ``torch.set_num_threads``."""
    model_dir = resolve_model_dir(path)
    if not is_export(model_dir):
        if threads is not None:
            raise ValueError(f"{path} is a torch model: threads sets an export's threads; set torch's with "
                             "torch.set_num_threads (OMP_NUM_THREADS)")
        return load_pipeline(path, device, precision)
    cls = tasks.get(str(read_meta(model_dir).get("task")))
    if precision != "fp32":
        raise ValueError(f"{path} is an ONNX export, which runs in fp32; leave out --precision {precision}")
    if device not in (None, "cpu"):
        raise ValueError(f"{path} is an ONNX export; zhie runs exports on the CPU (device {device!r} asked)")
    from zhie.deploy.runtime import load_export

    task, model = load_export(model_dir, threads)
    return cls.pipeline_class(task, model, "cpu")
