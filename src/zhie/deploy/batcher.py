"""Request batching for the HTTP service (:mod:`zhie.deploy.serve`): a :class:`Batcher` gathers the texts of
concurrent requests into model calls run one at a time in a worker thread, off the event loop, and answers each
request with its results, or with the reason it got none (:class:`QueueFull`, :class:`WorkerStopped`,
:class:`TimedOut`).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

RETRY_AFTER_S = 1
logger = logging.getLogger(__name__)


class QueueFull(Exception):
    """The batcher's queue has no room for a request's texts (answered 503 with ``Retry-After``)."""


class WorkerStopped(Exception):
    """The batching worker is not running (answered 503): it was never started, was stopped, or failed."""


class TimedOut(Exception):
    """A request was not answered within the batcher's timeout (answered 504)."""


class Abandoned(Exception):
    """Every request of a model call has gone (timed out or disconnected): the call stops before its next pass."""


@dataclass(eq=False)
class _Job:
    texts: list[str]
    future: asyncio.Future
    since: float  # the loop's time when it was queued
    dequeued: bool = False  # taken by the worker, timed out or cancelled
    timer: asyncio.TimerHandle | None = field(default=None, repr=False)


class Batcher:
    """Runs ``fn(texts, cancelled) -> one result per text`` on the texts of concurrent :meth:`submit` calls gathered
    together; ``cancelled`` (a ``threading.Event``) is set once no request waits for the call's results any more, and
    ``fn`` may then stop (raise) between its steps.

    A worker coroutine (:meth:`run`, started by the app) waits until ``max_batch`` texts are queued or the oldest
    request has waited ``max_wait_ms``, then takes the oldest requests while they fit in ``max_batch`` texts (the
    oldest always: a request with more texts is a call of its own) and runs them in ``executor``. If ``fn`` raises on
    a call of several requests, each request is run again alone, so only the one that fails gets the error.

    At most ``max_queue`` texts wait (:class:`QueueFull` above); a request not answered within ``timeout`` seconds
    gets :class:`TimedOut` and leaves the queue (a call already running goes on, its result for it is dropped, and
    it is told to stop once none of its requests waits); a call running longer than ``timeout`` is :meth:`stuck`.
    ``state`` is ``"not started"``, ``"running"``, ``"stopped"`` or ``"failed: ..."``; ``calls`` and ``texts`` count
    the calls of ``fn`` and the texts they were given.
    """

    def __init__(self, fn: Callable[[list[str], threading.Event], list], executor: ThreadPoolExecutor, max_batch: int,
                 max_wait_ms: float, max_queue: int | None = None, timeout: float | None = None) -> None:
        if max_batch < 1 or max_wait_ms < 0 or (max_queue is not None and max_queue < 1):
            raise ValueError(f"need max_batch >= 1, max_wait_ms >= 0 and max_queue >= 1, got {max_batch}, "
                             f"{max_wait_ms} and {max_queue}")
        self.fn, self.executor = fn, executor
        self.max_batch, self.max_wait = max_batch, max_wait_ms / 1000
        self.max_queue, self.timeout = max_queue, timeout
        self.waiting: deque[_Job] = deque()
        self.queued = 0  # texts waiting
        self.running = 0  # texts in the model call under way
        self.running_since: float | None = None
        self.running_jobs: list[_Job] = []  # the requests of the call under way
        self.cancelled = threading.Event()  # the call under way's: set once none of running_jobs waits
        self.state = "not started"
        self.calls = 0
        self.texts = 0
        self._wake: asyncio.Event | None = None

    async def submit(self, texts: list[str]) -> list:
        """One result per text of ``texts``, in order (raises what ``fn`` raised on them, :class:`QueueFull`,
        :class:`WorkerStopped` or :class:`TimedOut`)."""
        if not texts:
            return []
        if self.state != "running" or self._wake is None:
            raise WorkerStopped(f"the batching worker is {self.state}")
        if self.max_queue is not None and len(texts) > self.max_queue:
            raise ValueError(f"{len(texts)} texts in one request can never fit the queue of {self.max_queue} texts; "
                             f"send at most {self.max_queue}")
        if self.max_queue is not None and self.queued + len(texts) > self.max_queue:
            raise QueueFull(f"{self.queued} texts are waiting and the queue holds {self.max_queue}; "
                            f"retry in {RETRY_AFTER_S} s")
        loop = asyncio.get_running_loop()
        job = _Job(list(texts), loop.create_future(), loop.time())
        if self.timeout is not None:
            job.timer = loop.call_later(self.timeout, self._expire, job)
        self.waiting.append(job)
        self.queued += len(job.texts)
        self._wake.set()
        try:
            return await job.future
        finally:
            if job.timer is not None:
                job.timer.cancel()
            self._drop(job)  # a request cancelled while waiting leaves the queue
            if self.running_jobs and all(j.future.done() for j in self.running_jobs):
                self.cancelled.set()  # no request waits for the call under way

    def _expire(self, job: _Job) -> None:
        dropped = "its result was dropped" if job.dequeued else "its texts were dropped"
        _settle(job.future, error=TimedOut(f"no answer within the timeout of {self.timeout:g} s; {dropped}"))
        self._drop(job)

    def _drop(self, job: _Job) -> None:
        if not job.dequeued:
            job.dequeued = True
            self.waiting.remove(job)
            self.queued -= len(job.texts)

    def report(self) -> dict:
        """The worker's state and load, for ``/health``."""
        loop_time = asyncio.get_running_loop().time()
        return {"state": self.state, "queued_texts": self.queued, "queued_requests": len(self.waiting),
                "max_queue": self.max_queue, "running_texts": self.running,
                "running_s": None if self.running_since is None else round(loop_time - self.running_since, 3)}

    def has_room(self) -> bool:
        return self.max_queue is None or self.queued < self.max_queue

    def stuck(self) -> str | None:
        """Why the model thread is taken to be stuck (the call under way has run longer than the timeout), or None."""
        if self.timeout is None or self.running_since is None:
            return None
        took = asyncio.get_running_loop().time() - self.running_since
        if took <= self.timeout:
            return None
        return f"the model call under way has run {took:.0f} s, longer than the timeout of {self.timeout:g} s"

    async def run(self) -> None:
        """Gather and run calls until cancelled; waiting requests get :class:`WorkerStopped` when it ends."""
        self._wake = asyncio.Event()
        self.state = "running"
        try:
            while True:
                await self._run(await self._next_call())
        except asyncio.CancelledError:
            self.state = "stopped"
            raise
        except BaseException as err:
            self.state = f"failed: {type(err).__name__}: {err}"
            logger.error("the batching worker %s", self.state, exc_info=err)
            raise
        finally:
            while self.waiting:
                job = self.waiting[0]
                self._drop(job)
                _settle(job.future, error=WorkerStopped(f"the batching worker is {self.state}"))

    async def _next_call(self) -> list[_Job]:
        """Wait for work, then until ``max_batch`` texts wait or the oldest has waited ``max_wait``; take the oldest
        requests that fit."""
        loop = asyncio.get_running_loop()
        while True:
            if self.waiting:
                left = self.waiting[0].since + self.max_wait - loop.time()
                if self.queued >= self.max_batch or left <= 0:
                    break
            self._wake.clear()
            timer = loop.call_later(left, self._wake.set) if self.waiting else None
            await self._wake.wait()
            if timer is not None:
                timer.cancel()
        jobs, n = [], 0
        while self.waiting and (not jobs or n + len(self.waiting[0].texts) <= self.max_batch):
            job = self.waiting[0]
            self._drop(job)
            jobs.append(job)
            n += len(job.texts)
        return jobs

    async def _call(self, jobs: list[_Job]) -> list:
        texts = [t for j in jobs for t in j.texts]
        self.calls += 1
        self.texts += len(texts)
        self.running, self.running_since = len(texts), asyncio.get_running_loop().time()
        self.running_jobs, self.cancelled = jobs, threading.Event()
        try:
            results = await asyncio.get_running_loop().run_in_executor(self.executor, self.fn, texts, self.cancelled)
        finally:
            self.running, self.running_since, self.running_jobs = 0, None, []
        if len(results) != len(texts):
            raise RuntimeError(f"the model returned {len(results)} results for {len(texts)} texts")
        return results

    async def _run(self, jobs: list[_Job]) -> None:
        jobs = [j for j in jobs if not j.future.done()]  # timed out meanwhile
        try:
            await self._run_jobs(jobs)
        except BaseException:  # the worker itself is ending: no request of the call is left waiting
            for job in jobs:
                _settle(job.future, error=WorkerStopped("the batching worker stopped during the model call"))
            raise

    async def _run_jobs(self, jobs: list[_Job]) -> None:
        if not jobs:
            return
        try:
            results = await self._call(jobs)
        except Exception as err:
            if len(jobs) == 1:
                _settle(jobs[0].future, error=err)
                return
            for job in jobs:  # find the request that fails; the others get their results
                if job.future.done():
                    continue
                try:
                    _settle(job.future, await self._call([job]))
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
