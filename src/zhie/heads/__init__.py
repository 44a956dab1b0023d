"""Heads: plain ``nn.Module``s that turn encoder states into one documented output type (spec §0.1, §1-§4, §8).

Every head's ``forward(hidden, attention_mask)`` takes the encoder's last hidden states ``[b, n, D]`` (or, for a
head with a ``layers`` attribute, the average of those layers' states) and the attention mask:

* :class:`GlobalPointer`, :class:`EfficientGlobalPointer` -> masked span logits ``[b, heads, n, n]``;
* :class:`GPLinkerHead` -> :class:`RelationLogits`;
* :class:`SoftmaxTagger`, :class:`CrfTagger` -> emissions ``[b, n, tags]`` (with ``loss`` and ``decode``);
* :class:`Pooling` -> sentence vectors ``[b, D]`` (fp32);
* :class:`WordVectors` -> the hidden states after dropout ``[b, n, D]`` (MTMT's evaluator).

A module whose parameters need their own learning rate says so with ``lr_multipliers() -> {name: factor}``
(:class:`CRF`); :func:`zhie.training.build_param_groups` honours it wherever the module sits.
"""

from zhie.heads.crf import CRF, bio_allowed_transitions, bmes_allowed_transitions
from zhie.heads.global_pointer import EfficientGlobalPointer, GlobalPointer, GPLinkerHead, RelationLogits
from zhie.heads.masking import content_mask, mask_span_logits, masking_value
from zhie.heads.pooling import POOLINGS, Pooling, WordVectors
from zhie.heads.rope import apply_rope, rope_sin_cos
from zhie.heads.tagger import CrfTagger, SoftmaxTagger

__all__ = [
    "CRF",
    "POOLINGS",
    "CrfTagger",
    "EfficientGlobalPointer",
    "GPLinkerHead",
    "GlobalPointer",
    "Pooling",
    "RelationLogits",
    "SoftmaxTagger",
    "WordVectors",
    "apply_rope",
    "bio_allowed_transitions",
    "bmes_allowed_transitions",
    "content_mask",
    "mask_span_logits",
    "masking_value",
    "rope_sin_cos",
]
