"""The CRF's fast recursions (scaled forward algorithm with a closed-form gradient, host Viterbi) against pytorch-crf
on random ragged batches: log-likelihood, its gradients and the best paths (spec §8). Timings are in
``benchmarks/peers.py``, never here."""

from __future__ import annotations

import pytest
import torch

from tests.test_heads import _ragged, _random_crf, _torchcrf_copy, decode
from zhie.heads import CRF

torchcrf = pytest.importorskip("torchcrf")

SIZES = [(32, 64, 21, 1.0), (5, 1, 3, 1.0), (9, 40, 7, 8.0), (4, 130, 21, 3.0)]  # (batch, steps, tags, scale)


def _grads(loss: torch.Tensor, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    grads = torch.autograd.grad(loss, tensors, allow_unused=True)  # one step: pytorch-crf never uses transitions
    return [torch.zeros_like(t) if g is None else g for t, g in zip(tensors, grads)]


def _check_against_pytorch_crf(crf: CRF, emissions, tags, mask, atol: float) -> None:
    ref = _torchcrf_copy(crf)
    em = emissions.clone().requires_grad_()
    em_ref = emissions.clone().requires_grad_()
    ours = crf.log_likelihood(em, tags.clamp_min(0), mask)
    theirs = ref(em_ref, tags.clamp_min(0), mask, reduction="none")
    torch.testing.assert_close(ours, theirs, atol=atol, rtol=1e-5)

    weights = torch.rand(ours.shape, generator=torch.Generator().manual_seed(0))  # any incoming gradient
    mine = [em, crf.transitions] + ([crf.start_transitions, crf.end_transitions] if crf.start_transitions is not None
                                    else [])
    refs = [em_ref, ref.transitions] + ([ref.start_transitions, ref.end_transitions] if crf.start_transitions
                                        is not None else [])
    for g, g_ref in zip(_grads((ours * weights).sum(), mine), _grads((theirs * weights).sum(), refs)):
        torch.testing.assert_close(g, g_ref, atol=atol, rtol=1e-4)

    with torch.no_grad():
        paths, best = crf.viterbi(emissions, mask)
    assert decode(crf, emissions, mask) == ref.decode(emissions, mask)
    torch.testing.assert_close(best, crf.path_score(emissions, paths.clamp_min(0), mask), atol=atol, rtol=1e-5)


@pytest.mark.parametrize("b,n,L,scale", SIZES)
@pytest.mark.parametrize("start_end", [True, False])
def test_scaled_forward_and_viterbi_equal_pytorch_crf(b, n, L, scale, start_end):
    crf = _random_crf(L, seed=n, scale=scale / 2, start_end=start_end)
    emissions, tags, mask = _ragged(b, n, L, seed=b + n, scale=scale)
    _check_against_pytorch_crf(crf, emissions, tags, mask, atol=1e-4 * scale * n)


def test_wide_transitions_take_the_log_space_recursion():
    """Transitions spanning > 60 nats could underflow the scaled recursion: the log-space one runs, same results."""
    crf = _random_crf(6, seed=1, scale=40.0)
    emissions, tags, mask = _ragged(8, 12, 6, seed=2, scale=4.0)
    _check_against_pytorch_crf(crf, emissions, tags, mask, atol=1e-2)
    with torch.no_grad():
        crf.transitions[0, 1] = float("-inf")  # a forbidden move in training: finite log Z, same as log space
    log_z = crf.log_partition(emissions, mask)
    assert torch.isfinite(log_z).all()


def test_padded_emissions_may_hold_anything():
    crf = _random_crf(5, seed=3)
    emissions, tags, mask = _ragged(6, 10, 5, seed=4)
    junk = emissions.masked_fill(~mask.unsqueeze(-1), 1e30)
    torch.testing.assert_close(crf.log_partition(junk, mask), crf.log_partition(emissions, mask))
    assert torch.equal(crf.viterbi(junk, mask)[0], crf.viterbi(emissions, mask)[0])


def test_half_precision_emissions_give_fp32_results_and_gradients_of_their_dtype():
    crf = _random_crf(5, seed=5)
    emissions, tags, mask = _ragged(4, 7, 5, seed=6)
    em = emissions.to(torch.bfloat16).requires_grad_()
    ll = crf.log_likelihood(em, tags.clamp_min(0), mask)
    assert ll.dtype == torch.float32
    torch.testing.assert_close(ll, crf.log_likelihood(em.detach().float(), tags.clamp_min(0), mask))
    ll.sum().backward()
    assert em.grad.dtype == torch.bfloat16 and torch.isfinite(em.grad.float()).all()
