"""Label Studio's ML backend protocol on the HTTP service (:func:`add_label_studio_routes`), under
:data:`LABEL_STUDIO`, so that a project's "Connect model" takes ``http://HOST:PORT/label-studio``: ``GET
/label-studio/health``, ``POST /label-studio/setup``, ``POST /label-studio/predict``. With an API key, Label Studio's
basic authentication carries it as the password (:func:`zhie.deploy.gate.given_key`). The predictions' shape is
:mod:`zhie.data.label_studio`'s; the texts run through the service's batcher (:class:`zhie.deploy.service.Service`).
"""

from __future__ import annotations

import functools

from fastapi import FastAPI, HTTPException
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from zhie.data import label_studio
from zhie.deploy.service import Service

LABEL_STUDIO = "/label-studio"  # the prefix of Label Studio's ML backend routes


class LabelStudioTasks(BaseModel):
    """Label Studio's ``POST /predict`` to an ML backend: its tasks, the project's labelling config, and more that
    zhie does not read (``project``, ``params``)."""

    model_config = ConfigDict(extra="allow")
    tasks: list[dict]
    label_config: str | None = None


class LabelStudioSetup(BaseModel):
    """Label Studio's ``POST /setup``: the labelling config (``schema``), and more that zhie does not read."""

    model_config = ConfigDict(extra="allow")
    schema_: str | None = Field(default=None, alias="schema")


@functools.lru_cache(maxsize=16)
def labelling_config(xml: str | None) -> label_studio.LabelConfig:
    """The names a project's labelling config gives zhie's results (the defaults without one); 422 if it has none."""
    try:
        return label_studio.LabelConfig() if xml is None else label_studio.LabelConfig.parse(xml)
    except ValueError as err:
        raise HTTPException(422, str(err)) from None


def needs_spans(service: Service) -> None:
    if service.task.output_key not in label_studio.OUTPUT_KEYS:
        raise HTTPException(404, f"this {service.task.name} model has no Label Studio predictions: the ML backend "
                                 "routes serve NER, word segmentation and relation models")


def add_label_studio_routes(app: FastAPI, service: Service) -> None:
    """Label Studio's ML backend protocol under :data:`LABEL_STUDIO` (its URL in a project: ``http://HOST:PORT/label-
    studio``): ``GET /health``, ``POST /setup``, ``POST /predict``."""

    @app.get(f"{LABEL_STUDIO}/health")
    async def label_studio_health() -> JSONResponse:
        body, live, _ = service.health()
        return JSONResponse({"status": "UP" if live else "DOWN", "model_class": f"zhie {service.task.name}",
                             "model_version": service.model_version, "reason": body["reason"]},
                            status_code=200 if live else 503)

    @app.post(f"{LABEL_STUDIO}/setup")
    async def label_studio_setup(body: LabelStudioSetup) -> dict:
        """Label Studio's ``/setup``: check the model and the labelling config, answer the model's version."""
        needs_spans(service)
        labelling_config(body.schema_)
        return {"model_version": service.model_version}

    @app.post(f"{LABEL_STUDIO}/predict")
    async def label_studio_predict(body: LabelStudioTasks) -> dict:
        """Label Studio's ``/predict``: one prediction per task, in order, named as the labelling config names its
        ``<Labels>`` and ``<Text>``. Label Studio sends every task it asks about in one request, so the texts run
        through the batcher ``max_texts`` at a time."""
        needs_spans(service)
        config = labelling_config(body.label_config)
        texts = []
        for i, task in enumerate(body.tasks):
            text = task.get("data", {}).get(config.data_key) if isinstance(task.get("data"), dict) else None
            if not isinstance(text, str):
                raise HTTPException(422, f"tasks[{i}] (id {task.get('id')}) has no string data.{config.data_key}, "
                                         f"the field the labelling config's <Text name={config.to_name!r}> shows")
            texts.append(text)
        step = service.limits.max_texts
        predictions = []
        for start in range(0, len(texts), step):
            piece = texts[start:start + step]
            service.check(piece, "tasks")
            predictions += await service.run("predict", piece)
        results = [label_studio.prediction(label_studio.prediction_result(service.task.output_key, p, config),
                                           service.model_version) for p in predictions]
        return {"results": results, "model_version": service.model_version}
