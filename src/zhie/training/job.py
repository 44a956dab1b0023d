"""What a job hands the training engine (:func:`zhie.training.loop.run`) besides the model and its
:class:`~zhie.training.TrainConfig`: a :class:`Job`, whose data are :class:`Batches` and whose records, checkpoints and
best model go to an :class:`Output`.

A task's job (:func:`zhie.training.loop.train`) gives :class:`zhie.training.batching.ItemBatches` and
:class:`zhie.training.rundir.RunDir`; pre-training gives its stream of masked batches
(:class:`zhie.training.pretrain_data.StreamBatches`) and :class:`zhie.training.rundir.Snapshot`. Every process of a
launch runs the job; :func:`join_processes` gives its place in the launch.

Evaluation under several processes: **every process calls** ``evaluate`` **at the same time**, and none waits in a
collective while another evaluates. An evaluation that only the main process ran would leave the others in a
collective that times out with the process group (30 min for gloo, 10 for NCCL) on a long evaluation, and lengthening
that timeout would also delay the report of a process that really hung. An evaluation that can split its work does
(pre-training's held-out loss: each process its share of the batches, the sums added over the processes: N times
faster); one that cannot (a task's dev set) is computed whole by every process, in the time one process would take.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import torch
from accelerate import PartialState
from torch import Tensor, nn

from zhie.dist import world_size

__all__ = ["Batches", "Job", "Output", "join_processes"]


class Batches(Protocol):
    """A job's training data: this process's batches of each optimizer step, and where the job stands in them."""

    steps_per_epoch: int | None  # None: an endless stream (the run's length is config.max_steps)
    epoch_end: bool              # the last step finished an epoch

    def draw(self, step: int) -> list[dict[str, Tensor]]:
        """The collated batches (``grad_accum`` of them, or fewer at an epoch's end) of optimizer step ``step``."""

    def position(self) -> dict:
        """Where the job stands, for the record (``{"epoch": 1.5}``, ``{"tokens": 81920}``)."""

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


class Output(Protocol):
    """Where a job's records, checkpoints and best model go; called on the main process only."""

    checkpoint_path: Path
    logging_dir: Path  # where the experiment trackers write (zhie.training.tracking)

    def start(self, resumed: bool, step: int, history: list[dict]) -> None:
        """Before the first step (``resumed``: from the checkpoint, at ``step``, with the records of ``history``)."""

    def log(self, record: dict, history: list[dict]) -> None:
        """After each record (a step record or an evaluation's): ``record``, the last of ``history``."""

    def save(self, checkpoint: dict, history: list[dict]) -> None:
        """A resumable checkpoint (and whatever the job keeps with it)."""

    def save_best(self, model: nn.Module) -> None:
        """The best model so far (the final one when there is no evaluation)."""


@dataclass
class Job:
    """What a job gives the engine besides the model and the :class:`~zhie.training.TrainConfig`.

    ``evaluate(model) -> metrics`` runs in eval mode under ``torch.no_grad()`` with the EMA weights in place, on every
    process (module docstring); ``None``: no evaluation, and the final model is the one kept. ``train_log()``,
    called at each evaluation on every process: what the loss recorded since the last one, added to the record;
    ``step_log()``, the same at each step record (means since the last step record). ``hparams``: the run's settings
    (its command's flags), logged to the trackers as hyper-parameters with the ``TrainConfig``.
    ``param_groups``: AdamW parameter groups; default :func:`~zhie.training.optim.build_param_groups` (parameters that
    a module tags with a learning-rate multiplier, the CRF transitions, are moved to groups of their own either way).
    ``meta``: the job's settings that a resumed run must share; ``resumable``: the ``TrainConfig`` fields that may
    change when a run resumes (they change when things happen, not what is computed).
    """

    data: Batches
    loss_fn: Callable[[nn.Module, dict[str, Tensor]], Tensor]
    output: Output
    evaluate: Callable[[nn.Module], dict[str, float]] | None = None
    metric: str = "f1"
    train_log: Callable[[], dict] | None = None
    step_log: Callable[[], dict] | None = None
    hparams: dict = field(default_factory=dict)
    param_groups: list[dict] | None = None
    meta: dict = field(default_factory=dict)
    resumable: frozenset[str] = frozenset({"save_every"})
    name: str = "train"


def join_processes(cpu: bool = False) -> PartialState:
    """This process's place in the launch (accelerate's shared state: the process group, the device), set up once;
    the engine's :class:`Accelerator` finds it. ``cpu``: train on the CPU even where there is a GPU. Without a GPU,
    accelerate joins the processes of a launch (over gloo) only when told that the run is on the CPU; else each
    process would train alone."""
    state = PartialState(cpu=cpu or (world_size() > 1 and not torch.cuda.is_available()))
    if state.num_processes != world_size():
        raise RuntimeError(f"launched as {world_size()} processes, but accelerate found no way to run them together "
                           f"on {state.device} (it runs {state.num_processes})")
    return state
