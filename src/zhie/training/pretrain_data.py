"""The data side of ``zhie pretrain``: the corpus stream (:mod:`zhie.training.corpus`) as the engine's masked batches
(:class:`StreamBatches`, a :class:`~zhie.training.job.Batches`), the held-out lines as masked batches
(:func:`held_out_batches`), and the masker of both (:func:`make_masker`). The job that trains on them is
:mod:`zhie.training.pretrain`.

Several processes: every process reads the same stream; each step's global batch of ``batch_size x N`` sequences is
masked as one process would mask it and each process trains on its rows (:func:`shard`), its loss weighted by its
share of the batch's predicted tokens, so N processes compute the steps of one process with ``batch_size x N``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from zhie.core.text import TextTokenizer
from zhie.encoders.mlm import IGNORE, Masker
from zhie.training.corpus import TrainingStream, pack

__all__ = ["HELD_OUT_STEP", "StreamBatches", "held_out_batches", "make_masker", "shard"]

HELD_OUT_STEP = 1 << 30  # the step the held-out batches are masked as: apart from every training step's masks


def make_masker(tokenizer, text_tokenizer: TextTokenizer, rate: float) -> Masker:
    """The masker of the sequences of ``text_tokenizer`` (the encoder's ``tokenizer`` in zhie's char or subword mode):
    ``rate`` of the tokens predicted, a random replacement drawn from every token that is not a special one."""
    specials = set(tokenizer.all_special_ids)
    return Masker(
        ids={"cls_id": text_tokenizer.cls_id, "sep_id": text_tokenizer.sep_id, "pad_id": text_tokenizer.pad_id},
        mask_args={"mask_id": tokenizer.mask_token_id, "rate": rate,
                   "random_ids": torch.tensor([i for i in range(len(tokenizer)) if i not in specials])})


def shard(batch: dict[str, Tensor], rank: int, size: int, world: int) -> dict[str, Tensor] | None:
    """Process ``rank``'s ``size`` rows of a global batch, without the padding they do not need, and ``share``: its
    part of the batch's predicted tokens times ``world`` (1.0 with one process), so that the mean over the processes
    of ``loss x share`` is the loss of the whole batch. None when the batch has no row for ``rank``."""
    rows = slice(rank * size, (rank + 1) * size)
    if not len(batch["input_ids"][rows]):
        return None
    width = int(batch["attention_mask"][rows].sum(1).max())
    mine = {k: v[rows, :width] for k, v in batch.items()}
    predicted = int((mine["labels"] != IGNORE).sum())
    total = int((batch["labels"] != IGNORE).sum())
    return mine | {"share": torch.tensor(world * predicted / max(total, 1), dtype=torch.float32)}


class StreamBatches:
    """The corpus stream as the engine's batches: each step draws ``grad_accum`` global batches of ``batch_size x
    world`` sequences and masks each (seeded by ``seed``, the step and the batch), as one process with that batch size
    would; this process (``rank``) keeps its rows (:func:`shard`). Every process reads the same stream, so its state
    (corpus position, packer, shuffle buffer) is one and the checkpoint holds it once; ``tokens`` counts the
    non-padding tokens of the global batches."""

    steps_per_epoch = None
    epoch_end = False

    def __init__(self, stream: TrainingStream, masker: Masker, *, batch_size: int, grad_accum: int, seed: int,
                 world: int, rank: int) -> None:
        self.stream, self.masker = stream, masker
        self.batch_size, self.grad_accum, self.seed, self.world, self.rank = batch_size, grad_accum, seed, world, rank
        self.tokens = 0

    def draw(self, step: int) -> list[dict[str, Tensor]]:
        batches = []
        for micro in range(self.grad_accum):
            sequences = [next(self.stream) for _ in range(self.batch_size * self.world)]
            batch = self.masker(sequences, self.seed, step, micro)
            self.tokens += int(batch["attention_mask"].sum())
            batches.append(shard(batch, self.rank, self.batch_size, self.world))
        return batches

    def position(self) -> dict:
        return {"tokens": self.tokens}

    def state_dict(self) -> dict:
        return {"stream": self.stream.state_dict(), "tokens": self.tokens}

    def load_state_dict(self, state: dict) -> None:
        self.stream.load_state_dict(state["stream"])
        self.tokens = state["tokens"]


def held_out_batches(texts: list[str], encode: Callable[[list[str]], list], masker: Masker, *, max_length: int,
                     batch_size: int, seed: int, world: int, rank: int) -> list[dict[str, Tensor]] | None:
    """The held-out ``texts`` packed into sequences of ``max_length`` tokens and masked once, in global batches of
    ``batch_size x world`` sequences as in training: this process's rows of each (perhaps none, while other processes
    have some); None, in every process, without held-out sequences."""
    sequences = list(pack(encode(texts), max_length - 2)) if texts else []
    if not sequences:
        return None
    size = batch_size * world
    batches = [shard(masker(sequences[k:k + size], seed, HELD_OUT_STEP, k), rank, batch_size, world)
               for k in range(0, len(sequences), size)]
    return [b for b in batches if b is not None]
