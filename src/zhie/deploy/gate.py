"""What a request to the HTTP service passes before its body is read (:class:`Gate`, ASGI middleware), and the API key
it checks (:func:`read_api_key`, :func:`given_key`).

Refusals, cheapest first, each from the headers: with ``api_key`` set, every request but ``/health``, the page and the
API description (``/``, its files, ``/docs``, ``/redoc``, ``/openapi.json``: static documents with no model output)
needs ``Authorization: Bearer KEY`` (401; Label Studio's basic authentication carries the key as the password); past
``max_in_flight`` requests in flight (not counting those open ones, which take no body: 413 unread) 503 with
``Retry-After``; a body larger than
``max_body_bytes`` 413 (its bytes are counted as they arrive, chunked bodies too, and reading stops at the limit);
past ``max_buffered_mb`` of bodies held across requests 503 with ``Retry-After``; a body not sent within
``body_timeout`` seconds 408. The
refusals that read the body are :class:`zhie.deploy.service.Service`'s.

Before all of these, the connection: a client that has not sent a request's whole line and headers within
``header_timeout`` seconds of connecting (or of its last answer, on a kept-alive connection) is cut off, the
connection closed without an answer, and a head of more than 16 kB is answered 431 (:class:`HeaderTimeout`,
uvicorn's HTTP/1.1 protocol with that deadline and that bound).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import os
import secrets
from functools import partial
from pathlib import Path

from fastapi.responses import JSONResponse
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from zhie.deploy.batcher import RETRY_AFTER_S
from zhie.deploy.service import API_ROUTES, Limits, Service

API_KEY_ENV = "ZHIE_API_KEY"
MAX_HEAD_BYTES = 16 * 1024  # a request's line and headers (h11's limit in uvicorn; 431 above)


class Gate:
    """ASGI middleware: what a request must pass before its body is read, cheapest first, each from the headers: the
    API key (401), the cap on requests in flight (503 with ``Retry-After``), the body's declared size (413); then it
    reads the body, counting the bytes as they arrive (413 and the connection closed at the first chunk past the
    limit), and hands the app the whole body; a POST to one of the service's API routes (``/predict``, ``/embed``,
    ``/similarity``: :data:`zhie.deploy.service.API_ROUTES`) it answers itself, with :meth:`Service.answer`, past
    FastAPI's routing (another method there gets 405). The ``open_paths`` (``/health``, the page, the API description)
    need no key and are not counted. ``service.in_flight`` counts the requests it let through that are not answered
    yet."""

    def __init__(self, app, service: Service, api_key: str | None, open_paths: frozenset[str]) -> None:
        self.app, self.service, self.api_key, self.open_paths = app, service, api_key, open_paths

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        if scope["path"] in self.open_paths:  # GET documents: a body is refused unread, before anything is buffered
            if headers.get(b"content-length", b"0") != b"0" or b"transfer-encoding" in headers:
                await _refuse(scope, receive, send, 413, f"{scope['path']} takes no request body")
                return
            await self.app(scope, receive, send)
            return
        if self.api_key is not None:
            if not secrets.compare_digest(given_key(headers.get(b"authorization", b"")), self.api_key.encode()):
                await _refuse(scope, receive, send, 401, "missing or wrong API key: send the header "
                              "'Authorization: Bearer KEY' (or Basic authentication with KEY as the password)",
                              {"WWW-Authenticate": "Bearer"})
                return
        if scope["path"] in API_ROUTES and scope["method"] != "POST":
            await _refuse(scope, receive, send, 405, f"{scope['path']} takes POST", {"Allow": "POST"})
            return
        limit = self.service.limits.max_in_flight
        if self.service.in_flight >= limit:
            await _refuse(scope, receive, send, 503, f"the server is busy: it has the most requests in flight it "
                          f"takes ({limit}, --max-in-flight); retry in {RETRY_AFTER_S} s",
                          {"Retry-After": str(RETRY_AFTER_S)})
            return
        self.service.in_flight += 1
        try:
            await self._read(scope, headers, receive, send)
        finally:
            self.service.in_flight -= 1

    async def _read(self, scope, headers: dict[bytes, bytes], receive, send) -> None:
        limits, service = self.service.limits, self.service
        limit, budget = limits.body_bytes, 1_000_000 * limits.max_buffered_mb
        length = headers.get(b"content-length", b"0").decode("latin-1")
        if not length.isdigit() or int(length) > limit:
            await _refuse(scope, receive, send, 413, f"request body of {length} bytes is over the limit of {limit} "
                                                     "bytes")
            return
        held = int(length)  # reserved as declared; a chunked body's bytes as they arrive
        if service.buffered + held > budget:
            await _busy(scope, receive, send, budget)
            return
        service.buffered += held
        try:
            # One buffer of the declared length, its pages touched as the bytes come (a chunked body's grows): not a
            # list of the parts to join, which holds the body twice and leaves the allocator's heap full of holes
            buf, size, more, refusal = bytearray(held), 0, True, None
            try:
                # one deadline for the whole body (a timer, not a task per message as asyncio.wait_for makes one)
                async with asyncio.timeout(limits.body_timeout):
                    while more:
                        message = await receive()
                        if message["type"] != "http.request":  # the client went away
                            return
                        chunk = message.get("body", b"")
                        size += len(chunk)
                        more = message.get("more_body", False)
                        if size > limit:
                            refusal = partial(_refuse, scope, receive, send, 413, f"request body over the limit of "
                                              f"{limit} bytes (reading stopped at {size} bytes)")
                            break
                        if size > held:  # past what was declared (chunked): held as it arrives, within the budget
                            if service.buffered + size - held > budget:
                                refusal = partial(_busy, scope, receive, send, budget)
                                break
                            service.buffered += size - held
                            held = size
                        buf[size - len(chunk):size] = chunk
            except TimeoutError:
                refusal = partial(_refuse, scope, receive, send, 408, f"the request body did not arrive within "
                                  f"{limits.body_timeout:g} s")
            if refusal is not None:  # sent outside the body's deadline, which must not cut an answer short
                await refusal()
                return
            body = bytes(memoryview(buf)[:size])
            del buf  # one copy of the body for the rest of the request
            if scope["path"] in API_ROUTES:  # answered here, past FastAPI's routing (Service.answer)
                status, content, extra = await service.answer(scope["path"], headers.get(b"content-type", b""), body)
                head = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(content))]
                head += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in extra.items()]
                await send({"type": "http.response.start", "status": status, "headers": head})
                await send({"type": "http.response.body", "body": content})
                return
            messages = [{"type": "http.request", "body": body, "more_body": False}]

            async def replay():
                return messages.pop() if messages else await receive()

            await self.app(scope, replay, send)
        finally:
            service.buffered -= held


class HeaderTimeout(HttpToolsProtocol):
    """uvicorn's HTTP/1.1 protocol (httptools, llhttp's C parser) with a deadline and a size limit for each request's
    head. A connection that has not sent a whole request line and headers within ``header_timeout`` seconds of being
    made, or of its last answer (a kept-alive connection), is closed unanswered; a head of more than ``MAX_HEAD_BYTES``
    (URL, header names and values) is answered 431 and the connection closed. uvicorn has neither: its keep-alive
    timeout starts after an answer and stops at the next byte, so a client that sends its headers a byte at a time
    (slowloris) would hold its connection, and a place under ``--max-connections``, for as long as it likes; and with
    httptools it keeps every header it is sent. Once a request's head has come, the deadline is the app's (the body's
    ``body_timeout``, the answer's ``timeout``). :func:`header_timeout` makes the class for a number of seconds
    (uvicorn creates the protocol itself, from its ``http=`` class).

    httptools, not h11 (uvicorn's pure-Python protocol, which bounds a head's size itself): 1.55x the requests a
    second on one core through zhie's whole app (``benchmarks/RESULTS.md``, "The service at student speed")."""

    header_timeout: float = Limits.header_timeout
    _head_timer: asyncio.TimerHandle | None = None
    _head_bytes = 0

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._await_head()

    def on_message_begin(self) -> None:
        self._head_bytes = 0
        super().on_message_begin()

    def on_url(self, url: bytes) -> None:
        self._count_head(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_head(len(name) + len(value) + 4)  # ": " and CRLF
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._stop_clock()  # a request's head has come: the app's deadlines take over (the body's, the answer's)
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        pipelined = bool(self.pipeline)  # the next request's head has come already: it starts now, on the app's clock
        super().on_response_complete()
        if not pipelined:
            self._await_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_clock()
        super().connection_lost(exc)

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a request the parser refused; 431 when it was refused for :meth:`_count_head`."""
        if self._head_bytes <= MAX_HEAD_BYTES:
            super().send_400_response(msg)
            return
        self.logger.info("%s:%d - closed: a request head over %d bytes", *(self.client or ("?", 0)), MAX_HEAD_BYTES)
        text = f"the request's line and headers are over {MAX_HEAD_BYTES} bytes".encode()
        self.transport.write(b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: text/plain; "
                             b"charset=utf-8\r\ncontent-length: %d\r\nconnection: close\r\n\r\n%s" % (len(text), text))
        self.transport.close()

    def _count_head(self, size: int) -> None:
        self._head_bytes += size
        if self._head_bytes > MAX_HEAD_BYTES:  # stops the parser: uvicorn answers with send_400_response
            raise ValueError(f"request head over {MAX_HEAD_BYTES} bytes")

    def _await_head(self) -> None:
        self._stop_clock()
        if not self.transport.is_closing():
            self._head_timer = self.loop.call_later(self.header_timeout, self._head_timed_out)

    def _stop_clock(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing():
            return
        self.logger.info("%s:%d - closed: no whole request head within %g s (--header-timeout)",
                         *(self.client or ("?", 0)), self.header_timeout)
        self.transport.close()


def header_timeout(seconds: float) -> type[HeaderTimeout]:
    """:class:`HeaderTimeout` closing connections after ``seconds`` without a whole request head: uvicorn's
    ``http=`` class."""
    return type("HeaderTimeout", (HeaderTimeout,), {"header_timeout": seconds})


async def _busy(scope, receive, send, budget: int) -> None:
    await _refuse(scope, receive, send, 503, f"the server holds the most request bytes it takes ({budget} across "
                                             f"requests, --max-buffered-mb); retry in {RETRY_AFTER_S} s",
                  {"Retry-After": str(RETRY_AFTER_S)})


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

