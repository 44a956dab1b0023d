"""The parts of ``zhie pretrain``'s job on the training engine (:class:`zhie.training.loop.Job`; assembled by
:mod:`zhie.training.pretrain`): the stream of masked batches, each process's shard of them (:class:`StreamBatches`),
the MLM objective (:class:`MaskedLMLoss`), the held-out evaluation (:class:`HeldOut`) and the output directory
(:class:`Snapshot`).

Several processes: every process reads the same stream; each step's global batch of ``batch_size x N`` sequences is
masked as one process would mask it and each process trains on its rows (:func:`_shard`), its loss weighted by its
share of the batch's predicted tokens, so N processes compute the steps of one process with ``batch_size x N``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from zhie.core.files import atomic_write_text, replace_dir
from zhie.encoders.mlm import IGNORE, MaskedLM, Masker, save_head
from zhie.precision import autocast
from zhie.training.corpus import TrainingStream, pack

if TYPE_CHECKING:
    from zhie.training.pretrain import PretrainConfig

CHECKPOINT = "checkpoint.pt"
METRICS = "metrics.jsonl"
PLOT = "pretraining.png"
SUMMARY = "pretrain.json"


def _shard(batch: dict[str, Tensor], rank: int, size: int, world: int) -> dict[str, Tensor] | None:
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
    processes`` sequences and masks each (seeded by the step and the batch), as one process with that batch size
    would; this process keeps its rows (:func:`_shard`). Every process reads the same stream, so its state (corpus
    position, packer, shuffle buffer) is one and the checkpoint holds it once; ``tokens`` counts the non-padding
    tokens of the global batches."""

    steps_per_epoch = None
    epoch_end = False

    def __init__(self, stream: TrainingStream, masker: Masker, config: PretrainConfig, world: int, rank: int) -> None:
        self.stream, self.masker, self.config, self.world, self.rank = stream, masker, config, world, rank
        self.tokens = 0

    def draw(self, step: int) -> list[dict[str, Tensor]]:
        batches = []
        for micro in range(self.config.grad_accum):
            sequences = [next(self.stream) for _ in range(self.config.batch_size * self.world)]
            batch = self.masker(sequences, self.config.seed, step, micro)
            self.tokens += int(batch["attention_mask"].sum())
            batches.append(_shard(batch, self.rank, self.config.batch_size, self.world))
        return batches

    def position(self) -> dict:
        return {"tokens": self.tokens}

    def state_dict(self) -> dict:
        return {"stream": self.stream.state_dict(), "tokens": self.tokens}

    def load_state_dict(self, state: dict) -> None:
        self.stream.load_state_dict(state["stream"])
        self.tokens = state["tokens"]


class MaskedLMLoss(nn.Module):
    """The objective: the batch's MLM loss times its ``share`` (:func:`_shard`). It also counts the predicted tokens
    and the correct ones for the record's ``train_accuracy``, summed over the processes at each batch (two numbers),
    so the counts are the same in every process and the checkpoint keeps them once."""

    def __init__(self) -> None:
        super().__init__()
        self.tally = torch.zeros(2, dtype=torch.float64)  # correct, predicted (an attribute: DDP broadcasts buffers)

    def forward(self, model: MaskedLM, batch: dict[str, Tensor]) -> Tensor:
        from zhie.dist import all_reduce_sum

        output = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"])
        counts = torch.stack([output.correct, output.count]).double()
        self.tally = self.tally.to(counts.device) + all_reduce_sum(counts)
        return output.loss * batch["share"]

    def log(self) -> dict:
        """``train_accuracy`` since the last call."""
        correct, predicted = self.tally.tolist()
        self.tally = torch.zeros_like(self.tally)
        return {"train_accuracy": correct / max(predicted, 1)}

    def get_extra_state(self) -> dict:
        return {"tally": self.tally.cpu()}

    def set_extra_state(self, state: dict) -> None:
        self.tally = state["tally"]


class HeldOut:
    """The held-out evaluation: the first ``heldout`` lines, packed and masked once into global batches as in
    training; each process evaluates its rows of every batch and the sums are added over the processes, so N processes
    take 1/N of the time and report what one would."""

    def __init__(self, batches: list[dict[str, Tensor]], precision: str) -> None:
        self.batches, self.precision = batches, precision

    def __call__(self, model: MaskedLM) -> dict:
        from zhie.dist import all_reduce_sum

        device = next(model.parameters()).device
        sums = torch.zeros(3, dtype=torch.float64, device=device)  # loss sum, correct, predicted: no sync per batch
        with autocast(self.precision, device):
            for batch in self.batches:
                output = model(**{k: batch[k].to(device) for k in ("input_ids", "attention_mask", "labels")})
                sums += torch.stack([output.loss.double() * output.count, output.correct.double(),
                                     output.count.double()])
        loss, correct, count = all_reduce_sum(sums).tolist()
        return {"loss": loss / max(count, 1), "accuracy": correct / max(count, 1), "predicted": int(count)}


def held_out(texts: list[str], encode, masker: Masker, config: PretrainConfig, world: int, rank: int,
             precision: str) -> HeldOut | None:
    """:class:`HeldOut` on ``texts`` in global batches of ``batch_size x processes`` sequences, this process's rows
    of each; None without held-out text."""
    sequences = list(pack(encode(texts), config.max_length - 2)) if texts else []
    size = config.batch_size * world
    batches = [_shard(masker(sequences[k:k + size], config.seed, 1 << 30, k), rank, config.batch_size, world)
               for k in range(0, len(sequences), size)]
    return HeldOut([b for b in batches if b is not None], precision) if sequences else None


class Snapshot:
    """The output directory, replaced as a whole at every save (:func:`zhie.core.files.replace_dir`): the encoder
    directory, the MLM head, the checkpoint, the records, the summary and the plot of one moment. The trackers write
    beside it, in ``<out>-logs`` (their files are written as they go, never replaced)."""

    def __init__(self, out: Path, model: MaskedLM, tokenizer, summary: dict, say: Callable[[str], None]) -> None:
        self.out, self.model, self.tokenizer, self.summary, self.say = out, model, tokenizer, summary, say
        self.checkpoint_path = out / CHECKPOINT
        self.logging_dir = out.with_name(f"{out.name}-logs")

    def start(self, resumed: bool, step: int, history: list[dict]) -> None:
        if resumed:
            self.say(f"resuming {self.out} at step {step} of {self.summary['config']['steps']}")

    def log(self, record: dict, history: list[dict]) -> None:
        self.say(json.dumps(record, ensure_ascii=False))

    def save(self, checkpoint: dict, history: list[dict]) -> None:
        from zhie import encoders
        from zhie.training.report import plot_history, write_jsonl

        progress = checkpoint["progress"]
        summary = self.summary | {"step": progress["step"], "tokens": checkpoint["data"]["tokens"],
                                  "finished": progress["finished"],
                                  "last": next((r for r in reversed(history) if r["kind"] == "eval"), None)}

        def write(directory: Path) -> None:
            with encoders.quiet_transformers():
                self.model.encoder.save_pretrained(directory, safe_serialization=True)
                self.tokenizer.save_pretrained(directory)
            save_head(self.model.head, directory)
            torch.save(checkpoint, directory / CHECKPOINT)
            write_jsonl(directory / METRICS, history)
            atomic_write_text(directory / SUMMARY, json.dumps(summary, ensure_ascii=False, indent=2))
            if history:
                plot_history(history, directory / PLOT, "accuracy")

        self.out.parent.mkdir(parents=True, exist_ok=True)
        replace_dir(self.out, write)

    def save_best(self, model: MaskedLM) -> None:
        """Nothing: the snapshot holds the model."""
