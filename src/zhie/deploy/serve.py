"""``zhie serve DIR``: an HTTP service for a trained (or exported) model, with request batching and a page at ``/``.

Over 400 lines: one HTTP app, its limits, gate, service and routes on one request's path; the request batching is
:mod:`zhie.deploy.batcher`.

Endpoints (:func:`create_app`):

* ``POST /predict {"texts": [...]}`` -> a list with, per text, the object ``zhie predict`` prints for it
  (``{"text": ..., "entities" | "words" | "relations" | "tasks" | "embedding": ...}``);
* ``POST /embed {"texts": [...]}`` -> per text ``{"text", "embedding"}`` (sentence-embedding models, and multi-task
  models with one sentence-embedding member); ``POST /similarity {"a": [...], "b": [...]}`` -> per pair
  ``{"a", "b", "similarity"}`` (the cosine);
* ``GET /health`` (live: 200 while the batching workers run and the model thread is not stuck, else 503) and
  ``GET /health/ready`` (ready: 200 while they are live and their queues have room, else 503), both with the reason,
  the workers' state and queue depth, the requests in flight, and never needing the key; ``GET /info`` (task, labels,
  encoder, zhie version, limits, batching), ``/docs``;
* ``GET /`` and its two files: the entity-highlighting page (``zhie/deploy/resources``);
* Label Studio's ML backend API under ``/label-studio`` (``GET /label-studio/health``, ``POST /label-studio/setup``,
  ``POST /label-studio/predict``: :func:`_add_label_studio_routes`), so that a project's "Connect model" takes
  ``http://HOST:PORT/label-studio``; with an API key, Label Studio's basic authentication carries it as the password.

Request batching (:class:`zhie.deploy.batcher.Batcher`, settings :class:`Batching`): the texts of concurrent requests
wait in a bounded queue; a worker takes the oldest requests, up to ``max_batch`` texts, once that many wait or the
oldest has waited ``max_wait_ms``, and runs them as one model call in one worker thread, off the event loop, one call
at a time. Inside the call the texts are sorted by length and cut into forward passes of at most ``batch_size`` texts,
each at least ``MIN_FILL`` text rather than padding (:func:`length_groups`). ``max_batch=1`` turns batching off.

Refusals, cheapest first (:class:`Gate`, before the body is read): with ``api_key`` set, every request but
``/health``, the page and the API description (``/``, its files, ``/docs``, ``/redoc``, ``/openapi.json``: static
documents with no model output) needs ``Authorization: Bearer KEY`` (401); past ``max_in_flight`` requests in flight
(not counting those open ones) 503 with ``Retry-After``; a body larger than ``max_body_bytes`` 413 (its bytes are
counted as they arrive, chunked bodies too, and reading stops at the limit). Then more than ``max_texts`` texts (pairs
for ``/similarity``) or a text longer than ``max_text_length`` characters is answered 413 with a message saying which
limit; malformed JSON, a wrong type or an unknown key 422; an empty list 200 with an empty list. A full queue is
answered 503 with ``Retry-After``; a configuration whose queue cannot hold one request of ``max_texts`` (two of them
for ``/similarity``) is refused when the app is created. A request not answered within ``timeout`` seconds gets 504,
and its texts are dropped if the model has not started on them; a call whose requests have all gone stops before its
next forward pass, and while a call has run longer than ``timeout`` (the model thread is stuck: a thread cannot be
killed) ``/health`` answers 503 and new requests 503 with ``Retry-After``, until it returns. A request that makes the
model fail is answered 500 alone, its traceback logged (``logging``, logger ``zhie.deploy.serve``): the batch it was in
is run again one request at a time, so the other requests of the batch get their results. No request reads or writes
a file: the page's files are read once, when the app is created.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import copy
import functools
import logging
import os
import secrets
import sys
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path

import numpy as np
from fastapi import FastAPI, HTTPException
from fastapi.responses import HTMLResponse, JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from zhie.data import label_studio
from zhie.deploy.batcher import RETRY_AFTER_S, Abandoned, Batcher, QueueFull, TimedOut, WorkerStopped
from zhie.version import __version__

PAGE_HEADERS = {"Content-Security-Policy": "default-src 'self'", "X-Content-Type-Options": "nosniff"}
PAGE_FILES = {"/": ("index.html", "text/html; charset=utf-8"), "/page.js": ("page.js", "text/javascript"),
              "/page.css": ("page.css", "text/css")}
API_KEY_ENV = "ZHIE_API_KEY"
MIN_FILL = 0.8  # a forward pass of the service is at least this much text, at most this much padding (length_groups)
LABEL_STUDIO = "/label-studio"  # the prefix of Label Studio's ML backend routes
logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Limits:
    """What the service takes in: texts per request (pairs for ``/similarity``), characters per text, bytes per body
    (default: room for ``max_texts`` texts of ``max_text_length`` characters, JSON-escaped), requests in flight
    (``/health``, the page and the API description not counted)."""

    max_texts: int = 256
    max_text_length: int = 10_000
    max_body_bytes: int | None = None
    max_in_flight: int = 256

    def __post_init__(self) -> None:
        if min(self.max_texts, self.max_text_length, self.max_in_flight) < 1:
            raise ValueError(f"need max_texts, max_text_length and max_in_flight >= 1, got {self}")

    @property
    def body_bytes(self) -> int:
        return self.max_body_bytes or 8 * self.max_texts * (self.max_text_length + 8) + 4096


@dataclass(frozen=True)
class Batching:
    """How requests become model calls: at most ``max_batch`` texts per call, gathered for at most ``max_wait_ms``
    after the oldest request came; forward passes of at most ``batch_size`` texts inside a call (``zhie predict``'s
    ``--batch-size``); at most ``max_queue`` texts waiting (503 above); ``timeout`` seconds for a request's answer
    (504 after; None: no limit)."""

    max_batch: int = 64
    max_wait_ms: float = 5.0
    batch_size: int = 32
    max_queue: int = 1024
    timeout: float | None = 30.0

    def __post_init__(self) -> None:
        if min(self.max_batch, self.batch_size, self.max_queue) < 1 or self.max_wait_ms < 0:
            raise ValueError(f"need max_batch, batch_size and max_queue >= 1 and max_wait_ms >= 0, got {self}")
        if self.timeout is not None and self.timeout <= 0:
            raise ValueError(f"the timeout must be a positive number of seconds, got {self.timeout}")


class Texts(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    texts: list[str]


class Pairs(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    a: list[str]
    b: list[str]


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


def length_groups(lengths: Sequence[int], batch_size: int, min_fill: float = MIN_FILL) -> list[list[int]]:
    """Indices of rows grouped into forward passes, longest first: at most ``batch_size`` rows per group, and a group
    ends before a row that would leave less than ``min_fill`` of its padded cells (rows x its longest) real.

    ``zhie predict`` sorts thousands of texts by length, so batches of ``batch_size`` of them are nearly all text; a
    service has only the texts in flight, and ``batch_size`` of them would be padded to the longest (People's Daily
    sentences: a third text, two thirds padding)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    groups: list[list[int]] = []
    group: list[int] = []
    cells = 0
    for i in order:
        if group and (len(group) == batch_size or cells + lengths[i] < min_fill * (len(group) + 1) * lengths[group[0]]):
            groups.append(group)
            group, cells = [], 0
        group.append(i)
        cells += lengths[i]
    return groups + [group] if group else groups


def describe(pipe) -> dict:
    """What ``GET /info`` answers: task, output key, labels (a multi-task model: per member), members, the task's
    configuration, encoder type, runtime, precision, zhie version."""
    task = pipe.task
    config = asdict(task.config)
    members = [{"name": m.head_name, "task": m.name} for m in getattr(task, "members", [])]
    model = pipe.model
    encoder = getattr(model, "encoder_config", None) or getattr(getattr(model, "encoder", None), "config", None)
    return {"task": task.name, "output_key": task.output_key, "labels": _labels(config), "members": members,
            "config": config, "encoder": getattr(encoder, "model_type", None),
            "runtime": getattr(model, "runtime", "torch"), "precision": getattr(pipe, "precision", "fp32"),
            "zhie_version": __version__,
            "embeddings": hasattr(pipe, "encode")}


def _labels(config: dict) -> list | dict:
    if "members" in config:
        return {m["name"]: _labels(m["config"]) for m in config["members"]}
    return config.get("labels") or config.get("predicates") or []


def _page_files() -> dict[str, tuple[bytes, str]]:
    folder = resources.files("zhie.deploy") / "resources"
    return {route: ((folder / name).read_bytes(), kind) for route, (name, kind) in PAGE_FILES.items()}


class Gate:
    """ASGI middleware: what a request must pass before its body is read, cheapest first, each from the headers: the
    API key (401), the cap on requests in flight (503 with ``Retry-After``), the body's declared size (413); then it
    reads the body, counting the bytes as they arrive (413 and the connection closed at the first chunk past the
    limit), and hands the app the whole body. The ``open_paths`` (``/health``, the page, the API description) need no
    key and are not counted. ``service.in_flight`` counts the requests it let through that are not answered yet."""

    def __init__(self, app, service: Service, api_key: str | None, open_paths: frozenset[str]) -> None:
        self.app, self.service, self.api_key, self.open_paths = app, service, api_key, open_paths

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if scope["path"] in self.open_paths:
            await self._read(scope, receive, send)
            return
        headers = dict(scope["headers"])
        if self.api_key is not None:
            if not secrets.compare_digest(given_key(headers.get(b"authorization", b"")), self.api_key.encode()):
                await _refuse(scope, receive, send, 401, "missing or wrong API key: send the header "
                              "'Authorization: Bearer KEY' (or Basic authentication with KEY as the password)",
                              {"WWW-Authenticate": "Bearer"})
                return
        limit = self.service.limits.max_in_flight
        if self.service.in_flight >= limit:
            await _refuse(scope, receive, send, 503, f"the server is busy: it has the most requests in flight it "
                          f"takes ({limit}, --max-in-flight); retry in {RETRY_AFTER_S} s",
                          {"Retry-After": str(RETRY_AFTER_S)})
            return
        self.service.in_flight += 1
        try:
            await self._read(scope, receive, send)
        finally:
            self.service.in_flight -= 1

    async def _read(self, scope, receive, send) -> None:
        limit = self.service.limits.body_bytes
        length = dict(scope["headers"]).get(b"content-length", b"0").decode("latin-1")
        if not length.isdigit() or int(length) > limit:
            await _refuse(scope, receive, send, 413, f"request body of {length} bytes is over the limit of {limit} "
                                                     "bytes")
            return
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            more = message.get("more_body", False)
            if size > limit:
                await _refuse(scope, receive, send, 413, f"request body over the limit of {limit} bytes (reading "
                                                         f"stopped at {size} bytes)")
                return
        body = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]

        async def replay():
            return body.pop() if body else await receive()

        await self.app(scope, replay, send)


def given_key(authorization: bytes) -> bytes:
    """The API key an ``Authorization`` header gives: ``Bearer KEY``, or ``Basic`` with KEY as the password (any user
    name: how Label Studio authenticates to an ML backend); b"" for anything else."""
    scheme, _, value = authorization.partition(b" ")
    if scheme.lower() == b"bearer":
        return value.strip()
    if scheme.lower() == b"basic":
        try:
            return base64.b64decode(value.strip(), validate=True).partition(b":")[2]
        except binascii.Error:
            return b""
    return b""


async def _refuse(scope, receive, send, status: int, detail: str, headers: dict[str, str] | None = None) -> None:
    """Answer ``status`` with ``detail`` and close the connection: the body, if any, is left unread."""
    await JSONResponse({"detail": detail}, status_code=status,
                       headers={**(headers or {}), "Connection": "close"})(scope, receive, send)


class Service:
    """What the routes do for one pipeline: check the limits, run texts through the batchers, shape the answers.
    ``batchers`` maps ``"predict"`` and ``"embed"`` to the :class:`Batcher` of each (one model thread for both)."""

    def __init__(self, pipe, batching: Batching, limits: Limits, model_version: str | None = None) -> None:
        per = 2 if hasattr(pipe, "encode") else 1  # /similarity embeds both texts of its pairs in one request
        if batching.max_queue < per * limits.max_texts:
            what = "/similarity request (two texts a pair)" if per == 2 else "request"
            raise ValueError(f"a queue of {batching.max_queue} texts (max_queue, --max-queue) cannot hold one {what} "
                             f"of max_texts (--max-texts {limits.max_texts}): it needs room for "
                             f"{per * limits.max_texts} texts, and would be answered 503 forever; give --max-queue "
                             f"{per * limits.max_texts} or more, or --max-texts {batching.max_queue // per} or fewer")
        self.pipe, self.task, self.batching, self.limits = pipe, pipe.task, batching, limits
        self.model_version = model_version or f"zhie-{pipe.task.name}"
        self.in_flight = 0  # requests let through by the Gate and not answered yet
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="zhie-model")
        self.batchers = {name: Batcher(fn, executor, batching.max_batch, batching.max_wait_ms, batching.max_queue,
                                       batching.timeout)
                         for name, fn in (("predict", self._predict), ("embed", self._embed))}

    def _grouped(self, fn: Callable[..., Sequence], texts: list[str], cancelled: threading.Event) -> list:
        """``fn(texts)`` in forward passes of similar lengths (:func:`length_groups`; characters stand for tokens),
        stopping before the next pass once ``cancelled`` is set (:class:`Abandoned`)."""
        size = self.batching.batch_size
        results: list = [None] * len(texts)
        groups = length_groups([len(t) + 2 for t in texts], size)
        for done, group in enumerate(groups):
            if cancelled.is_set():
                logger.warning("a model call of %d texts stopped after %d of its %d forward passes: none of its "
                               "requests waits any more", len(texts), done, len(groups))
                raise Abandoned(f"no request waits for this call; {done} of {len(groups)} forward passes ran")
            out = fn([texts[i] for i in group], batch_size=size)
            if len(out) != len(group):
                raise RuntimeError(f"the model returned {len(out)} results for {len(group)} texts")
            for i, result in zip(group, out):
                results[i] = result
        return results

    def _predict(self, texts: list[str], cancelled: threading.Event) -> list:  # in the model thread
        return [self.task.to_json(p) for p in self._grouped(self.pipe.predict, texts, cancelled)]

    def _embed(self, texts: list[str], cancelled: threading.Event) -> list:  # in the model thread
        return self._grouped(self.pipe.encode, texts, cancelled)

    def stuck(self) -> str | None:
        """Why the one model thread is taken to be stuck (:meth:`Batcher.stuck`; both batchers share it), or None."""
        return next((why for b in self.batchers.values() if (why := b.stuck())), None)

    @contextlib.asynccontextmanager
    async def lifespan(self, app: FastAPI):
        workers = [asyncio.create_task(b.run()) for b in self.batchers.values()]
        await asyncio.sleep(0)  # let the workers start
        try:
            yield
        finally:
            for w in workers:
                w.cancel()
            await asyncio.gather(*workers, return_exceptions=True)

    def check(self, texts: list[str], what: str = "texts") -> None:
        if len(texts) > self.limits.max_texts:
            raise HTTPException(413, f"{len(texts)} {what} in one request; the limit is {self.limits.max_texts}")
        for i, text in enumerate(texts):
            if len(text) > self.limits.max_text_length:
                raise HTTPException(413, f"{what}[{i}] has {len(text)} characters; the limit is "
                                         f"{self.limits.max_text_length}")

    async def run(self, name: str, texts: list[str]) -> list:
        """The batcher's results for ``texts``, its errors as HTTP answers."""
        if texts and (why := self.stuck()):
            raise HTTPException(503, f"the server cannot run the model now: {why}; retry in {RETRY_AFTER_S} s "
                                     "(GET /health says when it is free)", headers={"Retry-After": str(RETRY_AFTER_S)})
        try:
            return await self.batchers[name].submit(texts)
        except QueueFull as err:
            raise HTTPException(503, f"the server is busy: {err}",
                                headers={"Retry-After": str(RETRY_AFTER_S)}) from None
        except WorkerStopped as err:
            raise HTTPException(503, f"the server cannot run the model: {err}") from None
        except TimedOut as err:
            raise HTTPException(504, f"the request was not answered in time: {err}") from None
        except ValueError as err:  # the model refuses these texts
            raise HTTPException(400, str(err)) from None
        except Exception as err:
            logger.error("the model failed on a request to /%s; answered 500", name, exc_info=err)
            raise HTTPException(500, f"the model failed on this request ({type(err).__name__}); "
                                     "other requests are not affected") from None

    def needs_embeddings(self) -> None:
        if not hasattr(self.pipe, "encode"):
            raise HTTPException(404, f"this {self.task.name} model has no sentence embeddings; /embed and /similarity "
                                     "need a similarity model (or a multi-task model with a similarity member)")

    async def predict(self, body: Texts) -> JSONResponse:
        self.check(body.texts)
        results = await self.run("predict", body.texts)
        return JSONResponse([{"text": t, self.task.output_key: r} for t, r in zip(body.texts, results)])

    async def embed(self, body: Texts) -> JSONResponse:
        self.needs_embeddings()
        self.check(body.texts)
        vectors = await self.run("embed", body.texts)
        return JSONResponse([{"text": t, "embedding": [round(x, 6) for x in np.asarray(v, dtype=float).tolist()]}
                             for t, v in zip(body.texts, vectors)])

    async def similarity(self, body: Pairs) -> JSONResponse:
        self.needs_embeddings()
        if len(body.a) != len(body.b):
            raise HTTPException(422, f"a has {len(body.a)} texts and b {len(body.b)}; they are pairs")
        self.check(body.a, "a")
        self.check(body.b, "b")
        vectors = await self.run("embed", body.a + body.b)
        n = len(body.a)
        return JSONResponse([{"a": a, "b": b, "similarity": round(float(np.dot(u, v)), 6)}
                             for a, b, u, v in zip(body.a, body.b, vectors[:n], vectors[n:])])

    def needs_spans(self) -> None:
        if self.task.output_key not in label_studio.OUTPUT_KEYS:
            raise HTTPException(404, f"this {self.task.name} model has no Label Studio predictions: the ML backend "
                                     "routes serve NER, word segmentation and relation models")

    async def label_studio_setup(self, body: LabelStudioSetup) -> dict:
        """Label Studio's ``/setup``: check the model and the labelling config, answer the model's version."""
        self.needs_spans()
        labelling_config(body.schema_)
        return {"model_version": self.model_version}

    async def label_studio_predict(self, body: LabelStudioTasks) -> dict:
        """Label Studio's ``/predict``: one prediction per task, in order, named as the labelling config names its
        ``<Labels>`` and ``<Text>``. Label Studio sends every task it asks about in one request, so the texts run
        through the batcher ``max_texts`` at a time."""
        self.needs_spans()
        config = labelling_config(body.label_config)
        texts = []
        for i, task in enumerate(body.tasks):
            text = task.get("data", {}).get(config.data_key) if isinstance(task.get("data"), dict) else None
            if not isinstance(text, str):
                raise HTTPException(422, f"tasks[{i}] (id {task.get('id')}) has no string data.{config.data_key}, "
                                         f"the field the labelling config's <Text name={config.to_name!r}> shows")
            texts.append(text)
        step = self.limits.max_texts
        predictions = []
        for start in range(0, len(texts), step):
            piece = texts[start:start + step]
            self.check(piece, "tasks")
            predictions += await self.run("predict", piece)
        results = [label_studio.prediction(label_studio.prediction_result(self.task.output_key, p, config),
                                           self.model_version) for p in predictions]
        return {"results": results, "model_version": self.model_version}

    def health(self) -> tuple[dict, bool, bool]:
        """``/health``'s answer, whether every worker runs and the model thread is not stuck (live), and whether each
        worker also has room (ready); ``reason`` says why not."""
        workers = {name: b.report() for name, b in self.batchers.items()}
        stopped = next((f"the {name} batching worker is {b.state}" for name, b in self.batchers.items()
                        if b.state != "running"), None)
        full = next((f"the {name} queue is full ({b.queued} of {b.max_queue} texts)" for name, b in
                     self.batchers.items() if not b.has_room()), None)
        stuck = self.stuck()
        live = stopped is None and stuck is None
        ready = live and full is None
        status = "ok" if ready else "busy" if live else "stuck" if stopped is None else "unavailable"
        return {"status": status, "live": live, "ready": ready, "reason": stopped or stuck or full,
                "requests_in_flight": self.in_flight, "max_in_flight": self.limits.max_in_flight,
                "workers": workers}, live, ready


@functools.lru_cache(maxsize=16)
def labelling_config(xml: str | None) -> label_studio.LabelConfig:
    """The names a project's labelling config gives zhie's results (the defaults without one); 422 if it has none."""
    try:
        return label_studio.LabelConfig() if xml is None else label_studio.LabelConfig.parse(xml)
    except ValueError as err:
        raise HTTPException(422, str(err)) from None


def _add_label_studio_routes(app: FastAPI, service: Service) -> None:
    """Label Studio's ML backend protocol under :data:`LABEL_STUDIO` (its URL in a project: ``http://HOST:PORT/label-
    studio``): ``GET /health``, ``POST /setup``, ``POST /predict``."""
    @app.get(f"{LABEL_STUDIO}/health")
    async def label_studio_health() -> JSONResponse:
        body, live, _ = service.health()
        return JSONResponse({"status": "UP" if live else "DOWN", "model_class": f"zhie {service.task.name}",
                             "model_version": service.model_version, "reason": body["reason"]},
                            status_code=200 if live else 503)

    app.post(f"{LABEL_STUDIO}/setup")(service.label_studio_setup)
    app.post(f"{LABEL_STUDIO}/predict")(service.label_studio_predict)


def _add_api_routes(app: FastAPI, service: Service, info: dict) -> None:
    @app.get("/health")
    async def health() -> JSONResponse:
        body, live, _ = service.health()
        return JSONResponse(body, status_code=200 if live else 503)

    @app.get("/health/ready")
    async def ready() -> JSONResponse:
        body, _, is_ready = service.health()
        return JSONResponse(body, status_code=200 if is_ready else 503)

    @app.get("/info")
    async def get_info() -> dict:
        return info

    app.post("/predict", response_model=list[dict])(service.predict)
    app.post("/embed", response_model=list[dict])(service.embed)
    app.post("/similarity", response_model=list[dict])(service.similarity)


def _add_page_routes(app: FastAPI) -> None:
    def add(route: str, content: bytes, kind: str) -> None:
        async def serve_file() -> Response:
            return (HTMLResponse if route == "/" else Response)(content, media_type=kind, headers=PAGE_HEADERS)

        app.get(route, include_in_schema=False)(serve_file)

    for route, (content, kind) in _page_files().items():
        add(route, content, kind)


def create_app(pipe, *, batching: Batching | None = None, limits: Limits | None = None,
               api_key: str | None = None, model_version: str | None = None) -> FastAPI:
    """The FastAPI app serving ``pipe`` (what :func:`zhie.load` returns). The batchers run while the app's lifespan
    does (uvicorn, or ``with TestClient(app)``); ``app.state.batchers`` maps ``"predict"`` and ``"embed"`` to them.
    ``model_version``: the model's version in Label Studio (:func:`zhie.data.label_studio.model_version`; default
    ``zhie-TASK``)."""
    batching, limits = batching or Batching(), limits or Limits()
    service = Service(pipe, batching, limits, model_version)
    info = {**describe(pipe), "limits": asdict(limits) | {"max_body_bytes": limits.body_bytes},
            "batching": asdict(batching)}
    app = FastAPI(title="zhie", version=__version__, lifespan=service.lifespan,
                  description=f"A zhie {pipe.task.name} model: POST /predict with {{\"texts\": [...]}}.")
    app.state.batchers = service.batchers
    open_paths = {"/health", "/health/ready", f"{LABEL_STUDIO}/health", *PAGE_FILES, app.docs_url, app.redoc_url,
                  app.openapi_url, app.swagger_ui_oauth2_redirect_url}
    app.add_middleware(Gate, service=service, api_key=api_key, open_paths=frozenset(open_paths - {None}))
    _add_api_routes(app, service, info)
    _add_label_studio_routes(app, service)
    _add_page_routes(app)
    return app


def read_api_key(key: str | None = None, path: str | os.PathLike | None = None,
                 environ: dict[str, str] | None = None) -> str | None:
    """The API key: ``key`` (``--api-key``, visible to anyone who can list processes), else the first line of the
    file ``path`` (``--api-key-file``), else the environment variable ``ZHIE_API_KEY``; None when none is set."""
    environ = os.environ if environ is None else environ
    if key is not None and path is not None:
        raise ValueError("give the API key once: --api-key or --api-key-file, not both")
    where = "--api-key"
    if path is not None:
        key, where = Path(path).read_text(encoding="utf-8").split("\n", 1)[0].strip(), f"the file {path}"
    elif key is None and environ.get(API_KEY_ENV) is not None:
        key, where = environ[API_KEY_ENV].strip(), f"${API_KEY_ENV}"
    if key is not None and not key:
        raise ValueError(f"the API key from {where} is empty")
    return key


def serve(model_dir: str, *, host: str = "127.0.0.1", port: int = 8000, batching: Batching | None = None,
          limits: Limits | None = None, api_key: str | None = None, device: str | None = None,
          precision: str = "fp32") -> None:
    """Load ``model_dir`` (a model or export directory) in ``precision`` (:func:`zhie.load`) and serve it with uvicorn
    until interrupted."""
    import uvicorn

    from zhie.deploy.pipeline import load
    from zhie.tasks.base import resolve_model_dir

    pipe = load(model_dir, device=device, precision=precision)
    version = label_studio.model_version(resolve_model_dir(model_dir), pipe.task.name)
    if host not in ("127.0.0.1", "localhost", "::1") and api_key is None:
        print(f"zhie serve: listening on {host} without an API key: anyone who can reach it can use the model",
              file=sys.stderr)
    app = create_app(pipe, batching=batching, limits=limits, api_key=api_key, model_version=version)
    log_config = copy.deepcopy(uvicorn.config.LOGGING_CONFIG)  # zhie's records (a 500's traceback) with uvicorn's
    log_config["loggers"]["zhie"] = {"handlers": ["default"], "level": "INFO", "propagate": False}  # on stderr
    uvicorn.run(app, host=host, port=port, log_level="info", log_config=log_config)

