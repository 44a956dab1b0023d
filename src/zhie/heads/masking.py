"""Masks shared by the heads and the tasks: the finite masking value, span-logit masks, content-token masks."""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["content_mask", "mask_span_logits", "masking_value"]


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


def content_mask(attention_mask: Tensor) -> Tensor:
    """The attention mask without ``[CLS]`` (position 0) and ``[SEP]`` (the last real position)."""
    mask = attention_mask.clone()
    mask[:, 0] = 0
    mask[torch.arange(mask.shape[0], device=mask.device), attention_mask.sum(1) - 1] = 0
    return mask
