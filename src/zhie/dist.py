"""What a process needs to know and share when training runs in several (``torchrun``, ``accelerate launch``).

Below the tasks (a task's loss may gather across processes: CoSENT ranks the pairs of the global batch,
:func:`all_gather_with_grad`); the training engine and its jobs use the rest."""

from __future__ import annotations

import os

import torch
from torch import Tensor

__all__ = ["all_gather_objects", "all_gather_with_grad", "all_reduce_sum", "broadcast_object", "is_main_process",
           "local_device", "rank", "world_size"]


def rank() -> int:
    """This process's rank: from ``torch.distributed`` once it is initialised, else from the launcher's ``RANK``."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank()
    return int(os.environ.get("RANK", "0"))


def world_size() -> int:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_world_size()
    return int(os.environ.get("WORLD_SIZE", "1"))


def is_main_process() -> bool:
    return rank() == 0


def local_device() -> torch.device:
    """The device the training loop gives this process (accelerate's): the GPU of its ``LOCAL_RANK`` (0 without a
    launcher), or the CPU without one. For models that serve the loop (distillation's teachers) on every process."""
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def broadcast_object(value: object) -> object:
    """The main process's ``value`` on every process (``value`` itself with one process)."""
    if world_size() == 1:
        return value
    box = [value]
    torch.distributed.broadcast_object_list(box, src=0)
    return box[0]


def all_gather_objects(value: object) -> list:
    """Every process's ``value``, in rank order (``[value]`` with one process)."""
    if world_size() == 1:
        return [value]
    values = [None] * world_size()
    torch.distributed.all_gather_object(values, value)
    return values


def all_reduce_sum(t: Tensor) -> Tensor:
    """``t`` summed over every process (``t`` itself with one process); a collective: every process calls it."""
    if world_size() == 1:
        return t
    t = t.clone()
    torch.distributed.all_reduce(t)
    return t


def all_gather_with_grad(t: Tensor) -> Tensor:
    """``t`` of every rank (the same shape on each) concatenated along dim 0, in rank order; differentiable.

    For a loss over the items of all ranks (CoSENT ranks every pair of pairs of the global batch). Every rank
    computes the same loss ``L`` on the gathered values; the backward sums the gradients of all ranks and keeps
    this rank's slice, so each rank's gradient is ``world_size x dL/d(its items)``, and DDP, which averages the
    parameter gradients over the ranks, ends with the gradient of ``L`` in a single process that held all the
    items. With one process: ``t`` itself.
    """
    if world_size() == 1:
        return t
    return _AllGather.apply(t)


class _AllGather(torch.autograd.Function):
    """The autograd function of :func:`all_gather_with_grad` (torch's own, ``torch.distributed.nn.functional``, is
    deprecated, and its gloo backward left a thread that aborted some processes at exit)."""

    @staticmethod
    def forward(ctx, t: Tensor) -> Tensor:
        parts = [torch.empty_like(t) for _ in range(world_size())]
        torch.distributed.all_gather(parts, t.contiguous())
        ctx.rows = t.shape[0]
        return torch.cat(parts)

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        start = rank() * ctx.rows
        return all_reduce_sum(grad.contiguous())[start:start + ctx.rows]
