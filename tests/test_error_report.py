"""Error reports (issue 26, item 4): ``zhie eval MODEL --data FILE --errors errors.jsonl`` writes every false positive,
false negative and wrong-type span (CWS: wrong word boundaries; GPLinker: triples) with its sentence and offsets, and
prints the per-type table and the most frequent confusions."""

from __future__ import annotations

import json
import random

import pytest

import zhie
from zhie.cli import main
from zhie.core.metrics import label_errors, span_prf
from zhie.core.spans import Span
from zhie.data import read_ner
from zhie.data.cws import read_segmented
from zhie.data.spo import Triple, read_spo
from zhie.tasks.cws import boundary_errors
from zhie.tasks.similarity import SimilarityTask

from . import tiny_models


def test_label_errors_pair_wrong_labels_and_count_what_span_prf_counts():
    gold = [((0, 2), "PER"), ((3, 5), "LOC"), ((3, 7), "ORG"), ((8, 9), "LOC")]
    pred = [((0, 2), "PER"), ((3, 5), "ORG"), ((3, 7), "ORG"), ((6, 7), "PER")]
    assert label_errors(gold, pred) == [((3, 5), "LOC", "ORG"), ((6, 7), None, "PER"), ((8, 9), "LOC", None)]

    rng = random.Random(0)
    for _ in range(200):  # false positives + wrong = wrong predictions, false negatives + wrong = missed gold
        g, p = ({((s, s + rng.randint(1, 2)), rng.choice("AB")) for s in rng.sample(range(6), 4)} for _ in "gp")
        errors = label_errors(g, p)
        m = span_prf([[(*i, label) for i, label in g]], [[(*i, label) for i, label in p]])
        tp = round(m["micro"]["precision"] * m["n_pred"])
        assert sum(gl is not None for _, gl, _ in errors) == m["n_gold"] - tp
        assert sum(pl is not None for _, _, pl in errors) == m["n_pred"] - tp


def _words(text: str, words: str) -> list[Span]:
    out, start = [], 0
    for w in words.split():
        out.append(Span(start, start + len(w), "", w))
        start += len(w)
    assert start == len(text)
    return out


@pytest.mark.parametrize("gold, predicted, expected", [
    ("研究 生命 起源", "研究 生命 起源", []),
    ("研究 生命 起源", "研究生 命 起源", [("boundary", 0, 4, "研究 生命", "研究生 命")]),
    ("研究生 命 起源", "研究 生 命 起源", [("split", 0, 3, "研究生", "研究 生")]),
    ("研究 生命 起源", "研究 生命起源", [("merged", 2, 6, "生命 起源", "生命起源")]),
])
def test_boundary_errors_are_the_stretches_between_shared_boundaries(gold, predicted, expected):
    text = gold.replace(" ", "")
    errors = boundary_errors(text, _words(text, gold), _words(text, predicted))
    assert [(e["kind"], e["start"], e["end"], e["gold"], e["predicted"]) for e in errors] == expected
    assert all(e["span"] == text[e["start"]:e["end"]] for e in errors)


def _lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_ner_errors_through_the_cli_match_the_metrics(tmp_path, capsys):
    best = tiny_models.trained("ner-softmax")
    dev = best.parent.parent / "dev.jsonl"
    (tmp_path / "errors.jsonl").write_text("old\n", encoding="utf-8")
    assert main(["eval", str(best), "--data", str(dev), "--errors", str(tmp_path / "errors.jsonl"),
                 "--json", str(tmp_path / "m.json")]) == 0
    out = capsys.readouterr().out
    metrics = json.loads((tmp_path / "m.json").read_text())
    assert metrics == zhie.load(best).evaluate(read_ner(dev))  # --errors changes nothing in the scores
    errors = _lines(tmp_path / "errors.jsonl")
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary file left
    texts = [ex.text for ex in read_ner(dev)]
    for e in errors:
        assert e["text"] == texts[e["example"]] and e["text"][e["start"]:e["end"]] == e["span"]
        assert e["kind"] == {(True, False): "false_positive", (False, True): "false_negative",
                             (False, False): "wrong_type"}[e["gold"] is None, e["predicted"] is None]
    tp = round(metrics["micro"]["recall"] * metrics["n_gold"])
    assert sum(e["predicted"] is not None for e in errors) == metrics["n_pred"] - tp
    assert sum(e["gold"] is not None for e in errors) == metrics["n_gold"] - tp > 0

    table, report = out.split(f"\n\n{len(errors)} errors written to {tmp_path / 'errors.jsonl'}")
    assert table.splitlines()[0].split() == ["type", "precision", "recall", "f1", "support"]
    assert [line.split()[0] for line in table.splitlines()[1:]] == [*metrics["per_type"], "micro"]
    assert report.splitlines()[1:3] == ["most frequent confusions (gold -> predicted):",
                                        f"{'count':>7}  {'gold':<8}predicted"]
    rows = [line.split() for line in report.splitlines()[3:]]
    pairs = [(e["gold"] or "(none)", e["predicted"] or "(none)") for e in errors]
    assert len(rows) == min(10, len(set(pairs))) and all(int(n) == pairs.count((g, p)) for n, g, p in rows)
    assert [int(n) for n, _, _ in rows] == sorted((pairs.count(x) for x in set(pairs)), reverse=True)[:len(rows)]


def test_cws_errors_are_wrong_word_boundaries(tmp_path, capsys):
    best = tiny_models.trained("cws")
    data = best.parent.parent / "train.txt"
    lines = data.read_text(encoding="utf-8").splitlines()[:30]
    (tmp_path / "test.txt").write_text("\n".join(line.replace("  ", "") if i % 3 == 0 else line
                                                 for i, line in enumerate(lines)) + "\n", encoding="utf-8")
    assert main(["eval", str(best), "--data", str(tmp_path / "test.txt"), "--errors", str(tmp_path / "e.jsonl")]) == 0
    errors = _lines(tmp_path / "e.jsonl")
    examples = read_segmented(tmp_path / "test.txt")
    assert errors and {e["kind"] for e in errors} <= {"split", "merged", "boundary"}
    assert {e["example"] for e in errors} >= {0, 3, 6}  # sentences made one word are split by the model
    for e in errors:
        ex = examples[e["example"]]
        assert e["gold"] == " ".join(w.text for w in ex.spans if e["start"] <= w.start and w.end <= e["end"])
        assert "".join(e["predicted"].split()) == e["span"] == ex.text[e["start"]:e["end"]]
    assert "most frequent confusions" in capsys.readouterr().out


def test_gplinker_errors_are_triples_and_wrong_predicates(tmp_path, capsys):
    best = tiny_models.trained("re")
    pipe = zhie.load(best)
    ex = read_spo(best.parent.parent / "train.jsonl")[0]
    right, other = ex.triples
    wrong = Triple(right.subject, "位于", right.object)
    made_up = Triple(Span(0, 1, "", ex.text[0]), "毕业于", Span(1, 2, "", ex.text[1]))
    errors = pipe.task.errors(ex, [wrong, made_up])
    expected = [("wrong_type", "毕业于", "位于", right.subject.text, right.object.text),
                ("false_positive", None, "毕业于", ex.text[0], ex.text[1]),
                ("false_negative", "位于", None, other.subject.text, other.object.text)]
    assert [(e["kind"], e["gold"], e["predicted"], e["subject"]["text"], e["object"]["text"]) for e in errors] == \
        sorted(expected, key=lambda e: (e[3], e[4]))  # by subject and object, as label_errors sorts
    for e in errors:
        first, last = sorted((e["subject"], e["object"]), key=lambda m: m["start"])
        assert (e["start"], e["end"]) == (first["start"], max(first["end"], last["end"]))
        assert all(ex.text[m["start"]:m["end"]] == m["text"] for m in (first, last))

    assert main(["eval", str(best), "--data", str(best.parent.parent / "train.jsonl"), "--errors",
                 str(tmp_path / "e.jsonl")]) == 0
    captured = capsys.readouterr()
    assert captured.out.splitlines()[0].split() == ["predicate", "precision", "recall", "f1", "support"]
    assert captured.err == ""  # the model's own predicates

    renamed = (best.parent.parent / "train.jsonl").read_text(encoding="utf-8").replace('"位于"', '"坐落于"')
    (tmp_path / "other.jsonl").write_text(renamed, encoding="utf-8")
    n = sum(t.predicate == "坐落于" for ex in read_spo(tmp_path / "other.jsonl") for t in ex.triples)
    assert main(["eval", str(best), "--data", str(tmp_path / "other.jsonl")]) == 0
    assert f"the model does not predict, each counted as missed: 坐落于 ({n});" in capsys.readouterr().err and n > 0


def test_a_task_without_an_error_report_fails_before_the_model_runs_or_anything_is_written(tmp_path, capsys,
                                                                                            monkeypatch):
    best = tiny_models.trained("similarity")
    (tmp_path / "e.jsonl").write_text("old\n", encoding="utf-8")

    def predict(*args, **kwargs):
        raise AssertionError("the model ran")

    monkeypatch.setattr(SimilarityTask, "predict", predict)
    assert main(["eval", str(best), "--data", str(best.parent.parent / "pairs.tsv"), "--errors",
                 str(tmp_path / "e.jsonl")]) == 2
    assert "no error report" in capsys.readouterr().err
    assert (tmp_path / "e.jsonl").read_text(encoding="utf-8") == "old\n"
