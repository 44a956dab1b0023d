"""span_prf: parity with seqeval on random BIO sequences, hand-computed values, edge cases."""

from __future__ import annotations

import random

import pytest
from seqeval.metrics import classification_report, f1_score, precision_score, recall_score

from zhie.core.metrics import span_prf
from zhie.core.spans import Span, tags_to_spans

TYPES = ["PER", "LOC", "ORG"]


def random_tags(rng: random.Random, length: int) -> list[str]:
    """Random BIO tags, including ill-formed ones (I- after O, type changes inside a span)."""
    tags = []
    for _ in range(length):
        r = rng.random()
        if r < 0.45:
            tags.append("O")
        elif r < 0.7:
            tags.append("B-" + rng.choice(TYPES))
        elif r < 0.9 and tags and tags[-1] != "O":
            tags.append("I-" + tags[-1][2:])  # mostly well-formed continuations
        else:
            tags.append("I-" + rng.choice(TYPES))
    return tags


def to_spans(seqs: list[list[str]]) -> list[list[Span]]:
    return [[Span(s, e, label) for s, e, label in tags_to_spans(tags, "BIO")] for tags in seqs]


@pytest.mark.parametrize("seed", range(20))
def test_matches_seqeval_on_random_bio(seed):
    rng = random.Random(seed)
    y_true, y_pred = [], []
    for _ in range(rng.randint(1, 30)):
        n = rng.randint(0, 25)
        gold = random_tags(rng, n)
        # predictions: the gold tags with some positions changed, so that many spans match
        pred = [t if rng.random() < 0.8 else random_tags(rng, 1)[0] for t in gold]
        y_true.append(gold)
        y_pred.append(pred)
    result = span_prf(to_spans(y_true), to_spans(y_pred))
    assert result["micro"]["f1"] == pytest.approx(f1_score(y_true, y_pred), abs=1e-12)
    assert result["micro"]["precision"] == pytest.approx(precision_score(y_true, y_pred), abs=1e-12)
    assert result["micro"]["recall"] == pytest.approx(recall_score(y_true, y_pred), abs=1e-12)

    report = classification_report(y_true, y_pred, output_dict=True, zero_division=0)
    labels = [k for k in report if k not in ("micro avg", "macro avg", "weighted avg")]
    assert set(result["per_type"]) >= set(labels)
    for label in labels:
        got, want = result["per_type"][label], report[label]
        assert got["precision"] == pytest.approx(want["precision"], abs=1e-12)
        assert got["recall"] == pytest.approx(want["recall"], abs=1e-12)
        assert got["f1"] == pytest.approx(want["f1-score"], abs=1e-12)
        assert got["support"] == want["support"]
    assert result["n_gold"] == sum(len(s) for s in to_spans(y_true))
    assert result["n_pred"] == sum(len(s) for s in to_spans(y_pred))


def test_hand_computed_per_type_and_micro():
    gold = [
        [Span(0, 2, "PER"), Span(3, 5, "LOC"), Span(6, 8, "LOC")],
        [Span(0, 4, "ORG"), Span(1, 3, "LOC")],  # nested gold spans
    ]
    pred = [
        [Span(0, 2, "PER"), Span(3, 5, "ORG"), Span(6, 8, "LOC")],  # (3, 5): right range, wrong type
        [Span(0, 4, "ORG"), Span(1, 3, "LOC"), Span(0, 3, "PER")],
    ]
    r = span_prf(gold, pred)
    assert (r["n_gold"], r["n_pred"]) == (5, 6)
    assert r["micro"] == pytest.approx({"precision": 4 / 6, "recall": 4 / 5, "f1": 2 * 4 / (5 + 6)})
    assert r["per_type"]["PER"] == pytest.approx({"precision": 0.5, "recall": 1.0, "f1": 2 / 3, "support": 1})
    assert r["per_type"]["LOC"] == pytest.approx({"precision": 1.0, "recall": 2 / 3, "f1": 0.8, "support": 3})
    assert r["per_type"]["ORG"] == pytest.approx({"precision": 0.5, "recall": 1.0, "f1": 2 / 3, "support": 1})
    assert list(r["per_type"]) == ["LOC", "ORG", "PER"]


def test_matching_is_per_example_and_ignores_text_score_and_duplicates():
    gold = [[Span(0, 2, "PER", "张三")], []]
    pred = [[(0, 2, "PER"), Span(0, 2, "PER", "", 0.3)], [Span(0, 2, "PER")]]  # tuples accepted
    r = span_prf(gold, pred)
    assert (r["n_gold"], r["n_pred"]) == (1, 2)  # the duplicate counts once
    assert r["micro"] == pytest.approx({"precision": 0.5, "recall": 1.0, "f1": 2 / 3})


def test_no_gold():
    r = span_prf([[], []], [[Span(0, 1, "X")], []])
    assert r["micro"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0}
    assert r["per_type"] == {"X": {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 0}}
    assert (r["n_gold"], r["n_pred"]) == (0, 1)


def test_no_pred():
    r = span_prf([[Span(0, 1, "X")]], [[]])
    assert r["micro"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0}
    assert r["per_type"] == {"X": {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 1}}


def test_nothing_at_all():
    for gold, pred in (([], []), ([[]], [[]])):
        assert span_prf(gold, pred) == {
            "micro": {"precision": 0.0, "recall": 0.0, "f1": 0.0},
            "per_type": {},
            "n_gold": 0,
            "n_pred": 0,
        }


def test_perfect():
    gold = [[Span(0, 1, "X"), Span(0, 3, "Y")]]
    r = span_prf(gold, gold)
    assert r["micro"] == {"precision": 1.0, "recall": 1.0, "f1": 1.0}


def test_length_mismatch():
    with pytest.raises(ValueError, match="gold has 2 examples but pred has 1"):
        span_prf([[], []], [[]])
