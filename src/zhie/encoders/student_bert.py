"""A BERT made for a distilled student (``model_type="zhie_student_bert"``): the cut transformer student of ``zhie
distill --student cut`` with ``--bigrams N`` or ``--attention-heads K``.

* ``bigram_buckets`` (``--bigrams N``): each token adds to its word embedding the row of the pair it starts (itself
  and the next token; the last one, and one before padding, pair with the padding id), hashed into N rows by
  :func:`zhie.encoders.conv.bigram_ids`, the convolutional student's table. The sum then goes through BERT's
  embeddings as the word embedding alone would (positions, token types, LayerNorm, dropout).
* ``attention_heads_kept`` (``--attention-heads K``): every layer keeps K of its attention heads, each as wide as
  before (``hidden_size / num_attention_heads``): the query, key and value projections keep those heads' rows, the
  attention's output projection their columns, and the rest of the layer is unchanged. The attention's products
  shrink by K / heads (e5-small: 12 heads of 32).

:func:`student_bert` turns a trained BERT into one: its bigram table starts at zero, and the heads it keeps are the K of
each layer with the largest mean contribution to the layer's output over the training text (:class:`HeadActivity`), so
that the student starts as close to the cut teacher as it can. Everything else is transformers' ``BertModel``: saving
(``config.json`` + ``model.safetensors``), :func:`zhie.encoders.load_pretrained`, ``--ffn-width`` and ``zhie export``
(fp32 and int8: the bigram ids are computed inside the graph) take it as they take a BERT.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn
from transformers import BertConfig, BertModel

from zhie.encoders.conv import bigram_ids
from zhie.encoders.prune import Activity

__all__ = ["HeadActivity", "StudentBertConfig", "StudentBertModel", "check_student_bert", "student_bert"]


class StudentBertConfig(BertConfig):
    """BERT's configuration, ``bigram_buckets`` (the rows of the bigram table; 0: none) and ``attention_heads_kept``
    (the heads each layer keeps; None: all ``num_attention_heads``)."""

    model_type = "zhie_student_bert"

    def __init__(self, bigram_buckets: int = 0, attention_heads_kept: int | None = None, **kwargs) -> None:
        super().__init__(**kwargs)
        self.bigram_buckets = int(bigram_buckets)
        self.attention_heads_kept = None if attention_heads_kept is None else int(attention_heads_kept)
        if self.bigram_buckets < 0:
            raise ValueError(f"--bigrams {bigram_buckets}: give the bigram table's rows (e.g. 65536), or leave it out")
        if self.attention_heads_kept is not None and not 1 <= self.attention_heads_kept <= self.num_attention_heads:
            raise ValueError(f"--attention-heads {attention_heads_kept}: the layers have {self.num_attention_heads} "
                             f"heads; keep 1 to {self.num_attention_heads}")

    @property
    def head_size(self) -> int:
        return self.hidden_size // self.num_attention_heads


class StudentBertModel(BertModel):
    """``BertModel`` (no pooler) with a bigram table and fewer attention heads (see the module docstring)."""

    config_class = StudentBertConfig

    def __init__(self, config: StudentBertConfig, add_pooling_layer: bool = False) -> None:
        super().__init__(config, add_pooling_layer=add_pooling_layer)
        self.bigram_embeddings = (nn.Embedding(config.bigram_buckets, config.hidden_size) if config.bigram_buckets
                                  else None)
        if config.attention_heads_kept is not None:
            inner = config.attention_heads_kept * config.head_size
            for layer in self.encoder.layer:
                attention = layer.attention.self
                attention.query, attention.key, attention.value = (
                    nn.Linear(config.hidden_size, inner) for _ in range(3))
                attention.num_attention_heads, attention.all_head_size = config.attention_heads_kept, inner
                layer.attention.output.dense = nn.Linear(inner, config.hidden_size)
        self.post_init()

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, **kwargs):
        if self.bigram_embeddings is None:
            return super().forward(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        rows = bigram_ids(input_ids, self.config.bigram_buckets, self.config.pad_token_id, attention_mask)
        embeds = self.embeddings.word_embeddings(input_ids) + self.bigram_embeddings(rows)
        return super().forward(inputs_embeds=embeds, attention_mask=attention_mask, **kwargs)


class HeadActivity(Activity):
    """Each attention head's contribution to its layer's output, per token: the norm of the head's context vector
    through its columns of the attention's output projection, ``||W_O[:, h] c_h||`` (the norm-based measure of
    Kobayashi et al. 2020), summed by :class:`~zhie.encoders.Activity`. For a BERT (:func:`check_student_bert`)."""

    def __init__(self, model: nn.Module) -> None:
        check_student_bert(model)
        heads = model.config.num_attention_heads

        def norms(module: nn.Linear, inputs, output) -> Tensor:
            context = inputs[0]
            b, n, inner = context.shape
            weight = module.weight.view(module.out_features, heads, inner // heads)
            return torch.einsum("bnhd,ohd->bnho", context.view(b, n, heads, inner // heads), weight).norm(dim=-1)

        super().__init__([layer.attention.output.dense for layer in model.encoder.layer], heads, norms)


def check_student_bert(model: nn.Module, bigrams: int = 0, heads: int | None = None) -> None:
    """A clear error unless :func:`student_bert` can make a student of ``model`` with these settings."""
    if type(model) is not BertModel:
        raise ValueError(f"--bigrams and --attention-heads change a BERT-like teacher's layers (BERT, e5-small); this "
                         f"teacher's encoder is a {type(model).__name__}: use --student conv (--bigrams) instead")
    StudentBertConfig(bigram_buckets=bigrams, attention_heads_kept=heads,
                      num_attention_heads=model.config.num_attention_heads, hidden_size=model.config.hidden_size)


def student_bert(model: BertModel, bigrams: int = 0, heads: tuple[int, Sequence[Tensor]] | None = None
                 ) -> StudentBertModel:
    """A :class:`StudentBertModel` with ``model``'s weights, a ``bigrams``-row bigram table of zeros (0: none) and, with
    ``heads = (K, each layer's head activity)``, the K heads of each layer of highest activity (:class:`HeadActivity`),
    in their order; with neither, the same function as ``model``."""
    kept = heads[0] if heads is not None else None
    check_student_bert(model, bigrams, kept)
    config = StudentBertConfig.from_dict({**model.config.to_dict(), "bigram_buckets": bigrams,
                                          "attention_heads_kept": kept})
    state = {k: v for k, v in model.state_dict().items() if not k.startswith("pooler.")}
    if heads is not None:
        if len(heads[1]) != len(model.encoder.layer):
            raise ValueError(f"{len(heads[1])} head activity vectors for {len(model.encoder.layer)} layers")
        size = config.head_size
        for i, activity in enumerate(heads[1]):
            best = torch.topk(activity, kept).indices.sort().values
            units = (best[:, None] * size + torch.arange(size)).flatten()
            prefix = f"encoder.layer.{i}.attention."
            for name in ("query", "key", "value"):
                for part in ("weight", "bias"):
                    state[f"{prefix}self.{name}.{part}"] = state[f"{prefix}self.{name}.{part}"][units]
            state[f"{prefix}output.dense.weight"] = state[f"{prefix}output.dense.weight"][:, units]
    student = StudentBertModel(config)
    missing, unexpected = student.load_state_dict(state, strict=False)
    if missing != (["bigram_embeddings.weight"] if bigrams else []) or unexpected:
        raise ValueError(f"student_bert: the BERT's weights do not fit (missing {missing}, unexpected {unexpected})")
    if student.bigram_embeddings is not None:
        with torch.no_grad():
            student.bigram_embeddings.weight.zero_()
    return student.to(next(model.parameters()))
