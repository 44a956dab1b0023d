"""``zhie serve --retrain-dir``: Label Studio's START_TRAINING trains a new version of the model in the background from
the project's annotations (fetched from a stand-in of Label Studio's export API here; benchmarks/label_studio.py
drives a real Label Studio server), and serves it only if it is not worse on the held-out tasks, while predictions go
on being answered."""

from __future__ import annotations

import json
import shutil
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

pytest.importorskip("fastapi")

from fastapi.testclient import TestClient  # noqa: E402

import zhie  # noqa: E402
from tests.tiny_models import nested_corpus, train_ner, trained  # noqa: E402
from zhie.data import write_ner_jsonl  # noqa: E402
from zhie.deploy.retrain import Retraining, held_out, served_model  # noqa: E402
from zhie.deploy.serve import create_app  # noqa: E402

CONFIG = """<View><Labels name="label" toName="text"><Label value="PER"/><Label value="LOC"/><Label value="ORG"/>
</Labels><Text name="text" value="$text"/></View>"""
TOKEN = "secret-token"
ARGS = "--epochs 6 --lr 2e-3 --head-lr 2e-3 --batch-size 8 --seed 0"


def export(examples, cancelled: int = 0) -> list[dict]:
    """Label Studio's JSON export of ``examples`` (the first ``cancelled`` annotations skipped by the annotator)."""
    return [{"id": i + 1, "data": {"text": ex.text}, "annotations": [{
        "id": 100 + i, "was_cancelled": i < cancelled, "result": [
            {"id": f"r{j}", "from_name": "label", "to_name": "text", "type": "labels",
             "value": {"start": s.start, "end": s.end, "text": s.text, "labels": [s.label]}}
            for j, s in enumerate(ex.spans)]}]} for i, ex in enumerate(examples)]


class LabelStudio:
    """A stand-in for Label Studio's export API (``GET /api/projects/ID/export``, token checked), as a context."""

    def __init__(self, projects: dict[int, list]) -> None:
        self.projects, self.asked = projects, []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's name)
                owner.asked.append((self.path, self.headers.get("Authorization")))
                project = self.path.split("/")[3] if self.path.startswith("/api/projects/") else ""
                if self.headers.get("Authorization") != f"Token {TOKEN}":
                    self.send_response(401)
                    self.end_headers()
                    return
                body = json.dumps(owner.projects.get(int(project) if project.isdigit() else -1)).encode()
                self.send_response(200 if project.isdigit() and int(project) in owner.projects else 404)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"

    def __enter__(self):
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()


@pytest.fixture(scope="module")
def weak_model(tmp_path_factory):
    """A NER model trained on 24 sentences for one epoch: annotations of more sentences make a better one."""
    return train_ner(tmp_path_factory.mktemp("weak"), "egp", n=24, epochs=1)


def served(model, tmp_path, min_tasks: int = 10, args: str = ARGS):
    pipe = zhie.load(model)
    app = create_app(pipe, model_dir=str(model), model_version="zhie-ner-v0",
                     retraining=Retraining(retrain_dir=str(tmp_path / "versions"), retrain_args=args,
                                           retrain_min_tasks=min_tasks))
    return app, TestClient(app)


def wait_idle(client, seconds: float = 300) -> dict:
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        report = client.get("/label-studio/versions").json()
        if report["state"] == "idle" and not report["queued"]:
            return report
        time.sleep(0.2)
    raise AssertionError(f"the training did not end in {seconds} s: {report}")


def start_training(client, project: int = 7):
    return client.post("/label-studio/webhook", json={"action": "START_TRAINING", "project": {"id": project}})


def test_start_training_serves_a_better_version_and_predictions_never_fail_meanwhile(weak_model, tmp_path):
    annotated = nested_corpus(80, seed=11)
    with LabelStudio({7: export(annotated, cancelled=2)}) as ls:
        app, client = served(weak_model, tmp_path)
        with client:
            setup = client.post("/label-studio/setup", json={"project": "7.1700000000", "schema": CONFIG,
                                                             "hostname": ls.url, "access_token": TOKEN})
            assert setup.json() == {"model_version": "zhie-ner-v0"}
            # the other events Label Studio sends to /webhook need nothing
            other = client.post("/label-studio/webhook", json={"action": "ANNOTATION_CREATED", "project": {"id": 7}})
            assert other.status_code == 200 and not ls.asked
            assert start_training(client).status_code == 201
            tasks = [{"id": i, "data": {"text": ex.text}} for i, ex in enumerate(nested_corpus(4, seed=3))]
            answers, versions = 0, set()
            while client.get("/label-studio/versions").json()["state"] != "idle":
                answer = client.post("/label-studio/predict", json={"tasks": tasks, "label_config": CONFIG})
                assert answer.status_code == 200, answer.text  # never a failed prediction during the training
                versions.add(answer.json()["model_version"])
                answers += 1
                time.sleep(0.2)  # a client every 0.2 s: the training, niced, gets the cores between
            report = wait_idle(client)
            assert answers > 0 and "zhie-ner-v0" in versions
            (line,) = report["versions"]
            assert line["annotated_tasks"] == 78  # the 2 cancelled annotations are not training data
            assert line["held_out_tasks"] == sum(held_out(ex.text) for ex in annotated[2:]) > 0
            assert line["held_out_f1_new"] > line["held_out_f1_current"], line  # 78 sentences beat 24 for 1 epoch
            assert line["swapped"] and line["model_version"] != "zhie-ner-v0"
            assert ls.asked == [("/api/projects/7/export?exportType=JSON&download_all_tasks=false", f"Token {TOKEN}")]
            after = client.post("/label-studio/predict", json={"tasks": tasks, "label_config": CONFIG}).json()
            assert after["model_version"] == line["model_version"] == report["model_version"]
            assert client.get("/label-studio/health").json()["model_version"] == line["model_version"]
            assert client.get("/info").json()["model_version"] == line["model_version"]
            # the version answers what the trained model answers
            new = zhie.load(line["model"])
            assert [r["value"]["start"] for r in after["results"][0]["result"]] == \
                [e.start for e in new.predict([tasks[0]["data"]["text"]])[0]]
    # a restarted service serves the last version swapped in, and trains the next one from it
    assert served_model(str(weak_model), str(tmp_path / "versions")) == line["model"]


def test_a_worse_version_is_not_served(weak_model, tmp_path):
    """Annotations that contradict the model (every mention labelled PER) make a version that scores worse on the
    held-out tasks than the model does, since they are scored against the same contradicting labels... so here the
    held-out tasks keep the right labels and only the training tasks are wrong."""
    good = nested_corpus(60, seed=12)
    tasks = export(good)
    for task, ex in zip(tasks, good):
        if not held_out(ex.text):
            for r in task["annotations"][0]["result"]:
                r["value"]["labels"] = ["PER"]
    strong = trained("ner-egp")  # 120 sentences, 4 epochs: shared with the other tests
    with LabelStudio({3: tasks}) as ls:
        app, client = served(strong, tmp_path)
        with client:
            client.post("/label-studio/setup", json={"project": "3.1", "schema": CONFIG, "hostname": ls.url,
                                                     "access_token": TOKEN})
            assert start_training(client, 3).status_code == 201
            (line,) = wait_idle(client)["versions"]
            assert line["held_out_f1_new"] < line["held_out_f1_current"], line
            assert not line["swapped"] and line["outcome"].startswith("kept zhie-ner-v0")
            assert client.get("/label-studio/health").json()["model_version"] == "zhie-ner-v0"
            # asked again with the same annotations: the same run, finished, is not trained again
            metrics = (tmp_path / "versions" / "runs" / line["run"].rsplit("/", 1)[-1] / "run" / "metrics.jsonl")
            before = metrics.read_bytes()
            assert start_training(client, 3).status_code == 201
            again = wait_idle(client)["versions"][-1]
            assert again["run"] == line["run"] and not again["swapped"] and metrics.read_bytes() == before
    assert served_model(str(strong), str(tmp_path / "versions")) == str(strong)


def test_what_cannot_train_is_said(weak_model, tmp_path, monkeypatch):
    monkeypatch.delenv("LABEL_STUDIO_URL", raising=False)
    monkeypatch.delenv("LABEL_STUDIO_API_KEY", raising=False)
    with LabelStudio({1: export(nested_corpus(6, seed=4)), 2: {"not": "a list"}}) as ls:
        app, client = served(weak_model, tmp_path)
        with client:
            unknown = start_training(client, 1)  # no /setup yet: nowhere to fetch from
            assert unknown.status_code == 400 and "LABEL_STUDIO_URL" in unknown.json()["detail"]
            assert start_training(client, None).status_code == 422
            for project in (1, 2):
                client.post("/label-studio/setup", json={"project": f"{project}.1", "schema": CONFIG,
                                                         "hostname": ls.url, "access_token": TOKEN})
            client.post("/label-studio/setup", json={"project": "9.1", "schema": CONFIG, "hostname": ls.url,
                                                     "access_token": "wrong"})
            for project in (1, 2, 9):
                assert start_training(client, project).status_code == 201
                wait_idle(client)
            few, not_a_list, refused = wait_idle(client)["versions"]
            assert few["outcome"].startswith("not trained: 6 annotated tasks") and not few["swapped"]
            assert "answered a JSON dict" in not_a_list["outcome"]
            assert "answered 401" in refused["outcome"] and "token" in refused["outcome"]
    # --retrain-dev: every annotated task trains, the file scores
    write_ner_jsonl(nested_corpus(7, seed=14), tmp_path / "dev.jsonl")
    with LabelStudio({1: export(nested_corpus(6, seed=4))}) as ls:
        app = create_app(zhie.load(weak_model), model_dir=str(weak_model), retraining=Retraining(
            retrain_dir=str(tmp_path / "with-dev"), retrain_dev=str(tmp_path / "dev.jsonl")))
        with TestClient(app) as client:
            client.post("/label-studio/setup", json={"project": "1.1", "schema": CONFIG, "hostname": ls.url,
                                                     "access_token": TOKEN})
            assert start_training(client, 1).status_code == 201
            (line,) = wait_idle(client)["versions"]
            assert (line["train_tasks"], line["held_out_tasks"]) == (6, 7), line
            assert line["scored_on"] == str(tmp_path / "dev.jsonl") and line["outcome"].startswith("not trained")
    off = TestClient(create_app(zhie.load(weak_model)))
    with off:
        answer = start_training(off)
        assert answer.status_code == 400 and "--retrain-dir" in answer.json()["detail"]
        assert off.get("/label-studio/versions").status_code == 404
    with pytest.raises(ValueError, match="is set for each training"):
        served(weak_model, tmp_path, args="--epochs 1 --out elsewhere")
    shutil.rmtree(tmp_path / "versions", ignore_errors=True)


def test_a_training_ends_with_the_service_and_leaves_its_checkpoint(weak_model, tmp_path):
    with LabelStudio({5: export(nested_corpus(40, seed=13))}) as ls:
        app, client = served(weak_model, tmp_path, args="--epochs 400 --save-every 5 --seed 0")
        with client:
            client.post("/label-studio/setup", json={"project": "5.1", "schema": CONFIG, "hostname": ls.url,
                                                     "access_token": TOKEN})
            assert start_training(client, 5).status_code == 201
            start = time.monotonic()
            while not list((tmp_path / "versions" / "runs").glob("*/run/checkpoint.pt")):
                assert time.monotonic() - start < 120, client.get("/label-studio/versions").json()
                time.sleep(0.2)
            process = app.state.retrainer.process
        # the service stopped: its training process with it, the run left to resume
        assert process.poll() is not None
        app.state.retrainer.wait()
        (line,) = app.state.retrainer.report()["versions"]
        assert not line["swapped"] and line["outcome"].startswith("failed")
        assert list((tmp_path / "versions" / "runs").glob("*/run/checkpoint.pt"))
