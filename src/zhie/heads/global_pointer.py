"""GlobalPointer (spec §1) and Efficient GlobalPointer (spec §2) span-scoring heads.

Both heads map encoder states ``[batch, seq, hidden]`` to span logits ``[batch, heads, seq, seq]`` where
``logits[b, a, i, j]`` scores tokens ``i..j`` (inclusive, token indices counted with ``[CLS]`` at 0) as
an entity of type ``a`` (or, without the triangle mask, the token pair ``(i, j)`` for GPLinker's linking
heads, spec §3.1). A cell is predicted when its logit is > 0. Both heads share one masking helper,
:func:`zhie.heads.masking.mask_span_logits`. :class:`GPLinkerHead` is GPLinker's three of them (spec §3.1).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from zhie.heads.masking import content_mask, mask_span_logits
from zhie.heads.rope import apply_rope

__all__ = ["EfficientGlobalPointer", "GPLinkerHead", "GlobalPointer", "RelationLogits"]


def _glorot_uniform_(weight: Tensor) -> None:
    # Keras glorot_uniform on a [in, out] kernel == torch xavier_uniform_ on the [out, in] weight.
    nn.init.xavier_uniform_(weight)


def _lecun_normal_(weight: Tensor) -> None:
    # Keras lecun_normal: truncated normal (at 2 std) with std sqrt(1 / fan_in) / 0.8796... so that the
    # truncated distribution has variance 1 / fan_in.
    std = math.sqrt(1.0 / weight.shape[1]) / 0.87962566103423978
    nn.init.trunc_normal_(weight, mean=0.0, std=std, a=-2 * std, b=2 * std)


class _SpanScorer(nn.Module):
    """What GlobalPointer and Efficient GlobalPointer share: their arguments and masks."""

    def __init__(self, hidden_size: int, heads: int, head_size: int, rope: bool, tril_mask: bool,
                 mask_special: bool) -> None:
        super().__init__()
        if rope and head_size % 2:
            raise ValueError(f"RoPE needs an even head_size, got {head_size}")
        self.hidden_size = hidden_size
        self.heads = heads
        self.head_size = head_size
        self.rope = rope
        self.tril_mask = tril_mask
        self.mask_special = mask_special

    def _mask(self, attention_mask: Tensor | None) -> Tensor | None:
        return content_mask(attention_mask) if self.mask_special and attention_mask is not None else attention_mask

    def extra_repr(self) -> str:
        return (f"hidden_size={self.hidden_size}, heads={self.heads}, head_size={self.head_size}, "
                f"rope={self.rope}, tril_mask={self.tril_mask}, mask_special={self.mask_special}")


class GlobalPointer(_SpanScorer):
    """GlobalPointer: one attention-logit head (no V) per entity type, spec §1.2.

    ``s_a(i, j) = (R_i q_{i,a}) . (R_j k_{j,a}) / sqrt(d)`` with ``[q_a; k_a] = W_a h + b_a``.

    Layout as in bert4keras: one ``Linear(hidden, heads * 2d)``; the output is split into ``heads`` chunks
    of ``2d`` channels, each ``[q (d), k (d)]``. Kernel init glorot_uniform (bert4keras 0.10.6, the
    published 2021 runs; spec §1.2 and §12.1), zero bias. RoPE on q and k with positions ``0..n-1``.
    Masks (:func:`mask_span_logits`) are applied after the ``1/sqrt(d)`` scaling.

    Args:
        hidden_size: encoder width ``D``.
        heads: number of types (one head per type).
        head_size: ``d``; 64 in every published run.
        rope: rotate q and k (off for GPLinker's linking heads).
        tril_mask: mask ``j < i`` (off for GPLinker's linking heads).
        mask_special: also mask the rows and columns of ``[CLS]`` (position 0) and ``[SEP]`` (the last position
            of ``attention_mask``), so that only spans of content tokens are scored (NER, GPLinker).
    """

    def __init__(self, hidden_size: int, heads: int, head_size: int = 64, rope: bool = True,
                 tril_mask: bool = True, mask_special: bool = False) -> None:
        super().__init__(hidden_size, heads, head_size, rope, tril_mask, mask_special)
        self.dense = nn.Linear(hidden_size, heads * head_size * 2)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        _glorot_uniform_(self.dense.weight)
        nn.init.zeros_(self.dense.bias)

    @torch.no_grad()
    def init_offsets(self, logits: Sequence[float]) -> None:
        """Start every cell of type ``a`` near the logit ``logits[a]`` (the prior: the best constant logit of the
        type on the training data, :func:`zhie.multitask.priors.multilabel_prior`) instead of near 0.

        Why (issue 17; measured in ``benchmarks/gp_collapse.py``): a span has ~n²/2 negative cells for a few
        positives, so the MCE's first gradients push *every* logit down. GP has no per-type offset to do that with:
        the fastest route is to make ``q_i . k_j`` uniformly negative, i.e. to make every token's encoder state the
        same; with a trainable encoder at lr 3e-3 the mean cosine between tokens rose from 0.30 to 0.96 in 20 steps,
        every logit went below -4, and the run ended at train F1 0. Started at the prior, the two MCE terms balance
        and only the discriminative signal reaches the encoder.

        How, without changing GP's scoring function (spec §1.2): only the initial **bias** of the q/k projection
        departs from bert4keras (which starts it at zero): in the last RoPE pair of each type (the slowest rotation,
        ``theta = 10000^(-(d-2)/d)``, under 0.035 rad across 256 positions) ``b_q = (r, 0)`` and
        ``b_k = (-r, 0)`` with ``r = sqrt(|logit| * sqrt(d))``, so that ``(R_i b_q) . (R_j b_k) / sqrt(d) =
        -r² cos((j - i) theta) / sqrt(d) ≈ logit``. Types whose prior logit is >= 0 keep the zero bias. The bias
        stays a free parameter; the weights and the head's output type are unchanged.
        """
        if len(logits) != self.heads:
            raise ValueError(f"init_offsets needs one logit per head ({self.heads}), got {len(logits)}")
        d = self.head_size
        bias = self.dense.bias.view(self.heads, 2 * d)
        for a, logit in enumerate(logits):
            if logit < 0:
                r = math.sqrt(-logit * math.sqrt(d))
                bias[a, d - 2], bias[a, 2 * d - 2] = r, -r  # q's and k's last RoPE pair, first channel

    def forward(self, hidden: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        """``hidden [b, n, D]``, ``attention_mask [b, n]`` (1 = token) -> logits ``[b, heads, n, n]``."""
        b, n, _ = hidden.shape
        qk = self.dense(hidden).view(b, n, self.heads, 2 * self.head_size)
        q, k = qk[..., : self.head_size], qk[..., self.head_size :]
        if self.rope:
            q, k = apply_rope(q), apply_rope(k)
        logits = torch.einsum("bmhd,bnhd->bhmn", q, k) / math.sqrt(self.head_size)
        return mask_span_logits(logits, self._mask(attention_mask), self.tril_mask)


class EfficientGlobalPointer(_SpanScorer):
    """Efficient GlobalPointer, spec §2: a shared extraction score plus a per-type linear bias.

    ``s_a(i, j) = (R_i q_i) . (R_j k_j) / sqrt(d) + c_{2a+1}(i) + c_{2a}(j)``, where (bert4keras layout, §2.2)

    * ``p = Linear(D, 2d)(h)`` (lecun_normal, zero bias); ``q = p[..., 0::2]``, ``k = p[..., 1::2]``
      (interleaved split);
    * ``c = Linear(2d, 2 * heads)(p) / 2`` from the pre-RoPE ``p``: odd channels give the start (row)
      term, even channels the end (column) term; the bias is *not* divided by ``sqrt(d)``;
    * then the masks of :func:`mask_span_logits`.

    Same arguments as :class:`GlobalPointer`; a drop-in replacement for it.
    """

    def __init__(self, hidden_size: int, heads: int, head_size: int = 64, rope: bool = True,
                 tril_mask: bool = True, mask_special: bool = False) -> None:
        super().__init__(hidden_size, heads, head_size, rope, tril_mask, mask_special)
        self.dense = nn.Linear(hidden_size, 2 * head_size)
        self.bias_dense = nn.Linear(2 * head_size, 2 * heads)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for layer in (self.dense, self.bias_dense):
            _lecun_normal_(layer.weight)
            nn.init.zeros_(layer.bias)

    def forward(self, hidden: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        """``hidden [b, n, D]``, ``attention_mask [b, n]`` (1 = token) -> logits ``[b, heads, n, n]``."""
        p = self.dense(hidden)  # [b, n, 2d]
        q, k = p[..., 0::2], p[..., 1::2]
        if self.rope:
            q, k = apply_rope(q), apply_rope(k)
        base = torch.einsum("bmd,bnd->bmn", q, k) / math.sqrt(self.head_size)  # [b, n, n]
        c = self.bias_dense(p) / 2  # [b, n, 2 * heads], from the pre-RoPE p
        start = c[..., 1::2].transpose(1, 2).unsqueeze(-1)  # [b, heads, n, 1]: row term c_{2a+1}(i)
        end = c[..., 0::2].transpose(1, 2).unsqueeze(-2)  # [b, heads, 1, n]: column term c_{2a}(j)
        # The masks go on the shared [b, 1, n, n] term before the per-type terms are added: the same logits with
        # one pass over [b, heads, n, n] fewer (the masked cells are masking_value + start + end, which is
        # masking_value itself in fp32 and bf16 while |start|, |end| < 32768, and stays far below the losses'
        # masked band, -1e4, in fp16).
        return mask_span_logits(base.unsqueeze(1), self._mask(attention_mask), self.tril_mask) + start + end


@dataclass
class RelationLogits:
    """GPLinker's masked logits: ``entity [b, 2, n, n]`` (0 = subject, 1 = object; cell (start, end)),
    ``head_head`` and ``tail_tail [b, predicates, n, n]`` (cells (subject start, object start) and (subject end,
    object end))."""

    entity: Tensor
    head_head: Tensor
    tail_tail: Tensor


class GPLinkerHead(nn.Module):
    """GPLinker (spec §3.1): three (Efficient) GlobalPointers on the encoder output, content tokens only.

    ``entity``: 2 heads with RoPE and the lower-triangle mask; ``head_head`` and ``tail_tail``: one head per
    predicate, no RoPE, no triangle mask. ``efficient`` picks :class:`EfficientGlobalPointer` for all three.
    """

    def __init__(self, hidden_size: int, predicates: int, head_size: int = 64, efficient: bool = True) -> None:
        super().__init__()
        cls = EfficientGlobalPointer if efficient else GlobalPointer
        self.entity = cls(hidden_size, 2, head_size, rope=True, tril_mask=True, mask_special=True)
        self.head_head = cls(hidden_size, predicates, head_size, rope=False, tril_mask=False, mask_special=True)
        self.tail_tail = cls(hidden_size, predicates, head_size, rope=False, tril_mask=False, mask_special=True)

    def forward(self, hidden: Tensor, attention_mask: Tensor) -> RelationLogits:
        return RelationLogits(self.entity(hidden, attention_mask), self.head_head(hidden, attention_mask),
                              self.tail_tail(hidden, attention_mask))
