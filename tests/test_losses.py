"""Multilabel categorical cross-entropy: dense, sparse, soft, and the GlobalPointer loss (spec §0.2-0.3, §1.4,
§3.1)."""

from __future__ import annotations

import math

import pytest
import torch

from zhie.heads import mask_span_logits, masking_value
from zhie.losses import (
    global_pointer_loss,
    multilabel_categorical_crossentropy,
    soft_multilabel_categorical_crossentropy,
    sparse_multilabel_categorical_crossentropy,
)


def direct_mce(s: torch.Tensor, y: torch.Tensor) -> float:
    """log(1 + sum_neg e^s) + log(1 + sum_pos e^-s) for one instance, in fp64 python."""
    neg = sum(math.exp(v) for v, t in zip(s.tolist(), y.tolist(), strict=True) if t == 0)
    pos = sum(math.exp(-v) for v, t in zip(s.tolist(), y.tolist(), strict=True) if t == 1)
    return math.log1p(neg) + math.log1p(pos)


def test_dense_mce_equals_direct_formula():
    g = torch.Generator().manual_seed(0)
    s = torch.randn(6, 9, generator=g) * 3
    y = (torch.rand(6, 9, generator=g) < 0.3).long()
    y[0] = 0  # no positive
    y[1] = 1  # no negative
    loss = multilabel_categorical_crossentropy(s, y)
    assert loss.shape == (6,) and loss.dtype == torch.float32
    for i in range(6):
        assert loss[i].item() == pytest.approx(direct_mce(s[i], y[i]), rel=1e-5)


def test_dense_mce_ignores_masked_cells():
    g = torch.Generator().manual_seed(1)
    s = torch.randn(3, 8, generator=g)
    y = (torch.rand(3, 8, generator=g) < 0.4).long()
    masked = s.clone()
    masked[:, -2:] = masking_value(torch.float32)
    y_masked = y.clone()
    y_masked[:, -1] = 1  # a "positive" on a masked cell must not count
    expected = multilabel_categorical_crossentropy(s[:, :-2], y[:, :-2])
    torch.testing.assert_close(multilabel_categorical_crossentropy(masked, y_masked), expected)
    torch.testing.assert_close(soft_multilabel_categorical_crossentropy(masked, y_masked.float()), expected)


@pytest.mark.parametrize("num_pos", [1, 3])
def test_sparse_equals_dense_without_mask_zero(num_pos):
    g = torch.Generator().manual_seed(2)
    shape, K = (3, 4), 12
    s = (torch.randn(*shape, K, generator=g) * 3).requires_grad_()
    idx = torch.stack([torch.randperm(K, generator=g)[:num_pos] for _ in range(12)]).view(*shape, num_pos)
    dense = torch.zeros(*shape, K).scatter_(-1, idx, 1.0)
    sparse = sparse_multilabel_categorical_crossentropy(s, idx)
    expected = multilabel_categorical_crossentropy(s, dense)
    torch.testing.assert_close(sparse, expected, atol=1e-5, rtol=1e-5)
    (g_sparse,) = torch.autograd.grad(sparse.sum(), s)
    (g_dense,) = torch.autograd.grad(expected.sum(), s)
    torch.testing.assert_close(g_sparse, g_dense, atol=1e-5, rtol=1e-4)


def test_sparse_equals_dense_with_mask_zero():
    g = torch.Generator().manual_seed(3)
    rows, K, P = 10, 12, 4
    s = (torch.randn(rows, K, generator=g) * 3).requires_grad_()
    idx = torch.zeros(rows, P, dtype=torch.long)  # padded with 0
    for r in range(rows):
        k = r % (P + 1)  # 0..P real positives, including rows with none
        idx[r, :k] = torch.randperm(K - 1, generator=g)[:k] + 1  # class 0 is never a real class
    dense = torch.zeros(rows, K).scatter_(-1, idx, 1.0)
    dense[:, 0] = 0
    # dense reference: class 0 excluded altogether (given the masking value)
    s_ref = torch.cat([torch.full((rows, 1), masking_value(torch.float32)), s[:, 1:]], dim=1)
    sparse = sparse_multilabel_categorical_crossentropy(s, idx, mask_zero=True)
    expected = multilabel_categorical_crossentropy(s_ref, dense)
    torch.testing.assert_close(sparse, expected, atol=1e-5, rtol=1e-5)
    (g_sparse,) = torch.autograd.grad(sparse.sum(), s)
    (g_dense,) = torch.autograd.grad(expected.sum(), s)
    assert torch.isfinite(g_sparse).all()  # rows without positives too
    torch.testing.assert_close(g_sparse, g_dense, atol=1e-5, rtol=1e-4)


def test_soft_mce():
    g = torch.Generator().manual_seed(4)
    s = (torch.randn(5, 7, generator=g) * 2).requires_grad_()
    y = (torch.rand(5, 7, generator=g) < 0.4).float()
    soft = soft_multilabel_categorical_crossentropy(s, y)
    torch.testing.assert_close(soft, multilabel_categorical_crossentropy(s, y))
    (grad,) = torch.autograd.grad(soft.sum(), s)
    assert torch.isfinite(grad).all()
    # fractional targets: log(1 + sum (1 - t) e^s) + log(1 + sum t e^-s)
    t = torch.rand(5, 7, generator=g)
    t[0, :3] = 0.0
    t[1, :3] = 1.0
    expected = torch.log1p(((1 - t) * s.exp()).sum(-1)) + torch.log1p((t * (-s).exp()).sum(-1))
    torch.testing.assert_close(soft_multilabel_categorical_crossentropy(s, t), expected, atol=1e-5, rtol=1e-5)


def _span_batch(seed: int, b: int = 3, heads: int = 4, n: int = 7):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(b, heads, n, n, generator=g) * 3
    lengths = [7, 5, 3]
    mask = (torch.arange(n).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)).long()
    spans = []  # per (sample, head): list of flattened cells row * n + col with 0 < ... , i <= j < length
    for bi in range(b):
        for a in range(heads):
            count = (bi + a) % 4  # includes empty heads
            cells = set()
            while len(cells) < count:
                i, j = sorted(torch.randint(0, lengths[bi], (2,), generator=g).tolist())
                if (i, j) != (0, 0):
                    cells.add(i * n + j)
            spans.append(sorted(cells))
    P = max(len(c) for c in spans)
    index = torch.zeros(b * heads, P, dtype=torch.long)
    for r, cells in enumerate(spans):
        index[r, : len(cells)] = torch.tensor(cells, dtype=torch.long)
    return logits, mask, index.view(b, heads, P)


def test_global_pointer_loss_equals_dense_mce():
    raw, mask, index = _span_batch(seed=5)
    logits = mask_span_logits(raw, mask, tril_mask=True)
    b, heads, n, _ = logits.shape
    # the test may build the dense labels; the library never does
    dense = torch.zeros(b, heads, n * n).scatter_(-1, index, 1.0)
    dense[..., 0] = 0
    flat = logits.reshape(b, heads, n * n).clone()
    flat[..., 0] = masking_value(torch.float32)  # mask_zero: cell ([CLS], [CLS]) is neither pos nor neg
    per = multilabel_categorical_crossentropy(flat, dense)  # [b, heads]
    torch.testing.assert_close(global_pointer_loss(logits, index), per.mean())
    torch.testing.assert_close(global_pointer_loss(logits, index, reduction="sum_heads_mean_batch"),
                               per.sum(1).mean())
    torch.testing.assert_close(global_pointer_loss(logits, index, reduction="none"), per)
    with pytest.raises(ValueError, match="reduction"):
        global_pointer_loss(logits, index, reduction="sum")


def test_losses_fp16_input_give_finite_fp32():
    raw, mask, index = _span_batch(seed=6)
    logits = mask_span_logits(raw, mask, tril_mask=True)
    half = mask_span_logits(raw.half(), mask, tril_mask=True)  # masked cells at the fp16 masking value
    assert torch.isfinite(half).all() and (half == masking_value(torch.float16)).any()
    half.requires_grad_()
    loss = global_pointer_loss(half, index)
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    torch.testing.assert_close(loss, global_pointer_loss(logits, index), atol=2e-2, rtol=2e-3)
    (grad,) = torch.autograd.grad(loss, half)
    assert grad.dtype == torch.float16 and torch.isfinite(grad).all()
    b, heads, n, _ = logits.shape
    dense = torch.zeros(b, heads, n * n).scatter_(-1, index, 1.0)
    for fn in (multilabel_categorical_crossentropy, soft_multilabel_categorical_crossentropy):
        out = fn(half.detach().reshape(b, heads, n * n), dense)
        assert out.dtype == torch.float32 and torch.isfinite(out).all()
