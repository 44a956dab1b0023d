"""GlobalPointer (spec §1) and Efficient GlobalPointer (spec §2) span-scoring heads.

Both heads map encoder states ``[batch, seq, hidden]`` to span logits ``[batch, heads, seq, seq]`` where
``logits[b, a, i, j]`` scores tokens ``i..j`` (inclusive, token indices counted with ``[CLS]`` at 0) as
an entity of type ``a`` (or, without the triangle mask, the token pair ``(i, j)`` for GPLinker's linking
heads, spec §3.1). A cell is predicted when its logit is > 0. Both heads share one masking helper,
:func:`mask_span_logits`.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from zhie.heads.rope import apply_rope

__all__ = ["EfficientGlobalPointer", "GlobalPointer", "mask_span_logits", "masking_value"]


def masking_value(dtype: torch.dtype) -> float:
    """The logit given to masked cells: ``max(-1e12, torch.finfo(dtype).min / 2)``.

    * fp32 / fp64 / bf16: ``-1e12``, the value of bert4keras 0.10.6 (the version behind the published GP
      numbers, spec §1.3) - far below any real logit, so ``exp`` of it is exactly 0 in fp32.
    * fp16: ``-32752`` (half of the most negative fp16), because ``-1e12`` would overflow to ``-inf``; the
      halving leaves head-room so that adding a bounded term later does not overflow either.

    The value is finite on purpose: ``-inf`` cells make ``logsumexp`` gradients NaN when a whole row is
    masked. :mod:`zhie.losses` treats every logit ``<= -1e4`` as masked.
    """
    return max(-1e12, torch.finfo(dtype).min / 2)


def mask_span_logits(logits: Tensor, attention_mask: Tensor | None = None, tril_mask: bool = True) -> Tensor:
    """Mask span logits ``[batch, heads, seq, seq]`` (spec §1.3); returns a new tensor.

    * padding: rows ``i`` and columns ``j`` whose ``attention_mask`` is 0 get :func:`masking_value`;
    * ``tril_mask``: cells strictly below the diagonal (``j < i``) are masked too; the diagonal
      (single-token spans) is kept.
    """
    n = logits.shape[-1]
    keep = None
    if attention_mask is not None:
        m = attention_mask.to(device=logits.device, dtype=torch.bool)
        keep = m[:, None, :, None] & m[:, None, None, :]
    if tril_mask:
        upper = torch.ones(n, n, dtype=torch.bool, device=logits.device).triu()
        keep = upper if keep is None else keep & upper
    if keep is None:
        return logits
    return logits.masked_fill(~keep, masking_value(logits.dtype))


def _glorot_uniform_(weight: Tensor) -> None:
    # Keras glorot_uniform on a [in, out] kernel == torch xavier_uniform_ on the [out, in] weight.
    nn.init.xavier_uniform_(weight)


def _lecun_normal_(weight: Tensor) -> None:
    # Keras lecun_normal: truncated normal (at 2 std) with std sqrt(1 / fan_in) / 0.8796... so that the
    # truncated distribution has variance 1 / fan_in.
    std = math.sqrt(1.0 / weight.shape[1]) / 0.87962566103423978
    nn.init.trunc_normal_(weight, mean=0.0, std=std, a=-2 * std, b=2 * std)


class GlobalPointer(nn.Module):
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
    """

    def __init__(self, hidden_size: int, heads: int, head_size: int = 64, rope: bool = True,
                 tril_mask: bool = True) -> None:
        super().__init__()
        if rope and head_size % 2:
            raise ValueError(f"RoPE needs an even head_size, got {head_size}")
        self.hidden_size = hidden_size
        self.heads = heads
        self.head_size = head_size
        self.rope = rope
        self.tril_mask = tril_mask
        self.dense = nn.Linear(hidden_size, heads * head_size * 2)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        _glorot_uniform_(self.dense.weight)
        nn.init.zeros_(self.dense.bias)

    def forward(self, hidden: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        """``hidden [b, n, D]``, ``attention_mask [b, n]`` (1 = token) -> logits ``[b, heads, n, n]``."""
        b, n, _ = hidden.shape
        qk = self.dense(hidden).view(b, n, self.heads, 2 * self.head_size)
        q, k = qk[..., : self.head_size], qk[..., self.head_size :]
        if self.rope:
            q, k = apply_rope(q), apply_rope(k)
        logits = torch.einsum("bmhd,bnhd->bhmn", q, k) / math.sqrt(self.head_size)
        return mask_span_logits(logits, attention_mask, self.tril_mask)

    def extra_repr(self) -> str:
        return (f"hidden_size={self.hidden_size}, heads={self.heads}, head_size={self.head_size}, "
                f"rope={self.rope}, tril_mask={self.tril_mask}")


class EfficientGlobalPointer(nn.Module):
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
                 tril_mask: bool = True) -> None:
        super().__init__()
        if rope and head_size % 2:
            raise ValueError(f"RoPE needs an even head_size, got {head_size}")
        self.hidden_size = hidden_size
        self.heads = heads
        self.head_size = head_size
        self.rope = rope
        self.tril_mask = tril_mask
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
        logits = base.unsqueeze(1) + start + end
        return mask_span_logits(logits, attention_mask, self.tril_mask)

    def extra_repr(self) -> str:
        return (f"hidden_size={self.hidden_size}, heads={self.heads}, head_size={self.head_size}, "
                f"rope={self.rope}, tril_mask={self.tril_mask}")
