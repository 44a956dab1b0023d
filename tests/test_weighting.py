"""Multi-task loss weighting (spec §5): each scheme's gradient equals its closed form; MGDA and the main+auxiliary
projection equal brute-force solutions and keep their promises about first-order changes of the losses."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.optimize import minimize, nnls

from zhie.multitask.weighting import (
    MGDA,
    Equal,
    GeneralisedMean,
    GradNormalise,
    InitialLoss,
    MainAuxiliary,
    PriorLoss,
    RealTime,
    UncertaintyWeighting,
    combine,
    min_norm_weights,
)


def hand_made_losses(theta: torch.Tensor) -> torch.Tensor:
    """Three losses of very different scales and shapes on a 4-d parameter."""
    return torch.stack([(theta ** 2).sum() + 1.0, 100 * (theta[0] - 1) ** 2 + 5.0, torch.exp(theta[1:3]).sum()])


def grad_of(scheme, theta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(gradient of combine(losses, weights), losses, per-task gradients [n, 4])."""
    theta = theta.clone().requires_grad_(True)
    losses = hand_made_losses(theta)
    per_task = torch.stack([torch.autograd.grad(loss, theta, retain_graph=True)[0] for loss in losses])
    weights = scheme.weights(losses, per_task.detach() if scheme.needs_gradients else None)
    (total,) = torch.autograd.grad(combine(losses, weights), theta)
    return total, losses.detach(), per_task


THETA = torch.tensor([0.3, -0.5, 0.8, 1.2])


def test_loss_schemes_have_their_closed_form_gradients():
    total, losses, g = grad_of(Equal(), THETA)
    torch.testing.assert_close(total, g.mean(0))
    total, _, _ = grad_of(RealTime(), THETA)  # Σ ∇L_i / L_i, the gradient of Σ log L_i
    torch.testing.assert_close(total, (g / losses[:, None]).sum(0))
    theta = THETA.clone().requires_grad_(True)
    (log_grad,) = torch.autograd.grad(torch.log(hand_made_losses(theta)).sum(), theta)
    torch.testing.assert_close(total, log_grad)
    total, _, _ = grad_of(PriorLoss([2.0, 4.0, 8.0]), THETA)
    torch.testing.assert_close(total, g[0] / 2 + g[1] / 4 + g[2] / 8)
    total, _, _ = grad_of(GradNormalise(), THETA)
    torch.testing.assert_close(total, (g / g.norm(dim=1, keepdim=True)).sum(0))


@pytest.mark.parametrize("gamma", [-2.0, 0.0, 0.5, 1.0, 3.0])
def test_generalised_mean_is_the_gradient_of_the_power_mean(gamma):
    total, losses, g = grad_of(GeneralisedMean(gamma), THETA)
    theta = THETA.clone().requires_grad_(True)
    x = hand_made_losses(theta)
    mean = torch.exp(torch.log(x).mean()) if gamma == 0 else x.pow(gamma).mean().pow(1 / gamma)
    (expected,) = torch.autograd.grad(mean, theta)
    torch.testing.assert_close(total, expected, rtol=1e-5, atol=1e-6)
    weights = GeneralisedMean(gamma).weights(losses)
    ratio = weights / losses.pow(gamma - 1)  # weights ∝ L_i^(γ-1)
    torch.testing.assert_close(ratio, ratio[:1].expand(3), rtol=1e-5, atol=0)
    if gamma == 1.0:
        torch.testing.assert_close(weights, torch.full((3,), 1 / 3))


def test_initial_loss_uses_the_first_batches_then_stays():
    scheme = InitialLoss(batches=2)
    assert torch.allclose(scheme.weights(torch.tensor([2.0, 8.0])), torch.tensor([1 / 2, 1 / 8]))
    assert torch.allclose(scheme.weights(torch.tensor([4.0, 4.0])), torch.tensor([1 / 3, 1 / 6]))
    assert torch.allclose(scheme.weights(torch.tensor([100.0, 100.0])), torch.tensor([1 / 3, 1 / 6]))
    resumed = InitialLoss(batches=2)
    resumed.load_state_dict(scheme.state_dict())
    assert torch.allclose(resumed.weights(torch.tensor([1.0, 1.0])), torch.tensor([1 / 3, 1 / 6]))
    analytic = InitialLoss([np.log(9), np.log(4)])  # K-way softmax with zero logits: log K
    assert torch.allclose(analytic.weights(torch.tensor([7.0, 7.0])), 1 / torch.tensor([np.log(9), np.log(4)]).float())


def brute_min_norm(gram: np.ndarray) -> float:
    n = len(gram)
    result = minimize(lambda a: a @ gram @ a, np.full(n, 1 / n), jac=lambda a: 2 * gram @ a, method="SLSQP",
                      bounds=[(0, 1)] * n, constraints=[{"type": "eq", "fun": lambda a: a.sum() - 1}],
                      options={"ftol": 1e-14, "maxiter": 500})
    return float(result.fun)


@pytest.mark.parametrize("seed", range(12))
def test_mgda_is_the_minimum_norm_point(seed):
    """At the iterations training uses (250), on 2 to 8 tasks; 8 gradients in 2 dimensions have the origin in their
    hull (minimum 0), where plain Frank–Wolfe was still off by orders of magnitude."""
    g = torch.Generator().manual_seed(seed)
    n, dim = [(2, 5), (3, 5), (4, 10), (5, 3), (8, 20), (8, 2)][seed % 6]
    grads = torch.randn(n, dim, generator=g, dtype=torch.float64)
    if seed >= 6:  # a shared direction: a common descent direction exists
        grads += 2 * torch.randn(1, dim, generator=g, dtype=torch.float64)
    gram = grads @ grads.T
    alpha = min_norm_weights(gram)
    assert alpha.min() >= 0 and alpha.sum().item() == pytest.approx(1.0)
    assert (alpha @ gram @ alpha).item() == pytest.approx(brute_min_norm(gram.numpy()), rel=1e-6, abs=1e-9)
    u = alpha @ grads
    if u.norm() > 1e-6:  # then u is a common descent direction: <u, g_i> >= |u|^2 > 0 for every task
        assert ((grads @ u) >= u.norm() ** 2 * (1 - 1e-6)).all()
    weights = MGDA().weights(torch.ones(n), grads.float())
    assert (weights.double() @ gram @ weights.double()).item() == pytest.approx(
        (alpha @ gram @ alpha).item(), rel=1e-4, abs=1e-6)


def test_mgda_with_two_opposite_gradients_stops():
    grads = torch.tensor([[1.0, 0.0], [-1.0, 0.0]])
    alpha = MGDA().weights(torch.ones(2), grads)
    assert alpha @ grads == pytest.approx(torch.zeros(2), abs=1e-6)  # Pareto-stationary: no common descent


@pytest.mark.parametrize("seed", range(6))
def test_main_auxiliary_projection(seed):
    g = torch.Generator().manual_seed(seed)
    k = 1 + seed % 3
    grads = torch.randn(k + 1, 6, generator=g, dtype=torch.float64)
    grads[1] = -grads[0] + 0.3 * torch.randn(6, generator=g, dtype=torch.float64)  # a conflicting auxiliary
    alpha = MainAuxiliary().weights(torch.ones(k + 1), grads.float()).double()
    assert alpha[0] == 1 and (alpha[1:] >= 0).all()
    lam, _ = nnls(grads[1:].T.numpy(), -grads[0].numpy())  # min ||g0 + A lam|| with lam >= 0
    np.testing.assert_allclose(alpha[1:].numpy(), lam, rtol=1e-3, atol=1e-4)
    u = alpha @ grads
    assert (grads[1:] @ u >= -1e-4).all()  # no auxiliary loss increases to first order
    assert grads[0] @ u >= -1e-6  # nor does the main loss, although the gradients conflict
    if k == 1:
        expected = torch.relu(-(grads[0] @ grads[1])) / (grads[1] @ grads[1])
        assert alpha[1].item() == pytest.approx(expected.item(), rel=1e-4)


def test_main_auxiliary_without_conflict_is_the_main_gradient():
    grads = torch.tensor([[1.0, 1.0], [1.0, 0.0], [0.0, 2.0]])
    assert MainAuxiliary().weights(torch.ones(3), grads).tolist() == [1.0, 0.0, 0.0]


def test_uncertainty_weighting_settles_at_the_losses():
    scheme = UncertaintyWeighting(2)
    losses = torch.tensor([0.5, 20.0])
    optimizer = torch.optim.SGD(scheme.parameters(), lr=0.5)
    for _ in range(300):
        optimizer.zero_grad()
        scheme(losses).backward()
        optimizer.step()
    torch.testing.assert_close(scheme.log_var.exp(), losses, rtol=1e-3, atol=1e-3)  # optimum sigma^2 = L_i
    torch.testing.assert_close(scheme.weights(), 1 / (2 * losses), rtol=1e-3, atol=1e-4)
