"""Using trained models: :func:`~zhie.deploy.pipeline.load` (a model directory, or an export), streamed input and
output (:mod:`~zhie.deploy.stream`), the HTTP service and its page (:mod:`~zhie.deploy.serve`, ``resources/``), ONNX
export (:mod:`~zhie.deploy.export`) and the runtime that runs an export without torch
(:mod:`~zhie.deploy.runtime`), Ray Data prediction (:mod:`~zhie.deploy.ray_predict`), ``zhie eval --errors``
(:mod:`~zhie.deploy.error_report`) and ``zhie select``, the texts to label next (:mod:`~zhie.deploy.selection`). Only
:mod:`zhie.cli` and the package's top import from here.
"""
