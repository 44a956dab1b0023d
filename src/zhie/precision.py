"""Numeric precision of training and prediction: ``fp32``, or the encoder in ``bf16`` / ``fp16`` under autocast.

Only the encoder runs in half precision: :class:`zhie.model.Model` gives the heads fp32 hidden states with autocast
off, so masks, decoding and losses stay in fp32 whatever the precision. Training hands the precision to accelerate
(which adds a gradient scaler for fp16); prediction wraps the model calls in :func:`autocast`.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

__all__ = ["PRECISIONS", "accelerate_precision", "autocast", "check_precision", "pick_precision"]

PRECISIONS = ("fp32", "bf16", "fp16")
_DTYPES = {"bf16": "bfloat16", "fp16": "float16"}  # torch's names (torch is imported only for half precision)


def check_precision(precision: str) -> str:
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; use one of {', '.join(PRECISIONS)}")
    return precision


def autocast(precision: str, device) -> AbstractContextManager:
    """A context that runs the encoder's matrix products on ``device`` (a ``torch.device`` or its name) in
    ``precision`` (nothing for fp32); an error that says what to use instead where ``device`` cannot (bf16 on a GPU
    without it)."""
    if check_precision(precision) == "fp32":
        return nullcontext()
    import torch

    device = torch.device(device)
    if not torch.amp.is_autocast_available(device.type):
        raise ValueError(f"--precision {precision} is not available on {device.type}; use --precision fp32")
    if precision == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ValueError("this GPU has no bf16; use --precision fp16 (or fp32)")
    return torch.autocast(device.type, dtype=getattr(torch, _DTYPES[precision]))


def accelerate_precision(precision: str) -> str:
    """accelerate's ``mixed_precision`` for ``precision`` ("no", "bf16", "fp16")."""
    return "no" if check_precision(precision) == "fp32" else precision


def pick_precision(precision: str, cpu: bool = False) -> str:
    """``precision``, or for ``"auto"``: ``bf16`` when the work runs on a CUDA GPU that has it (not with ``cpu``),
    else ``fp32``."""
    if precision != "auto":
        return check_precision(precision)
    import torch

    return "bf16" if not cpu and torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "fp32"
