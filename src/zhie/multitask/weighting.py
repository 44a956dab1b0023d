"""Loss weighting for several tasks on one encoder: every scheme of Su's three posts (spec §5), and uncertainty
weighting (Kendall et al. 2018; not in the posts, marked as such).

Every scheme here is a rule for the weights ``α_i`` of ``L = Σ_i sg(α_i) L_i`` (``sg``: no gradient through the
weight), so that the update direction is ``Σ_i α_i ∇L_i``: :meth:`Weighting.weights` returns them from the tasks'
losses (and, for the gradient schemes, their gradients), :func:`combine` forms ``L``.

* §5.1 loss schemes (no extra backward pass): :class:`Equal` (``1/n``), :class:`InitialLoss` (``1/L_i^init``),
  :class:`PriorLoss` (``1/L_i^prior``), :class:`RealTime` (``1/sg(L_i)``: the gradient of ``Σ log L_i``, i.e. of the
  geometric mean), :class:`GeneralisedMean` (the gradient of ``(1/n Σ L_i^γ)^(1/γ)``);
* §5.1.7 and §5.2 gradient schemes (one backward pass per task and step, to get each ``g_i = ∇L_i``):
  :class:`GradNormalise` (``1/‖g_i‖``, the "ideal target": scale- and shift-invariant), :class:`MGDA` (the
  minimum-norm point of the convex hull of the ``g_i``, by pairwise Frank–Wolfe on their Gram matrix);
* §5.3 :class:`MainAuxiliary` (task 0 is the main task: ``u = g_0 + Σ λ_i g_i`` with the smallest ``λ ≥ 0`` that keeps
  every auxiliary loss from increasing to first order; the main loss never increases to first order either);
* :class:`UncertaintyWeighting` (Kendall et al.; learnable ``log σ_i²``): an ``nn.Module`` with its own weights.

``grads`` is ``[n, P]``: each task's gradient flattened over the shared parameters (or, MGDA's cheaper upper bound,
over the shared encoder's output — spec §5.2: Su shows that the paper's proof that this bound still reaches
Pareto-stationary points is wrong, so it is a heuristic).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["MGDA", "Equal", "GeneralisedMean", "GradNormalise", "InitialLoss", "MainAuxiliary", "PriorLoss",
           "RealTime", "UncertaintyWeighting", "Weighting", "combine", "min_norm_weights", "nonnegative_projection"]


def combine(losses: Tensor, weights: Tensor) -> Tensor:
    """``Σ_i sg(α_i) L_i`` (fp32): its gradient is ``Σ_i α_i ∇L_i``."""
    return (weights.detach().float() * losses.float()).sum()


class Weighting:
    """A weighting rule: ``weights(losses [n], grads [n, P] or None) -> α [n]`` (detached)."""

    needs_gradients = False  # True: the caller must pass each task's gradient (one backward pass per task)

    def weights(self, losses: Tensor, grads: Tensor | None = None) -> Tensor:
        raise NotImplementedError

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


class Equal(Weighting):
    """§5.1.1: ``α_i = 1/n`` for ``n`` tasks per step (default: as many as the losses given). Sampled steps, which
    take one task's loss each, have ``n = 1``: ``α_i = 1``, the task's own loss."""

    def __init__(self, tasks_per_step: int | None = None) -> None:
        self.tasks_per_step = tasks_per_step

    def weights(self, losses: Tensor, grads: Tensor | None = None) -> Tensor:
        return torch.full_like(losses.detach().float(), 1.0 / (self.tasks_per_step or len(losses)))


class InitialLoss(Weighting):
    """§5.1.2: ``α_i = 1 / L_i^init``, with ``L_i^init`` given (analytic: ``log K`` for a K-way softmax with zero
    logits) or, when ``None``, the mean of the first ``batches`` batches' losses (the first batch alone until then)."""

    def __init__(self, initial: list[float] | None = None, batches: int = 1) -> None:
        self.initial = None if initial is None else torch.tensor(initial, dtype=torch.float32)
        self.batches, self.seen, self.sums = batches, 0, None

    def weights(self, losses: Tensor, grads: Tensor | None = None) -> Tensor:
        losses = losses.detach().float()
        if self.initial is None or self.seen < self.batches and self.sums is not None:
            self.sums = losses.cpu() if self.sums is None else self.sums + losses.cpu()
            self.seen += 1
            self.initial = self.sums / self.seen
        return 1.0 / self.initial.to(losses.device)

    def state_dict(self) -> dict:
        return {"initial": self.initial, "seen": self.seen, "sums": self.sums}

    def load_state_dict(self, state: dict) -> None:
        self.initial, self.seen, self.sums = state["initial"], state["seen"], state["sums"]


class PriorLoss(Weighting):
    """§5.1.3: ``α_i = 1 / L_i^prior``, the loss of a model that knows only the label prior (Su prefers it to the
    initial loss); ``priors`` are given by the tasks."""

    def __init__(self, priors: list[float]) -> None:
        if any(p <= 0 for p in priors):
            raise ValueError(f"prior losses must be > 0, got {priors}")
        self.priors = torch.tensor(priors, dtype=torch.float32)

    def weights(self, losses: Tensor, grads: Tensor | None = None) -> Tensor:
        return 1.0 / self.priors.to(losses.device)


class RealTime(Weighting):
    """§5.1.4–5: ``α_i = 1 / sg(L_i)``; ``L`` is ``n`` in value and ``Σ ∇L_i / L_i`` in gradient, the gradient of
    ``Σ log L_i = n log (geometric mean)``."""

    def weights(self, losses: Tensor, grads: Tensor | None = None) -> Tensor:
        return 1.0 / losses.detach().float().clamp(min=1e-12)


class GeneralisedMean(Weighting):
    """§5.1.6: the gradient of the power mean ``M_γ = (1/n Σ L_i^γ)^(1/γ)``:
    ``α_i = ∂M_γ/∂L_i = (1/n) L_i^(γ-1) M_γ^(1-γ)`` (∝ ``L_i^(γ-1)``: larger γ favours the largest loss); γ = 1 is
    the arithmetic mean (equal weights), γ → 0 the geometric mean (``α_i = M_0 / (n L_i)``)."""

    def __init__(self, gamma: float) -> None:
        self.gamma = gamma

    def weights(self, losses: Tensor, grads: Tensor | None = None) -> Tensor:
        x, n, g = losses.detach().double().clamp(min=1e-12), len(losses), self.gamma
        if g == 0:
            mean = torch.exp(torch.log(x).mean())
            return (mean / (n * x)).float()
        mean = (x.pow(g).mean()).pow(1 / g)
        return (x.pow(g - 1) * mean.pow(1 - g) / n).float()


class GradNormalise(Weighting):
    """§5.1.7: ``α_i = 1 / ‖g_i‖`` (``L_i / sg(‖∇L_i‖)``): each task contributes a unit step direction; invariant to
    the scale and the shift of every loss."""

    needs_gradients = True

    def weights(self, losses: Tensor, grads: Tensor | None = None) -> Tensor:
        return 1.0 / grads.float().norm(dim=1).clamp(min=1e-12)


def min_norm_weights(gram: Tensor, iterations: int = 250, tolerance: float = 1e-10) -> Tensor:
    """``argmin_{α ∈ simplex} αᵀ G α`` (spec §5.2; Sener & Koltun 2018) by pairwise Frank–Wolfe on the Gram matrix:
    move weight from the away vertex ``v = argmax_{α_i > 0} (Gα)_i`` to the Frank–Wolfe vertex ``τ = argmin_i (Gα)_i``
    by the exact line search ``γ = min(α_v, ((Gα)_v - (Gα)_τ) / ‖g_τ - g_v‖²)``; stops when that gap is below
    ``tolerance`` times ``αᵀGα``. Plain Frank–Wolfe (the spec's, with the step towards ``e_τ`` only) converges as
    ``O(1/k)`` and is still far off after 250 iterations when the minimum is 0 or on a face; the away step makes the
    convergence linear (Lacoste-Julien & Jaggi 2015), so 250 iterations reach the optimum to float precision. The
    ``n x n`` matrix is solved on the CPU (no device synchronisation per iteration)."""
    gram = gram.detach().double().cpu()
    n = gram.shape[0]
    alpha = torch.full((n,), 1.0 / n, dtype=torch.float64)
    for _ in range(iterations):
        scores = gram @ alpha
        t = int(scores.argmin())
        v = int(scores.masked_fill(alpha <= 0, -torch.inf).argmax())
        gap = float(scores[v] - scores[t])
        if gap <= tolerance * max(float(alpha @ scores), 1e-30):
            break
        curvature = float(gram[t, t] + gram[v, v] - 2 * gram[t, v])
        step = float(alpha[v]) if curvature <= 0 else min(gap / curvature, float(alpha[v]))
        alpha[t] += step
        alpha[v] -= step
    return alpha


class MGDA(Weighting):
    """§5.2: ``α`` = the minimum-norm point of the convex hull of the task gradients, so that ``u = Σ α_i g_i``
    satisfies ``⟨u, g_i⟩ ≥ ‖u‖² ≥ 0`` for every task (no task gets worse to first order; ``u = 0``: Pareto-stationary).
    Pairwise Frank–Wolfe (:func:`min_norm_weights`) on the Gram matrix ``⟨g_i, g_j⟩``, computed once per step."""

    needs_gradients = True

    def __init__(self, iterations: int = 250) -> None:
        self.iterations = iterations

    def weights(self, losses: Tensor, grads: Tensor | None = None) -> Tensor:
        g = grads.double()
        return min_norm_weights(g @ g.T, self.iterations).float()


def nonnegative_projection(gram: Tensor, sweeps: int = 100, tolerance: float = 1e-10) -> Tensor:
    """``argmin_{λ ≥ 0} ½‖g_0 + Σ_{i≥1} λ_i g_i‖²`` from the Gram matrix of ``g_0..g_k``, by exact coordinate
    minimisation (spec §5.3): ``λ_i ← max(0, λ_i - ⟨u, g_i⟩ / ‖g_i‖²)`` with ``u = g_0 + Σ λ_j g_j``; one auxiliary:
    ``λ = relu(-⟨g_0, g_1⟩) / ‖g_1‖²``. Returns ``λ [k]``."""
    gram = gram.double()
    k = gram.shape[0] - 1
    lam = torch.zeros(k, dtype=torch.float64, device=gram.device)
    for _ in range(sweeps):
        change = 0.0
        for i in range(1, k + 1):
            if gram[i, i] <= 1e-20:
                continue
            inner = gram[0, i] + lam @ gram[1:, i]  # ⟨u, g_i⟩
            new = max(0.0, float(lam[i - 1] - inner / gram[i, i]))
            change = max(change, abs(new - float(lam[i - 1])))
            lam[i - 1] = new
        if change < tolerance:
            break
    return lam


class MainAuxiliary(Weighting):
    """§5.3: task 0 is the main task, the others are auxiliaries that must not get worse: ``α = (1, λ)`` with
    ``λ`` from :func:`nonnegative_projection`. At that optimum ``⟨u, g_i⟩ ≥ 0`` for every auxiliary, with equality
    where ``λ_i > 0``, so ``⟨u, g_0⟩ = ‖u‖² - Σ λ_i ⟨u, g_i⟩ = ‖u‖² ≥ 0``: neither the main loss nor an auxiliary
    increases to first order, and without conflict (``⟨g_0, g_i⟩ ≥ 0``) ``u = g_0``."""

    needs_gradients = True

    def __init__(self, sweeps: int = 100) -> None:
        self.sweeps = sweeps

    def weights(self, losses: Tensor, grads: Tensor | None = None) -> Tensor:
        g = grads.double()
        lam = nonnegative_projection(g @ g.T, self.sweeps)
        return torch.cat([lam.new_ones(1), lam]).float()


class UncertaintyWeighting(nn.Module):
    """Kendall, Gal & Cipolla (2018) — **not in Su's posts**: ``L = Σ_i exp(-s_i) L_i / 2 + s_i / 2`` with learnable
    ``s_i = log σ_i²`` (zero init). At its optimum ``σ_i² = L_i``, so it tends to the gradient of ``½ Σ log L_i``
    (real-time normalisation, halved). Train ``s`` with the heads' learning rate."""

    def __init__(self, tasks: int) -> None:
        super().__init__()
        self.log_var = nn.Parameter(torch.zeros(tasks))

    def forward(self, losses: Tensor, present: Tensor | None = None) -> Tensor:
        """The objective over the tasks ``present`` (a bool mask; default all: a sampled step has one task)."""
        s = self.log_var
        terms = torch.exp(-s) * losses.float() / 2 + s / 2
        return (terms if present is None else terms[present]).sum()

    def weights(self) -> Tensor:
        """The current ``α_i = exp(-s_i) / 2`` (for logging)."""
        return (torch.exp(-self.log_var) / 2).detach()

