"""Where a run of the training engine stands (:class:`Progress`, saved in its checkpoint) and the windows that its
records summarise (:class:`Window`: the loss, gradient norm and throughput since the last record).

Records, distinguished by ``kind``: a **step record** every ``config.log_every`` optimizer steps (:func:`log_interval`
by default, and at the last one): ``{"kind": "step", "step", <position: "epoch" or "tokens">, "loss", "grad_norm",
"tokens_per_s", "lr": {group: lr}, "elapsed_s"}`` plus the job's ``step_log()`` (a multi-task loss's ``task_losses``
and ``task_weights``), each a mean over the steps since the last step record, kept on the device (no host sync per
step); and an **evaluation record** at each evaluation: ``{"kind": "eval", "step", <position>, "train_loss", "lr",
"tokens_per_s", "elapsed_s", "dev": metrics}`` plus the job's ``train_log()``, its training numbers means since the
last evaluation. Readers of ``metrics.jsonl`` that want one kind filter on it
(:func:`zhie.training.report.read_metrics`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    from accelerate import Accelerator

__all__ = ["Progress", "Window", "log_interval"]


def log_interval(total_steps: int) -> int:
    """The default steps between step records: at most 100 records in a run, and one every 50 steps at least."""
    return min(50, math.ceil(total_steps / 100))


@dataclass
class Progress:
    """Where training stands; saved in the checkpoint as plain python."""

    step: int = 0                  # optimizer steps done
    best_score: float | None = None
    best_metrics: dict = field(default_factory=dict)
    best_step: int | None = None
    bad_evals: int = 0             # evaluations since the last improvement
    history: list[dict] = field(default_factory=list)  # the records, both kinds
    trackers: dict = field(default_factory=dict)       # the MLflow and W&B runs, to go on in them
    elapsed_s: float = 0.0         # wall time of the sessions before this one
    finished: bool = False


class Window:
    """This process's training loss, gradient norm and throughput since the window's last record, summed on the device
    (no host sync per batch); saved with each checkpoint, process by process."""

    def __init__(self, device: torch.device) -> None:
        self.sums = torch.zeros(4, dtype=torch.float64, device=device)  # loss, tokens, gradient norm, finite norms
        self.reset()

    def add(self, loss: Tensor, batch: dict) -> None:
        self.sums[0] += loss.detach().double()
        self.loss_count += 1
        mask = batch.get("attention_mask")
        if isinstance(mask, Tensor):
            self.sums[1] += mask.sum()
        else:
            self.count_tokens = False

    def add_grad_norm(self, norm: Tensor) -> None:
        """A step's gradient norm (an fp16 step that overflowed has none)."""
        finite = torch.isfinite(norm)
        self.sums[2:] += torch.stack([torch.where(finite, norm.double(), 0.0), finite.double()])

    def reset(self) -> None:
        self.sums.zero_()
        self.loss_count = 0
        self.count_tokens = True
        self.seconds = 0.0

    def summary(self, accelerator: Accelerator) -> dict:
        """The mean loss of the processes, the mean gradient norm and the tokens per second of all processes (one
        collective)."""
        mine = self.sums.clone()
        mine[0] /= max(self.loss_count, 1)
        loss, tokens, grad_norm, norms = accelerator.reduce(mine, "sum").tolist()
        return {"loss": loss / accelerator.num_processes, "grad_norm": grad_norm / norms if norms else None,
                "tokens_per_s": tokens / self.seconds if self.count_tokens and self.seconds > 0 else None}

    def state_dict(self) -> dict:
        return {"sums": self.sums.tolist(), "loss_count": self.loss_count, "count_tokens": self.count_tokens,
                "seconds": self.seconds}

    def load_state_dict(self, state: dict) -> None:
        self.sums.copy_(torch.tensor(state["sums"], dtype=torch.float64))
        self.loss_count, self.count_tokens, self.seconds = state["loss_count"], state["count_tokens"], state["seconds"]
