"""Evaluation metrics.

- :func:`span_prf`: span-level precision / recall / F1, micro-averaged and per type (NER).
- :func:`segmentation_prf`: word-level P/R/F1 over character spans, with OOV and IV recall (SIGHAN scoring).

Conventions shared by every metric here: inputs are per-example lists, a ratio with a zero
denominator is 0.0, and results are plain dicts of Python numbers (JSON-serialisable).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from zhie.spans import Span

SpanLike = Span | tuple[int, int, str]


def prf(tp: int, n_pred: int, n_gold: int) -> dict[str, float]:
    precision = tp / n_pred if n_pred else 0.0
    recall = tp / n_gold if n_gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1}


def _key(span: SpanLike) -> tuple[int, int, str]:
    if isinstance(span, Span):
        return span.start, span.end, span.label
    start, end, label = span[:3]
    return start, end, label


def span_prf(gold: Sequence[Sequence[SpanLike]], pred: Sequence[Sequence[SpanLike]]) -> dict:
    """Exact-match span P/R/F1 over a corpus.

    ``gold[i]`` and ``pred[i]`` are the spans of example ``i`` (:class:`Span` objects or
    ``(start, end, label)`` tuples); a span is correct when its (start, end, label) is among the
    gold ones of the same example. Each example's spans are a set: duplicates count once, and
    text and score are ignored. This is the metric of seqeval / conlleval for flat spans, and it
    applies unchanged to nested ones.

    Returns ``{"micro": {"precision", "recall", "f1"}, "per_type": {label: {"precision", "recall",
    "f1", "support"}}, "n_gold", "n_pred"}``, where ``support`` is the number of gold spans of that
    type and ``per_type`` lists every label seen in gold or pred, sorted.
    """
    if len(gold) != len(pred):
        raise ValueError(f"gold has {len(gold)} examples but pred has {len(pred)}")
    tp, n_gold, n_pred = Counter(), Counter(), Counter()
    for g_spans, p_spans in zip(gold, pred, strict=True):
        g = {_key(s) for s in g_spans}
        p = {_key(s) for s in p_spans}
        n_gold.update(label for _, _, label in g)
        n_pred.update(label for _, _, label in p)
        tp.update(label for _, _, label in g & p)
    per_type = {}
    for label in sorted(n_gold.keys() | n_pred.keys()):
        per_type[label] = {**prf(tp[label], n_pred[label], n_gold[label]), "support": n_gold[label]}
    return {
        "micro": prf(sum(tp.values()), sum(n_pred.values()), sum(n_gold.values())),
        "per_type": per_type,
        "n_gold": sum(n_gold.values()),
        "n_pred": sum(n_pred.values()),
    }


def segmentation_prf(gold: Sequence[Sequence[SpanLike]], pred: Sequence[Sequence[SpanLike]],
                     gold_words: Sequence[Sequence[str]], train_vocab: set[str]) -> dict:
    """SIGHAN-style word segmentation scores over character spans.

    Precision, recall and F1 of predicted word spans (exact ``(start, end)`` match), plus the recall of gold
    words that are out of the training vocabulary (``oov_recall``) and of those in it (``iv_recall``).
    ``gold_words[i]`` are the texts of ``gold[i]``, in the same order.
    """
    tp = n_gold = n_pred = oov = oov_hit = iv = iv_hit = 0
    for g_spans, p_spans, words in zip(gold, pred, gold_words, strict=True):
        g = [_key(s)[:2] for s in g_spans]
        p = {_key(s)[:2] for s in p_spans}
        n_gold, n_pred = n_gold + len(g), n_pred + len(p)
        for span, word in zip(g, words, strict=True):
            hit = span in p
            tp += hit
            if word in train_vocab:
                iv, iv_hit = iv + 1, iv_hit + hit
            else:
                oov, oov_hit = oov + 1, oov_hit + hit
    return {**prf(tp, n_pred, n_gold), "oov_recall": oov_hit / oov if oov else 0.0,
            "iv_recall": iv_hit / iv if iv else 0.0, "n_gold": n_gold, "n_pred": n_pred, "n_oov": oov}


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rank correlation (scipy's, ties averaged); 0.0 where it is undefined (a constant input)."""
    import math
    import warnings

    from scipy.stats import spearmanr

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scipy warns on constant input; the result is NaN, reported as 0.0
        value = float(spearmanr(x, y).statistic)
    return 0.0 if math.isnan(value) else value
