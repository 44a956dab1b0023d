"""``zhie serve DIR``: an HTTP service for a trained (or exported) model, with request batching and a page at ``/``.

Endpoints (:func:`create_app`):

* ``POST /predict {"texts": [...]}`` -> a list with, per text, the object ``zhie predict`` prints for it
  (``{"text": ..., "entities" | "words" | "relations" | "tasks" | "embedding": ...}``);
* ``POST /embed {"texts": [...]}`` -> per text ``{"text", "embedding"}`` (sentence-embedding models, and multi-task
  models with one sentence-embedding member); ``POST /similarity {"a": [...], "b": [...]}`` -> per pair
  ``{"a", "b", "similarity"}`` (the cosine);
* ``GET /health`` (never needs the key), ``GET /info`` (task, labels, encoder, zhie version, limits), ``/docs``;
* ``GET /`` and its two files: the entity-highlighting page (:mod:`zhie.resources`).

Request batching (:class:`Batcher`): the texts of concurrent requests are gathered into one model call of at most
``max_batch`` texts, waiting at most ``max_wait_ms`` after the first; the model runs in one worker thread, off the
event loop, one batch at a time. ``max_batch=1`` turns batching off (each request is one call).

Limits: more than ``max_texts`` texts, a text longer than ``max_text_length`` characters, or a body larger than
``max_body_bytes`` is answered 413 with a message saying which limit; malformed JSON, a wrong type or an unknown key
422; an empty list 200 with an empty list. A request that makes the model fail is answered 500 alone: the batch it was
in is run again one request at a time, so the other requests of the batch get their results. With ``api_key`` set,
every endpoint but ``/health``, the page and the API description (``/``, its files, ``/docs``, ``/openapi.json``:
static documents with no model output) needs ``Authorization: Bearer KEY``. No request reads or writes a file: the
page's files are read once, when the app is created.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from importlib import resources
from typing import Any

import numpy as np
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from pydantic import BaseModel, ConfigDict

from zhie.version import __version__

PAGE_HEADERS = {"Content-Security-Policy": "default-src 'self'", "X-Content-Type-Options": "nosniff"}
PAGE_FILES = {"/": ("index.html", "text/html; charset=utf-8"), "/page.js": ("page.js", "text/javascript"),
              "/page.css": ("page.css", "text/css")}


@dataclass(frozen=True)
class Limits:
    """What one request may send: texts per request, characters per text, bytes per body (default: room for
    ``max_texts`` texts of ``max_text_length`` characters, JSON-escaped)."""

    max_texts: int = 256
    max_text_length: int = 10_000
    max_body_bytes: int | None = None

    @property
    def body_bytes(self) -> int:
        return self.max_body_bytes or 8 * self.max_texts * (self.max_text_length + 8) + 4096


class Texts(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    texts: list[str]


class Pairs(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    a: list[str]
    b: list[str]


@dataclass
class _Job:
    texts: list[str]
    future: asyncio.Future


class Batcher:
    """Runs ``fn(texts) -> one result per text`` on the texts of concurrent :meth:`submit` calls gathered together.

    A worker coroutine (:meth:`run`, started by the app) takes the first waiting request, then adds waiting requests
    while the batch stays within ``max_batch`` texts and ``max_wait_ms`` has not passed since it took the first (a
    request with more than ``max_batch`` texts is a batch of its own). The batch runs in ``executor``. If ``fn``
    raises on a batch of several requests, each request is run again alone, so only the one that fails gets the
    error. ``calls`` and ``texts`` count the calls of ``fn`` and the texts they were given.
    """

    def __init__(self, fn: Callable[[list[str]], list], executor: ThreadPoolExecutor, max_batch: int,
                 max_wait_ms: float) -> None:
        if max_batch < 1 or max_wait_ms < 0:
            raise ValueError(f"need max_batch >= 1 and max_wait_ms >= 0, got {max_batch} and {max_wait_ms}")
        self.fn, self.executor = fn, executor
        self.max_batch, self.max_wait = max_batch, max_wait_ms / 1000
        self.queue: asyncio.Queue[_Job] | None = None
        self.calls = 0
        self.texts = 0

    async def submit(self, texts: list[str]) -> list:
        """One result per text of ``texts``, in order (raises what ``fn`` raised on them)."""
        if not texts:
            return []
        if self.queue is None:
            raise RuntimeError("the batcher is not running (the app's lifespan starts it)")
        job = _Job(list(texts), asyncio.get_running_loop().create_future())
        await self.queue.put(job)
        return await job.future

    async def run(self) -> None:
        """Gather and run batches until cancelled."""
        self.queue = asyncio.Queue()
        loop = asyncio.get_running_loop()
        carry: _Job | None = None
        while True:
            first = carry or await self.queue.get()
            carry = None
            jobs, n = [first], len(first.texts)
            deadline = loop.time() + self.max_wait
            while n < self.max_batch:
                try:
                    job = self.queue.get_nowait()
                except asyncio.QueueEmpty:
                    left = deadline - loop.time()
                    if left <= 0:
                        break
                    try:
                        job = await asyncio.wait_for(self.queue.get(), left)
                    except TimeoutError:
                        break
                if n + len(job.texts) > self.max_batch:
                    carry = job
                    break
                jobs.append(job)
                n += len(job.texts)
            await self._run(jobs)

    async def _call(self, texts: list[str]) -> list:
        self.calls += 1
        self.texts += len(texts)
        results = await asyncio.get_running_loop().run_in_executor(self.executor, self.fn, texts)
        if len(results) != len(texts):
            raise RuntimeError(f"the model returned {len(results)} results for {len(texts)} texts")
        return results

    async def _run(self, jobs: list[_Job]) -> None:
        jobs = [j for j in jobs if not j.future.done()]  # a client that went away cancelled its future
        if not jobs:
            return
        try:
            results = await self._call([t for j in jobs for t in j.texts])
        except Exception as err:
            if len(jobs) == 1:
                _settle(jobs[0].future, error=err)
                return
            for job in jobs:  # find the request that fails; the others get their results
                try:
                    _settle(job.future, await self._call(job.texts))
                except Exception as one:
                    _settle(job.future, error=one)
            return
        start = 0
        for job in jobs:
            _settle(job.future, results[start:start + len(job.texts)])
            start += len(job.texts)


def _settle(future: asyncio.Future, result: Any = None, error: BaseException | None = None) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


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
    folder = resources.files("zhie") / "resources"
    return {route: ((folder / name).read_bytes(), kind) for route, (name, kind) in PAGE_FILES.items()}


def create_app(pipe, *, max_batch: int = 32, max_wait_ms: float = 5.0, limits: Limits | None = None,
               api_key: str | None = None, batch_size: int = 32) -> FastAPI:
    """The FastAPI app serving ``pipe`` (what :func:`zhie.load` returns). ``batch_size``: windows per model batch
    inside one call. The batchers run while the app's lifespan does (uvicorn, or ``with TestClient(app)``);
    ``app.state.batchers`` maps ``"predict"`` and ``"embed"`` to them."""
    limits = limits or Limits()
    task = pipe.task
    info = {**describe(pipe), "limits": asdict(limits) | {"max_body_bytes": limits.body_bytes},
            "batching": {"max_batch": max_batch, "max_wait_ms": max_wait_ms}}
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="zhie-model")

    def predict(texts: list[str]) -> list:
        return [task.to_json(p) for p in pipe.predict(texts, batch_size=batch_size)]

    def embed(texts: list[str]) -> list:
        return list(pipe.encode(texts, batch_size=batch_size))

    batchers = {"predict": Batcher(predict, executor, max_batch, max_wait_ms),
                "embed": Batcher(embed, executor, max_batch, max_wait_ms)}

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        workers = [asyncio.create_task(b.run()) for b in batchers.values()]
        await asyncio.sleep(0)  # let the workers create their queues
        try:
            yield
        finally:
            for w in workers:
                w.cancel()
            await asyncio.gather(*workers, return_exceptions=True)

    app = FastAPI(title="zhie", version=__version__, lifespan=lifespan,
                  description=f"A zhie {task.name} model: POST /predict with {{\"texts\": [...]}}.")
    app.state.batchers = batchers
    page = _page_files()

    @app.middleware("http")
    async def body_limit(request: Request, call_next):
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > limits.body_bytes):
            return JSONResponse({"detail": f"request body of {length} bytes is over the limit of "
                                           f"{limits.body_bytes} bytes"}, status_code=413)
        return await call_next(request)

    def authorise(request: Request) -> None:
        if api_key is None:
            return
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(given.strip().encode(), api_key.encode()):
            raise HTTPException(401, "missing or wrong API key: send the header 'Authorization: Bearer KEY'",
                                headers={"WWW-Authenticate": "Bearer"})

    def check(texts: list[str], what: str = "texts") -> None:
        if len(texts) > limits.max_texts:
            raise HTTPException(413, f"{len(texts)} {what} in one request; the limit is {limits.max_texts}")
        for i, text in enumerate(texts):
            if len(text) > limits.max_text_length:
                raise HTTPException(413, f"{what}[{i}] has {len(text)} characters; the limit is "
                                         f"{limits.max_text_length}")

    async def run(name: str, texts: list[str]) -> list:
        try:
            return await batchers[name].submit(texts)
        except ValueError as err:  # the model refuses these texts
            raise HTTPException(400, str(err)) from None
        except Exception as err:
            print(f"zhie serve: {type(err).__name__}: {err}", file=sys.stderr)
            raise HTTPException(500, f"the model failed on this request ({type(err).__name__}); "
                                     "other requests are not affected") from None

    def needs_embeddings() -> None:
        if not hasattr(pipe, "encode"):
            raise HTTPException(404, f"this {task.name} model has no sentence embeddings; /embed and /similarity "
                                     "need a similarity model (or a multi-task model with a similarity member)")

    auth = [Depends(authorise)]

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok"}

    @app.get("/info", dependencies=auth)
    async def get_info() -> dict:
        return info

    @app.post("/predict", dependencies=auth)
    async def post_predict(body: Texts) -> list[dict]:
        check(body.texts)
        results = await run("predict", body.texts)
        return JSONResponse([{"text": t, task.output_key: r} for t, r in zip(body.texts, results)])

    @app.post("/embed", dependencies=auth)
    async def post_embed(body: Texts) -> list[dict]:
        needs_embeddings()
        check(body.texts)
        vectors = await run("embed", body.texts)
        return JSONResponse([{"text": t, "embedding": [round(float(x), 6) for x in v]}
                             for t, v in zip(body.texts, vectors)])

    @app.post("/similarity", dependencies=auth)
    async def post_similarity(body: Pairs) -> list[dict]:
        needs_embeddings()
        if len(body.a) != len(body.b):
            raise HTTPException(422, f"a has {len(body.a)} texts and b {len(body.b)}; they are pairs")
        check(body.a, "a")
        check(body.b, "b")
        vectors = await run("embed", body.a + body.b)
        n = len(body.a)
        return JSONResponse([{"a": a, "b": b, "similarity": round(float(np.dot(u, v)), 6)}
                             for a, b, u, v in zip(body.a, body.b, vectors[:n], vectors[n:])])

    def page_route(route: str) -> None:
        content, kind = page[route]

        async def serve_file() -> Response:
            return (HTMLResponse if route == "/" else Response)(content, media_type=kind, headers=PAGE_HEADERS)

        app.get(route, include_in_schema=False)(serve_file)

    for route in PAGE_FILES:
        page_route(route)
    return app


def serve(model_dir: str, *, host: str = "127.0.0.1", port: int = 8000, max_batch: int = 32,
          max_wait_ms: float = 5.0, limits: Limits | None = None, api_key: str | None = None,
          device: str | None = None, precision: str = "fp32") -> None:
    """Load ``model_dir`` (a model or export directory) in ``precision`` (:func:`zhie.load`) and serve it with uvicorn
    until interrupted."""
    import uvicorn

    import zhie

    pipe = zhie.load(model_dir, device=device, precision=precision)
    if host not in ("127.0.0.1", "localhost", "::1") and api_key is None:
        print(f"zhie serve: listening on {host} without --api-key: anyone who can reach it can use the model",
              file=sys.stderr)
    app = create_app(pipe, max_batch=max_batch, max_wait_ms=max_wait_ms, limits=limits, api_key=api_key)
    uvicorn.run(app, host=host, port=port, log_level="info")
