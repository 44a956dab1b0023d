"""Which training items go together in a batch, per epoch (:func:`epoch_batches`), and a task's items as the engine's
batches of each step, one slice of each global batch per process (:class:`ItemBatches`).

The order is a pure function of ``(seed, epoch)``, so a resumed run regenerates exactly the batches of the
interrupted one and skips those already done. Padding is the task's ``collate``'s job.

Several processes (``torchrun`` / ``accelerate launch``): each step's global batch of ``batch_size x processes``
items (the batch one process would draw with that size) is cut into one slice per process, so N processes with
``batch_size`` B compute the step of one process with ``batch_size`` N x B (for losses that are means over the
items of a batch).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from torch import Tensor

    from .config import TrainConfig

__all__ = ["ItemBatches", "epoch_batches", "process_batches"]


def epoch_batches(n_items: int, batch_size: int, *, seed: int, epoch: int, lengths: Sequence[int] | None = None,
                  chunk_batches: int = 50) -> list[list[int]]:
    """Item indices of each batch of one epoch.

    Without ``lengths``: a seeded shuffle cut into batches. With ``lengths`` (length-grouped batching):
    shuffle, cut into chunks of ``chunk_batches`` batches, sort each chunk by length (stable), split into
    batches, then shuffle the batch order with the same generator. Items in a batch then have similar lengths
    (little padding) while batches stay random. The last batch may be smaller.
    """
    if lengths is not None and len(lengths) != n_items:
        raise ValueError(f"lengths has {len(lengths)} entries for {n_items} training items")
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(n_items)
    if lengths is None:
        return [order[i:i + batch_size].tolist() for i in range(0, n_items, batch_size)]

    lengths = np.asarray(lengths)
    chunk = batch_size * chunk_batches
    batches = []
    for start in range(0, n_items, chunk):
        indices = order[start:start + chunk]
        indices = indices[np.argsort(lengths[indices], kind="stable")]
        batches += [indices[i:i + batch_size].tolist() for i in range(0, len(indices), batch_size)]
    return [batches[i] for i in rng.permutation(len(batches))]


class ItemBatches:
    """A task's encoded items as epochs of global batches of ``batch_size x processes`` items (grouped by length when
    ``lengths`` are given, :func:`epoch_batches`), each cut into one slice per process (:func:`process_batches`);
    a step takes ``grad_accum`` of them (:class:`zhie.training.job.Batches`). The epoch's batches are a pure function
    of ``(seed, epoch)``: a resumed run skips those done."""

    def __init__(self, items: Sequence, collate: Callable[[list], dict[str, Tensor]], config: TrainConfig, *,
                 lengths: Sequence[int] | None, world: int, rank: int) -> None:
        if lengths is not None and len(lengths) != len(items):
            raise ValueError(f"lengths has {len(lengths)} entries for {len(items)} training items")
        self.items, self.collate, self.lengths = items, collate, lengths
        self.batch_size, self.grad_accum, self.seed = config.batch_size, config.grad_accum, config.seed
        self.world, self.rank = world, rank
        # With several processes a last batch that cannot give every process a full slice is dropped.
        global_batch = config.batch_size * world
        n = len(items)
        self.batches_per_epoch = math.ceil(n / global_batch) if world == 1 else n // global_batch
        if self.batches_per_epoch == 0:
            raise ValueError(f"{n} training items make no batch for {world} process(es) "
                             f"(batch_size={config.batch_size})")
        self.steps_per_epoch = math.ceil(self.batches_per_epoch / config.grad_accum)
        self.epoch = self.batch = 0  # epochs completed; batches of the current epoch done
        self.epoch_end = False
        self._plan: tuple[int, list[list[int]]] | None = None

    def draw(self, step: int) -> list[dict[str, Tensor]]:
        if self._plan is None or self._plan[0] != self.epoch:
            batches = epoch_batches(len(self.items), self.batch_size * self.world, seed=self.seed, epoch=self.epoch,
                                    lengths=self.lengths)
            self._plan = (self.epoch, process_batches(batches, self.batch_size, self.world, self.rank))
        group = self._plan[1][self.batch:self.batch + self.grad_accum]
        self.batch += len(group)
        self.epoch_end = self.batch == self.batches_per_epoch
        if self.epoch_end:
            self.epoch, self.batch = self.epoch + 1, 0
        return [self.collate([self.items[j] for j in indices]) for indices in group]

    def position(self) -> dict:
        return {"epoch": round(self.epoch + self.batch / self.batches_per_epoch, 4)}

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "batch": self.batch}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.batch = state["epoch"], state["batch"]


def process_batches(batches: list[list[int]], batch_size: int, world: int, rank: int) -> list[list[int]]:
    """This process's slice of each global batch. With several processes only the full global batches are kept:
    every process needs a whole slice, and the short batch is anywhere once length grouping has shuffled them."""
    if world > 1:
        batches = [b for b in batches if len(b) == batch_size * world]
    return [b[rank * batch_size:(rank + 1) * batch_size] for b in batches]
