"""Tests for zhie.core.spans: tag sequences <-> spans, checked against seqeval."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from seqeval.metrics import f1_score
from seqeval.metrics.sequence_labeling import get_entities

from zhie.core.spans import BatchTagDecoder, Span, spans_to_tags, tags_to_spans

SETTINGS = settings(derandomize=True, max_examples=300, deadline=None)
TYPES = ["PER", "LOC"]
TYPED_SCHEMES = ["BIO", "IOB1", "BIOES"]
ALPHABETS = {
    "BIO": ["O"] + [f"{p}-{t}" for p in "BI" for t in TYPES],
    "IOB1": ["O"] + [f"{p}-{t}" for p in "BI" for t in TYPES],
    "BIOES": ["O"] + [f"{p}-{t}" for p in "BIES" for t in TYPES],
}


def seqeval_spans(tags: list[str]) -> list[tuple[int, int, str]]:
    """seqeval's default decoding, with exclusive ends."""
    return [(start, end + 1, label) for label, start, end in get_entities(list(tags))]


def tag_seqs(scheme: str, min_size: int = 0, max_size: int = 12):
    return st.lists(st.sampled_from(ALPHABETS[scheme]), min_size=min_size, max_size=max_size)


@st.composite
def seq_pairs(draw) -> tuple[list[str], list[str]]:
    """A (true, predicted) pair of BIOES tag sequences of the same length."""
    n = draw(st.integers(1, 10))
    return draw(tag_seqs("BIOES", n, n)), draw(tag_seqs("BIOES", n, n))


@st.composite
def typed_spans(draw) -> tuple[list[tuple[int, int, str]], int]:
    """Non-overlapping typed spans, often adjacent (gap 0), and the sequence length."""
    spans, pos = [], 0
    for _ in range(draw(st.integers(0, 6))):
        start = pos + draw(st.integers(0, 2))
        pos = start + draw(st.integers(1, 4))
        spans.append((start, pos, draw(st.sampled_from(TYPES))))
    return spans, pos + draw(st.integers(0, 2))


@st.composite
def segmentations(draw) -> tuple[list[tuple[int, int, str]], int]:
    """A segmentation of some length into words, as BMES spans."""
    spans, pos = [], 0
    for width in draw(st.lists(st.integers(1, 4), max_size=8)):
        spans.append((pos, pos + width, ""))
        pos += width
    return spans, pos


# ---------------------------------------------------------------- the batched decoder is tags_to_spans


@pytest.mark.parametrize("scheme", [*TYPED_SCHEMES, "BMES"])
def test_batch_decoder_equals_tags_to_spans_row_by_row(scheme):
    alphabet = ALPHABETS.get(scheme, ["B", "M", "E", "S"])

    @SETTINGS
    @given(st.lists(st.lists(st.sampled_from(alphabet), max_size=12), min_size=1, max_size=6), st.data())
    def check(rows, data):
        n = max(map(len, rows)) + data.draw(st.integers(0, 2))  # padding, and garbage ids after each row's length
        ids = np.array([[alphabet.index(t) for t in row] + data.draw(st.lists(
            st.integers(-1, len(alphabet) - 1), min_size=n - len(row), max_size=n - len(row))) for row in rows])
        decoder = BatchTagDecoder(alphabet, scheme)
        b, s, e, k = decoder(ids, [len(row) for row in rows])
        got = [(r, start, end, decoder.labels[label]) for r, start, end, label in zip(b, s, e, k)]
        assert got == [(r, *span) for r, row in enumerate(rows) for span in tags_to_spans(row, scheme)]

    check()


# ---------------------------------------------------------------- decoding agrees with seqeval


@pytest.mark.parametrize("scheme", TYPED_SCHEMES)
def test_tags_to_spans_matches_seqeval(scheme):
    @SETTINGS
    @given(tag_seqs(scheme))
    def check(tags):
        assert tags_to_spans(tags, scheme) == seqeval_spans(tags)

    check()


@pytest.mark.parametrize(
    "tags, scheme, expected",
    [
        ([], "BIO", []),
        (["O", "O"], "BIO", []),
        (["B-PER", "I-PER", "O", "B-LOC"], "BIO", [(0, 2, "PER"), (3, 4, "LOC")]),
        (["B-PER", "B-PER", "I-PER"], "BIO", [(0, 1, "PER"), (1, 3, "PER")]),
        # ill-formed: I after O starts an entity, a type change ends one
        (["O", "I-PER", "I-PER", "I-LOC"], "BIO", [(1, 3, "PER"), (3, 4, "LOC")]),
        (["B-PER", "I-LOC"], "BIO", [(0, 1, "PER"), (1, 2, "LOC")]),
        (
            ["I-PER", "I-PER", "B-PER", "I-LOC", "I-LOC"],
            "IOB1",
            [(0, 2, "PER"), (2, 3, "PER"), (3, 5, "LOC")],
        ),
        (["B-LOC", "I-LOC", "E-LOC", "S-PER", "O"], "BIOES", [(0, 3, "LOC"), (3, 4, "PER")]),
        # ill-formed: E closes, a following E/I starts anew; B not closed by E still ends
        (
            ["E-LOC", "E-LOC", "I-LOC", "B-PER"],
            "BIOES",
            [(0, 1, "LOC"), (1, 2, "LOC"), (2, 3, "LOC"), (3, 4, "PER")],
        ),
        (["S-PER", "I-PER", "E-PER"], "BIOES", [(0, 1, "PER"), (1, 3, "PER")]),
        (["B-ORG-X", "I-ORG-X"], "iob2", [(0, 2, "ORG-X")]),  # alias, case-insensitive; type keeps "-"
        (["B", "M", "E", "S", "B", "E"], "BMES", [(0, 3, ""), (3, 4, ""), (4, 6, "")]),
        # ill-formed BMES still partitions: stray M/E start words, unclosed B/M end at the next B/S
        (
            ["M", "E", "E", "B", "B", "M", "S", "M"],
            "BMES",
            [(0, 2, ""), (2, 3, ""), (3, 4, ""), (4, 6, ""), (6, 7, ""), (7, 8, "")],
        ),
    ],
)
def test_tags_to_spans_examples(tags, scheme, expected):
    assert tags_to_spans(tags, scheme) == expected
    if scheme.upper() != "BMES":
        assert expected == seqeval_spans(tags)


@SETTINGS
@given(st.lists(st.sampled_from("BMES"), max_size=16))
def test_bmes_always_partitions(tags):
    words = tags_to_spans(tags, "BMES")
    assert [i for s, e, _ in words for i in range(s, e)] == list(range(len(tags)))
    # and agrees with seqeval's decoding with M read as I
    assert words == [(s, e, "") for s, e, _ in seqeval_spans(["I" if t == "M" else t for t in tags])]


# ---------------------------------------------------------------- round trips


@pytest.mark.parametrize("scheme", TYPED_SCHEMES)
def test_round_trip_typed(scheme):
    @SETTINGS
    @given(typed_spans())
    def check(spans_and_length):
        spans, length = spans_and_length
        tags = spans_to_tags(spans, length, scheme)
        assert len(tags) == length
        assert tags_to_spans(tags, scheme) == spans

    check()


@SETTINGS
@given(segmentations())
def test_round_trip_bmes(spans_and_length):
    spans, length = spans_and_length
    tags = spans_to_tags(spans, length, "BMES")
    assert set(tags) <= set("BMES")
    assert tags_to_spans(tags, "BMES") == spans


def test_spans_to_tags_examples():
    spans = [(0, 2, "PER"), (2, 3, "PER"), (3, 4, "LOC"), (5, 8, "LOC")]
    assert spans_to_tags(spans, 9, "BIO") == [
        "B-PER", "I-PER", "B-PER", "B-LOC", "O", "B-LOC", "I-LOC", "I-LOC", "O",
    ]  # fmt: skip
    assert spans_to_tags(spans, 9, "IOB1") == [
        "I-PER", "I-PER", "B-PER", "I-LOC", "O", "I-LOC", "I-LOC", "I-LOC", "O",
    ]  # fmt: skip
    assert spans_to_tags(spans, 9, "BIOES") == [
        "B-PER", "E-PER", "S-PER", "S-LOC", "O", "B-LOC", "I-LOC", "E-LOC", "O",
    ]  # fmt: skip
    assert spans_to_tags([(0, 1, ""), (1, 4, ""), (4, 6, "")], 6, "BMES") == ["S", "B", "M", "E", "B", "E"]
    # Span objects and unsorted input are accepted
    assert spans_to_tags([Span(3, 4, "LOC", "x"), Span(0, 2, "PER", "ab")], 4) == [
        "B-PER", "I-PER", "O", "B-LOC",
    ]  # fmt: skip


# ---------------------------------------------------------------- scoring agrees with seqeval


def span_f1(true_seqs: list[list[str]], pred_seqs: list[list[str]]) -> float:
    true = {(i, *s) for i, tags in enumerate(true_seqs) for s in tags_to_spans(tags, "BIOES")}
    pred = {(i, *s) for i, tags in enumerate(pred_seqs) for s in tags_to_spans(tags, "BIOES")}
    return 2 * len(true & pred) / (len(true) + len(pred)) if true or pred else 0.0


@settings(derandomize=True, max_examples=50, deadline=None)
@given(st.lists(seq_pairs(), min_size=1, max_size=4))
def test_f1_matches_seqeval(pairs):
    true_seqs = [t for t, _ in pairs]
    pred_seqs = [p for _, p in pairs]
    assert span_f1(true_seqs, pred_seqs) == pytest.approx(f1_score(true_seqs, pred_seqs, zero_division=0))


# ---------------------------------------------------------------- errors


@pytest.mark.parametrize("func", [lambda s: tags_to_spans(["O"], s), lambda s: spans_to_tags([], 1, s)])
def test_unknown_scheme(func):
    with pytest.raises(ValueError, match="unknown tagging scheme 'BILOU'"):
        func("BILOU")


@pytest.mark.parametrize(
    "tag, scheme",
    [
        ("X-PER", "BIO"),
        ("B-", "BIO"),
        ("B", "BIO"),
        ("PER", "BIO"),
        ("", "BIO"),
        ("BB-PER", "BIO"),
        ("O-PER", "BIO"),
        ("E-PER", "BIO"),
        ("S-PER", "IOB1"),
        ("M-PER", "BIOES"),
        ("O", "BMES"),
        ("B-PER", "BMES"),
    ],
)
def test_malformed_tag(tag, scheme):
    with pytest.raises(ValueError, match="malformed"):
        tags_to_spans(["O", tag] if scheme != "BMES" else ["S", tag], scheme)


@pytest.mark.parametrize("scheme", ["BIO", "IOB1", "BIOES", "BMES"])
def test_overlapping_spans(scheme):
    with pytest.raises(ValueError, match=r"overlapping spans \(0, 3, 'PER'\) and \(2, 4, 'LOC'\)"):
        spans_to_tags([(2, 4, "LOC"), (0, 3, "PER")], 5, scheme)


def test_other_span_errors():
    with pytest.raises(ValueError, match="outside"):
        spans_to_tags([(3, 6, "PER")], 5)
    with pytest.raises(ValueError, match="empty or outside"):
        spans_to_tags([(2, 2, "PER")], 5)
    with pytest.raises(ValueError, match="needs a label"):
        spans_to_tags([(0, 1, "")], 5, "BIOES")
    with pytest.raises(ValueError, match="position 2 is not"):
        spans_to_tags([(0, 2, ""), (3, 4, "")], 4, "BMES")
