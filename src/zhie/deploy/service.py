"""The HTTP service's work for one pipeline (:class:`Service`): its settings (:class:`Limits`, :class:`Batching`), the
request bodies, the checks of the limits, the texts run through the request batchers, and the answers of ``/predict``,
``/embed``, ``/similarity``, ``/health`` and ``/info`` (:func:`add_api_routes`). The app around it is
:func:`zhie.deploy.serve.create_app`; what a request passes before its body is read, :class:`zhie.deploy.gate.Gate`.

Request batching (:class:`zhie.deploy.batcher.Batcher`, settings :class:`Batching`): the texts of concurrent requests
wait in a bounded queue; a worker takes the oldest requests, up to ``max_batch`` texts, once that many wait or the
oldest has waited ``max_wait_ms``, and runs them as one model call in one worker thread, off the event loop, one call
at a time. Inside the call the texts are sorted by length and cut into forward passes of at most ``batch_size`` texts,
each at least ``MIN_FILL`` text rather than padding (:func:`length_groups`). ``max_batch=1`` turns batching off.

Refusals, after the gate's: more than ``max_texts`` texts (pairs for ``/similarity``) or a text longer than
``max_text_length`` characters is answered 413 with a message saying which limit; malformed JSON, a wrong type or an
unknown key 422; an empty list 200 with an empty list. A full queue is answered 503 with ``Retry-After``; a
configuration whose queue cannot hold one request of ``max_texts`` (two of them for ``/similarity``) is refused when
the service is created. A request not answered within ``timeout`` seconds gets 504, and its texts are dropped if the
model has not started on them; a call whose requests have all gone stops before its next forward pass, and while a
call has run longer than ``timeout`` (the model thread is stuck: a thread cannot be killed) ``/health`` answers 503 and
new requests 503 with ``Retry-After``, until it returns. A request that makes the model fail is answered 500 alone, its
traceback logged (``logging``, logger ``zhie.deploy.serve``): the batch it was in is run again one request at a time,
so the other requests of the batch get their results.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass

import numpy as np
from fastapi import FastAPI, HTTPException
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel, ConfigDict, ValidationError

from zhie.core.options import option, positive_int
from zhie.deploy.batcher import RETRY_AFTER_S, Abandoned, Batcher, QueueFull, TimedOut, WorkerStopped
from zhie.version import __version__

MIN_FILL = 0.8  # a forward pass of the service is at least this much text, at most this much padding (length_groups)
logger = logging.getLogger("zhie.deploy.serve")  # the logger `zhie serve` documents for its 500s' tracebacks

@dataclass(frozen=True)
class Limits:
    """What the service takes in: texts per request (pairs for ``/similarity``), characters per text, bytes per body
    (default: room for ``max_texts`` texts of ``max_text_length`` characters, JSON-escaped), requests in flight
    (``/health``, the page and the API description not counted), the bytes of bodies held at once across requests
    (64 MB by default, three bodies at the default limit, far more text than the model runs within ``timeout``: the
    server's memory grows by about 2.5 times that, with their copies while parsed, ``benchmarks/hostile_load.py``),
    the seconds a client may take to send its body, and those it may take to send a request's line and headers
    (uvicorn has no such limit: :class:`zhie.deploy.gate.HeaderTimeout` closes the connection)."""

    max_texts: int = option(256, "texts per request, pairs for /similarity (413 above)", type=positive_int)
    max_text_length: int = option(10_000, "characters per text (413 above)", type=positive_int)
    max_body_bytes: int | None = option(None, "bytes per request body (413 above; default: room for --max-texts texts "
                                              "of --max-text-length characters, JSON-escaped)")
    max_in_flight: int = option(256, "requests in flight, /health and the page not counted (503 with Retry-After "
                                     "above)", type=positive_int)
    max_buffered_mb: int = option(64, "megabytes of request bodies held at once, across all requests (503 with "
                                      "Retry-After above): bounds the memory that clients can make the server hold "
                                      "(about 2.5 times this, with the bodies' copies while parsed)",
                                 type=positive_int)
    body_timeout: float = option(30.0, "seconds a client may take to send its request body (408 after): slow "
                                       "clients are cut off")
    header_timeout: float = option(10.0, "seconds a client may take to send a request's line and headers, from when "
                                         "it connects or had its last answer (the connection is closed after): "
                                         "clients that send their headers a byte at a time are cut off")

    def __post_init__(self) -> None:
        if min(self.max_texts, self.max_text_length, self.max_in_flight, self.max_buffered_mb) < 1:
            raise ValueError(f"need max_texts, max_text_length, max_in_flight and max_buffered_mb >= 1, got {self}")
        for name in ("body_timeout", "header_timeout"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be a positive number of seconds, got {getattr(self, name)}")

    @property
    def body_bytes(self) -> int:
        return self.max_body_bytes or 8 * self.max_texts * (self.max_text_length + 8) + 4096


@dataclass(frozen=True)
class Batching:
    """How requests become model calls: at most ``max_batch`` texts per call, gathered for at most ``max_wait_ms``
    after the oldest request came; forward passes of at most ``batch_size`` texts inside a call (16: a call of 64
    texts in passes of 32 ran a 128-wide student 5-8 % slower, ``benchmarks/RESULTS.md``); at most ``max_queue``
    texts waiting (503 above); ``timeout`` seconds for a request's answer (504 after; None: no limit)."""

    max_batch: int = option(64, "texts per model call, gathered across requests (1: no batching)", type=positive_int)
    max_wait_ms: float = option(0.0, "how long a call waits for more requests after the oldest came (0: it starts as "
                                     "soon as the model is free, and the requests that come during a call make the "
                                     "next one)")
    batch_size: int = option(16, "texts per forward pass inside a call, of similar lengths (half zhie predict's 32: "
                                 "a call holds only the texts in flight, and smaller passes follow their lengths)",
                             type=positive_int)
    max_queue: int = option(1024, "texts waiting for the model (503 with Retry-After above)", type=positive_int)
    timeout: float | None = option(30.0, "seconds a request may take (504 after; texts not yet run are dropped); 0: no "
                                         "limit")

    def __post_init__(self) -> None:
        if min(self.max_batch, self.batch_size, self.max_queue) < 1 or self.max_wait_ms < 0:
            raise ValueError(f"need max_batch, batch_size and max_queue >= 1 and max_wait_ms >= 0, got {self}")
        if self.timeout is not None and self.timeout < 0:
            raise ValueError(f"the timeout must be a positive number of seconds (0: none), got {self.timeout}")


class Texts(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    texts: list[str]


class Pairs(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    a: list[str]
    b: list[str]


# POST routes answered by the gate itself once it has read the body (Service.answer: the request model and the
# Service method): past FastAPI's routing, dependency solving and middleware, which cost a single-text request 0.12 ms
# of the 0.17 it spent on the server's event loop (benchmarks/RESULTS.md, "The service at student speed")
API_ROUTES: dict[str, tuple[type[BaseModel], str]] = {"/predict": (Texts, "predict"), "/embed": (Texts, "embed"),
                                                      "/similarity": (Pairs, "similarity")}


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
        self.buffered = 0  # bytes of request bodies the Gate holds (reserved as declared, or as they arrive)
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="zhie-model")
        self.batchers = {name: Batcher(fn, executor, batching.max_batch, batching.max_wait_ms, batching.max_queue,
                                       batching.timeout or None)  # 0: no limit
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
        pipe = self.pipe  # one model for the whole call, whatever swap() does meanwhile
        return [pipe.task.to_json(p) for p in self._grouped(pipe.predict, texts, cancelled)]

    def _embed(self, texts: list[str], cancelled: threading.Event) -> list:  # in the model thread
        return self._grouped(self.pipe.encode, texts, cancelled)

    def swap(self, pipe, model_version: str) -> None:
        """Serve ``pipe`` (a new version of the model: the same task and output) from the next model call on."""
        if (pipe.task.name, pipe.task.output_key) != (self.task.name, self.task.output_key):
            raise ValueError(f"cannot serve a {pipe.task.name} model in place of a {self.task.name} model")
        self.pipe, self.task, self.model_version = pipe, pipe.task, model_version

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

    async def predict(self, body: Texts) -> list[dict]:
        self.check(body.texts)
        results = await self.run("predict", body.texts)
        return [{"text": t, self.task.output_key: r} for t, r in zip(body.texts, results)]

    async def embed(self, body: Texts) -> list[dict]:
        self.needs_embeddings()
        self.check(body.texts)
        vectors = await self.run("embed", body.texts)
        return [{"text": t, "embedding": [round(x, 6) for x in np.asarray(v, dtype=float).tolist()]}
                for t, v in zip(body.texts, vectors)]

    async def similarity(self, body: Pairs) -> list[dict]:
        self.needs_embeddings()
        if len(body.a) != len(body.b):
            raise HTTPException(422, f"a has {len(body.a)} texts and b {len(body.b)}; they are pairs")
        self.check(body.a, "a")
        self.check(body.b, "b")
        vectors = await self.run("embed", body.a + body.b)
        n = len(body.a)
        return [{"a": a, "b": b, "similarity": round(float(np.dot(u, v)), 6)}
                for a, b, u, v in zip(body.a, body.b, vectors[:n], vectors[n:])]

    async def answer(self, path: str, content_type: bytes, body: bytes) -> tuple[int, bytes, dict[str, str]]:
        """The status, JSON body and extra headers of the answer to a POST of ``body`` to ``path``, one of
        :data:`API_ROUTES` (:class:`zhie.deploy.gate.Gate` calls it once it has read the body): 415 for a body that
        is not JSON by its ``Content-Type``, 422 with pydantic's errors (as FastAPI words them) for one that is not
        the route's request, else the route's answer, its refusals as ``{"detail": ...}``."""
        model, method = API_ROUTES[path]
        headers: dict[str, str] = {}
        kind = content_type.partition(b";")[0].strip().lower()
        if kind != b"application/json" and not (kind.startswith(b"application/") and kind.endswith(b"+json")):
            status, content = 415, {"detail": f"{path} takes a JSON body: send 'Content-Type: application/json' "
                                              f"(got {content_type.decode('latin-1')[:100]!r})"}
        else:
            try:
                status, content = 200, await getattr(self, method)(model.model_validate_json(body))
            except ValidationError as err:
                status, content = 422, {"detail": [{**e, "loc": ["body", *e["loc"]]}
                                                   for e in err.errors(include_url=False)]}
            except HTTPException as err:
                status, content, headers = err.status_code, {"detail": err.detail}, dict(err.headers or {})
        return status, json.dumps(content, ensure_ascii=False, separators=(",", ":"), default=str).encode(), headers

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
                "body_bytes_held": self.buffered,
                "workers": workers}, live, ready


def add_api_routes(app: FastAPI, service: Service, settings: dict) -> None:
    """The service's FastAPI routes: ``GET /health``, ``/health/ready``, ``/info`` (:func:`describe` of the model served
    now, its ``model_version`` and ``settings``). ``POST /predict``, ``/embed`` and ``/similarity`` are answered by
    :meth:`Service.answer` from the gate, past FastAPI's routing (:func:`describe_api_routes` puts them in the app's
    OpenAPI schema)."""
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
        return describe(service.pipe) | {"model_version": service.model_version} | settings


def describe_api_routes(app: FastAPI) -> None:
    """Add :data:`API_ROUTES` to the app's OpenAPI schema (what ``/openapi.json`` and ``/docs`` show; FastAPI keeps
    it once made): each a POST of its request model answering a list of objects, described by a route that FastAPI
    never runs (the gate answers them, :meth:`Service.answer`). Call it once the app has all its routes."""
    described = [APIRoute(path, {Texts: _texts, Pairs: _pairs}[model], methods=["POST"], response_model=list[dict],
                          summary=method) for path, (model, method) in API_ROUTES.items()]
    schema, ours = app.openapi(), get_openapi(title=app.title, version=app.version, routes=described)
    schema["paths"].update(ours["paths"])
    schema.setdefault("components", {}).setdefault("schemas", {}).update(ours["components"]["schemas"])


async def _texts(body: Texts) -> list[dict]:  # the description of a route taking Texts (describe_api_routes)
    raise NotImplementedError("a description: the gate answers this route (Service.answer)")


async def _pairs(body: Pairs) -> list[dict]:  # the description of a route taking Pairs (describe_api_routes)
    raise NotImplementedError("a description: the gate answers this route (Service.answer)")
