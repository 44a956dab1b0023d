"""zhie serve: every endpoint, limit and error case through FastAPI's TestClient; request batching counted on the
batcher's model calls; a full queue, a timeout and a dead worker made certain by a model call that waits on an event;
a chunked body and a refused API key sent to a real uvicorn; the page in a real headless Chromium (marked ``browser``,
skipped with its reason when playwright or Debian's chromium is missing). Tests write under ``tmp_path`` only."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import select
import shutil
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

pytest.importorskip("fastapi", reason="the serve extra (fastapi, uvicorn) is not installed")
from fastapi.testclient import TestClient  # noqa: E402

import zhie  # noqa: E402
from tests.tiny_models import trained  # noqa: E402
from zhie.cli import main  # noqa: E402
from zhie.deploy.batcher import Batcher  # noqa: E402
from zhie.deploy.gate import API_KEY_ENV, HeaderTimeout, header_timeout  # noqa: E402
from zhie.deploy.serve import Batching, Limits, create_app  # noqa: E402
from zhie.deploy.service import length_groups  # noqa: E402

NESTED = "吕洋琼在清宁县银行工作。"  # ORG 清宁县银行 with LOC 清宁县 inside (see tests/tiny_models.py)


@pytest.fixture(scope="module")
def ner_pipe():
    return zhie.load(trained("ner-gp"))


@pytest.fixture(scope="module")
def sim_pipe():
    return zhie.load(trained("similarity"))


def test_predict_answers_what_zhie_predict_prints(ner_pipe):
    texts = [NESTED, "", "许霞娜去了福江省。"]
    with TestClient(create_app(ner_pipe)) as client:
        r = client.post("/predict", json={"texts": texts})
    assert r.status_code == 200
    expected = [{"text": t, "entities": ner_pipe.task.to_json(p)} for t, p in zip(texts, ner_pipe.predict(texts))]
    assert r.json() == json.loads(json.dumps(expected))
    found = {(e["text"], e["label"]) for e in r.json()[0]["entities"]}
    assert {("清宁县银行", "ORG"), ("清宁县", "LOC")} <= found  # the nested pair
    assert r.json()[1]["entities"] == []


def test_health_info_docs_and_page(ner_pipe):
    with TestClient(create_app(ner_pipe, batching=Batching(max_batch=8, max_wait_ms=2))) as client:
        health = client.get("/health")
        assert health.status_code == 200 and client.get("/health/ready").status_code == 200
        assert health.json()["status"] == "ok" and health.json()["live"] and health.json()["ready"]
        assert health.json()["workers"]["predict"] == {"state": "running", "queued_texts": 0, "queued_requests": 0,
                                                       "max_queue": 1024, "running_texts": 0, "running_s": None}
        info = client.get("/info").json()
        assert info["task"] == "ner" and info["output_key"] == "entities"
        assert info["labels"] == ["LOC", "ORG", "PER"] and info["encoder"] == "bert"
        assert info["zhie_version"] == zhie.__version__ and info["runtime"] == "torch"
        assert info["batching"] == {"max_batch": 8, "max_wait_ms": 2, "batch_size": 16, "max_queue": 1024,
                                    "timeout": 30.0}
        assert client.get("/docs").status_code == 200
        paths = set(client.get("/openapi.json").json()["paths"])
        assert {"/predict", "/embed", "/similarity", "/info", "/health", "/health/ready"} <= paths
        page = client.get("/")
        assert page.status_code == 200 and "text/html" in page.headers["content-type"]
        assert page.headers["content-security-policy"] == "default-src 'self'"
        for name in ("page.js", "page.css"):
            body = client.get(f"/{name}")
            assert body.status_code == 200 and "http://" not in body.text and "https://" not in body.text
        script = client.get("/page.js").text
        assert ".innerHTML" not in script and "insertAdjacentHTML" not in script and "eval(" not in script
        for path in ("/zhie.json", "/../zhie.json", "/resources/index.html", "/page.js/../zhie.json"):
            assert client.get(path).status_code == 404  # nothing but the three page files is served


def test_empty_list_is_an_empty_answer_without_a_model_call(ner_pipe):
    app = create_app(ner_pipe)
    with TestClient(app) as client:
        r = client.post("/predict", json={"texts": []})
    assert r.status_code == 200 and r.json() == []
    assert app.state.batchers["predict"].calls == 0


def test_limits_answer_413_with_the_limit(ner_pipe):
    app = create_app(ner_pipe, limits=Limits(max_texts=3, max_text_length=20, max_body_bytes=2000))
    with TestClient(app) as client:
        r = client.post("/predict", json={"texts": ["好"] * 4})
        assert r.status_code == 413 and "4 texts" in r.json()["detail"] and "limit is 3" in r.json()["detail"]
        r = client.post("/predict", json={"texts": ["好", "长" * 21]})
        assert r.status_code == 413 and "texts[1] has 21 characters" in r.json()["detail"]
        r = client.post("/predict", content=b'{"texts": ["' + b"a" * 3000 + b'"]}',
                        headers={"content-type": "application/json"})
        assert r.status_code == 413 and "limit of 2000 bytes" in r.json()["detail"]
        assert client.post("/predict", json={"texts": ["好"] * 3}).status_code == 200  # at the limit
    assert app.state.batchers["predict"].calls == 1


def test_a_chunked_body_over_the_limit_is_413(ner_pipe):
    app = create_app(ner_pipe, limits=Limits(max_texts=3, max_text_length=20, max_body_bytes=2000))
    body = '{"texts": ["好"]'.encode() + b" " * 3000 + b"}"  # JSON within the text limits, too many bytes
    with TestClient(app) as client:
        r = client.post("/predict", content=(body[i:i + 500] for i in range(0, len(body), 500)),
                        headers={"content-type": "application/json"})
        assert "content-length" not in r.request.headers and r.request.headers["transfer-encoding"] == "chunked"
        assert r.status_code == 413 and "limit of 2000 bytes" in r.json()["detail"], r.text
        r = client.post("/predict", content=iter([b'{"texts": ', b'["\xe5\xa5\xbd"]}']),
                        headers={"content-type": "application/json"})
        assert r.status_code == 200 and r.json()[0]["text"] == "好"  # a chunked body within the limit
    assert app.state.batchers["predict"].calls == 1


@pytest.mark.parametrize("body", [b"{not json", b'{"texts": "one text"}', b'{"texts": [1, 2]}', b'{"texts": [null]}',
                                  b'{"text": ["a"]}', b'{"texts": ["a"], "extra": 1}', b"[]", b""])
def test_malformed_json_and_wrong_types_are_422(ner_pipe, body):
    with TestClient(create_app(ner_pipe)) as client:
        r = client.post("/predict", content=body, headers={"content-type": "application/json"})
        assert r.status_code == 422, r.text
        assert client.post("/predict", json={"texts": ["好"]}).status_code == 200  # the server is fine


def test_the_gates_api_routes_refuse_what_is_not_their_request(ner_pipe):
    """/predict, /embed and /similarity are answered by the gate (Service.answer), not FastAPI's router: a body that
    is not JSON by its Content-Type gets 415, another method 405, a wrong request 422 with pydantic's errors located
    in the body as FastAPI words them; /openapi.json still describes the three with their request models."""
    with TestClient(create_app(ner_pipe)) as client:
        for kind in (None, "text/plain", "application/x-www-form-urlencoded"):
            r = client.post("/predict", content=b'{"texts": ["a"]}', headers={"content-type": kind} if kind else {})
            assert r.status_code == 415 and "send 'Content-Type: application/json'" in r.json()["detail"], kind
        for kind in ("application/json; charset=utf-8", "application/vnd.zhie+json"):
            r = client.post("/predict", content=b'{"texts": ["a"]}', headers={"content-type": kind})
            assert r.status_code == 200 and r.json() == [{"text": "a", "entities": []}], kind
        r = client.get("/predict")
        assert r.status_code == 405 and r.headers["allow"] == "POST"
        r = client.post("/predict", json={"texts": ["a", 1]})
        assert r.status_code == 422
        assert r.json()["detail"] == [{"type": "string_type", "loc": ["body", "texts", 1],
                                       "msg": "Input should be a valid string", "input": 1}]
        r = client.post("/similarity", json={"a": ["a"]})
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "b"]
        schema = client.get("/openapi.json").json()
        for path, model in (("/predict", "Texts"), ("/embed", "Texts"), ("/similarity", "Pairs")):
            body = schema["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
            assert body == {"$ref": f"#/components/schemas/{model}"}, path
        assert set(schema["components"]["schemas"]["Pairs"]["properties"]) == {"a", "b"}


def test_api_key_guards_every_endpoint_but_health_and_the_page(ner_pipe, sim_pipe):
    with TestClient(create_app(ner_pipe, api_key="s3cret")) as client:
        for method, path, body in [("get", "/info", None), ("post", "/predict", {"texts": ["好"]}),
                                   ("post", "/embed", {"texts": ["好"]}), ("post", "/similarity", {"a": [], "b": []})]:
            for headers in [{}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"},
                            {"Authorization": "Basic s3cret"}]:
                r = client.request(method, path, json=body, headers=headers)
                assert r.status_code == 401, (path, headers)
                assert "Authorization: Bearer KEY" in r.json()["detail"]
        ok = {"Authorization": "Bearer s3cret"}
        assert client.get("/info", headers=ok).status_code == 200
        assert client.post("/predict", json={"texts": ["好"]}, headers=ok).status_code == 200
        assert client.get("/health").status_code == 200 and client.get("/").status_code == 200


def test_the_open_paths_refuse_a_body_without_reading_it(ner_pipe):
    """``/health``, the page and the API description need no key, and so take no body: a declared one (a length, or
    chunks) is refused at once, before a byte of it is read, so that keyless clients cannot make the server buffer
    bodies; without a body they answer as always."""
    app = create_app(ner_pipe, api_key="s3cret")
    with TestClient(app) as client:
        for path in ("/health", "/health/ready", "/", "/openapi.json", "/docs"):
            assert client.post(path, content=b"x" * 1_000_000).status_code == 413, path
            assert client.get(path).status_code in (200, 503), path
        reads = []

        async def receive():
            reads.append(1)
            return {"type": "http.request", "body": b"x" * 65536, "more_body": True}

        sent = []

        async def send(message):
            sent.append(message)

        for headers in ([(b"content-length", b"15000000")], [(b"transfer-encoding", b"chunked")]):
            scope = {"type": "http", "method": "POST", "path": "/health", "headers": headers, "query_string": b"",
                     "http_version": "1.1", "scheme": "http", "server": ("testserver", 80), "client": ("c", 1),
                     "root_path": ""}
            asyncio.run(app.middleware_stack(scope, receive, send))
            assert sent[0]["status"] == 413 and not reads
            sent.clear()


def _http(path: str, headers: list[tuple[bytes, bytes]]) -> dict:
    return {"type": "http", "method": "POST", "path": path, "headers": headers, "query_string": b"",
            "http_version": "1.1", "scheme": "http", "server": ("testserver", 80), "client": ("c", 1), "root_path": ""}


def test_the_bytes_held_across_requests_are_bounded_and_slow_bodies_cut_off(ner_pipe):
    """Bodies held at once count against --max-buffered-mb (a declared length is reserved before a byte is read, a
    chunked body as it arrives): past it 503 with Retry-After, and the bytes come back when a request ends; a body
    that does not arrive within --body-timeout gets 408."""
    app = create_app(ner_pipe, limits=Limits(max_texts=8, max_text_length=100_000, max_buffered_mb=1,
                                             body_timeout=0.3))
    with TestClient(app) as client:
        service_health = lambda: client.get("/health").json()["body_bytes_held"]  # noqa: E731

        async def race():
            sent, waiting = {}, asyncio.Event()

            def sender(name):
                async def send(message):
                    sent.setdefault(name, message)
                return send

            async def slow():  # a client that declared 600 kB and sends nothing for now
                await waiting.wait()
                return {"type": "http.disconnect"}

            async def never():
                await asyncio.sleep(10)

            first = asyncio.create_task(app.middleware_stack(_http("/predict", [(b"content-length", b"600000")]), slow,
                                                             sender("first")))
            await asyncio.sleep(0.05)
            held = app.state.service.buffered
            # a second 600 kB body would pass the 1 MB budget: refused at once, unread
            await app.middleware_stack(_http("/predict", [(b"content-length", b"600000")]), never, sender("second"))
            # a slow body is cut off
            await app.middleware_stack(_http("/predict", [(b"content-length", b"10")]), never, sender("slow"))
            waiting.set()
            await first
            return held, sent

        held, sent = asyncio.run(race())
        assert held == 600_000
        assert sent["second"]["status"] == 503 and (b"retry-after", b"1") in [
            (k.lower(), v) for k, v in sent["second"]["headers"]]
        assert sent["slow"]["status"] == 408
        assert service_health() == 0  # every byte given back
        assert client.post("/predict", json={"texts": ["好"]}).status_code == 200


def test_embed_and_similarity(sim_pipe, ner_pipe):
    texts = ["王伟在青山市工作。", "王伟在青山市工作。", "据远华集团消息，临江县将举办一场展览。"]
    with TestClient(create_app(sim_pipe)) as client:
        r = client.post("/embed", json={"texts": texts})
        assert r.status_code == 200 and [x["text"] for x in r.json()] == texts
        np.testing.assert_allclose([x["embedding"] for x in r.json()], sim_pipe.encode(texts), atol=1e-5)
        r = client.post("/similarity", json={"a": texts[:2], "b": texts[1:]})
        assert r.status_code == 200
        assert r.json()[0]["similarity"] == pytest.approx(1.0, abs=1e-5)
        np.testing.assert_allclose(r.json()[1]["similarity"], sim_pipe.similarity(texts[1], texts[2])[0], atol=1e-5)
        assert client.post("/similarity", json={"a": ["a"], "b": []}).status_code == 422
        assert client.post("/similarity", json={"a": [], "b": []}).json() == []
        assert client.get("/info").json()["embeddings"] is True
    with TestClient(create_app(ner_pipe)) as client:
        r = client.post("/embed", json={"texts": ["好"]})
        assert r.status_code == 404 and "no sentence embeddings" in r.json()["detail"]


# ----------------------------------------------------------------------------------------------- batching
def run_batcher(fn, requests: list[list[str]], max_batch: int, max_wait_ms: float = 50):
    """Submit ``requests`` concurrently to a running Batcher; returns (batcher, results or exceptions)."""
    async def go():
        batcher = Batcher(fn, ThreadPoolExecutor(1), max_batch, max_wait_ms)
        worker = asyncio.create_task(batcher.run())
        await asyncio.sleep(0)
        results = await asyncio.gather(*(batcher.submit(r) for r in requests), return_exceptions=True)
        worker.cancel()
        return batcher, results
    return asyncio.run(go())


def test_concurrent_requests_share_model_calls_up_to_max_batch():
    calls = []

    def fn(texts, cancelled):
        calls.append(list(texts))
        return [t.upper() for t in texts]

    requests = [[f"t{i}"] for i in range(8)] + [["a", "b"], []]
    batcher, results = run_batcher(fn, requests, max_batch=64)
    assert results == [[f"T{i}"] for i in range(8)] + [["A", "B"], []]
    assert batcher.calls == 1 and batcher.texts == 10 and calls == [[f"t{i}" for i in range(8)] + ["a", "b"]]

    calls.clear()
    batcher, results = run_batcher(fn, [[f"t{i}"] for i in range(8)], max_batch=3)
    assert [len(c) for c in calls] == [3, 3, 2] and results == [[f"T{i}"] for i in range(8)]

    calls.clear()
    batcher, results = run_batcher(fn, [["x"] * 5, ["y"]], max_batch=2)  # a request over max_batch runs alone
    assert calls == [["x"] * 5, ["y"]] and results == [["X"] * 5, ["Y"]]

    batcher, _ = run_batcher(fn, [[f"t{i}"] for i in range(4)], max_batch=1)  # batching off
    assert batcher.calls == 4


def test_a_failing_request_does_not_fail_the_others_in_its_batch():
    def fn(texts, cancelled):
        if "boom" in texts:
            raise RuntimeError("boom")
        return texts

    batcher, results = run_batcher(fn, [["a"], ["boom"], ["b", "c"]], max_batch=64)
    assert results[0] == ["a"] and results[2] == ["b", "c"] and isinstance(results[1], RuntimeError)
    assert batcher.calls == 4  # the batch, then each request alone


class FailsOnBoom:
    """A pipeline that fails on texts containing 'boom' and counts the texts it was given."""

    def __init__(self, pipe) -> None:
        self.pipe, self.task, self.model, self.seen = pipe, pipe.task, pipe.model, []

    def predict(self, texts, batch_size=32):
        self.seen.append(list(texts))
        if any("boom" in t for t in texts):
            raise RuntimeError("the model broke")
        return self.pipe.predict(texts, batch_size)


def test_concurrent_http_requests_are_batched_and_a_bad_one_stays_alone(ner_pipe):
    pipe = FailsOnBoom(ner_pipe)
    app = create_app(pipe, batching=Batching(max_batch=64, max_wait_ms=300))
    texts = [NESTED, "许霞娜去了福江省。", "赵娥在清西湾出版社工作。"] * 4
    expected = {t: json.loads(json.dumps(ner_pipe.task.to_json(p))) for t, p in zip(texts, ner_pipe.predict(texts))}
    batcher = app.state.batchers["predict"]
    with TestClient(app) as client, ThreadPoolExecutor(len(texts) + 1) as pool:
        answers = list(pool.map(lambda t: client.post("/predict", json={"texts": [t]}), texts))
        assert [r.json()[0]["entities"] for r in answers] == [expected[t] for t in texts]
        assert batcher.calls < len(texts) and max(map(len, pipe.seen)) > 1, pipe.seen  # 12 requests, fewer calls

        pipe.seen.clear()
        futures = [pool.submit(client.post, "/predict", json={"texts": [t]}) for t in texts]
        bad = pool.submit(client.post, "/predict", json={"texts": ["boom"]})
        answers = [f.result() for f in futures]
        assert bad.result().status_code == 500 and "other requests are not affected" in bad.result().json()["detail"]
        assert [r.json()[0]["entities"] for r in answers] == [expected[t] for t in texts]
        assert client.get("/health").status_code == 200


def test_a_call_runs_in_forward_passes_of_similar_lengths(ner_pipe):
    lengths = [50, 10, 48, 12, 200, 11, 49, 9]
    groups = length_groups(lengths, batch_size=3)
    assert groups == [[4], [0, 6, 2], [3, 5, 1], [7]]  # longest first, <= 3 rows, >= 80 % of each pass is text
    assert [len(g) for g in length_groups([5] * 70, 32)] == [32, 32, 6] and length_groups([], 32) == []

    pipe = FailsOnBoom(ner_pipe)
    texts = ["许霞娜去了福江省。" * 6, NESTED, "许霞娜去了福江省。" * 5 + NESTED[:8], "许霞娜去了福江省。"]
    with TestClient(create_app(pipe)) as client:
        r = client.post("/predict", json={"texts": texts})
    assert pipe.seen == [[texts[0], texts[2]], [texts[1], texts[3]]]  # one call, two forward passes
    assert r.json() == json.loads(json.dumps([{"text": t, "entities": ner_pipe.task.to_json(p)}
                                              for t, p in zip(texts, ner_pipe.predict(texts))]))


class Gate(FailsOnBoom):
    """A pipeline whose model calls wait for ``release`` (``entered`` is set when the first starts)."""

    def __init__(self, pipe) -> None:
        super().__init__(pipe)
        self.entered, self.release = threading.Event(), threading.Event()

    def predict(self, texts, batch_size=32):
        self.entered.set()
        if not self.release.wait(120):
            raise RuntimeError("the test never released the model call")
        return super().predict(texts, batch_size)


def wait_until(condition, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "the server never reached the state the test waits for"
        time.sleep(0.02)


def predict_worker(client) -> dict:
    return client.get("/health").json()["workers"]["predict"]


def test_a_full_queue_is_answered_503_with_retry_after_and_health_shows_the_depth(ner_pipe):
    pipe = Gate(ner_pipe)
    app = create_app(pipe, batching=Batching(max_batch=1, max_wait_ms=0, max_queue=2, timeout=60),
                     limits=Limits(max_texts=2))
    with TestClient(app) as client, ThreadPoolExecutor(2) as pool:
        running = pool.submit(client.post, "/predict", json={"texts": [NESTED]})
        assert pipe.entered.wait(60)
        queued = pool.submit(client.post, "/predict", json={"texts": ["甲", "乙"]})
        wait_until(lambda: predict_worker(client)["queued_texts"] == 2)
        health = client.get("/health")
        assert health.status_code == 200 and health.json()["live"] and not health.json()["ready"]
        assert health.json()["status"] == "busy" and client.get("/health/ready").status_code == 503
        worker = health.json()["workers"]["predict"]
        assert worker["state"] == "running" and worker["queued_requests"] == 1 and worker["running_texts"] == 1
        assert worker["running_s"] >= 0 and worker["max_queue"] == 2

        r = client.post("/predict", json={"texts": ["丙"]})
        assert r.status_code == 503 and r.headers["retry-after"] == "1", r.text
        assert "2 texts are waiting and the queue holds 2" in r.json()["detail"]
        pipe.release.set()
        assert running.result().status_code == 200 and queued.result().status_code == 200
        assert client.get("/health/ready").status_code == 200
    assert pipe.seen == [[NESTED], ["甲", "乙"]]  # the refused text never reached the model


def test_a_request_past_the_timeout_gets_504_and_its_texts_never_reach_the_model(ner_pipe):
    pipe = Gate(ner_pipe)
    app = create_app(pipe, batching=Batching(max_batch=1, max_wait_ms=0, timeout=2))
    with TestClient(app) as client, ThreadPoolExecutor(1) as pool:
        running = pool.submit(client.post, "/predict", json={"texts": [NESTED]})
        assert pipe.entered.wait(60)
        r = client.post("/predict", json={"texts": ["等得太久的句子"]})  # queued behind the call that waits
        assert r.status_code == 504 and "timeout of 2 s; its texts were dropped" in r.json()["detail"], r.text
        assert predict_worker(client)["queued_texts"] == 0
        pipe.release.set()
        assert running.result().status_code == 504 and "its result was dropped" in running.result().json()["detail"]
        wait_until(lambda: predict_worker(client)["running_texts"] == 0)
    assert pipe.seen == [[NESTED]]


class Crash(BaseException):
    """Not an Exception: what a request's error handling does not catch, so the batching worker dies of it."""


class Crashes(FailsOnBoom):
    def predict(self, texts, batch_size=32):
        raise Crash("the model thread was torn down")


def test_health_reports_a_dead_worker_and_requests_get_503(ner_pipe):
    with TestClient(create_app(Crashes(ner_pipe))) as client:
        assert client.get("/health").status_code == 200
        r = client.post("/predict", json={"texts": [NESTED]})
        assert r.status_code == 503 and "stopped during the model call" in r.json()["detail"], r.text
        health = client.get("/health")
        assert health.status_code == 503 and health.json()["status"] == "unavailable" and not health.json()["live"]
        assert health.json()["workers"]["predict"]["state"] == "failed: Crash: the model thread was torn down"
        assert health.json()["workers"]["embed"]["state"] == "running"
        assert client.get("/health/ready").status_code == 503
        r = client.post("/predict", json={"texts": [NESTED]})
        assert r.status_code == 503 and "worker is failed: Crash" in r.json()["detail"]


def test_a_call_past_the_timeout_fails_health_refuses_requests_and_stops_before_its_next_pass(ner_pipe):
    pipe = Gate(ner_pipe)
    app = create_app(pipe, batching=Batching(max_batch=8, max_wait_ms=0, batch_size=1, timeout=1))
    texts = [NESTED, "许霞娜去了福江省。"]  # one call, two forward passes of one text (the longer first)
    with TestClient(app) as client:
        r = client.post("/predict", json={"texts": texts})  # its first pass waits on the gate
        assert r.status_code == 504, r.text
        wait_until(lambda: client.get("/health").status_code == 503)
        health = client.get("/health").json()
        assert health["status"] == "stuck" and not health["live"] and not health["ready"]
        assert "longer than the timeout of 1 s" in health["reason"] and client.get("/health/ready").status_code == 503
        r = client.post("/predict", json={"texts": ["好"]})  # refused at once, not queued behind the stuck call
        assert r.status_code == 503 and r.headers["retry-after"] == "1", r.text
        assert "longer than the timeout of 1 s" in r.json()["detail"]
        pipe.release.set()
        wait_until(lambda: client.get("/health").status_code == 200)  # the call returned: live again
        assert client.get("/health").json()["reason"] is None
        assert client.post("/predict", json={"texts": ["好"]}).status_code == 200
    assert pipe.seen == [[NESTED], ["好"]]  # the abandoned call's second pass never ran


def test_a_queue_that_cannot_hold_one_similarity_request_is_refused_at_start_up(sim_pipe, ner_pipe, monkeypatch,
                                                                                 capsys):
    import uvicorn

    with pytest.raises(ValueError, match=r"a queue of 300 texts .* cannot hold one /similarity request .* needs room "
                                         r"for 512 texts.* give --max-queue 512 or more, or --max-texts 150 or fewer"):
        create_app(sim_pipe, batching=Batching(max_queue=300), limits=Limits(max_texts=256))
    create_app(ner_pipe, batching=Batching(max_queue=256), limits=Limits(max_texts=256))  # /predict: one per text
    served = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: served.update(app=app))
    assert main(["serve", str(trained("similarity")), "--max-queue", "300"]) == 2
    assert "give --max-queue 512 or more" in capsys.readouterr().err and not served
    app = create_app(sim_pipe, batching=Batching(max_queue=4), limits=Limits(max_texts=2))  # just enough room
    with TestClient(app) as client:
        r = client.post("/similarity", json={"a": ["甲", "乙"], "b": ["丙", "丁"]})
        assert r.status_code == 200 and len(r.json()) == 2

    async def too_many():  # a request that can never fit is told so, not to retry
        batcher = Batcher(lambda texts, cancelled: texts, ThreadPoolExecutor(1), 8, 0, max_queue=2)
        worker = asyncio.create_task(batcher.run())
        await asyncio.sleep(0)
        try:
            with pytest.raises(ValueError, match="3 texts in one request can never fit the queue of 2 texts"):
                await batcher.submit(["a", "b", "c"])
        finally:
            worker.cancel()

    asyncio.run(too_many())


def test_a_500_logs_its_traceback(ner_pipe, caplog):
    with caplog.at_level(logging.ERROR, logger="zhie.deploy.serve"), \
            TestClient(create_app(FailsOnBoom(ner_pipe))) as client:
        r = client.post("/predict", json={"texts": ["boom"]})
    assert r.status_code == 500
    (record,) = [r for r in caplog.records if r.name == "zhie.deploy.serve"]
    assert record.levelno == logging.ERROR and "the model failed on a request to /predict" in record.getMessage()
    traceback = logging.Formatter().formatException(record.exc_info)
    assert "Traceback" in traceback and "in predict" in traceback and "RuntimeError: the model broke" in traceback


def test_cli_serve_flags_and_errors(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    assert "--max-wait-ms" in capsys.readouterr().out
    assert main(["serve", str(tmp_path / "missing")]) == 2
    assert "no zhie.json" in capsys.readouterr().err
    for port in ("65536", "-1"):  # refused by the parser, before the model loads (not bind()'s OverflowError)
        with pytest.raises(SystemExit):
            main(["serve", str(tmp_path / "missing"), "--port", port])
        assert f"argument --port: must be a port number from 0 to 65535, got {port}" in capsys.readouterr().err


def test_cli_serve_loads_the_model_in_the_precision_asked(monkeypatch):
    import uvicorn

    served = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: served.update(app=app, **kw))
    assert main(["serve", str(trained("ner-gp")), "--precision", "bf16", "--port", "8123"]) == 0
    assert served["port"] == 8123 and served["limit_concurrency"] == 512  # --max-connections' default
    assert issubclass(served["http"], HeaderTimeout) and served["http"].header_timeout == 10
    log = served["log_config"]  # zhie's records (a 500's traceback) go where uvicorn's own errors go: stderr
    assert log["loggers"]["zhie"]["handlers"] == ["default"] and log["handlers"]["default"]["stream"] == "ext://sys.stderr"
    with TestClient(served["app"]) as client:
        info = client.get("/info").json()
        assert client.post("/predict", json={"texts": [NESTED]}).status_code == 200
    assert info["precision"] == "bf16"
    assert served["access_log"] is False  # a line per request costs 7 % of the server at 1,000 requests/s
    assert main(["serve", str(trained("ner-gp")), "--header-timeout", "2.5", "--access-log"]) == 0
    assert served["http"].header_timeout == 2.5 and served["access_log"] is True


def test_cli_serve_reads_the_api_key_from_a_file_or_the_environment(tmp_path, monkeypatch, capsys):
    import uvicorn

    served = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: served.update(app=app))
    model = str(trained("ner-gp"))
    (tmp_path / "key").write_text("from-file\nignored\n")
    monkeypatch.setenv(API_KEY_ENV, "from-env")
    for flags, key in [([], "from-env"), (["--api-key-file", str(tmp_path / "key")], "from-file"),
                       (["--api-key", "from-flag"], "from-flag")]:
        assert main(["serve", model, *flags]) == 0
        with TestClient(served.pop("app")) as client:
            assert client.get("/info", headers={"Authorization": "Bearer other"}).status_code == 401
            assert client.get("/info", headers={"Authorization": f"Bearer {key}"}).status_code == 200, flags
    (tmp_path / "empty").write_text("\n")
    assert main(["serve", model, "--api-key-file", str(tmp_path / "empty")]) == 2
    assert f"the API key from the file {tmp_path / 'empty'} is empty" in capsys.readouterr().err
    assert main(["serve", model, "--api-key-file", str(tmp_path / "missing")]) == 2
    assert "missing" in capsys.readouterr().err and not served  # nothing was served
    assert main(["serve", model, "--api-key", "a", "--api-key-file", str(tmp_path / "key")]) == 2
    assert "give the key once: --api-key-file FILE or --api-key KEY, not both" in capsys.readouterr().err
    assert not served


# ----------------------------------------------------------------------------------------------- the browser
def _chromium() -> tuple[str | None, str]:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return None, "playwright is not installed (pip install playwright; the browser is Debian's chromium)"
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path, ""
    return None, "Debian's chromium is not installed (apt-get install -y chromium)"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running(app, **config):
    """``app`` served by a real uvicorn on a free loopback port, in a thread, with the HTTP protocol of ``zhie serve``
    (``config``: more of uvicorn's settings); yields the port."""
    import uvicorn

    port = _free_port()
    config.setdefault("http", header_timeout(app.state.service.limits.header_timeout))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", **config))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.time() + 30
    while not server.started:
        assert time.time() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    try:
        yield port
    finally:
        server.should_exit = True
        thread.join(10)


@pytest.fixture
def live_server(ner_pipe):
    with running(create_app(ner_pipe)) as port:
        yield f"http://127.0.0.1:{port}"


def test_a_chunked_body_is_refused_at_the_limit_before_it_ends(ner_pipe):
    app = create_app(ner_pipe, limits=Limits(max_body_bytes=2000))
    with running(app) as port, socket.create_connection(("127.0.0.1", port), timeout=20) as s:
        chunk = b'{"texts": ["' + b"a" * 1000
        # 3036 bytes of a body that never ends (no last chunk), sent at once: the server reads them all before it
        # closes, so no unread byte turns its close into a reset that would drop the answer (RFC 9112, 9.6)
        s.sendall(b"POST /predict HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                  b"Transfer-Encoding: chunked\r\n\r\n" + b"%x\r\n%s\r\n" % (len(chunk), chunk) * 3)
        answer = b""
        while part := s.recv(65536):  # the server answers and closes while the body is still open
            answer += part
    assert answer.startswith(b"HTTP/1.1 413"), answer
    assert b"request body over the limit of 2000 bytes (reading stopped at" in answer


def test_a_wrong_api_key_is_refused_from_the_headers_before_the_body_is_read(ner_pipe):
    app = create_app(ner_pipe, api_key="s3cret")
    limit = Limits().body_bytes  # ~20 MB
    with running(app) as port:
        for length in (limit, 10 * limit):  # a body within the limit (401, not read), one over it (401, not 413)
            with socket.create_connection(("127.0.0.1", port), timeout=20) as s:
                s.sendall(b"POST /predict HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                          b"Authorization: Bearer wrong\r\nContent-Length: %d\r\n\r\n" % length + b'{"texts": [')
                answer = b""
                while part := s.recv(65536):  # answered and closed while the rest of the body is still to come
                    answer += part
            assert answer.startswith(b"HTTP/1.1 401"), answer
            assert b"Authorization: Bearer KEY" in answer
    assert app.state.batchers["predict"].calls == 0


def test_requests_past_max_in_flight_get_503_with_retry_after(ner_pipe):
    pipe = Gate(ner_pipe)
    app = create_app(pipe, limits=Limits(max_in_flight=1))
    with TestClient(app) as client, ThreadPoolExecutor(1) as pool:
        first = pool.submit(client.post, "/predict", json={"texts": [NESTED]})
        assert pipe.entered.wait(60)
        r = client.post("/predict", json={"texts": ["好"]})
        assert r.status_code == 503 and r.headers["retry-after"] == "1", r.text
        assert "the most requests in flight it takes (1, --max-in-flight)" in r.json()["detail"]
        health = client.get("/health")  # /health and the page are not counted
        assert health.status_code == 200 and health.json()["requests_in_flight"] == 1
        assert health.json()["max_in_flight"] == 1 and client.get("/").status_code == 200
        pipe.release.set()
        assert first.result().status_code == 200
        assert client.post("/predict", json={"texts": ["好"]}).status_code == 200  # room again
        assert client.get("/health").json()["requests_in_flight"] == 0
    assert pipe.seen == [[NESTED], ["好"]]


def _answer(s: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """The status, headers and body of the next answer on ``s`` (a body of its Content-Length, or up to the close)."""
    data = b""
    while b"\r\n\r\n" not in data:
        part = s.recv(65536)
        assert part, f"the connection closed before an answer's head: {data!r}"
        data += part
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    length = int(headers.get("content-length", -1))
    while (length < 0 or len(body) < length) and (part := s.recv(65536)):
        body += part
    return int(lines[0].split()[1]), headers, body


def _closed_after(sockets: dict[socket.socket, bytes], every: float = 0.1, limit: float = 10) -> list[float]:
    """Seconds until the server closed each of ``sockets`` unanswered, while each is sent its bytes one every
    ``every`` seconds (none: an idle connection)."""
    start, closed, sent = time.monotonic(), {}, dict.fromkeys(sockets, 0)
    while len(closed) < len(sockets):
        assert time.monotonic() - start < limit, f"still open after {limit} s"
        for s, data in sockets.items():
            if s not in closed and sent[s] < len(data):
                try:
                    sent[s] += s.send(data[sent[s]:sent[s] + 1])
                except OSError:  # reset: the server closed it
                    closed[s] = time.monotonic() - start
        for s in select.select([s for s in sockets if s not in closed], [], [], every)[0]:
            try:
                answer = s.recv(65536)
            except OSError:
                answer = b""
            assert answer == b"", f"a head that never ended was answered: {answer!r}"
            closed[s] = time.monotonic() - start
    return [closed[s] for s in sockets]


SLOW_HEAD = b"GET /health HTTP/1.1\r\nHost: localhost\r\nX-Slow: " + b"a" * 200  # never ends


def test_a_head_not_sent_within_the_header_timeout_is_cut_off(ner_pipe):
    """A connection that has not sent a whole request head within --header-timeout seconds of being made (an idle one,
    or one sending its headers a byte at a time), or of its last answer (kept alive), is closed unanswered, and the
    place it held under --max-connections is free again; a request whose head came in time is not cut off however
    long its answer takes."""
    pipe = Gate(ner_pipe)
    app = create_app(pipe, limits=Limits(header_timeout=1))
    with running(app, limit_concurrency=3) as port:
        connect = lambda: socket.create_connection(("127.0.0.1", port), timeout=20)  # noqa: E731
        with connect() as idle, connect() as slow:
            with connect() as third:  # the two hold their places: a third connection's request is refused
                third.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
                assert _answer(third)[0] == 503
            for seconds in _closed_after({idle: b"", slow: SLOW_HEAD}):
                assert 0.9 <= seconds < 3.5, seconds
        with connect() as kept:  # kept alive after an answer, then a slow head: cut off a timeout after the answer
            kept.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
            assert _answer(kept)[0] == 200
            (seconds,) = _closed_after({kept: SLOW_HEAD})
            assert 0.9 <= seconds < 3.5, seconds
        with connect() as s:  # the model call takes longer than the header timeout: answered all the same
            threading.Timer(2, pipe.release.set).start()
            body = json.dumps({"texts": [NESTED]}).encode()
            s.sendall(b"POST /predict HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            status, _, answer = _answer(s)
            assert status == 200 and json.loads(answer)[0]["text"] == NESTED
            s.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")  # and the connection is kept
            assert _answer(s)[0] == 200
    with pytest.raises(ValueError, match="header_timeout must be a positive number of seconds"):
        Limits(header_timeout=0)


def test_a_head_over_the_limit_is_answered_431_and_a_pipelined_head_that_came_is_not_cut_off(ner_pipe):
    """A request head (line and headers) over MAX_HEAD_BYTES is answered 431 and the connection closed, one just
    within is answered (httptools keeps every header it is sent: without the bound a client could fill the server's
    memory at its own pace). A request pipelined behind another sent its head in time: it is answered however long it
    takes, not cut off a header timeout after the first answer."""
    from zhie.deploy.gate import MAX_HEAD_BYTES

    pipe = Gate(ner_pipe)
    app = create_app(pipe, limits=Limits(header_timeout=1))
    line = b"GET /health HTTP/1.1\r\nHost: localhost\r\n"
    room = MAX_HEAD_BYTES - len(b"/health") - len(b"host") - len(b"localhost") - 4  # what X-Pad may take
    with running(app) as port:
        for pad, status in ((room - len("x-pad") - 4, 200), (room - len("x-pad") - 3, 431)):
            with socket.create_connection(("127.0.0.1", port), timeout=20) as s:
                s.sendall(line + b"X-Pad: " + b"a" * pad + b"\r\n\r\n")
                got, _, body = _answer(s)
                assert got == status, (pad, body)
                if status == 431:
                    assert body == b"the request's line and headers are over %d bytes" % MAX_HEAD_BYTES
                    assert s.recv(65536) == b""  # closed
        with socket.create_connection(("127.0.0.1", port), timeout=20) as s, s.makefile("rb") as answers:
            body = json.dumps({"texts": [NESTED]}).encode()
            threading.Timer(2.5, pipe.release.set).start()  # the second answer ends 2.5 s after the first
            s.sendall(line + b"\r\n" + b"POST /predict HTTP/1.1\r\nHost: localhost\r\nContent-Type: "
                      b"application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            for _ in range(2):  # both answers, in order
                status = answers.readline()
                assert status.startswith(b"HTTP/1.1 200 "), status
                headers = dict(h.lower().split(b":", 1) for h in iter(answers.readline, b"\r\n"))
                answer = answers.read(int(headers[b"content-length"]))
            assert json.loads(answer)[0]["text"] == NESTED


def test_over_a_socket_a_held_body_counts_against_the_budget_and_a_slow_one_gets_408(ner_pipe):
    """Through a real uvicorn: a body that is slow to come is held against --max-buffered-mb as declared (/health says
    so), a second one past the budget gets 503 with Retry-After at once, and the slow one 408 after --body-timeout;
    then every byte and every place in flight is given back."""
    app = create_app(ner_pipe, limits=Limits(max_texts=8, max_text_length=100_000, max_buffered_mb=1, body_timeout=2))
    post = (b"POST /predict HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            b"Content-Length: 600000\r\n\r\n")
    with running(app) as port:
        connect = lambda: socket.create_connection(("127.0.0.1", port), timeout=20)  # noqa: E731

        def health() -> dict:
            with connect() as s:
                s.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
                return json.loads(_answer(s)[2])

        with connect() as slow:
            start = time.monotonic()
            slow.sendall(post + b'{"texts": [')
            wait_until(lambda: health()["body_bytes_held"] == 600_000)
            assert health()["requests_in_flight"] == 1
            with connect() as second:
                second.sendall(post + b'{"texts": [')
                status, headers, body = _answer(second)
            assert status == 503 and headers["retry-after"] == "1" and b"--max-buffered-mb" in body, body
            status, _, body = _answer(slow)
            assert status == 408 and b"did not arrive within 2 s" in body and time.monotonic() - start >= 1.9, body
        assert (health()["body_bytes_held"], health()["requests_in_flight"]) == (0, 0)
        with connect() as s:
            body = json.dumps({"texts": ["好"]}).encode()
            s.sendall(post.replace(b"600000", b"%d" % len(body)) + body)
            assert _answer(s)[0] == 200


@pytest.mark.browser
def test_page_in_headless_chromium_shows_nested_entities_and_escapes_text(live_server, ner_pipe, tmp_path):
    executable, reason = _chromium()
    if executable is None:
        print(f"SKIPPED browser test: {reason}")
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    text = NESTED + " <script>window.pwned=1</script> & <b>粗</b> 许霞娜去了福江省。"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, headless=True, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 900, "height": 560}, device_scale_factor=1)
        errors = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(live_server + "/")
        # selectors, not wait_for_function: its polling evaluates a string in the page, which the page's CSP (no
        # 'unsafe-eval') refuses whenever the condition is not already true at the first look
        page.wait_for_selector("#model:not(:empty)")
        page.fill("#text", text)
        page.click("#run")
        page.wait_for_selector("section.result .ent")
        boxes = page.eval_on_selector_all("section.result .doc .ent", """els => els.map(e => {
            const outer = e.parentElement.closest('.ent');
            return [e.textContent, e.dataset.label, outer ? outer.dataset.label : null, e.title];
        })""")
        (predicted,) = ner_pipe.predict([text])
        assert sorted((b[0], b[1]) for b in boxes) == sorted((s.text, s.label) for s in predicted)
        nested = {(b[0], b[1], b[2]) for b in boxes}
        assert ("清宁县", "LOC", "ORG") in nested and ("清宁县银行", "ORG", None) in nested  # LOC drawn inside ORG
        assert all(b[3].startswith(b[1] + " · score ") for b in boxes)  # label and score on hover
        doc = page.inner_text("section.result .doc")
        assert "<script>window.pwned=1</script> & <b>粗</b>" in doc  # shown as text ...
        assert page.evaluate("window.pwned") is None and page.query_selector("section.result b") is None  # ... not run
        legend = page.eval_on_selector_all("#legend .chip", "els => els.map(e => e.textContent)")
        assert {"LOC", "ORG", "PER"} <= set(legend)
        assert not errors
        page.fill("#text", "吕洋琼在清宁县银行工作，蔡涛勇毕业于新平省基金会，住在湖南区。")
        page.click("#run")
        page.locator("section.result .doc", has_text=re.compile("^吕洋琼")).first.wait_for()
        page.screenshot(path=str(tmp_path / "serve_page.png"), full_page=True)  # a test writes under tmp_path only
        browser.close()
    assert (tmp_path / "serve_page.png").read_bytes().startswith(b"\x89PNG")
