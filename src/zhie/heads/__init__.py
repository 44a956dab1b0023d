"""Heads: plain ``nn.Module``s that turn encoder states into logits (spec §0.1, §1, §2, §8)."""

from zhie.heads.crf import CRF, bio_allowed_transitions, bmes_allowed_transitions
from zhie.heads.global_pointer import EfficientGlobalPointer, GlobalPointer, mask_span_logits, masking_value
from zhie.heads.rope import apply_rope, rope_sin_cos
from zhie.heads.tagger import SoftmaxTagger

__all__ = [
    "CRF",
    "EfficientGlobalPointer",
    "GlobalPointer",
    "SoftmaxTagger",
    "apply_rope",
    "bio_allowed_transitions",
    "bmes_allowed_transitions",
    "mask_span_logits",
    "masking_value",
    "rope_sin_cos",
]
