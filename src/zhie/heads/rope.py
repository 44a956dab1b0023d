"""Rotary position embedding (RoPE), interleaved pairs exactly as bert4keras applies it.

Spec §0.1 / §11.1. For a vector ``x`` of even size ``d`` at position ``m`` the channel pairs
``(2i, 2i+1)`` are rotated by the angle ``m * theta_i`` with ``theta_i = 10000 ** (-2i / d)``:

    x'[2i]   = x[2i]   * cos(m theta_i) - x[2i+1] * sin(m theta_i)
    x'[2i+1] = x[2i+1] * cos(m theta_i) + x[2i]   * sin(m theta_i)

Vectorised: ``x * cos_rep + rot(x) * sin_rep`` with ``cos_rep = [c0, c0, c1, c1, ...]``,
``sin_rep = [s0, s0, s1, s1, ...]`` and ``rot(x) = [-x1, x0, -x3, x2, ...]``.
Positions default to ``0..n-1`` over the whole token sequence, so ``[CLS]`` is position 0.
Because every ``R_m`` is orthogonal, ``(R_m q) . (R_n k) = q . R_{n-m} k`` depends only on ``n - m``.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["apply_rope", "rope_sin_cos"]

ROPE_BASE = 10000.0


def rope_sin_cos(positions: Tensor, dim: int, dtype: torch.dtype = torch.float32) -> tuple[Tensor, Tensor]:
    """Return ``(sin_rep, cos_rep)`` of shape ``positions.shape + (dim,)``, each value repeated twice.

    The tables are built on ``positions.device`` in ``dtype`` (fp32 unless fp64 is asked for), never in
    half precision: ``m * theta`` for large ``m`` loses too many digits there.
    """
    if dim % 2:
        raise ValueError(f"RoPE needs an even size, got {dim}")
    inv_freq = torch.pow(
        torch.tensor(ROPE_BASE, dtype=dtype, device=positions.device),
        -torch.arange(0, dim, 2, dtype=dtype, device=positions.device) / dim,
    )
    angles = positions.to(dtype).unsqueeze(-1) * inv_freq  # [..., d/2]
    return angles.sin().repeat_interleave(2, dim=-1), angles.cos().repeat_interleave(2, dim=-1)


def _rotate_pairs(x: Tensor) -> Tensor:
    """``[x0, x1, x2, x3, ...] -> [-x1, x0, -x3, x2, ...]``."""
    return torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)


def apply_rope(x: Tensor, positions: Tensor | None = None) -> Tensor:
    """Rotate ``x`` by RoPE (interleaved pairs, spec §0.1) and return a tensor of ``x``'s dtype.

    Args:
        x: ``[batch, seq, heads, d]`` or ``[batch, seq, d]``, ``d`` even.
        positions: integer positions ``[seq]`` or ``[batch, seq]``; default ``0..seq-1``.

    The sin/cos tables are computed on ``x.device`` in fp32 (fp64 for fp64 input); the rotation is done
    in that precision and the result is cast back to ``x.dtype``.
    """
    if x.dim() not in (3, 4):
        raise ValueError(f"apply_rope expects [batch, seq, d] or [batch, seq, heads, d], got {tuple(x.shape)}")
    seq, dim = x.shape[1], x.shape[-1]
    if positions is None:
        positions = torch.arange(seq, device=x.device)
    elif positions.shape[-1] != seq or positions.dim() not in (1, 2):
        raise ValueError(f"positions must be [seq] or [batch, seq] with seq={seq}, got {tuple(positions.shape)}")
    compute_dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    sin, cos = rope_sin_cos(positions.to(x.device), dim, compute_dtype)  # [seq, d] or [batch, seq, d]
    if positions.dim() == 1:
        sin, cos = sin.unsqueeze(0), cos.unsqueeze(0)  # [1, seq, d]
    if x.dim() == 4:
        sin, cos = sin.unsqueeze(2), cos.unsqueeze(2)  # broadcast over heads
    xf = x.to(compute_dtype)
    return (xf * cos + _rotate_pairs(xf) * sin).to(x.dtype)
