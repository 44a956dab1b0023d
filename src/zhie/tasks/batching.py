"""Batches: token id rows right-padded into arrays or tensors, sparse span-label cells, length-sorted prediction
batches, lazy chunks of a stream, and the torch helpers tasks share (a model's device, a seeded block).

Numpy at import; torch only inside the functions that make tensors.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, TypeVar

import numpy as np

if TYPE_CHECKING:
    import torch
    from torch import Tensor, nn

T = TypeVar("T")


def pad_array(rows: Sequence[Sequence[int]], value: int, length: int | None = None) -> np.ndarray:
    """Right-pad integer rows into a ``[len(rows), length]`` int64 array."""
    return _padded(rows, value, length)[0]


def input_arrays(rows: Sequence[Sequence[int]], pad_id: int) -> dict[str, np.ndarray]:
    """Token id rows (special tokens included) -> right-padded ``input_ids`` and ``attention_mask`` (int64 arrays)."""
    ids, mask = _padded(rows, pad_id)
    return {"input_ids": ids, "attention_mask": mask.astype(np.int64)}


def _padded(rows: Sequence[Sequence[int]], value: int, length: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(rows right-padded with value into [len(rows), length] int64, the bool mask of the cells the rows fill)``, in
    one scatter of all the rows' values (a row longer than ``length`` is an error)."""
    sizes = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
    length = int(sizes.max(initial=0)) if length is None else length
    if len(rows) and sizes.max() > length:
        raise ValueError(f"a row of {int(sizes.max())} values does not fit the padded length {length}")
    mask = np.arange(length) < sizes[:, None]
    out = np.full((len(rows), length), value, dtype=np.int64)
    out[mask] = np.fromiter(itertools.chain.from_iterable(rows), dtype=np.int64, count=int(sizes.sum()))
    return out, mask


def pad(rows: Sequence[Sequence[int]], value: int, length: int | None = None) -> Tensor:
    """Right-pad integer rows into a ``[len(rows), length]`` long tensor."""
    import torch

    return torch.from_numpy(pad_array(rows, value, length))


def model_inputs(rows: Sequence[Sequence[int]], pad_id: int) -> dict[str, Tensor]:
    """Token id rows (special tokens included) -> right-padded ``input_ids`` and ``attention_mask`` (tensors)."""
    import torch

    return {k: torch.from_numpy(v) for k, v in input_arrays(rows, pad_id).items()}


def sparse_cells(rows: list[list[tuple[int, int, int]]], heads: int, n: int) -> Tensor:
    """Per-row ``(head, i, j)`` content positions -> ``[b, heads, P]`` cells ``(i+1) * n + (j+1)``, 0-padded."""
    import torch

    per_head = [[set() for _ in range(heads)] for _ in rows]
    for b, cells in enumerate(rows):
        for k, i, j in cells:
            per_head[b][k].add((i + 1) * n + j + 1)
    width = max([1] + [len(c) for row in per_head for c in row])
    out = torch.zeros(len(rows), heads, width, dtype=torch.long)
    for b, row in enumerate(per_head):
        for k, cells in enumerate(row):
            out[b, k, : len(cells)] = torch.tensor(sorted(cells), dtype=torch.long)
    return out


def sorted_batches(lengths: Sequence[int], batch_size: int, max_tokens: int | None = None) -> Iterator[list[int]]:
    """Indices grouped into batches of similar length (longest first), for prediction: ``batch_size`` rows each, or,
    with ``max_tokens``, as many rows as keep ``rows x longest length <= max_tokens`` (a row longer than
    ``max_tokens`` alone in its batch); ``lengths`` are the rows' padded-to lengths (special tokens included)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    if max_tokens is None:
        yield from (order[i : i + batch_size] for i in range(0, len(order), batch_size))
        return
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be a positive number of tokens, got {max_tokens}")
    batch: list[int] = []
    for i in order:
        if batch and (len(batch) + 1) * lengths[batch[0]] > max_tokens:
            yield batch
            batch = []
        batch.append(i)
    if batch:
        yield batch


def device_of(model: nn.Module) -> torch.device:
    """Where ``model``'s parameters are (the CPU for a model without any)."""
    import torch

    param = next(model.parameters(), None)
    return param.device if param is not None else torch.device("cpu")


@contextlib.contextmanager
def seeded(seed: int):
    """Run the block with torch's generator seeded with ``seed``, then give the caller's generator state back."""
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def chunks(items: Iterable[T], size: int) -> Iterator[list[T]]:
    """``items`` in lists of ``size`` (the last one shorter), read lazily."""
    if size < 1:
        raise ValueError(f"a chunk holds at least one item, got a size of {size}")
    it = iter(items)
    while chunk := list(itertools.islice(it, size)):
        yield chunk

