"""Label Studio's ML backend protocol on the HTTP service (:func:`add_label_studio_routes`), under
:data:`LABEL_STUDIO`, so that a project's "Connect model" takes ``http://HOST:PORT/label-studio``: ``GET
/label-studio/health``, ``POST /label-studio/setup``, ``POST /label-studio/predict``, ``POST /label-studio/webhook``
(Label Studio's events: ``START_TRAINING`` trains a new version of the model where ``zhie serve --retrain-dir`` is on,
:mod:`zhie.deploy.retrain`) and ``GET /label-studio/versions`` (the trainings and their state). With an API key, Label
Studio's basic authentication carries it as the password (:func:`zhie.deploy.gate.given_key`); the events of the
webhook that Label Studio adds for the backend come without it and are refused unread (401): no harm, as nothing but
``START_TRAINING``, which comes with it, is needed. The predictions' shape is :mod:`zhie.data.label_studio`'s; the
texts run through the service's batcher (:class:`zhie.deploy.service.Service`).
"""

from __future__ import annotations

import functools

from fastapi import FastAPI, HTTPException
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from zhie.data import label_studio
from zhie.deploy.retrain import Retrainer
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


class LabelStudioEvent(BaseModel):
    """An event that Label Studio sends to ``/webhook``: its ``action``, the ``project`` (an object with its ``id``),
    and more that zhie does not read."""

    model_config = ConfigDict(extra="allow")
    action: str
    project: dict | None = None


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


def add_label_studio_routes(app: FastAPI, service: Service, retrainer: Retrainer | None = None) -> None:
    """Label Studio's ML backend protocol under :data:`LABEL_STUDIO` (its URL in a project: ``http://HOST:PORT/label-
    studio``): ``GET /health``, ``POST /setup``, ``POST /predict``, ``POST /webhook``, ``GET /versions``;
    ``retrainer``: trains new versions on ``START_TRAINING`` (None: training is off)."""

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
        if retrainer is not None:
            extra = body.model_extra or {}
            retrainer.remember(extra.get("project"), extra.get("hostname"), extra.get("access_token"))
        return {"model_version": service.model_version}

    @app.post(f"{LABEL_STUDIO}/webhook")
    async def label_studio_webhook(event: LabelStudioEvent) -> JSONResponse:
        """Label Studio's events: ``START_TRAINING`` starts a training in the background (201); the others need
        nothing (200)."""
        if event.action != "START_TRAINING":
            return JSONResponse({"status": f"{event.action}: nothing to do (annotations are fetched when a training "
                                           "starts)"})
        if retrainer is None:
            raise HTTPException(400, "training is off: start zhie serve with --retrain-dir DIR to train new versions "
                                     "of the model from the project's annotations")
        project = (event.project or {}).get("id")
        if not isinstance(project, int) or isinstance(project, bool):
            raise HTTPException(422, "START_TRAINING without the project's id (project.id)")
        try:
            status = retrainer.start(str(project))
        except LookupError as err:
            raise HTTPException(400, str(err)) from None
        return JSONResponse({"status": status}, status_code=201)

    @app.get(f"{LABEL_STUDIO}/versions")
    async def label_studio_versions() -> dict:
        """The trainings: the state now (``idle``, ``fetching``, ``training``, ``scoring``, ``loading``) and a line per
        attempt (``versions.jsonl``); 404 when training is off."""
        if retrainer is None:
            raise HTTPException(404, "training is off: start zhie serve with --retrain-dir DIR")
        return retrainer.report()

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
