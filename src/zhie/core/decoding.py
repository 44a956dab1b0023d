"""The decoders of every head, in numpy: one implementation for the torch path and the exported (onnxruntime) path.

The torch path hands its heads' outputs to these functions as numpy arrays (:meth:`zhie.model.Model.arrays`), an
export hands the graph's outputs (:mod:`zhie.deploy.runtime`); nothing here imports torch.

* :func:`span_cells` — GlobalPointer / Efficient GlobalPointer: the cells whose masked logit is > 0, at most ``cap``
  per row (the highest), score ``sigmoid(2 * logit)``;
* :func:`viterbi` — the CRF's Viterbi, restricted by :func:`bio_allowed_transitions` /
  :func:`bmes_allowed_transitions`; :func:`tag_probabilities` — the softmax probability of each chosen tag;
* :func:`link_relations` — GPLinker's linking of subjects and objects into triples, with its caps;
* :func:`l2_normalize` — sentence vectors; :data:`POOLINGS` — the pooling heads (they run inside the model);
* how sure a head is of what it decoded (``zhie select``, :mod:`zhie.deploy.selection`): :func:`cell_surprise` for the
  span heads' cells, :func:`crf_surprise` for the CRF.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from zhie.core.spans import parse_tag

POOLINGS = ("cls", "mean", "first-last-avg")
FORBIDDEN = -1e12  # the score of a forbidden transition, start or end tag; real path scores are << 1e12


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def l2_normalize(vectors: np.ndarray, eps: float = 1e-12) -> np.ndarray:
    """Rows divided by their L2 norm (at least ``eps``), as ``torch.nn.functional.normalize``."""
    return vectors / np.maximum(np.linalg.norm(vectors, axis=-1, keepdims=True), eps)


# ------------------------------------------------------------------------------------------------- span heads
def span_cells(logits: np.ndarray, cap: int) -> tuple[np.ndarray, ...]:
    """Masked span logits ``[b, types, n, n]`` -> ``(row, type, i, j, score)`` arrays of the cells > 0, in row-major
    order; a row with more than ``cap`` such cells keeps the ``cap`` highest (an early or diverged model scores most
    cells > 0: without a cap every one would become a span). ``score = sigmoid(2 * logit)``."""
    if cap < 1:
        raise ValueError(f"the span cap must be a positive number of spans, got {cap}")
    logits = np.asarray(logits)
    flat = logits.reshape(-1)
    where = np.flatnonzero(flat > 0)  # a 1-d nonzero and unravel_index: ~10x faster than np.nonzero on 4 axes
    cells = np.stack(np.unravel_index(where, logits.shape), axis=1)  # [m, 4], row-major, so grouped by row
    values = flat[where].astype(np.float32)
    counts = np.bincount(cells[:, 0], minlength=logits.shape[0])
    if (counts > cap).any():
        keep, offset = [], 0
        for count in counts.tolist():
            part = np.arange(offset, offset + count)
            if count > cap:
                part = offset + np.sort(np.argsort(-values[part], kind="stable")[:cap])
            keep.append(part)
            offset += count
        cells, values = cells[np.concatenate(keep)], values[np.concatenate(keep)]
    return (*cells.T, sigmoid(2 * values))


def cell_surprise(logits: np.ndarray) -> np.ndarray:
    """``[b]`` float64: for each row of span logits ``[b, ...]`` (GlobalPointer's ``[b, types, n, n]``, a GPLinker
    module's), ``-log P`` of the cells as :func:`span_cells` decodes them, each cell read as the independent Bernoulli
    ``p = sigmoid(2 * logit)`` that scores it (predicted where ``p > 0.5``): the sum over the cells of ``-log max(p,
    1 - p) = log(1 + exp(-2 |logit|))``. A masked cell (its logit far below 0) adds nothing."""
    logits = np.asarray(logits)
    out = np.empty(len(logits), dtype=np.float64)
    for b, row in enumerate(logits):  # a row at a time: the temporaries of [types, n, n], not of the whole batch
        out[b] = np.log1p(np.exp(-2.0 * np.abs(row.astype(np.float32)))).sum(dtype=np.float64)
    return out


# ------------------------------------------------------------------------------------------------- taggers
def bio_allowed_transitions(tags: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Constraints of the BIO scheme for ``tags`` (tag id -> name, e.g. ``["O", "B-PER", "I-PER"]``).

    Returns bool ``(allowed [L, L], allowed_start [L], allowed_end [L])``: ``I-X`` may only follow ``B-X``
    or ``I-X`` (so ``O -> I-X`` and ``B-X/I-X -> I-Y``, ``Y != X``, are forbidden) and a sequence may not
    start with ``I-X``; every tag may end a sequence.
    """
    parsed = [parse_tag(tag, "BIO") for tag in tags]
    allowed = np.ones((len(tags), len(tags)), dtype=bool)
    for j, (pj, tj) in enumerate(parsed):
        if pj == "I":
            for i, (pi, ti) in enumerate(parsed):
                allowed[i, j] = pi in ("B", "I") and ti == tj
    start = np.array([p != "I" for p, _ in parsed], dtype=bool)
    return allowed, start, np.ones(len(tags), dtype=bool)


def bmes_allowed_transitions(tags: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Constraints of the BMES scheme (word segmentation ``["S", "B", "M", "E"]``, or typed ``"B-X"`` with
    ``"O"``; ``"I"`` is read as ``"M"`` so BIOES works too).

    Inside a word (after ``B-X`` or ``M-X``) only ``M-X`` / ``E-X`` may follow; after ``S``, ``E`` or ``O``
    only ``B``, ``S`` or ``O``. So ``S->M, S->E, B->S, B->B, M->S, M->B, E->M, E->E`` are forbidden, a
    sequence may not start with ``M``/``E`` nor end with ``B``/``M``.
    Returns bool ``(allowed [L, L], allowed_start [L], allowed_end [L])``.
    """
    scheme = "BMES" if all(len(tag) == 1 and tag != "O" for tag in tags) else "BIOES"
    parsed = [(("M" if p == "I" else p), t) for p, t in (parse_tag(tag, scheme) for tag in tags)]
    allowed = np.zeros((len(tags), len(tags)), dtype=bool)
    for i, (pi, ti) in enumerate(parsed):
        for j, (pj, tj) in enumerate(parsed):
            allowed[i, j] = pj in ("M", "E") and tj == ti if pi in ("B", "M") else pj in ("B", "S", "O")
    start = np.array([p in ("B", "S", "O") for p, _ in parsed], dtype=bool)
    end = np.array([p in ("S", "E", "O") for p, _ in parsed], dtype=bool)
    return allowed, start, end


CONSTRAINTS = {"BIO": bio_allowed_transitions, "BMES": bmes_allowed_transitions}


def constrained(transitions: np.ndarray, start: np.ndarray | None, end: np.ndarray | None,
                constraints: tuple[np.ndarray, np.ndarray, np.ndarray] | None
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """fp32 ``(transitions, start, end)`` scores (zeros for a CRF without start/end scores) with :data:`FORBIDDEN`
    where ``constraints`` (``allowed``, ``allowed_start``, ``allowed_end``) forbid."""
    trans = np.asarray(transitions, dtype=np.float32)
    n = trans.shape[0]
    start = np.zeros(n, np.float32) if start is None else np.asarray(start, dtype=np.float32)
    end = np.zeros(n, np.float32) if end is None else np.asarray(end, dtype=np.float32)
    if constraints is not None:
        allowed, allowed_start, allowed_end = constraints
        trans = np.where(allowed, trans, np.float32(FORBIDDEN))
        start = np.where(allowed_start, start, np.float32(FORBIDDEN))
        end = np.where(allowed_end, end, np.float32(FORBIDDEN))
    return trans, start, end


def viterbi(emissions: np.ndarray, lengths: Sequence[int], transitions: np.ndarray, start: np.ndarray,
            end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Batched Viterbi in fp32 -> ``(tags [b, n] int64 with -1 past each row's length, best scores [b])``.

    ``emissions [b, n, L]``, right-padded rows of ``lengths`` steps (each at least 1); ``transitions[i, j]`` scores tag
    ``i`` -> ``j``; ``start`` / ``end`` ``[L]`` (see :func:`constrained` for the constraints). Forward:
    ``delta_0 = start + e_0``, ``delta_t(j) = max_i(delta_{t-1}(i) + T[i, j]) + e_t(j)``, tag-major (``[n, L, b]``:
    the batch is the contiguous axis); each row is read at its own last step. Backtrace from
    ``argmax_j(delta_last(j) + end(j))``: the tag before ``j`` at step ``t`` is ``argmax_i(delta_{t-1}(i) + T[i, j])``.
    If no allowed path exists the result is the least-violating path.
    """
    em = np.ascontiguousarray(np.asarray(emissions, dtype=np.float32).transpose(1, 2, 0))  # [n, L, b]
    n, L, b = em.shape
    lengths = np.asarray(lengths, dtype=np.int64).reshape(b)
    if n == 0 or (lengths < 1).any() or (lengths > n).any():
        raise ValueError(f"every sequence needs 1 to {n} steps, got lengths {lengths.tolist()}")
    trans = np.asarray(transitions, dtype=np.float32)
    delta = np.empty_like(em)
    delta[0] = em[0] + np.asarray(start, dtype=np.float32)[:, None]
    trans_ijb = trans[:, :, None]
    for t in range(1, n):
        np.add((delta[t - 1][:, None, :] + trans_ijb).max(0), em[t], out=delta[t])
    last = delta[lengths - 1, :, np.arange(b)] + np.asarray(end, dtype=np.float32)  # [b, L]
    tag, best = last.argmax(-1), last.max(-1)
    real = lengths[None, :] > np.arange(n)[:, None]
    tags = np.full((n, b), -1, dtype=np.int64)
    for t in range(n - 1, 0, -1):
        tags[t] = np.where(real[t], tag, -1)
        tag = np.where(real[t], (delta[t - 1] + trans[:, tag]).argmax(0), tag)
    tags[0] = tag
    return tags.T, best


def tag_probabilities(emissions: np.ndarray, tags: np.ndarray) -> np.ndarray:
    """``[b, n]``: the softmax probability of each position's tag in ``tags`` (``-1``: tag 0's, to be ignored)."""
    probs = softmax(np.asarray(emissions, dtype=np.float32))
    return np.take_along_axis(probs, np.maximum(tags, 0)[..., None], axis=-1)[..., 0]


def crf_surprise(emissions: np.ndarray, lengths: Sequence[int], transitions: np.ndarray, start: np.ndarray,
                 end: np.ndarray) -> np.ndarray:
    """``[b]`` float64: ``log Z - best``, ``-log`` of the probability of each row's best tag path, for the arguments of
    :func:`viterbi`. ``log Z`` is the log-sum-exp of the scores of every path (the forward algorithm, in log space),
    ``best`` the score of the best one (:func:`viterbi`'s recursion, its max for the sum), both in float64 over the
    same steps; with :func:`constrained` scores the paths that the constraints forbid add nothing (``exp(FORBIDDEN)``
    is 0), so the probability is that of the decoded path among the allowed ones."""
    em = np.asarray(emissions, dtype=np.float64)
    b, n, _ = em.shape
    lengths = np.asarray(lengths, dtype=np.int64).reshape(b)
    if n == 0 or (lengths < 1).any() or (lengths > n).any():
        raise ValueError(f"every sequence needs 1 to {n} steps, got lengths {lengths.tolist()}")
    trans = np.asarray(transitions, dtype=np.float64)[None]  # [1, from, to]
    alpha = np.asarray(start, dtype=np.float64)[None] + em[:, 0]  # [b, L]: log-sum-exp of the paths so far
    delta = alpha.copy()  # [b, L]: the best path so far
    for t in range(1, int(lengths.max())):
        real = (t < lengths)[:, None]
        scores = alpha[:, :, None] + trans
        top = scores.max(1)
        alpha = np.where(real, top + np.log(np.exp(scores - top[:, None]).sum(1)) + em[:, t], alpha)
        delta = np.where(real, (delta[:, :, None] + trans).max(1) + em[:, t], delta)
    end = np.asarray(end, dtype=np.float64)[None]
    last, best = alpha + end, (delta + end).max(1)
    top = last.max(1)
    return np.maximum(top + np.log(np.exp(last - top[:, None]).sum(1)) - best, 0.0)


# ------------------------------------------------------------------------------------------------- GPLinker
def top_cells(logits: np.ndarray, cap: int) -> np.ndarray:
    """``[m, 2]`` ``(row, col)`` of the cells of ``logits [n, n]`` scoring > 0, at most ``cap`` (the highest), in
    row-major order."""
    cells = np.argwhere(logits > 0)
    if len(cells) > cap:
        keep = np.sort(np.argsort(-logits[cells[:, 0], cells[:, 1]], kind="stable")[:cap])
        cells = cells[keep]
    return cells


def link_relations(entity: np.ndarray, head_head: np.ndarray, tail_tail: np.ndarray, max_spans: int,
                   max_triples: int) -> list[tuple[np.ndarray, ...]]:
    """GPLinker's masked logits (``entity [b, 2, n, n]``, ``head_head`` and ``tail_tail [b, predicates, n, n]``) ->
    per row ``(subjects [m, 2], predicate [t], subject index [t], object index [t], objects [m', 2], score [t])``.

    A triple is a subject cell and an object cell > 0 (at most ``max_spans`` of each, the highest) whose two linking
    cells of the predicate are > 0; its score is the smallest ``sigmoid(2 * logit)`` of its four cells; above
    ``max_triples`` the highest are kept (in their order).
    """
    rows = []
    for b in range(entity.shape[0]):
        ent = entity[b].astype(np.float32)
        subjects, objects = top_cells(ent[0], max_spans), top_cells(ent[1], max_spans)
        hh = head_head[b].astype(np.float32)[:, subjects[:, 0, None], objects[None, :, 0]]  # [R, S, O]
        tt = tail_tail[b].astype(np.float32)[:, subjects[:, 1, None], objects[None, :, 1]]
        p, si, oi = np.nonzero((hh > 0) & (tt > 0))
        logits = np.stack([ent[0][subjects[si, 0], subjects[si, 1]], ent[1][objects[oi, 0], objects[oi, 1]],
                           hh[p, si, oi], tt[p, si, oi]])
        score = sigmoid(2 * logits).min(0)
        if len(score) > max_triples:
            keep = np.sort(np.argsort(-score, kind="stable")[:max_triples])
            p, si, oi, score = p[keep], si[keep], oi[keep], score[keep]
        rows.append((subjects, p, si, oi, objects, score))
    return rows
