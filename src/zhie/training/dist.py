"""What a process needs to know and share when training runs in several (``torchrun``, ``accelerate launch``)."""

from __future__ import annotations

import os

import torch

__all__ = ["broadcast_object", "is_main_process", "rank", "world_size"]


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


def broadcast_object(value: object) -> object:
    """The main process's ``value`` on every process (``value`` itself with one process)."""
    if world_size() == 1:
        return value
    box = [value]
    torch.distributed.broadcast_object_list(box, src=0)
    return box[0]
