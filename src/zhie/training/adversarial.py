"""Adversarial training on the input embeddings: FGM and PGD.

Both add a perturbation ``r`` to the **word-embedding matrix** (``encoder.get_input_embeddings().weight``), run the
batch again and add the gradient of that adversarial loss to the clean one; then the matrix is restored **bit for
bit** from a copy taken before the first perturbation (a ``copy_`` of the saved tensor, not a subtraction, so no
rounding is left behind). Nothing is patched: the perturbation is an in-place change of the weight under
``torch.no_grad()``, undone in a ``finally``.

* **FGM** (Miyato et al. 2017; bert4keras ``adversarial_training``, bert4torch ``FGM``): after the clean backward,
  ``r = epsilon * g / ||g||`` with ``g`` the gradient of the clean loss with respect to the embedding matrix (the
  norm over the whole matrix: rows of tokens absent from the batch have ``g = 0`` and stay unchanged). One
  adversarial forward/backward; the step's gradient is ``grad(clean) + grad(adversarial)``.
* **PGD** (Madry et al. 2018, as in the "功守道" NLP recipe that bert4torch follows): ``K = steps`` ascent steps
  ``r <- Proj_{||r|| <= epsilon}(r + alpha * g_t / ||g_t||)``, ``g_t`` the embedding gradient at the current
  perturbation (the first from the clean backward). The intermediate passes only give directions (taken with
  :func:`torch.autograd.grad` on the bare model, so no parameter's ``.grad`` sees them); the last perturbed pass is
  back-propagated into the gradients: the step's gradient is ``grad(clean) + grad(loss at r_K)``.

With gradient accumulation the direction comes from this batch's own gradient (the embedding gradient accumulated
before the batch is subtracted). In several processes every direction is the mean over the processes of the gradient
of their slices of the batch (:func:`batch_gradient`; PGD's later directions too): the same in every process, and
the direction one process computes on the whole batch. ``model`` is the task model (an ``encoder`` attribute with
``get_input_embeddings()``, or such an encoder itself).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from zhie.dist import all_reduce_sum, world_size

__all__ = ["batch_gradient", "embedding_weight", "fgm_step", "pgd_step"]


def embedding_weight(model: nn.Module) -> nn.Parameter:
    """The word-embedding matrix that the adversarial perturbation is added to."""
    for candidate in (model, getattr(model, "encoder", None), getattr(getattr(model, "model", None), "encoder", None)):
        if candidate is not None and callable(getattr(candidate, "get_input_embeddings", None)):
            embedding = candidate.get_input_embeddings()
            if embedding is not None:
                return embedding.weight
    raise ValueError(f"adversarial training perturbs the input embeddings, but this {type(model).__name__} has no "
                     "encoder with get_input_embeddings()")


def batch_gradient(grad: Tensor | None, before: Tensor | None, synced: bool) -> Tensor | None:
    """The embedding gradient of the batch just back-propagated, the same in every process: the mean over the
    processes of the gradients of their slices of it, which is what one process computes on the whole batch.

    ``grad``: the embedding's ``.grad`` after the batch's clean backward; ``before``: the ``.grad`` before it (``None``:
    the step's first batch). ``synced``: that backward all-reduced the gradients (DDP's last batch of a step, the
    others run under ``no_sync``), so ``grad`` is already the mean of every process's accumulated gradient and the
    mean of ``before`` is what to subtract; otherwise ``grad - before`` is this process's own and is averaged. In
    several processes: one all-reduce of the embedding gradient per batch, none for a step of one batch."""
    if grad is None:
        return None
    if synced:
        return grad if before is None else grad - _mean(before)
    return _mean(grad if before is None else grad - before)


def _mean(t: Tensor) -> Tensor:
    """``t`` averaged over the processes (``t`` itself in one)."""
    n = world_size()
    return t if n == 1 else all_reduce_sum(t) / n


def _unit(g: Tensor) -> Tensor | None:
    norm = g.float().norm()
    if not torch.isfinite(norm) or norm == 0:
        return None
    return g / norm


def fgm_step(weight: nn.Parameter, batch_grad: Tensor | None, adversarial_loss: Callable[[], Tensor],
             backward: Callable[[Tensor], None], epsilon: float) -> Tensor | None:
    """One FGM step after the clean backward: perturb ``weight`` by ``epsilon * g / ||g||`` (``g = batch_grad``, this
    batch's embedding gradient), back-propagate ``adversarial_loss()`` with ``backward``, restore ``weight`` exactly.
    Returns the adversarial loss (``None`` when the gradient is zero or not finite: no perturbation, no extra pass)."""
    direction = _unit(batch_grad) if batch_grad is not None else None
    if direction is None:
        return None
    saved = weight.detach().clone()
    try:
        with torch.no_grad():
            weight.add_(direction.to(weight.dtype), alpha=epsilon)
        loss = adversarial_loss()
        backward(loss)
    finally:
        with torch.no_grad():
            weight.copy_(saved)
    return loss.detach()


def pgd_step(weight: nn.Parameter, batch_grad: Tensor | None, direction_loss: Callable[[], Tensor],
             adversarial_loss: Callable[[], Tensor], backward: Callable[[Tensor], None], epsilon: float,
             alpha: float, steps: int) -> Tensor | None:
    """``steps`` PGD ascent steps from this batch's embedding gradient ``batch_grad``; the intermediate losses
    (``direction_loss()``, on the bare model) only give directions, the last (``adversarial_loss()``) is
    back-propagated with ``backward``; ``weight`` is restored exactly. Returns the last adversarial loss."""
    if batch_grad is None or _unit(batch_grad) is None:
        return None
    saved = weight.detach().clone()
    g = batch_grad
    loss = None
    try:
        for t in range(steps):
            direction = _unit(g)
            if direction is None:
                break
            with torch.no_grad():
                weight.add_(direction.to(weight.dtype), alpha=alpha)
                r = weight - saved
                norm = r.float().norm()
                if norm > epsilon:  # project back onto the epsilon-ball around the clean embeddings
                    weight.copy_(saved + r * (epsilon / norm))
            if t < steps - 1:  # on the bare model, no DDP: averaged here, the same direction in every process
                (g,) = torch.autograd.grad(direction_loss(), weight)
                g = _mean(g)
        loss = adversarial_loss()
        backward(loss)
    finally:
        with torch.no_grad():
            weight.copy_(saved)
    return loss.detach() if loss is not None else None
