"""Label Studio: its JSON export read for NER, word segmentation and relations (errors named file:line: task), zhie's
predictions written as its pre-annotations (``zhie predict --output-format label-studio``), and ``zhie serve``'s ML
backend routes (``/label-studio/health``, ``/setup``, ``/predict``). A real Label Studio server is driven by
``benchmarks/label_studio.py`` (the last test runs it when asked: ``ZHIE_LABEL_STUDIO=1``)."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tiny_models import nested_corpus, trained
from zhie import encoders
from zhie.cli import main
from zhie.core.spans import Span
from zhie.data import DataError, NerExample, label_studio, read_ner
from zhie.data.ner import detect_format
from zhie.tasks.cws import CwsTask
from zhie.tasks.ner import NerTask
from zhie.tasks.ner_heads import NerConfig
from zhie.tasks.relation import RelationTask

CONFIG = """<View>
  <Labels name="label" toName="text"><Label value="PER"/><Label value="LOC"/><Label value="ORG"/></Labels>
  <Text name="text" value="$text"/>
</View>"""


def region(rid: str, start: int, end: int, text: str, *labels: str) -> dict:
    return {"id": rid, "from_name": "label", "to_name": "text", "type": "labels",
            "value": {"start": start, "end": end, "text": text[start:end], "labels": list(labels)}}


def export_of(examples: list[NerExample]) -> list[dict]:
    """What Label Studio's JSON export holds for ``examples`` annotated once each."""
    return [{"id": i + 1, "data": {"text": ex.text}, "predictions": [],
             "annotations": [{"id": 100 + i, "was_cancelled": False, "ground_truth": False,
                              "created_at": "2026-01-01T00:00:00.000000Z", "updated_at": "2026-01-01T00:00:00.000000Z",
                              "result": [region(f"r{j}", s.start, s.end, ex.text, s.label)
                                         for j, s in enumerate(ex.spans)]}]}
            for i, ex in enumerate(examples)]


def write(path: Path, tasks: list[dict]) -> Path:
    path.write_text(json.dumps(tasks, ensure_ascii=False, indent=2), encoding="utf-8")
    return path


def test_an_export_is_detected_and_read_as_it_was_labelled_nested_spans_too(tmp_path):
    examples = nested_corpus(12, seed=5)
    path = write(tmp_path / "export.json", export_of(examples))
    assert detect_format(path) == "label-studio"
    labelled = [NerExample(ex.text, sorted(ex.spans)) for ex in examples]
    assert read_ner(path) == read_ner(path, "label-studio") == labelled
    cmeee = tmp_path / "cmeee.json"  # another JSON list is still CMeEE
    cmeee.write_text(json.dumps([{"text": "北京", "entities": []}]), encoding="utf-8")
    assert detect_format(cmeee) == "cmeee"


def test_which_annotation_is_taken_and_unannotated_tasks_are_left_out(tmp_path, caplog):
    text = "王伟去了青山市。"
    old = {"id": 1, "updated_at": "2026-01-01T00:00:00Z", "result": [region("a", 0, 2, text, "PER")]}
    new = {"id": 2, "updated_at": "2026-02-01T00:00:00Z", "result": [region("a", 4, 7, text, "LOC")]}
    cancelled = {"id": 3, "updated_at": "2026-03-01T00:00:00Z", "was_cancelled": True, "result": []}
    truth = {"id": 4, "updated_at": "2025-01-01T00:00:00Z", "ground_truth": True,
             "result": [region("a", 0, 2, text, "PER"), region("b", 4, 7, text, "LOC")]}
    tasks = [{"id": 1, "data": {"text": text}, "annotations": [old, new, cancelled]},
             {"id": 2, "data": {"text": text}, "annotations": [new, truth, old]},
             {"id": 3, "data": {"text": text}, "annotations": [cancelled]},
             {"id": 4, "data": {"text": text}, "annotations": []}]
    with caplog.at_level("INFO", logger="zhie.data.label_studio"):
        examples = read_ner(write(tmp_path / "e.json", tasks))
    assert [[(s.start, s.label) for s in ex.spans] for ex in examples] == [[(4, "LOC")], [(0, "PER"), (4, "LOC")]]
    assert "2 task(s) without an annotation" in caplog.text and "2 task(s) have several annotations" in caplog.text
    with pytest.raises(DataError, match="no annotated task"):
        read_ner(write(tmp_path / "none.json", tasks[2:]))


@pytest.mark.parametrize("item, error", [
    (region("a", 0, 3, "王伟去", "PER") | {"value": {"start": 0, "end": 3, "text": "王伟", "labels": ["PER"]}},
     r"e.json:2: task 0 \(id 7\), annotations\[0\] \(id 9\): result\[0\]: the offsets \[0, 3\) do not match "
     r"'value.text' '王伟': the text reads '王伟去'"),
    (region("a", 5, 40, "王伟去了青山市。" + "x" * 40, "LOC"), r"the text reads nothing \(the text has 8 characters\)"),
    (region("a", 0, 2, "王伟", "PER") | {"value": {"start": 0, "end": 2, "labels": []}}, "non-empty list of labels"),
    ({"type": "labels", "value": {"startOffset": 0, "labels": ["PER"]}}, "integer character offsets"),
])
def test_regions_that_cannot_be_taken_are_errors_naming_file_line_and_task(tmp_path, item, error):
    tasks = [{"id": 7, "data": {"text": "王伟去了青山市。"}, "annotations": [{"id": 9, "result": [item]}]}]
    with pytest.raises(DataError, match=error):
        read_ner(write(tmp_path / "e.json", tasks))


def test_a_task_without_its_text_is_an_error(tmp_path):
    tasks = [{"id": 7, "data": {"sentence": "好", "url": "x"}, "annotations": [{"result": []}]}]
    with pytest.raises(DataError, match=r"task 0 \(id 7\): no field 'text' in 'data' \(fields: sentence, url\)"):
        read_ner(write(tmp_path / "e.json", tasks))
    tasks[0]["data"] = {"sentence": "王伟", "n": 1}  # the one string field is the text
    assert read_ner(write(tmp_path / "e.json", tasks))[0].text == "王伟"


def test_browser_offsets_in_utf16_code_units_are_converted(tmp_path):
    text = "😀王伟去了青山市。"  # the emoji is two UTF-16 code units: a browser counts 青山市 at [6, 9)
    item = {"id": "a", "type": "labels", "value": {"start": 6, "end": 9, "text": "青山市", "labels": ["LOC"]}}
    (example,) = read_ner(write(tmp_path / "e.json", [{"data": {"text": text}, "annotations": [{"result": [item]}]}]))
    assert example.spans == [Span(5, 8, "LOC", "青山市")]


def test_a_flat_head_refuses_overlapping_labels_naming_the_task(tmp_path):
    examples = read_ner(write(tmp_path / "e.json", export_of(nested_corpus(6, seed=1))))
    _, tokenizer = encoders.tiny([ex.text for ex in examples])
    first = next(i for i, ex in enumerate(examples) if any(s.label == "ORG" for s in ex.spans))
    with pytest.raises(ValueError, match=rf"first: {tmp_path / 'e.json'}:\d+: task {first} \(id {first + 1}\), "
                                         r"annotations\[0\] \(id \d+\): '.+' \[\d+, \d+\) LOC and '.+' "
                                         r"\[\d+, \d+\) ORG overlap\); the crf head"):
        NerTask(NerConfig(["LOC", "ORG", "PER"], head="crf"), tokenizer).encode(examples)
    assert NerTask(NerConfig(["LOC", "ORG", "PER"], head="egp"), tokenizer).encode(examples)  # nested is fine for EGP


def test_relations_link_two_labelled_regions(tmp_path):
    text = "王伟毕业于青山大学。"
    result = [region("p", 0, 2, text, "PER"), region("o", 5, 9, text, "ORG"),
              {"type": "relation", "from_id": "p", "to_id": "o", "direction": "right", "labels": ["毕业于"]},
              {"type": "relation", "from_id": "o", "to_id": "p", "direction": "left", "labels": ["校友"]}]
    path = write(tmp_path / "re.json", [{"id": 1, "data": {"text": text}, "annotations": [{"result": result}]}])
    (example,) = RelationTask.read(path)
    assert [(t.subject, t.predicate, t.object) for t in example.triples] == [
        (Span(0, 2, "PER", "王伟"), "毕业于", Span(5, 9, "ORG", "青山大学")),
        (Span(0, 2, "PER", "王伟"), "校友", Span(5, 9, "ORG", "青山大学"))]
    for link, error in [({"from_id": "p", "to_id": "zz"}, r"result\[2\]: a relation from 'p' to 'zz', but no labelled "
                                                          r"region of this annotation has the id 'zz'"),
                        ({"labels": []}, r"result\[2\]: a relation from 'p' to 'o' without a label"),
                        ({"direction": "bi"}, r"result\[2\]: a relation with direction 'bi'")]:
        bad = [*result[:2], {**result[2], **link}]
        with pytest.raises(DataError, match=r"re.json:2: task 0 \(id 1\), annotations\[0\]: " + error):
            RelationTask.read(write(tmp_path / "re.json", [{"id": 1, "data": {"text": text},
                                                           "annotations": [{"result": bad}]}]))


def test_words_are_the_labelled_regions_and_must_cover_the_text(tmp_path):
    text = "上海市 体育局召开会议"
    words = [(0, 3), (4, 7), (7, 9), (9, 11)]
    task = {"id": 1, "data": {"text": text},
            "annotations": [{"result": [region(f"w{i}", a, b, text, "W") for i, (a, b) in enumerate(words)]}]}
    (example,) = CwsTask.read(write(tmp_path / "cws.json", [task]))
    assert example.text == "上海市体育局召开会议"
    assert [s.text for s in example.spans] == ["上海市", "体育局", "召开", "会议"]
    for wrong, error in [([(0, 3), (4, 7), (9, 11)], r"'召开' at \[7, 9\) is in no word"),
                         ([(0, 3), (2, 7), (7, 9), (9, 11)], "the words '上海市' and '市 体育局' overlap"),
                         ([(0, 3), (4, 7), (7, 9)], r"'会议' at \[9, 11\) is in no word")]:
        task["annotations"][0]["result"] = [region(f"w{i}", a, b, text, "W") for i, (a, b) in enumerate(wrong)]
        with pytest.raises(DataError, match=r"cws.json:2: task 0 \(id 1\), annotations\[0\]: " + error):
            CwsTask.read(write(tmp_path / "cws.json", [task]))
    with pytest.raises(ValueError, match="--format cmeee does not apply to segmented text"):
        CwsTask.read(tmp_path / "cws.json", "cmeee")


def test_the_labelling_config_names_the_results():
    config = label_studio.LabelConfig.parse(CONFIG.replace('name="label"', 'name="ner"').replace("$text", "$sentence"))
    assert config == label_studio.LabelConfig("ner", "text", "sentence", ("PER", "LOC", "ORG"))
    for xml, error in [("<View><Text name='t' value='$text'/></View>", "no <Labels> control on a <Text>"),
                       ("<View", "not valid XML"),
                       ("<View><Labels name='l' toName='t'/><Text name='t' value='text'/></View>", "not a task field")]:
        with pytest.raises(ValueError, match=error):
            label_studio.LabelConfig.parse(xml)


def test_predictions_written_as_pre_annotations_read_back_unchanged(tmp_path):
    """A prediction accepted as it is in Label Studio (its result becomes the annotation) reads back as the spans and
    triples zhie predicted, for each kind of prediction."""
    text = "王伟在青山市大学工作。"
    entities = [{"start": 0, "end": 2, "label": "PER", "text": "王伟", "score": 0.9},
                {"start": 3, "end": 6, "label": "LOC", "text": "青山市", "score": 0.6},
                {"start": 3, "end": 8, "label": "ORG", "text": "青山市大学", "score": 0.8}]
    task = label_studio.prediction_task(text, label_studio.prediction_result("entities", entities), "v1")
    (prediction,) = task["predictions"]
    assert prediction["model_version"] == "v1" and prediction["score"] == pytest.approx(0.7667, abs=1e-4)
    assert prediction["result"][0] == {"id": "e0", "from_name": "label", "to_name": "text", "type": "labels",
                                       "value": {"start": 0, "end": 2, "text": "王伟", "labels": ["PER"]}, "score": 0.9}
    accepted = [{**task, "annotations": [{"result": prediction["result"]}]}]
    assert [s.to_dict() for s in read_ner(write(tmp_path / "e.json", accepted))[0].spans] == \
        [{k: v for k, v in e.items() if k != "score"} for e in entities]

    relations = [{"subject": {"start": 0, "end": 2, "text": "王伟"}, "predicate": "工作于",
                  "object": {"start": 3, "end": 8, "text": "青山市大学"}, "score": 0.7},
                 {"subject": {"start": 3, "end": 8, "text": "青山市大学"}, "predicate": "位于",
                  "object": {"start": 3, "end": 6, "text": "青山市"}, "score": 0.5}]
    result = label_studio.prediction_result("relations", relations)
    assert [r["type"] for r in result] == ["labels"] * 3 + ["relation"] * 2  # 青山市大学 is one region
    (example,) = RelationTask.read(write(tmp_path / "re.json", [{"data": {"text": text},
                                                                 "annotations": [{"result": result}]}]))
    assert [t.to_dict() for t in example.triples] == [{k: v for k, v in r.items() if k != "score"} for r in relations]

    words = [{"start": 0, "end": 2, "text": "王伟"}, {"start": 2, "end": 3, "text": "在"}]
    config = label_studio.LabelConfig("seg", "sentence", "sentence", ("W",))
    task = label_studio.prediction_task("王伟在", label_studio.prediction_result("words", words, config), "v1", config)
    assert task["data"] == {"sentence": "王伟在"} and "score" not in task["predictions"][0]
    assert {(r["from_name"], r["to_name"], r["value"]["labels"][0]) for r in task["predictions"][0]["result"]} == \
        {("seg", "sentence", "W")}
    with pytest.raises(ValueError, match="no Label Studio output"):
        label_studio.prediction_result("embedding", [])


def test_model_version_follows_the_model_files(tmp_path):
    (tmp_path / "zhie.json").write_text('{"task": "ner"}', encoding="utf-8")
    first = label_studio.model_version(tmp_path, "ner")
    assert first.startswith("zhie-ner-") and first == label_studio.model_version(tmp_path, "ner")
    (tmp_path / "training.json").write_text('{"finished": "today"}', encoding="utf-8")
    assert label_studio.model_version(tmp_path, "ner") != first


# ---------------------------------------------------------------------------------------------------- the commands
def test_zhie_predict_writes_label_studio_tasks_one_per_input_line(tmp_path, capsys):
    model = trained("ner-egp")
    texts = ["王伟在青山市大学工作。", "", "李娜去了白河县。"]
    (tmp_path / "in.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    assert main(["predict", str(model), "--input", str(tmp_path / "in.txt")]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    out = tmp_path / "tasks.json"
    assert main(["predict", str(model), "--input", str(tmp_path / "in.txt"), "--output-format", "label-studio",
                 "--output", str(out), "--ls-from-name", "ner"]) == 0
    tasks = json.loads(out.read_text(encoding="utf-8"))
    assert len(out.read_text(encoding="utf-8").splitlines()) == len(texts) + 1  # a task a line, then "]"
    assert [t["data"]["text"] for t in tasks] == texts
    for task, line in zip(tasks, lines):
        (prediction,) = task["predictions"]
        assert prediction["model_version"] == label_studio.model_version(model, "ner")
        assert [(r["from_name"], r["to_name"], r["type"], r["value"]["start"], r["value"]["end"], r["value"]["labels"],
                 r["score"]) for r in prediction["result"]] == \
            [("ner", "text", "labels", e["start"], e["end"], [e["label"]], e["score"]) for e in line["entities"]]
    assert any(t["predictions"][0]["result"] for t in tasks)
    assert main(["predict", str(model), "王伟", "--ls-to-name", "t"]) == 2
    assert "--ls-to-name names the Label Studio output: add --output-format label-studio" in capsys.readouterr().err


def test_zhie_eval_reads_an_export(tmp_path, capsys):
    path = write(tmp_path / "dev.json", export_of(nested_corpus(20, seed=2)))
    assert main(["eval", str(trained("ner-egp")), "--data", str(path), "--json", str(tmp_path / "m.json")]) == 0
    metrics = json.loads((tmp_path / "m.json").read_text(encoding="utf-8"))
    assert metrics["n_gold"] == sum(len(ex.spans) for ex in nested_corpus(20, seed=2))


# ---------------------------------------------------------------------------------------------------- zhie serve
def test_serve_speaks_label_studios_ml_backend_protocol():
    pytest.importorskip("fastapi", reason="the serve extra (fastapi, uvicorn) is not installed")
    from fastapi.testclient import TestClient

    import zhie
    from zhie.deploy.serve import Limits, create_app

    pipe = zhie.load(trained("ner-egp"))
    texts = ["王伟在青山市大学工作。", "李娜去了白河县。", "记者从青山市大学获悉。"]
    with TestClient(create_app(pipe, limits=Limits(max_texts=2), api_key="k3y", model_version="zhie-ner-x")) as client:
        assert client.get("/label-studio/health").json()["status"] == "UP"  # no key needed, as /health
        auth = {"Authorization": "Basic " + base64.b64encode(b"anyone:k3y").decode()}  # Label Studio's basic auth
        assert client.post("/label-studio/setup", json={"schema": CONFIG}).status_code == 401
        setup = client.post("/label-studio/setup", headers=auth, json={"project": "1.1", "schema": CONFIG,
                                                                       "hostname": "http://localhost:8080"})
        assert setup.status_code == 200 and setup.json() == {"model_version": "zhie-ner-x"}
        bad = client.post("/label-studio/setup", headers=auth, json={"schema": "<View/>"})
        assert bad.status_code == 422 and "no <Labels> control" in bad.json()["detail"]
        config = CONFIG.replace('name="label"', 'name="ner"').replace("$text", "$sentence")
        tasks = [{"id": i, "data": {"sentence": t}, "annotations": []} for i, t in enumerate(texts)]
        answer = client.post("/label-studio/predict", headers=auth,  # 3 tasks, over max_texts: run 2 at a time
                             json={"tasks": tasks, "project": "1.1", "label_config": config, "params": {}})
        assert answer.status_code == 200
        body = answer.json()
        assert body["model_version"] == "zhie-ner-x" and len(body["results"]) == len(texts)
        assert any(result["result"] for result in body["results"])
        expected = [line for piece in (texts[:2], texts[2:]) for line in client.post(
            "/predict", headers={"Authorization": "Bearer k3y"}, json={"texts": piece}).json()]
        for result, plain in zip(body["results"], expected):
            assert result["model_version"] == "zhie-ner-x"
            assert [(r["from_name"], r["to_name"], r["value"]["start"], r["value"]["end"], r["value"]["labels"][0])
                    for r in result["result"]] == \
                [("ner", "text", e["start"], e["end"], e["label"]) for e in plain["entities"]]
        missing = client.post("/label-studio/predict", headers=auth, json={"tasks": [{"id": 5, "data": {}}]})
        assert missing.status_code == 422 and "tasks[0] (id 5) has no string data.text" in missing.json()["detail"]


# ---------------------------------------------------------------------------------------------------- the real server
@pytest.mark.skipif(os.environ.get("ZHIE_LABEL_STUDIO") != "1",
                    reason="drives a real Label Studio server: installing label-studio into its own venv takes minutes "
                           "and starting it about a minute; run with ZHIE_LABEL_STUDIO=1 (or run "
                           "benchmarks/label_studio.py)")
def test_a_real_label_studio_server_round_trip(tmp_path):
    root = Path(__file__).resolve().parents[1]
    run = subprocess.run([sys.executable, str(root / "benchmarks" / "label_studio.py"), "--work", str(tmp_path),
                          "--no-results"], capture_output=True, text=True, timeout=1500,
                         env={**os.environ, "PYTHONPATH": str(root / "src")})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    row = json.loads(run.stdout.strip().splitlines()[-1])
    assert row["spans_checked"] > 0 and row["spans_unchanged"] == row["spans_checked"]
