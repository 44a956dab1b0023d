"""doccano JSON lines: NER and relation round trips, detection, file:line errors, train/eval/predict through the CLI."""

from __future__ import annotations

import dataclasses
import json
import random

import pytest

import zhie
from zhie import demo
from zhie.cli import main
from zhie.core.spans import Span
from zhie.data import DataError, NerExample, detect_format, read_ner
from zhie.data.doccano import (
    UNTYPED,
    read_doccano,
    read_doccano_relations,
    records,
    write_doccano,
    write_doccano_relations,
)
from zhie.data.spo import SpoExample, Triple
from zhie.tasks.relation import RelationTask

from .tiny_models import nested_corpus, trained

# doccano's own relation example, in Chinese: two entities and a relation, ids as doccano numbers them
RELATION_LINE = {"id": 7, "text": "李明毕业于青山大学。",
                 "entities": [{"id": 0, "start_offset": 0, "end_offset": 2, "label": "PER"},
                              {"id": 1, "start_offset": 5, "end_offset": 9, "label": "ORG"}],
                 "relations": [{"id": 3, "from_id": 0, "to_id": 1, "type": "毕业于"}], "Comments": []}


def write(tmp_path, content: str, name: str = "d.jsonl"):
    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    return path


def relation_examples(n: int, seed: int) -> list[SpoExample]:
    """'{PER}毕业于{ORG}，{ORG}位于{LOC}。' with its two typed triples (the ORG mention shared by both)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        per, org, loc = (demo._entity(rng, x) for x in ("PER", "ORG", "LOC"))
        text = f"{per}毕业于{org}，{org}位于{loc}。"
        p, o, o2, lo = 0, len(per) + 3, len(per) + 3 + len(org) + 1, len(text) - 1 - len(loc)
        per_s, org_s = Span(p, len(per), "PER", per), Span(o, o + len(org), "ORG", org)
        org2_s, loc_s = Span(o2, o2 + len(org), "ORG", org), Span(lo, lo + len(loc), "LOC", loc)
        out.append(SpoExample(text, [Triple(per_s, "毕业于", org_s), Triple(org2_s, "位于", loc_s)]))
    return out


def test_ner_round_trip_nested_spans_and_detection(tmp_path):
    examples = [NerExample(ex.text, sorted(ex.spans)) for ex in nested_corpus(30, seed=5)]
    examples.append(NerExample("没有实体。", []))
    path = tmp_path / "ner.jsonl"
    write_doccano(examples, path)
    first = json.loads(path.read_text(encoding="utf-8").splitlines()[0])
    assert set(first) == {"text", "label"} and all(len(item) == 3 for item in first["label"])
    assert detect_format(path) == "doccano"
    assert read_doccano(path) == read_ner(path) == read_ner(path, "doccano") == examples


def test_relation_round_trip_and_the_entities_shape_read_as_ner(tmp_path):
    examples = relation_examples(20, seed=1)
    path = tmp_path / "re.jsonl"
    write_doccano_relations(examples, path)
    assert read_doccano_relations(path) == examples
    assert [[(t.subject.label, t.object.label) for t in ex.triples] for ex in read_doccano_relations(path)] == \
        [[("PER", "ORG"), ("ORG", "LOC")]] * 20
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    ids = [e["id"] for line in lines for e in line["entities"]]
    assert len(ids) == len(set(ids)) == 20 * 4  # one per range and type, numbered through the file
    assert detect_format(path) == "doccano"
    assert RelationTask.read(path) == RelationTask.read(path, "doccano") == examples
    # the same file as NER: every entity a span, relations set aside
    ner = read_ner(path)
    assert [sorted({m for t in ex.triples for m in (t.subject, t.object)}) for ex in examples] == \
        [ex.spans for ex in ner]


def test_doccanos_own_example_and_untyped_mentions(tmp_path):
    path = write(tmp_path, json.dumps(RELATION_LINE, ensure_ascii=False) + "\n")
    (ex,) = read_doccano_relations(path)
    per, org = Span(0, 2, "PER", "李明"), Span(5, 9, "ORG", "青山大学")
    assert ex == SpoExample("李明毕业于青山大学。", [Triple(per, "毕业于", org)])
    assert read_doccano(path) == [NerExample(ex.text, [per, org])]
    # a relation model's mentions have no type: written with UNTYPED, the offsets kept
    untyped = SpoExample(ex.text, [Triple(Span(0, 2, "", "李明"), "毕业于", Span(5, 9, "", "青山大学"), 0.9)])
    write_doccano_relations([untyped], tmp_path / "out.jsonl")
    (back,) = read_doccano_relations(tmp_path / "out.jsonl")
    assert [(t.subject, t.object) for t in back.triples] == \
        [(dataclasses.replace(per, label=UNTYPED), dataclasses.replace(org, label=UNTYPED))]


def test_records_for_predictions():
    spans = [Span(0, 2, "PER", "李明", 0.9)]
    assert records("entities")("李明来了", spans) == {"text": "李明来了", "label": [[0, 2, "PER"]]}
    record = records("relations")
    triple = Triple(Span(0, 2, "", "李明"), "毕业于", Span(5, 9, "", "青山大学"), 0.8)
    assert [record(RELATION_LINE["text"], [triple])["relations"] for _ in range(2)] == \
        [[{"from_id": 1, "to_id": 2, "type": "毕业于"}], [{"from_id": 3, "to_id": 4, "type": "毕业于"}]]
    with pytest.raises(ValueError, match="no doccano form"):
        records("words")


BAD = [
    ('{"text": "ab", "label": [[0, 3, "X"]]}', 1, "label[0]: range [0, 3) is empty or outside the text (length 2)"),
    ('{"text": "ab", "label": []}\n{"text": "ab", "label": [[1, 1, "X"]]}', 2, "label[0]: range [1, 1) is empty"),
    ('{"text": "ab", "label": [[0, 1]]}', 1, 'label[0]: expected [start, end, "TYPE"], got [0, 1]'),
    ('{"text": "ab", "label": ["pos"]}', 1, "a doccano text-classification export"),
    ('{"text": "ab", "label": [[0, 1, ""]]}', 1, "label[0]: the label must be a non-empty string"),
    ('{"text": "ab", "label": [["0", 1, "X"]]}', 1, "label[0]: offsets must be integers"),
    ('{"text": "ab", "label": [], "entities": []}', 1, "both 'label' and 'entities'"),
    ('{"label": []}', 1, "missing field 'text'"),
    ('{"text": "ab", "entities": [{"id": 1, "start_offset": 0, "end_offset": 1}], "relations": []}', 1,
     "entities[0]: missing field 'label'"),
    ('{"text": "ab", "entities": [{"id": 1, "start_offset": 0, "end_offset": 1, "label": "X"}, '
     '{"id": 1, "start_offset": 1, "end_offset": 2, "label": "X"}], "relations": []}', 1,
     "entities[1]: id 1 is given to two entities"),
    ('{"text": "ab", "entities": [{"id": 1, "start_offset": 1, "end_offset": 0, "label": "X"}], "relations": []}', 1,
     "entities[0]: range [1, 0) is empty"),
    ('{"text": "ab", "entities": [{"id": 1, "start_offset": 0, "end_offset": 1, "label": "X"}], '
     '"relations": [{"from_id": 1, "to_id": 2, "type": "r"}]}', 1,
     "relations[0]: to_id 2 names no entity of this line (its entities' ids: 1)"),
    ('{"text": "ab", "entities": [], "relations": [{"from_id": 1, "to_id": 2}]}', 1,
     "relations[0]: missing field 'type'"),
    ('{"text": "ab", "entities": [], "relations": {}}', 1, "'relations' must be a list"),
    ('{"text": "ab", "label": []}\n\n{"text": "ab", "label": [[0, 1, "X"]]} x', 3, "malformed JSON"),
]


@pytest.mark.parametrize("content,line,reason", BAD)
def test_errors_name_file_line_and_reason(tmp_path, content, line, reason):
    path = write(tmp_path, content + "\n")
    with pytest.raises(DataError) as info:
        read_ner(path, "doccano")
    assert (info.value.path, info.value.line) == (str(path), line) and reason in info.value.reason, info.value
    assert detect_format(path) == "doccano" or "text" not in content or "malformed" in reason


def test_relation_reader_refuses_the_ner_shape(tmp_path):
    path = write(tmp_path, '{"text": "ab", "label": [[0, 1, "X"]]}\n')
    with pytest.raises(DataError, match=r"d\.jsonl:1: 'label' \(doccano's NER shape\) has no relations"):
        read_doccano_relations(path)
    with pytest.raises(ValueError, match="--format cluener does not apply to triples"):
        RelationTask.read(path, "cluener")


def test_ner_train_eval_predict_through_the_cli(tmp_path, capsys):
    write_doccano(nested_corpus(40, seed=1), tmp_path / "train.jsonl")
    write_doccano(nested_corpus(10, seed=2), tmp_path / "dev.jsonl")
    assert main(["train", "ner", "--train", str(tmp_path / "train.jsonl"), "--dev", str(tmp_path / "dev.jsonl"),
                 "--format", "doccano", "--encoder", "tiny", "--head", "egp", "--max-length", "48", "--epochs", "1",
                 "--out", str(tmp_path / "run"), "--quiet"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["model"] == str(tmp_path / "run" / "best")
    assert main(["eval", str(tmp_path / "run"), "--data", str(tmp_path / "dev.jsonl"), "--json",
                 str(tmp_path / "m.json")]) == 0
    assert set(json.loads((tmp_path / "m.json").read_text())["per_type"]) <= {"LOC", "ORG", "PER"}

    model = trained("ner-egp")  # one that finds entities
    texts = [ex.text for ex in nested_corpus(8, seed=9)]
    (tmp_path / "in.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    assert main(["predict", str(model), "--input", str(tmp_path / "in.txt"), "--output-format", "doccano",
                 "--output", str(tmp_path / "pred.jsonl")]) == 0
    predicted = zhie.load(model).predict(texts)
    assert sum(map(len, predicted)) > 0
    assert read_doccano(tmp_path / "pred.jsonl") == \
        [NerExample(t, [dataclasses.replace(s, score=None) for s in p]) for t, p in zip(texts, predicted)]


def test_relation_train_eval_predict_through_the_cli(tmp_path, capsys):
    write_doccano_relations(relation_examples(30, seed=1), tmp_path / "train.jsonl")
    assert main(["train", "re", "--train", str(tmp_path / "train.jsonl"), "--dev", str(tmp_path / "train.jsonl"),
                 "--encoder", "tiny", "--max-length", "48", "--epochs", "1", "--out", str(tmp_path / "run"),
                 "--quiet"]) == 0
    capsys.readouterr()
    assert main(["eval", str(tmp_path / "run"), "--data", str(tmp_path / "train.jsonl"), "--format", "doccano"]) == 0
    assert "entity f1" in capsys.readouterr().out
    assert json.loads((tmp_path / "run" / "best" / "zhie.json").read_text())["predicates"] == ["毕业于", "位于"]

    model = trained("re")
    texts = [ex.text for ex in relation_examples(6, seed=7)]
    assert main(["predict", str(model), *texts, "--output-format", "doccano"]) == 0
    out = capsys.readouterr().out
    predicted = zhie.load(model).predict(texts)
    assert sum(map(len, predicted)) > 0
    (tmp_path / "pred.jsonl").write_text(out, encoding="utf-8")
    assert [[(t.subject.start, t.subject.end, t.predicate, t.object.start, t.object.end) for t in ex.triples]
            for ex in read_doccano_relations(tmp_path / "pred.jsonl")] == \
        [[(t.subject.start, t.subject.end, t.predicate, t.object.start, t.object.end) for t in p] for p in predicted]


def test_predict_refuses_doccano_for_a_model_without_spans(tmp_path, capsys):
    assert main(["predict", str(trained("similarity")), "你好", "--output-format", "doccano"]) == 2
    assert "no doccano form" in capsys.readouterr().err
