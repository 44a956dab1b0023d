"""ALBERT with its layer sharing dropped (spec §9.1, bert4keras ``ALBERT_Unshared``).

ALBERT = factorised embeddings (``embedding_size``, e.g. 128) + a projection to ``hidden_size`` + one block of
weights applied ``num_hidden_layers`` times. Fine-tuning it with sharing dropped gives every layer its own copy of
that block, each starting from the shared weights. transformers already has exactly that architecture: ELECTRA's
encoder (factorised embeddings, ``embeddings_project``, then independent BERT layers), whose layer is ALBERT's layer
with other names (attention q/k/v, the attention output dense + LayerNorm, the FFN in and out + LayerNorm, the same
order and residuals). So :func:`unshare` writes an :class:`~transformers.ElectraModel` whose hidden states equal the
ALBERT's before any training (tested), and which saves and reloads as an ordinary ELECTRA directory.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["unshare"]

# ALBERT layer names -> ELECTRA (BERT) layer names
_LAYER = {
    "attention.query.": "attention.self.query.",
    "attention.key.": "attention.self.key.",
    "attention.value.": "attention.self.value.",
    "attention.dense.": "attention.output.dense.",
    "attention.LayerNorm.": "attention.output.LayerNorm.",
    "ffn.": "intermediate.dense.",
    "ffn_output.": "output.dense.",
    "full_layer_layer_norm.": "output.LayerNorm.",
}


def unshare(albert: nn.Module) -> nn.Module:
    """An :class:`~transformers.ElectraModel` with one independent layer per layer the ALBERT applies
    (``num_hidden_layers x inner_group_num``), each a copy of the shared block it used; embeddings and projection kept.
    The pooler (unused by zhie) is dropped."""
    from transformers import AlbertModel, ElectraConfig, ElectraModel

    if not isinstance(albert, AlbertModel):
        raise ValueError(f"--unshare-layers needs an ALBERT encoder, got a {type(albert).__name__}")
    c = albert.config
    if c.embedding_size == c.hidden_size:
        raise ValueError("this ALBERT's embedding size equals its hidden size: ELECTRA, whose layers zhie reuses, has "
                         "no projection layer then, so the unshared model would not equal it; use it shared")
    config = ElectraConfig(
        vocab_size=c.vocab_size, embedding_size=c.embedding_size, hidden_size=c.hidden_size,
        num_hidden_layers=c.num_hidden_layers * c.inner_group_num, num_attention_heads=c.num_attention_heads,
        intermediate_size=c.intermediate_size, hidden_act=c.hidden_act, hidden_dropout_prob=c.hidden_dropout_prob,
        attention_probs_dropout_prob=c.attention_probs_dropout_prob, max_position_embeddings=c.max_position_embeddings,
        type_vocab_size=c.type_vocab_size, initializer_range=c.initializer_range, layer_norm_eps=c.layer_norm_eps,
        pad_token_id=c.pad_token_id)
    source = albert.state_dict()
    state = {k: v for k, v in source.items() if k.startswith("embeddings.")}
    for suffix in ("weight", "bias"):
        state[f"embeddings_project.{suffix}"] = source[f"encoder.embedding_hidden_mapping_in.{suffix}"]
    for i in range(c.num_hidden_layers):
        group = int(i / (c.num_hidden_layers / c.num_hidden_groups))  # AlbertTransformer's rule
        for j in range(c.inner_group_num):
            prefix = f"encoder.albert_layer_groups.{group}.albert_layers.{j}."
            for name, value in source.items():
                if name.startswith(prefix):
                    rest = name[len(prefix):]
                    old = next(k for k in _LAYER if rest.startswith(k))
                    state[f"encoder.layer.{i * c.inner_group_num + j}.{_LAYER[old]}{rest[len(old):]}"] = value.clone()
    with torch.random.fork_rng(devices=[]):  # its random init is overwritten: leave the caller's generator alone
        model = ElectraModel(config)
    model.load_state_dict(state, strict=True)
    return model.to(next(albert.parameters()).device)
