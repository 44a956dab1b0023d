"""Soft-target losses of same-language distillation (``zhie distill student``, :mod:`zhie.training.students`).

A teacher's outputs on a training window are computed once and stored compactly; a student's loss compares its own
outputs with them. One loss per output type, each in fp32, each the soft form of the head's own training loss:

* span logits (GP/EGP, GPLinker's three matrices): the soft multilabel categorical cross-entropy
  (:func:`zhie.losses.soft_multilabel_categorical_crossentropy`, spec §0.2) against the teacher's calibrated
  probabilities ``t = sigmoid(2 s_T / T)`` of the cells, with the student's logits divided by the same temperature
  ``T``. Stored sparse: only cells with ``t >= SPAN_MIN_PROB`` keep their probability; every other cell is a negative
  (``t = 0``), as in the dense loss;
* tag emissions (CRF, softmax): ``T² · KL(softmax(e_T / T) || softmax(e_S / T))`` per content token, averaged over
  the window's content tokens (Hinton et al. 2015), stored dense in fp16;
* sentence vectors (similarity): the mean squared difference of the two in-batch cosine-similarity matrices (the pair
  similarities the teacher would score), which holds for a student of any width.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from zhie.losses import MASKED_LOGIT_THRESHOLD, soft_multilabel_categorical_crossentropy

__all__ = ["SPAN_MIN_PROB", "dense_targets", "similarity_matrix_loss", "soft_cells", "span_soft_loss", "stack_cells",
           "tag_soft_loss"]

SPAN_MIN_PROB = 1e-3
"""Span cells whose teacher probability is below this are stored as plain negatives (logit < -3.45 at T = 1)."""


def soft_cells(logits: Tensor, temperature: float = 1.0, min_prob: float = SPAN_MIN_PROB
               ) -> list[tuple[Tensor, Tensor]]:
    """A batch of masked span logits ``[b, heads, n, n]`` -> per row its stored soft targets: ``(cells [k, 3]`` int32
    ``(head, row, col)``, ``probs [k]`` fp16 ``sigmoid(2 s / T))``, the cells with a probability ``>= min_prob``."""
    probs = torch.sigmoid(2 * logits.float() / temperature)
    keep = probs >= min_prob
    out = []
    for b in range(logits.shape[0]):
        cells = keep[b].nonzero()
        out.append((cells.to(torch.int32).cpu(), probs[b][keep[b]].to(torch.float16).cpu()))
    return out


def stack_cells(rows: list[tuple[Tensor, Tensor]]) -> tuple[Tensor, Tensor]:
    """The stored soft cells of a batch's rows (:func:`soft_cells`) as one ``cells [K, 4]`` int64 tensor ``(row, head,
    i, j)`` and ``probs [K]`` fp32: what a collated batch carries (sparse, never a dense ``[b, heads, n, n]`` on the
    host)."""
    cells = [torch.cat([torch.full((len(c), 1), b, dtype=torch.int64), c.to(torch.int64)], dim=1)
             for b, (c, _) in enumerate(rows)]
    return (torch.cat(cells) if cells else torch.zeros((0, 4), dtype=torch.int64),
            torch.cat([p.float() for _, p in rows]) if rows else torch.zeros(0))


def dense_targets(cells: Tensor, probs: Tensor, like: Tensor) -> Tensor:
    """:func:`stack_cells`' ``cells`` and ``probs`` -> the dense target of the span logits ``like`` ``[b, heads, n,
    n]``, on their device (0 where nothing was stored)."""
    target = torch.zeros(like.shape, dtype=torch.float32, device=like.device)
    c = cells.to(like.device)
    target[c[:, 0], c[:, 1], c[:, 2], c[:, 3]] = probs.to(device=like.device, dtype=torch.float32)
    return target


def span_soft_loss(logits: Tensor, target: Tensor, temperature: float = 1.0) -> Tensor:
    """Per ``[b, heads]`` instance: the soft MCE of ``logits / T`` against ``target`` (probabilities, the same shape as
    ``logits``), times ``T²``; masked cells (the head's mask value) count for nothing."""
    b, h, n, _ = logits.shape
    s = logits.float()
    scaled = torch.where(s > MASKED_LOGIT_THRESHOLD, s / temperature, s)  # keep masked cells masked
    loss = soft_multilabel_categorical_crossentropy(scaled.reshape(b, h, n * n), target.reshape(b, h, n * n))
    return loss * temperature ** 2


def tag_soft_loss(emissions: Tensor, teacher: Tensor, mask: Tensor, temperature: float = 1.0) -> Tensor:
    """Per row ``[b]``: ``T² · KL(p_T || p_S)`` with ``p = softmax(emissions / T)`` over the tags, averaged over the
    positions where ``mask`` is true (a row without any gives 0)."""
    log_s = F.log_softmax(emissions.float() / temperature, dim=-1)
    log_t = F.log_softmax(teacher.float() / temperature, dim=-1)
    kl = (log_t.exp() * (log_t - log_s)).sum(-1)  # [b, n]
    m = mask.to(kl.dtype)
    return (kl * m).sum(-1) / m.sum(-1).clamp(min=1) * temperature ** 2


def similarity_matrix_loss(student: Tensor, teacher: Tensor) -> Tensor:
    """Mean squared difference of the cosine-similarity matrices of ``student [B, d]`` and ``teacher [B, d']`` (every
    ordered pair of distinct rows); a scalar, 0 for a batch of one."""
    if student.shape[0] < 2:
        return student.float().sum() * 0.0
    s, t = F.normalize(student.float(), dim=-1), F.normalize(teacher.float(), dim=-1)
    off = ~torch.eye(s.shape[0], dtype=torch.bool, device=s.device)
    return ((s @ s.T - t @ t.T)[off] ** 2).mean()
