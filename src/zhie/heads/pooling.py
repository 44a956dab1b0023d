"""Vectors from token states: sentence vectors by ``cls``, ``mean`` and ``first-last-avg`` pooling (spec §4), and the
word vectors of MTMT's similarity evaluator (spec §10.2)."""

from __future__ import annotations

from torch import Tensor, nn

from zhie.core.decoding import POOLINGS

__all__ = ["POOLINGS", "Pooling", "WordVectors"]


class Pooling(nn.Module):
    """``forward(hidden, attention_mask)`` -> sentence vectors ``[b, hidden]`` in fp32 (not normalised).

    * ``cls``: the last layer's first token;
    * ``mean``: the last layer averaged over the tokens of the sentence (special tokens included, as
      sentence-transformers and e5 do);
    * ``first-last-avg``: the outputs of the first and the last transformer layer averaged, then averaged over the
      tokens (BERT-whitening's pooling).

    ``layers`` names the encoder states the head reads (indices into ``hidden_states``, 0 = embeddings):
    :class:`zhie.model.Model` passes it their average.
    """

    def __init__(self, mode: str = "cls") -> None:
        super().__init__()
        if mode not in POOLINGS:
            raise ValueError(f"unknown pooling {mode!r}; use one of {', '.join(POOLINGS)}")
        self.mode = mode
        self.layers = (1, -1) if mode == "first-last-avg" else (-1,)

    def forward(self, hidden: Tensor, attention_mask: Tensor) -> Tensor:
        if self.mode == "cls":
            return hidden[:, 0].float()
        mask = attention_mask.unsqueeze(-1).float()
        return (hidden.float() * mask).sum(1) / mask.sum(1).clamp(min=1)

    def extra_repr(self) -> str:
        return f"mode={self.mode!r}"


class WordVectors(nn.Module):
    """The evaluator's head (:class:`zhie.tasks.xner.XnerEvaluatorTask`): the encoder's last hidden states after
    dropout, ``[b, n, D]`` (no weights)."""

    def __init__(self, dropout: float = 0.1) -> None:
        super().__init__()
        self.dropout = nn.Dropout(dropout)

    def forward(self, hidden: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        return self.dropout(hidden)
