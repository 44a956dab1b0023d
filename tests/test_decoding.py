"""The numpy decoders (zhie.core.decoding) against brute force, the span cap, and the torch-free tokenizer against
transformers' (the CRF's Viterbi against pytorch-crf and brute force: tests/test_heads.py, through CRF.viterbi)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zhie.core import decoding
from zhie.tasks.ner_heads import NerConfig
from zhie.tasks.ner_labels import SpanLabels
from zhie.tasks.relation import RelationConfig, RelationTask


def brute_spans(logits: np.ndarray, cap: int) -> list[list[tuple[int, int, int]]]:
    """Per row: every cell > 0 visited in Python, the ``cap`` highest kept, in row-major order."""
    rows = []
    for row in logits:
        cells = [(row[k, i, j], (k, i, j)) for k, i, j in np.ndindex(row.shape) if row[k, i, j] > 0]
        rows.append(sorted(cell for _, cell in sorted(cells, reverse=True)[:cap]))
    return rows


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), shape=st.tuples(st.integers(1, 3), st.integers(1, 3), st.integers(1, 7)),
       cap=st.integers(1, 40))
def test_span_cells_are_the_positive_cells_up_to_the_cap(seed, shape, cap):
    b, k, n = shape
    logits = np.random.default_rng(seed).normal(size=(b, k, n, n)).astype(np.float32)
    row, kind, i, j, score = decoding.span_cells(logits, cap)
    got = [[(t, a, c) for r, t, a, c in zip(row, kind, i, j) if r == x] for x in range(b)]
    assert got == brute_spans(logits, cap)
    np.testing.assert_allclose(score, 1 / (1 + np.exp(-2.0 * logits[row, kind, i, j])), rtol=1e-6)


def test_a_diverged_span_model_decodes_at_most_max_spans_per_window():
    """Every cell of a window > 0 (an early or diverged model): the cap keeps the highest, not n² spans."""
    spans = SpanLabels(NerConfig(["A", "B"], max_spans=50))
    logits = np.random.default_rng(0).uniform(0.1, 5.0, size=(3, 2, 40, 40)).astype(np.float32)
    rows = spans.decode(logits, np.ones((3, 40), dtype=np.int64))
    assert [len(r) for r in rows] == [50, 50, 50]
    for b, row in enumerate(rows):
        kept = sorted((logits[b, s.label, s.start + 1, s.end] for s in row), reverse=True)
        assert kept[-1] >= np.sort(logits[b].ravel())[-50]  # the 50 highest cells


def brute_triples(ent, hh, tt, max_spans, max_triples):
    def top(m):
        cells = [(m[i, j], (i, j)) for i, j in np.ndindex(m.shape) if m[i, j] > 0]
        return sorted(c for _, c in sorted(cells, reverse=True)[:max_spans])

    def sig(x):
        return 1 / (1 + np.exp(-2.0 * x))

    out = []
    for p, (sh, se), (oh, oe) in itertools.product(range(len(hh)), top(ent[0]), top(ent[1])):
        if hh[p, sh, oh] > 0 and tt[p, se, oe] > 0:
            score = min(sig(ent[0, sh, se]), sig(ent[1, oh, oe]), sig(hh[p, sh, oh]), sig(tt[p, se, oe]))
            out.append(((sh - 1, se), p, (oh - 1, oe), score))
    return sorted(sorted(out, key=lambda t: -t[3])[:max_triples], key=lambda t: t[:3])


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), r=st.integers(1, 3), n=st.integers(2, 7),
       caps=st.sampled_from([(128, 512), (3, 4), (2, 1)]))
def test_relations_are_the_linked_pairs_up_to_the_caps(seed, r, n, caps):
    rng = np.random.default_rng(seed)
    ent, hh, tt = (rng.normal(size=(1, m, n, n)).astype(np.float32) for m in (2, r, r))
    task = RelationTask.__new__(RelationTask)
    task.config, task.head_name = RelationConfig(["p"] * r, max_spans=caps[0], max_triples=caps[1]), "re"
    (row,) = task.decode(None, {"re": {"entity": ent, "head_head": hh, "tail_tail": tt}}, np.ones((1, n)))
    want = brute_triples(ent[0], hh[0], tt[0], *caps)
    got = sorted((t.subject, t.predicate, t.object, t.score) for t in row)
    assert [g[:3] for g in got] == [w[:3] for w in want] or len(want) == caps[1]  # ties at the triple cap
    np.testing.assert_allclose(sorted(g[3] for g in got), sorted(w[3] for w in want), rtol=1e-6)


@pytest.mark.parametrize("scheme,tags", [("BIO", ["O", "B-A", "I-A", "B-B", "I-B"]), ("BMES", ["S", "B", "M", "E"])])
def test_viterbi_follows_the_constraints_on_a_batch(scheme, tags):
    rng = np.random.default_rng(1)
    constraints = decoding.CONSTRAINTS[scheme](tags)
    trans = rng.normal(scale=3.0, size=(len(tags),) * 2)
    lengths = rng.integers(1, 12, size=32)
    paths, _ = decoding.viterbi(rng.normal(scale=2.0, size=(32, 12, len(tags))), lengths,
                                *decoding.constrained(trans, None, None, constraints))
    allowed, start, end = constraints
    for path, n in zip(paths, lengths):
        assert (path[n:] == -1).all() and start[path[0]] and end[path[n - 1]]
        assert all(allowed[a, b] for a, b in zip(path[: n - 1], path[1:n]))


def test_the_torch_free_tokenizer_reads_what_transformers_reads(tmp_path):
    """FastTokenizer (tokenizers only) gives TextTokenizer the same ids and offsets as the transformers tokenizer it
    was saved from, in both modes, and the same truncated model inputs."""
    from transformers import AutoTokenizer

    from zhie import encoders
    from zhie.core.text import FastTokenizer, TextTokenizer

    texts = ["王伟在青山市工作。", "ＡＢＣ  hello, World!\t北京 ", "", "e5 的 tokenizer 很长很长很长很长很长"]
    _, tokenizer = encoders.tiny(texts)
    tokenizer.save_pretrained(tmp_path)
    theirs, ours = AutoTokenizer.from_pretrained(tmp_path), FastTokenizer.from_dir(tmp_path)
    for mode in ("char", "subword"):
        a, b = TextTokenizer(theirs, mode), TextTokenizer(ours, mode)
        assert (a.cls_id, a.sep_id, a.pad_id, a.unk_id) == (b.cls_id, b.sep_id, b.pad_id, b.unk_id)
        for text in texts:
            assert a(text) == b(text)
    for length in (3, 8, 64):
        assert ours(texts, truncation=True, max_length=length)["input_ids"] == \
            theirs(texts, truncation=True, max_length=length)["input_ids"]
