"""A BERT with a table of character bigrams (``model_type="zhie_bigram_bert"``): the cut transformer student of
``zhie distill --student cut --bigrams N``.

Each token adds to its word embedding the row of the pair it starts (itself and the next token; the last one, and one
before padding, pair with the padding id), hashed into ``bigram_buckets`` rows by
:func:`zhie.encoders.conv.bigram_ids`, the convolutional student's table. The sum then goes through BERT's embeddings
as the word embedding alone would (positions, token types, LayerNorm, dropout). :func:`with_bigrams` turns a BERT into
one with a table of zeros, which computes exactly what the BERT computes until the table learns. Everything else is
transformers' ``BertModel``: saving (``config.json`` + ``model.safetensors``), :func:`zhie.encoders.load_pretrained`,
layer cutting, ``--ffn-width`` and ``zhie export`` (fp32 and int8: the bigram ids are computed inside the graph) take it
as they take a BERT.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from transformers import BertConfig, BertModel

from zhie.encoders.conv import bigram_ids

__all__ = ["BigramBertConfig", "BigramBertModel", "check_bigrams", "with_bigrams"]


class BigramBertConfig(BertConfig):
    """BERT's configuration and ``bigram_buckets``, the rows of the bigram table (at least 1)."""

    model_type = "zhie_bigram_bert"

    def __init__(self, bigram_buckets: int = 1, **kwargs) -> None:
        super().__init__(**kwargs)
        self.bigram_buckets = int(bigram_buckets)
        if self.bigram_buckets < 1:
            raise ValueError(f"bigram_buckets {bigram_buckets}: the bigram table needs at least one row")


class BigramBertModel(BertModel):
    """``BertModel`` (no pooler) whose word embeddings gain each token's bigram row (see the module docstring)."""

    config_class = BigramBertConfig

    def __init__(self, config: BigramBertConfig, add_pooling_layer: bool = False) -> None:
        super().__init__(config, add_pooling_layer=add_pooling_layer)
        self.bigram_embeddings = nn.Embedding(config.bigram_buckets, config.hidden_size)
        self.post_init()

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, **kwargs):
        rows = bigram_ids(input_ids, self.config.bigram_buckets, self.config.pad_token_id, attention_mask)
        embeds = self.embeddings.word_embeddings(input_ids) + self.bigram_embeddings(rows)
        return super().forward(inputs_embeds=embeds, attention_mask=attention_mask, **kwargs)


def check_bigrams(model: nn.Module, buckets: int) -> None:
    """A clear error unless :func:`with_bigrams` can add a ``buckets``-row table to ``model``."""
    if not isinstance(model, BertModel) or isinstance(model, BigramBertModel):
        raise ValueError(f"--bigrams adds a bigram table to a BERT-like teacher's layers (BERT, e5-small); this "
                         f"teacher's encoder is a {type(model).__name__}: use --student conv --bigrams instead")
    if buckets < 1:
        raise ValueError(f"--bigrams {buckets}: give the bigram table's rows (e.g. 65536), or leave it out")


def with_bigrams(model: nn.Module, buckets: int) -> BigramBertModel:
    """A :class:`BigramBertModel` with ``model``'s weights (a BERT-like encoder: BERT, e5-small) and a ``buckets``-row
    bigram table of zeros: the same function as ``model`` until the table learns."""
    check_bigrams(model, buckets)
    config = BigramBertConfig.from_dict({**model.config.to_dict(), "bigram_buckets": buckets})
    student = BigramBertModel(config)
    missing, unexpected = student.load_state_dict(model.state_dict(), strict=False)
    unexpected = [k for k in unexpected if not k.startswith("pooler.")]
    if missing != ["bigram_embeddings.weight"] or unexpected:
        raise ValueError(f"with_bigrams: the BERT's weights do not fit (missing {missing}, unexpected {unexpected})")
    with torch.no_grad():
        student.bigram_embeddings.weight.zero_()
    return student.to(next(model.parameters()))
