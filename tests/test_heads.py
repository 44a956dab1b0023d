"""Heads: RoPE, GlobalPointer, Efficient GlobalPointer, CRF, softmax tagger (spec §0.1, §1, §2, §8)."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from torch import nn

from zhie.heads import (
    CRF,
    CrfTagger,
    EfficientGlobalPointer,
    GlobalPointer,
    SoftmaxTagger,
    apply_rope,
    bio_allowed_transitions,
    bmes_allowed_transitions,
    mask_span_logits,
    masking_value,
)
from zhie.losses import MASKED_LOGIT_THRESHOLD
from zhie.training import TrainConfig, build_param_groups

torchcrf = pytest.importorskip("torchcrf")


# ----------------------------------------------------------------------------------------------------
# RoPE
# ----------------------------------------------------------------------------------------------------
def rope_reference(x: torch.Tensor) -> torch.Tensor:
    """Explicit 2x2 rotation of each channel pair (2i, 2i+1) at position m; x is [n, d], fp64."""
    n, d = x.shape
    out = torch.empty_like(x, dtype=torch.float64)
    for m in range(n):
        for i in range(d // 2):
            theta = m * 10000.0 ** (-2 * i / d)
            rot = torch.tensor([[math.cos(theta), -math.sin(theta)], [math.sin(theta), math.cos(theta)]],
                               dtype=torch.float64)
            out[m, 2 * i : 2 * i + 2] = rot @ x[m, 2 * i : 2 * i + 2].double()
    return out


def test_rope_matches_explicit_rotation():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 6, 3, 8, generator=g)  # [batch, seq, heads, d]
    y = apply_rope(x)
    assert y.dtype == x.dtype and y.shape == x.shape
    for b in range(2):
        for h in range(3):
            torch.testing.assert_close(y[b, :, h].double(), rope_reference(x[b, :, h]), atol=1e-5, rtol=1e-5)
    # 3-D input, fp64 input, explicit positions (batch-wise) and reduced precision keep their dtype
    x3 = torch.randn(2, 6, 8, generator=g, dtype=torch.float64)
    torch.testing.assert_close(apply_rope(x3)[1], rope_reference(x3[1]), atol=1e-12, rtol=1e-12)
    shifted = apply_rope(x3, positions=torch.arange(6).expand(2, 6) + 0)
    torch.testing.assert_close(shifted, apply_rope(x3))
    assert apply_rope(x.bfloat16()).dtype == torch.bfloat16


def test_rope_relative_property():
    g = torch.Generator().manual_seed(1)
    d = 16
    q, k = torch.randn(d, generator=g, dtype=torch.float64), torch.randn(d, generator=g, dtype=torch.float64)
    n = 40
    rq = apply_rope(q.expand(1, n, d))[0]  # R_m q for m = 0..n-1
    rk = apply_rope(k.expand(1, n, d))[0]
    for delta in (0, 1, 5, 17):
        dots = torch.stack([rq[m] @ rk[m + delta] for m in range(n - delta)])
        torch.testing.assert_close(dots, dots[0].expand_as(dots), atol=1e-10, rtol=1e-10)
        torch.testing.assert_close(dots[0], q @ rk[delta], atol=1e-10, rtol=1e-10)  # = q . R_delta k
    assert not torch.allclose(rq[0] @ rk[3], rq[0] @ rk[4])  # but it does depend on n - m


# ----------------------------------------------------------------------------------------------------
# masking
# ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_masking_value_is_finite_and_below_loss_threshold(dtype):
    value = masking_value(dtype)
    assert math.isfinite(value) and value <= MASKED_LOGIT_THRESHOLD
    logits = torch.zeros(1, 1, 3, 3, dtype=dtype)
    out = mask_span_logits(logits, torch.tensor([[1, 1, 0]]), tril_mask=True)
    assert torch.isfinite(out).all()
    expected_keep = torch.tensor([[1, 1, 0], [0, 1, 0], [0, 0, 0]], dtype=torch.bool)
    assert torch.equal(out[0, 0] == 0, expected_keep)


# ----------------------------------------------------------------------------------------------------
# GlobalPointer / Efficient GlobalPointer against loop implementations of the spec formulas
# ----------------------------------------------------------------------------------------------------
def _inputs(seed: int = 0, b: int = 2, n: int = 6, hidden: int = 10):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(b, n, hidden, generator=g)
    mask = torch.ones(b, n, dtype=torch.long)
    mask[1, 4:] = 0  # second sequence has 4 tokens
    return h, mask


def _expected_mask(mask: torch.Tensor, b: int, i: int, j: int, tril: bool) -> bool:
    return bool(mask[b, i] == 0 or mask[b, j] == 0 or (tril and j < i))


def _randomise_biases(module: nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=g))


@pytest.mark.parametrize("rope,tril", [(True, True), (False, False), (True, False)])
def test_global_pointer_matches_loop_reference(rope, tril):
    torch.manual_seed(0)
    hidden, heads, d = 10, 3, 4
    gp = GlobalPointer(hidden, heads, head_size=d, rope=rope, tril_mask=tril)
    _randomise_biases(gp, 1)
    h, mask = _inputs()
    logits = gp(hidden=h, attention_mask=mask)
    assert logits.shape == (2, heads, 6, 6) and logits.dtype == torch.float32

    W, bias = gp.dense.weight.detach().double(), gp.dense.bias.detach().double()
    masked = torch.tensor(masking_value(torch.float32)).item()  # as stored in fp32
    for b in range(2):
        proj = h[b].double() @ W.T + bias  # [n, heads * 2d]
        for a in range(heads):
            chunk = proj[:, a * 2 * d : (a + 1) * 2 * d]
            q, k = chunk[:, :d], chunk[:, d:]
            if rope:
                q, k = rope_reference(q), rope_reference(k)
            for i in range(6):
                for j in range(6):
                    if _expected_mask(mask, b, i, j, tril):
                        assert logits[b, a, i, j].item() == masked
                    else:
                        expected = float(q[i] @ k[j]) / math.sqrt(d)
                        assert logits[b, a, i, j].item() == pytest.approx(expected, abs=1e-4)


@pytest.mark.parametrize("rope,tril", [(True, True), (False, False)])
def test_efficient_global_pointer_matches_loop_reference(rope, tril):
    torch.manual_seed(0)
    hidden, heads, d = 10, 3, 4
    egp = EfficientGlobalPointer(hidden, heads, head_size=d, rope=rope, tril_mask=tril)
    _randomise_biases(egp, 2)
    h, mask = _inputs(seed=3)
    logits = egp(hidden=h, attention_mask=mask)
    assert logits.shape == (2, heads, 6, 6)

    Wp, bp = egp.dense.weight.detach().double(), egp.dense.bias.detach().double()
    Wc, bc = egp.bias_dense.weight.detach().double(), egp.bias_dense.bias.detach().double()
    masked = torch.tensor(masking_value(torch.float32)).item()  # as stored in fp32
    for b in range(2):
        p = h[b].double() @ Wp.T + bp  # [n, 2d]
        q, k = p[:, 0::2], p[:, 1::2]
        if rope:
            q, k = rope_reference(q), rope_reference(k)
        c = (p @ Wc.T + bc) / 2  # from the pre-RoPE p
        for a in range(heads):
            for i in range(6):
                for j in range(6):
                    if _expected_mask(mask, b, i, j, tril):
                        assert logits[b, a, i, j].item() == masked
                    else:
                        expected = float(q[i] @ k[j]) / math.sqrt(d) + float(c[i, 2 * a + 1]) + float(c[j, 2 * a])
                        assert logits[b, a, i, j].item() == pytest.approx(expected, abs=1e-4)


def test_heads_init_and_low_precision():
    gp = GlobalPointer(32, 2, head_size=8)
    limit = math.sqrt(6 / (32 + 2 * 2 * 8))  # glorot_uniform
    assert gp.dense.weight.abs().max() <= limit and torch.all(gp.dense.bias == 0)
    egp = EfficientGlobalPointer(32, 2, head_size=8)
    assert torch.all(egp.dense.bias == 0) and torch.all(egp.bias_dense.bias == 0)
    h, mask = _inputs(hidden=32)
    for module in (gp, egp):
        out = module.to(torch.bfloat16)(h.bfloat16(), mask)
        assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
        assert (out <= MASKED_LOGIT_THRESHOLD).any()


# ----------------------------------------------------------------------------------------------------
# CRF
# ----------------------------------------------------------------------------------------------------
def _random_crf(num_tags: int, seed: int, scale: float = 1.0, start_end: bool = True) -> CRF:
    g = torch.Generator().manual_seed(seed)
    crf = CRF(num_tags, start_end_transitions=start_end)
    with torch.no_grad():
        for p in crf.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * scale)
    return crf


def _ragged(b: int, n: int, L: int, seed: int, scale: float = 1.0):
    g = torch.Generator().manual_seed(seed)
    emissions = torch.randn(b, n, L, generator=g) * scale
    lengths = torch.randint(1, n + 1, (b,), generator=g)
    lengths[0] = n
    mask = torch.arange(n).unsqueeze(0) < lengths.unsqueeze(1)
    tags = torch.randint(0, L, (b, n), generator=g).masked_fill(~mask, -100)  # padded tags: anything
    return emissions, tags, mask


def _torchcrf_copy(crf: CRF):
    ref = torchcrf.CRF(crf.num_tags, batch_first=True)
    with torch.no_grad():
        ref.transitions.copy_(crf.transitions)
        if crf.start_transitions is not None:
            ref.start_transitions.copy_(crf.start_transitions)
            ref.end_transitions.copy_(crf.end_transitions)
        else:
            ref.start_transitions.zero_()
            ref.end_transitions.zero_()
    return ref


@pytest.mark.parametrize("start_end", [True, False])
def test_crf_matches_pytorch_crf(start_end):
    for seed in range(3):
        crf = _random_crf(5, seed, start_end=start_end)
        ref = _torchcrf_copy(crf)
        emissions, tags, mask = _ragged(b=7, n=9, L=5, seed=10 + seed)
        ours = crf.log_likelihood(emissions, tags, mask)
        theirs = ref(emissions, tags.clamp_min(0), mask, reduction="none")
        assert ours.shape == (7,)
        torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
        assert decode(crf, emissions, mask) == ref.decode(emissions, mask)
    # no mask == all-ones mask
    full = torch.ones(tags.shape, dtype=torch.bool)
    torch.testing.assert_close(crf(emissions, tags.clamp_min(0)),
                               ref(emissions, tags.clamp_min(0), full, reduction="none"))


def _all_paths(L: int, n: int) -> torch.Tensor:
    return torch.tensor(list(itertools.product(range(L), repeat=n)), dtype=torch.long)


def _path_scores(crf: CRF, em: torch.Tensor, paths: torch.Tensor) -> torch.Tensor:
    """Scores of all ``paths [P, n]`` for one unpadded emission matrix ``em [n, L]``."""
    n = paths.shape[1]
    s = em[torch.arange(n), paths].sum(1)
    if n > 1:
        s = s + crf.transitions[paths[:, :-1], paths[:, 1:]].sum(1)
    if crf.start_transitions is not None:
        s = s + crf.start_transitions[paths[:, 0]] + crf.end_transitions[paths[:, -1]]
    return s


def test_crf_log_partition_and_viterbi_brute_force():
    L = 3
    crf = _random_crf(L, seed=4)
    emissions, tags, mask = _ragged(b=6, n=4, L=L, seed=5)
    with torch.no_grad():
        log_z = crf.log_partition(emissions, mask)
        best_tags, best_scores = crf.viterbi(emissions, mask)
        for i, length in enumerate(mask.sum(1).tolist()):
            scores = _path_scores(crf, emissions[i, :length], _all_paths(L, length))
            assert log_z[i].item() == pytest.approx(torch.logsumexp(scores, 0).item(), abs=1e-5)
            assert best_scores[i].item() == pytest.approx(scores.max().item(), abs=1e-5)
            assert best_tags[i, :length].tolist() == _all_paths(L, length)[scores.argmax()].tolist()
            assert (best_tags[i, length:] == -1).all()


def decode(crf: CRF, emissions, mask, **constraints) -> list[list[int]]:
    """Best paths as lists of their ``length_i`` tag ids (pytorch-crf's ``decode``)."""
    tags, _ = crf.viterbi(emissions, mask, **constraints)
    return [row[row >= 0].tolist() for row in tags]


def _violations(path: list[int], allowed, start, end) -> int:
    bad = int(not start[path[0]]) + int(not end[path[-1]])
    return bad + sum(int(not allowed[a, b]) for a, b in itertools.pairwise(path))


BIO_LABELS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
BMES_LABELS = ["S", "B", "M", "E"]


@pytest.mark.parametrize("labels,helper", [(BIO_LABELS, bio_allowed_transitions),
                                           (BMES_LABELS, bmes_allowed_transitions)])
def test_constrained_decode(labels, helper):
    allowed, start, end = helper(labels)
    L = len(labels)
    crf = _random_crf(L, seed=6, scale=3.0)
    emissions, _, mask = _ragged(b=64, n=10, L=L, seed=7, scale=2.0)
    free = decode(crf, emissions, mask)
    assert sum(_violations(p, allowed, start, end) for p in free) > 0  # the constraints do matter here
    constrained = decode(crf, emissions, mask, allowed=allowed, allowed_start=start, allowed_end=end)
    assert [len(p) for p in constrained] == mask.sum(1).tolist()
    assert all(_violations(p, allowed, start, end) == 0 for p in constrained)

    # tiny cases: equals the best allowed path found by enumeration
    emissions, _, mask = _ragged(b=8, n=4, L=L, seed=8, scale=2.0)
    constrained = decode(crf, emissions, mask, allowed=allowed, allowed_start=start, allowed_end=end)
    with torch.no_grad():
        for i, length in enumerate(mask.sum(1).tolist()):
            paths = _all_paths(L, length)
            ok = start[paths[:, 0]] & end[paths[:, -1]]
            if length > 1:
                ok &= allowed[paths[:, :-1], paths[:, 1:]].all(1)
            scores = _path_scores(crf, emissions[i, :length], paths).masked_fill(~ok, float("-inf"))
            assert constrained[i] == paths[scores.argmax()].tolist()


def test_allowed_transition_helpers():
    allowed, start, end = bio_allowed_transitions(BIO_LABELS)
    ix = {t: i for i, t in enumerate(BIO_LABELS)}
    assert not allowed[ix["O"], ix["I-PER"]] and not allowed[ix["B-LOC"], ix["I-PER"]]
    assert not allowed[ix["I-LOC"], ix["I-PER"]]
    assert allowed[ix["B-PER"], ix["I-PER"]] and allowed[ix["I-PER"], ix["I-PER"]]
    assert allowed[ix["I-PER"], ix["O"]] and allowed[ix["B-PER"], ix["B-LOC"]]
    assert start.tolist() == [True, True, False, True, False] and end.all()

    allowed, start, end = bmes_allowed_transitions(BMES_LABELS)
    #                         to:  S      B      M      E
    expected = torch.tensor([[True, True, False, False],   # from S
                             [False, False, True, True],   # from B
                             [False, False, True, True],   # from M
                             [True, True, False, False]])  # from E
    assert torch.equal(allowed, expected)
    assert start.tolist() == [True, True, False, False] and end.tolist() == [True, False, False, True]
    with pytest.raises(ValueError, match="malformed BIO tag"):
        bio_allowed_transitions(["O", "X-PER"])


def _train_crf(multiplier: float, steps: int = 3):
    torch.manual_seed(0)
    L = 4
    encoder = nn.Linear(8, L)
    crf = CRF(L, lr_multiplier=multiplier)
    assert crf.lr_multipliers() == dict.fromkeys(["transitions", "start_transitions", "end_transitions"], multiplier)
    optimizer = torch.optim.AdamW(build_param_groups(nn.ModuleDict({"encoder": encoder, "crf": crf}),
                                                     TrainConfig(lr=1e-3, head_lr=1e-3, weight_decay=0.0)))
    g = torch.Generator().manual_seed(1)
    x = torch.randn(16, 6, 8, generator=g)
    tags = torch.randint(0, L, (16, 6), generator=g)
    t0, w0 = crf.transitions.detach().clone(), encoder.weight.detach().clone()
    for _ in range(steps):
        optimizer.zero_grad()
        loss = -crf.log_likelihood(encoder(x), tags).mean()
        loss.backward()
        optimizer.step()
    return (crf.transitions - t0).abs().mean().item(), (encoder.weight - w0).abs().mean().item()


def test_crf_transitions_learn_with_their_own_learning_rate():
    dt1, dw1 = _train_crf(1.0)
    dt100, dw100 = _train_crf(100.0)
    # Adam moves each coordinate by ~lr per step, so the displacement scales with the group's lr
    # (measured: 90x after 3 steps, exactly 100x after one); the encoder moves the same in both runs.
    assert 70 < dt100 / dt1 < 130
    assert 0.5 < dw100 / dw1 < 2


def test_crf_rejects_left_padding():
    crf = CRF(3)
    with pytest.raises(ValueError, match="first timestep"):
        crf.viterbi(torch.zeros(2, 3, 3), torch.tensor([[1, 1, 1], [0, 1, 1]]))


# ----------------------------------------------------------------------------------------------------
# softmax tagger
# ----------------------------------------------------------------------------------------------------
def test_softmax_tagger():
    torch.manual_seed(0)
    tagger = SoftmaxTagger(8, 5, dropout=0.1).eval()
    h = torch.randn(2, 4, 8)
    logits = tagger(h)
    assert logits.shape == (2, 4, 5)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    tags = torch.tensor([[1, 2, 3, 4], [0, 1, -100, -100]])
    expected = torch.nn.functional.cross_entropy(logits[mask.bool()], tags[mask.bool()])
    torch.testing.assert_close(tagger.loss(logits, tags), expected)


def test_crf_tagger_loss_is_its_crfs():
    torch.manual_seed(0)
    tags = ["O", "B-PER", "I-PER"]
    tagger = CrfTagger(8, tags, "BIO", lr_multiplier=10).eval()
    emissions = tagger(torch.randn(2, 5, 8))
    labels = torch.tensor([[0, 1, 2, 0, 0], [1, 2, 2, -100, -100]])
    mask = labels != -100
    expected = -tagger.crf.log_likelihood(emissions, labels.clamp(min=0), mask).mean()
    torch.testing.assert_close(tagger.loss(emissions, labels), expected)
    assert tagger.crf.lr_multiplier == 10
