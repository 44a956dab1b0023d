"""The training engine: one loop for every job (a task's ``fit``, multi-task, ``distill`` and ``pretrain``).

:func:`run` runs a job a session at a time (:class:`~zhie.training.session.Session`: steps, records, evaluations,
checkpoints and exact resume, one state machine whose parts share its state); :func:`train` is a task's job on it.

A job hands the engine its model and a :class:`~zhie.training.job.Job` (:mod:`zhie.training.job`): an objective
``loss_fn(model, batch) -> scalar``, its data as this process's batches of each step (a task's encoded items,
:class:`~zhie.training.batching.ItemBatches`; pre-training's corpus stream), its evaluation and the metric to maximise,
and its output (where records, checkpoints and the best model go, :mod:`zhie.training.rundir`: a task's
:class:`~zhie.training.rundir.RunDir`, pre-training's snapshot directory). The engine adds: parameter groups with their
own learning rates, AdamW or LAMB with linear warm-up/decay, gradient accumulation and clipping, EMA weights, FGM/PGD,
evaluation with best-model saving and early stopping, records (:meth:`~zhie.training.session.Session.log`: the one
place where a record is logged; to ``metrics.jsonl`` and the experiment trackers of ``config.report_to``,
:mod:`zhie.training.tracking`; what they hold: :mod:`zhie.training.progress`), checkpoints from which an interrupted
run resumes bit-exactly (same batches, same dropout masks, same weights, the same records;
:func:`zhie.training.checkpoint.check_resumable`), and session limits (``stop_after``, ``time_limit_s``) that end a
session early with a checkpoint.

Device placement, mixed precision (``config.precision``: the encoder in bf16/fp16 under autocast, the heads and losses
in fp32, see :class:`zhie.model.Model`) and DDP come from :mod:`accelerate`.

Several processes (``torchrun`` / ``accelerate launch``): each process trains on its slice of each step's global
batch (:mod:`zhie.training.batching`), draws its own dropout masks (seed + rank) and keeps them, and its running loss,
in the checkpoint. The main process alone writes (records, checkpoints, the best model).

Evaluation under several processes: every process calls ``evaluate`` at the same time (:class:`~zhie.training.job.Job`
says why), and the main process's metrics are broadcast, so that every process takes the same best-model and
early-stopping decisions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from accelerate.utils import set_seed
from torch import Tensor, nn

from zhie.core.files import NoRoom
from zhie.dist import world_size

from .batching import ItemBatches
from .checkpoint import load_checkpoint
from .config import BASE_WIDTH, TrainConfig
from .job import Job, join_processes
from .progress import Progress
from .rdrop import RDropLoss
from .rundir import RunDir
from .session import Session

__all__ = ["run", "train"]


# ------------------------------------------------------------------------------------------------- a task's job
def train(
    model: nn.Module,
    train_items: Sequence,
    *,
    collate: Callable[[list], dict[str, Tensor]],
    loss_fn: Callable[[nn.Module, dict[str, Tensor]], Tensor],
    config: TrainConfig,
    out_dir: Path,
    evaluate: Callable[[nn.Module], dict[str, float]] | None = None,
    metric: str = "f1",
    save_best: Callable[[nn.Module, Path], None] | None = None,
    lengths: Sequence[int] | None = None,
    param_groups: list[dict] | None = None,
    resume: bool = True,
    progress: bool = True,
    train_log: Callable[[], dict] | None = None,
    step_log: Callable[[], dict] | None = None,
    hparams: dict | None = None,
    identity: dict | None = None,
) -> dict:
    """Train ``model`` on a task's ``train_items`` (:class:`ItemBatches`) into the run directory ``out_dir``
    (:class:`RunDir`); returns :func:`run`'s summary.

    Args:
        model: the task's module; trained in place. After training it holds the last training weights (not
            the EMA average: with ``config.ema`` the weights evaluated and saved through ``save_best`` are the
            average, and the last training weights come back afterwards).
        train_items: already-encoded examples, opaque to the loop.
        collate: list of items -> dict of tensors (padded by the task). If it has ``"attention_mask"``,
            tokens/s is logged (tokens = ``attention_mask.sum()``).
        loss_fn: ``loss_fn(model, batch) -> scalar tensor``; ``batch`` is already on the device and ``model`` is the
            bare model (also under DDP). An ``nn.Module`` loss may hold weights of its own: they are trained,
            checkpointed and synchronised with the model's, and not saved with it.
        evaluate, metric, param_groups, train_log, step_log, hparams: see :class:`Job`.
        identity: what else defines the run (the task's settings, the encoder and its pruning, the data files'
            hashes): a checkpoint written with other values is not resumed (:class:`Job`'s ``meta``).
        save_best: ``save_best(model, directory)`` writes the model into ``directory`` (which exists and is empty).
        lengths: lengths of the items; given, batches are grouped by length (:func:`epoch_batches`).
        resume: continue from ``out_dir/checkpoint.pt`` if it exists; ``False`` starts over.
        progress: show a tqdm bar (main process only).
    """
    if config.rdrop is not None and not isinstance(loss_fn, RDropLoss):
        raise ValueError("config.rdrop needs an R-Drop loss: pass loss_fn=RDropLoss(task, alpha, head) "
                         "(zhie.fit does this for you)")
    processes = join_processes()
    data = ItemBatches(train_items, collate, config, lengths=lengths, world=processes.num_processes,
                       rank=processes.process_index)
    job = Job(data=data, loss_fn=loss_fn, output=RunDir(out_dir, metric, save_best), evaluate=evaluate,
              metric=metric, train_log=train_log, step_log=step_log, hparams=hparams or {}, param_groups=param_groups,
              meta={**(identity or {}), "n_items": len(train_items), "grouped_by_length": lengths is not None})
    return run(model, job, config, resume=resume, progress=progress)


# ----------------------------------------------------------------------------------------------------------- the engine
def run(model: nn.Module, job: Job, config: TrainConfig, *, resume: bool = True, progress: bool = True,
        stop_after: int | None = None, time_limit_s: float | None = None, cpu: bool = False) -> dict:
    """Train ``model`` on ``job`` with ``config``; returns ``{"best", "best_step", "steps", "session_steps", "history",
    "step_records", "finished"}`` (``session_steps``: the steps this call took, 0 for a run that had finished;
    ``history``: the evaluations' records; ``step_records``: the step records).

    ``resume``: continue from ``job.output.checkpoint_path`` if it exists (the same settings and data, or an error
    that lists the differences). ``stop_after`` (a step) and ``time_limit_s`` (seconds of this session) end the session
    early with a checkpoint (``finished`` is then False; the schedule still runs to the end of the run). ``cpu``:
    train on the CPU even where there is a GPU.
    """
    config = config.resolved(_encoder_width(model))  # a job that set no learning rate gets the default ones
    path = job.output.checkpoint_path
    if resume and world_size() > 1:
        torch.distributed.barrier()  # a process may get here while the main one still writes the last checkpoint
    checkpoint = load_checkpoint(path) if resume and path.exists() else None
    session = Session(model, job, config, cpu, Progress(**checkpoint["progress"]) if checkpoint else Progress())
    if checkpoint is not None:
        session.restore(checkpoint, path)
    else:
        set_seed(config.seed + session.rank)  # one stream of dropout masks per process (DDP synchronised the weights)
    first_step = session.p.step
    if session.is_main:
        job.output.start(checkpoint is not None, session.p.step, session.p.history)
    try:
        session.start_trackers()
        session.loop(progress, stop_after, time_limit_s)
    except NoRoom as err:  # a full disk: say where the same command will resume
        raise NoRoom(err.errno, f"{err.strerror}: it resumes the run {_resumes_at(session, path)}",
                     err.filename) from err
    finally:
        session.close()
    p = session.p
    return {"best": p.best_metrics, "best_step": p.best_step, "steps": p.step, "session_steps": p.step - first_step,
            "history": [r for r in p.history if r["kind"] == "eval"],
            "step_records": [r for r in p.history if r["kind"] == "step"], "finished": p.finished}


def _resumes_at(session: Session, path: Path) -> str:
    """Where the same command resumes a run whose session stopped now: at the step of the last checkpoint."""
    step = session.saved_step
    return f"at step {step}, from {path}" if step is not None else "from its start (no checkpoint was written yet)"


def _encoder_width(model: nn.Module) -> int:
    """The hidden size of ``model.encoder`` (or of ``model``), which sets the default learning rate; 384 if neither
    says."""
    return getattr(getattr(getattr(model, "encoder", model), "config", None), "hidden_size", BASE_WIDTH)
