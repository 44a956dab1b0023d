"""``zhie serve DIR``: an HTTP service for a trained (or exported) model, with request batching and a page at ``/``.

The start-up: :func:`serve` loads the model and runs the app of :func:`create_app` with uvicorn. The app is the service
(:mod:`zhie.deploy.service`: its limits, request batching and answers; the batching itself is
:mod:`zhie.deploy.batcher`) behind its gate (:mod:`zhie.deploy.gate`: the deadline for a request's head, the API key,
the requests in flight, the body's size), Label Studio's ML backend (:mod:`zhie.deploy.label_studio_backend`) and the
page.

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
  ``POST /label-studio/predict``), so that a project's "Connect model" takes ``http://HOST:PORT/label-studio``; with an
  API key, Label Studio's basic authentication carries it as the password.

Settings: :class:`Limits` (what a request may hold, requests in flight), :class:`Batching` (how requests become model
calls), the API key (:func:`read_api_key`). No request reads or writes a file: the page's files are read once, when
the app is created.
"""

from __future__ import annotations

import contextlib
import copy
import sys
from dataclasses import asdict, dataclass
from importlib import resources

from fastapi import FastAPI
from fastapi.responses import HTMLResponse, Response

from zhie.core.options import option, port_number, positive_int
from zhie.data import label_studio
from zhie.deploy.gate import Gate, header_timeout, read_api_key
from zhie.deploy.label_studio_backend import LABEL_STUDIO, add_label_studio_routes
from zhie.deploy.retrain import Retrainer, Retraining, served_model
from zhie.deploy.service import Batching, Limits, Service, add_api_routes, describe_api_routes
from zhie.precision import PRECISIONS
from zhie.version import __version__

__all__ = ["Batching", "Limits", "Retraining", "create_app", "read_api_key", "serve"]

PAGE_HEADERS = {"Content-Security-Policy": "default-src 'self'", "X-Content-Type-Options": "nosniff"}
PAGE_FILES = {"/": ("index.html", "text/html; charset=utf-8"), "/page.js": ("page.js", "text/javascript"),
              "/page.css": ("page.css", "text/css")}


def _page_files() -> dict[str, tuple[bytes, str]]:
    folder = resources.files("zhie.deploy") / "resources"
    return {route: ((folder / name).read_bytes(), kind) for route, (name, kind) in PAGE_FILES.items()}


def _add_page_routes(app: FastAPI) -> None:
    def add(route: str, content: bytes, kind: str) -> None:
        async def serve_file() -> Response:
            return (HTMLResponse if route == "/" else Response)(content, media_type=kind, headers=PAGE_HEADERS)

        app.get(route, include_in_schema=False)(serve_file)

    for route, (content, kind) in _page_files().items():
        add(route, content, kind)


def lifespan(service: Service, retrainer: Retrainer | None):
    """The app's lifespan: the service's (its batchers), and a training process ended when it ends."""
    @contextlib.asynccontextmanager
    async def run(app: FastAPI):
        try:
            async with service.lifespan(app):
                yield
        finally:
            if retrainer is not None:
                retrainer.stop()
    return run


def create_app(pipe, *, batching: Batching | None = None, limits: Limits | None = None,
               api_key: str | None = None, model_version: str | None = None, retraining: Retraining | None = None,
               model_dir: str | None = None) -> FastAPI:
    """The FastAPI app serving ``pipe`` (what :func:`zhie.load` returns). The batchers run while the app's lifespan
    does (uvicorn, or ``with TestClient(app)``); ``app.state.batchers`` maps ``"predict"`` and ``"embed"`` to them.
    ``model_version``: the model's version in Label Studio (:func:`zhie.data.label_studio.model_version`; default
    ``zhie-TASK``). ``retraining`` with a ``retrain_dir``: new versions of the model, whose directory is ``model_dir``,
    are trained from Label Studio (:mod:`zhie.deploy.retrain`; ``app.state.retrainer``)."""
    batching, limits = batching or Batching(), limits or Limits()
    service = Service(pipe, batching, limits, model_version)
    retrainer = None
    if retraining is not None and retraining.retrain_dir is not None:
        if model_dir is None:
            raise ValueError("retraining needs the served model's directory (model_dir)")

        def swap(path: str) -> str:  # in the retrainer's thread: load the new version, then serve it
            from zhie.deploy.pipeline import load

            version = label_studio.model_version(path, pipe.task.name)
            service.swap(load(path, device=str(getattr(pipe, "device", "cpu")),
                              precision=getattr(pipe, "precision", "fp32")), version)
            return version

        retrainer = Retrainer(retraining, model_dir, pipe.task.name, service.model_version, swap)
    settings = {"limits": asdict(limits) | {"max_body_bytes": limits.body_bytes}, "batching": asdict(batching)}
    app = FastAPI(title="zhie", version=__version__, lifespan=lifespan(service, retrainer),
                  description=f"A zhie {pipe.task.name} model: POST /predict with {{\"texts\": [...]}}.")
    app.state.batchers, app.state.service, app.state.retrainer = service.batchers, service, retrainer
    open_paths = {"/health", "/health/ready", f"{LABEL_STUDIO}/health", *PAGE_FILES, app.docs_url, app.redoc_url,
                  app.openapi_url, app.swagger_ui_oauth2_redirect_url}
    app.add_middleware(Gate, service=service, api_key=api_key, open_paths=frozenset(open_paths - {None}))
    add_api_routes(app, service, settings)
    add_label_studio_routes(app, service, retrainer)
    _add_page_routes(app)
    describe_api_routes(app)  # in what /openapi.json and /docs show
    return app


@dataclass
class ServeOptions:
    """The options of ``zhie serve`` besides :class:`Limits` and :class:`Batching` (:func:`serve`'s keywords take
    their defaults from here)."""

    host: str = option("127.0.0.1", "address to bind (loopback only by default)")
    port: int = option(8000, "TCP port (0: one the system picks)", type=port_number)
    api_key_file: str | None = option(None, "require 'Authorization: Bearer KEY' (all but /health, the page), KEY "
                                            "the file's first line; default: $ZHIE_API_KEY if set", metavar="FILE")
    api_key: str | None = option(None, "the key itself (visible in ps: prefer the file or ZHIE_API_KEY)")
    device: str | None = option(None, "cpu, cuda, ... (default: cuda if there is one)")
    precision: str = option("fp32", "the encoder's precision (bf16/fp16 under autocast; decoding stays fp32)",
                            choices=PRECISIONS)
    max_connections: int = option(512, "connections open at once, idle ones included (uvicorn's limit_concurrency: "
                                       "503 above)", type=positive_int)
    access_log: bool = option(False, "log a line per request (uvicorn's access log: 7 percent of the server's time at "
                                     "a thousand requests a second)")


def serve(model_dir: str, *, host: str = ServeOptions.host, port: int = ServeOptions.port,
          batching: Batching | None = None, limits: Limits | None = None, api_key: str | None = None,
          device: str | None = ServeOptions.device, precision: str = ServeOptions.precision,
          max_connections: int = ServeOptions.max_connections, retraining: Retraining | None = None,
          access_log: bool = ServeOptions.access_log) -> None:
    """Load ``model_dir`` (a model or export directory) in ``precision`` (:func:`zhie.load`) and serve it with uvicorn
    until interrupted: its HTTP/1.1 protocol is httptools' with a deadline and a size limit for a request's head
    (:class:`zhie.deploy.gate.HeaderTimeout`), on uvloop where it is installed. ``retraining``: new versions
    trained from Label Studio (:mod:`zhie.deploy.retrain`); the last one swapped in is served again on a restart."""
    import uvicorn

    from zhie.deploy.pipeline import load
    from zhie.tasks.base import resolve_model_dir

    model_dir = served_model(model_dir, retraining.retrain_dir if retraining else None)
    pipe = load(model_dir, device=device, precision=precision)
    version = label_studio.model_version(resolve_model_dir(model_dir), pipe.task.name)
    if host not in ("127.0.0.1", "localhost", "::1") and api_key is None:
        print(f"zhie serve: listening on {host} without an API key: anyone who can reach it can use the model",
              file=sys.stderr)
    app = create_app(pipe, batching=batching, limits=limits, api_key=api_key, model_version=version,
                     retraining=retraining, model_dir=model_dir)
    if app.state.retrainer is not None:
        app.state.retrainer.check_args()
    log_config = copy.deepcopy(uvicorn.config.LOGGING_CONFIG)  # zhie's records (a 500's traceback) with uvicorn's
    log_config["loggers"]["zhie"] = {"handlers": ["default"], "level": "INFO", "propagate": False}  # on stderr
    uvicorn.run(app, host=host, port=port, log_level="info", log_config=log_config, limit_concurrency=max_connections,
                access_log=access_log,
                http=header_timeout((limits or Limits()).header_timeout))
