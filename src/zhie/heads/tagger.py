"""Softmax tagger: per-token logits from a linear layer, argmax decoding (the CRF-free baseline, spec §8.2)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["SoftmaxTagger"]


class SoftmaxTagger(nn.Module):
    """``Dropout -> Linear(hidden_size, num_tags)``; train with token cross-entropy on the logits."""

    def __init__(self, hidden_size: int, num_tags: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.num_tags = num_tags
        self.dropout = nn.Dropout(dropout)
        self.dense = nn.Linear(hidden_size, num_tags)

    def forward(self, hidden: Tensor) -> Tensor:
        """``hidden [b, n, D]`` -> logits ``[b, n, num_tags]``."""
        return self.dense(self.dropout(hidden))

    @torch.no_grad()
    def decode(self, logits: Tensor, mask: Tensor | None = None) -> list[list[int]]:
        """Argmax tag of each unmasked token, as a list of ``length_i`` tag ids per sequence (right padding),
        the same return type as :meth:`zhie.heads.CRF.decode`."""
        tags = logits.argmax(-1)
        if mask is None:
            return tags.tolist()
        lengths = mask.to(torch.long).sum(1).tolist()
        return [row[:k] for row, k in zip(tags.tolist(), lengths, strict=True)]
