"""Tagging heads: per-token tag scores (emissions) from a linear layer, decoded by argmax (:class:`SoftmaxTagger`,
the CRF-free baseline, spec §8.2) or by constrained Viterbi (:class:`CrfTagger`, spec §8).

Both return the same output type from ``forward``: emissions ``[b, n, num_tags]``. Their ``loss(emissions, tags)``
takes tag ids with ``-100`` on positions that carry no tag (special tokens, padding; right padding only for the
CRF) and returns the mean loss in fp32. Decoding is :mod:`zhie.core.decoding`'s (argmax;
:func:`~zhie.core.decoding.viterbi` with the constraints of the scheme), on the emissions as numpy arrays.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from zhie.core.decoding import CONSTRAINTS
from zhie.heads.crf import CRF

__all__ = ["CrfTagger", "SoftmaxTagger"]

IGNORE = -100


class SoftmaxTagger(nn.Module):
    """``Dropout -> Linear(hidden_size, num_tags)``, trained with token cross-entropy, decoded by argmax."""

    def __init__(self, hidden_size: int, num_tags: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.num_tags = num_tags
        self.dropout = nn.Dropout(dropout)
        self.dense = nn.Linear(hidden_size, num_tags)

    def forward(self, hidden: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        """``hidden [b, n, D]`` -> emissions ``[b, n, num_tags]`` (``attention_mask`` is not needed)."""
        return self.dense(self.dropout(hidden))

    def loss(self, emissions: Tensor, tags: Tensor) -> Tensor:
        """Mean cross-entropy over the positions whose tag is not ``-100``."""
        return F.cross_entropy(emissions.float().transpose(1, 2), tags, ignore_index=IGNORE)


class CrfTagger(SoftmaxTagger):
    """Emissions as :class:`SoftmaxTagger`, plus a :class:`CRF` over ``tags`` (names, e.g. ``["O", "B-PER",
    "I-PER"]`` or ``["S", "B", "M", "E"]``) whose Viterbi only follows the paths ``scheme`` ("BIO" or "BMES")
    allows. The transitions learn at ``lr_multiplier`` times the base learning rate (spec §8.1)."""

    def __init__(self, hidden_size: int, tags: list[str], scheme: str = "BIO", dropout: float = 0.0,
                 lr_multiplier: float = 100.0) -> None:
        super().__init__(hidden_size, len(tags), dropout)
        if scheme not in CONSTRAINTS:
            raise ValueError(f"unknown tagging scheme {scheme!r} for the CRF; use {' or '.join(CONSTRAINTS)}")
        self.crf = CRF(len(tags), lr_multiplier=lr_multiplier)

    def loss(self, emissions: Tensor, tags: Tensor) -> Tensor:
        """Mean negative log-likelihood of the tag paths; positions tagged ``-100`` must be at the right end."""
        mask = tags != IGNORE
        return -self.crf.log_likelihood(emissions, tags.clamp(min=0), mask).mean()
