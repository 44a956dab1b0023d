"""Which training items go together in a batch, per epoch.

The order is a pure function of ``(seed, epoch)``, so a resumed run regenerates exactly the batches of the
interrupted one and skips those already done. Padding is the task's ``collate``'s job.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["epoch_batches"]


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
