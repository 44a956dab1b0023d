"""Evaluation metrics.

- :func:`span_prf`: span-level precision / recall / F1, micro-averaged and per type (NER).
- :func:`segmentation_prf`: word-level P/R/F1 over character spans, with OOV and IV recall (SIGHAN scoring).
- :func:`prf_table`: the per-type table of :func:`span_prf`'s result, as text.
- :func:`label_errors`: the false positives, false negatives and wrong labels of one example (``zhie eval --errors``).

Conventions shared by every metric here: inputs are per-example lists, a ratio with a zero
denominator is 0.0, and results are plain dicts of Python numbers (JSON-serialisable).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Hashable, Iterable, Sequence

import numpy as np

from zhie.core.spans import Span

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


def prf_table(metrics: dict, first: str = "type") -> str:
    """:func:`span_prf`'s result as a table: one row per type (precision, recall, F1, support), then ``micro``."""
    width = max([16, *(len(label) + 2 for label in metrics["per_type"])])
    lines = [f"{first:<{width}}{'precision':>10}{'recall':>10}{'f1':>10}{'support':>10}"]
    rows = [*metrics["per_type"].items(), ("micro", {**metrics["micro"], "support": metrics["n_gold"]})]
    for label, m in rows:
        lines.append(f"{label:<{width}}{m['precision']:>10.4f}{m['recall']:>10.4f}{m['f1']:>10.4f}{m['support']:>10}")
    return "\n".join(lines)


def label_errors(gold: Iterable[tuple[Hashable, str]], pred: Iterable[tuple[Hashable, str]]
                 ) -> list[tuple[Hashable, str | None, str | None]]:
    """What one example's predicted ``(item, label)`` pairs get wrong against the gold ones, both taken as sets (as
    :func:`span_prf` takes them): ``(item, gold label, predicted label)`` per error, sorted by item. An item predicted
    with another label than its gold one is a wrong label (both set; items with several labels are paired in label
    order), a predicted pair left over a false positive (gold label ``None``), a gold pair left over a false negative
    (predicted label ``None``). So false positives + wrong labels = the predictions :func:`span_prf` counts wrong,
    false negatives + wrong labels = the gold pairs it misses."""
    g, p = set(gold), set(pred)
    missed: dict[Hashable, list[str]] = defaultdict(list)
    for item, label in sorted(g - p):
        missed[item].append(label)
    out: list[tuple[Hashable, str | None, str | None]] = []
    for item, label in sorted(p - g):
        out.append((item, missed[item].pop(0) if missed.get(item) else None, label))
    out += [(item, label, None) for item, labels in missed.items() for label in labels]
    return sorted(out, key=lambda error: error[0])


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


def average_ranks(values: Sequence[float]) -> np.ndarray:
    """The 1-based ranks of ``values``, tied values sharing the mean of their ranks (scipy's ``rankdata``)."""
    values = np.asarray(values, dtype=np.float64)
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])  # where each run of equal values begins
    ends = np.r_[starts[1:], len(values)]
    ranks = np.empty(len(values))
    ranks[order] = np.repeat((starts + ends + 1) / 2, ends - starts)  # mean of the ranks start+1 .. end
    return ranks


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rank correlation (ties averaged, as scipy's); 0.0 where it is undefined (a constant input)."""
    rx, ry = average_ranks(x) - (len(x) + 1) / 2, average_ranks(y) - (len(y) + 1) / 2
    scale = float(np.sqrt((rx * rx).sum() * (ry * ry).sum()))
    return float((rx * ry).sum()) / scale if scale > 0 else 0.0
