"""The training engine: one loop for every job (a task's ``fit``, multi-task, ``distill`` and ``pretrain``).

Over 400 lines: one engine; its session (:class:`_Session`: steps, records, evaluations, checkpoints and exact resume)
is one state machine whose parts share its state, beside the protocols it runs and a task's job (:func:`train`).

A job hands the engine its model and a :class:`Job`: an objective ``loss_fn(model, batch) -> scalar``, its data as
this process's batches of each step (:class:`ItemBatches` for a task's encoded items; pre-training's corpus stream),
its evaluation and the metric to maximise, and its :class:`Output` (where records, checkpoints and the best model go:
a task's :class:`RunDir`, pre-training's snapshot directory). The engine adds: parameter groups with their own learning
rates, AdamW or LAMB with linear warm-up/decay, gradient accumulation and clipping, EMA weights, FGM/PGD, evaluation
with best-model saving and early stopping, records (:meth:`_Session.log`: the one place where a record is logged;
to ``metrics.jsonl`` and the experiment trackers of ``config.report_to``, :mod:`zhie.training.tracking`),
checkpoints from which an interrupted run resumes bit-exactly (same batches, same dropout masks, same weights, the
same records), and session limits (``stop_after``, ``time_limit_s``) that end a session early with a checkpoint.

Records, distinguished by ``kind``: a **step record** every ``config.log_every`` optimizer steps (and at the last
one): ``{"kind": "step", "step", <position: "epoch" or "tokens">, "loss", "grad_norm", "tokens_per_s", "lr":
{group: lr}, "elapsed_s"}`` plus the job's ``step_log()`` (a multi-task loss's ``task_losses`` and ``task_weights``),
each a mean over the steps since the last step record, kept on the device (no host sync per step); and an
**evaluation record** at each evaluation: ``{"kind": "eval", "step", <position>, "train_loss", "lr",
"tokens_per_s", "elapsed_s", "dev": metrics}`` plus the job's ``train_log()``, its training numbers means since the
last evaluation. Readers of ``metrics.jsonl`` that want one kind filter on it
(:func:`zhie.training.report.read_metrics`).

Device placement, mixed precision (``config.precision``: the encoder in bf16/fp16 under autocast, the heads and losses
in fp32, see :class:`zhie.model.Model`) and DDP come from :mod:`accelerate`.

Several processes (``torchrun`` / ``accelerate launch``): each step's global batch of ``batch_size x processes``
items (the batch one process would draw with that size) is cut into one slice per process, so N processes with
``batch_size`` B compute the step of one process with ``batch_size`` N x B (for losses that are means over the
items of a batch). Each process draws its own dropout masks (seed + rank) and keeps them, and its running loss, in
the checkpoint. The main process alone writes (records, checkpoints, the best model).

Evaluation under several processes: **every process calls** ``evaluate`` **at the same time**, and none waits in a
collective while another evaluates. An evaluation that only the main process ran would leave the others in a
collective that times out with the process group (30 min for gloo, 10 for NCCL) on a long evaluation, and lengthening
that timeout would also delay the report of a process that really hung. An evaluation that can split its work does
(pre-training's held-out loss: each process its share of the batches, the sums added over the processes: N times
faster); one that cannot (a task's dev set) is computed whole by every process, in the time one process would take.
The main process's metrics are then broadcast, so that every process takes the same best-model and early-stopping
decisions.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Protocol

import torch
from accelerate import Accelerator, PartialState
from accelerate.state import AcceleratorState
from accelerate.utils import DistributedDataParallelKwargs, set_seed
from torch import Tensor, nn
from tqdm.auto import tqdm

from zhie.dist import all_gather_objects, broadcast_object, world_size
from zhie.precision import accelerate_precision

from .adversarial import batch_gradient, embedding_weight, fgm_step, pgd_step
from .batching import epoch_batches
from .checkpoint import atomic_torch_save, load_checkpoint, recover_dir, replace_dir, rng_state, set_rng_state
from .config import BASE_WIDTH, TrainConfig
from .ema import EMA
from .optim import build_optimizer, build_param_groups, build_scheduler, with_lr_multipliers
from .rdrop import RDropLoss
from .report import append_jsonl, jsonable, plot_history, write_jsonl
from .tracking import PROJECT, flat_hparams, make_trackers, tracker_ids, tracker_values

__all__ = ["Batches", "ItemBatches", "Job", "Output", "RunDir", "join_processes", "run", "train"]

CHECKPOINT = "checkpoint.pt"
METRICS = "metrics.jsonl"
PLOT = "training.png"
BEST = "best"
# 3: the model and its loss module under "model" and "loss_fn", the job's data position under "data", each process's
# generators and running loss under "ranks".
# 4: records with a "kind" (step records), the windows of the step records and the evaluations under "ranks".
_CHECKPOINT_FORMAT = 4


# ------------------------------------------------------------------------------------------------- what a job gives
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
    """What a job gives the engine besides the model and the :class:`TrainConfig`.

    ``evaluate(model) -> metrics`` runs in eval mode under ``torch.no_grad()`` with the EMA weights in place, on every
    process (module docstring); ``None``: no evaluation, and the final model is the one kept. ``train_log()``, called
    at each evaluation on every process: what the loss recorded since the last one, added to the record;
    ``step_log()``, the same at each step record (means since the last step record). ``hparams``: the run's settings
    (its command's flags), logged to the trackers as hyper-parameters with the :class:`TrainConfig`.
    ``param_groups``: AdamW parameter groups; default :func:`build_param_groups` (parameters that a module tags with a
    learning-rate multiplier, the CRF transitions, are moved to groups of their own either way). ``meta``: the job's
    settings that a resumed run must share; ``resumable``: the :class:`TrainConfig` fields that may change when a run
    resumes (they change when things happen, not what is computed).
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


def log_interval(total_steps: int) -> int:
    """The default steps between step records: at most 100 records in a run, and one every 50 steps at least."""
    return min(50, math.ceil(total_steps / 100))


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


# --------------------------------------------------------------------------------------------- a task's items, its dir
class ItemBatches:
    """A task's encoded items as epochs of global batches of ``batch_size x processes`` items (grouped by length when
    ``lengths`` are given, :func:`epoch_batches`), each cut into one slice per process (:func:`_process_batches`);
    a step takes ``grad_accum`` of them. The epoch's batches are a pure function of ``(seed, epoch)``: a resumed run
    skips those done."""

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
            self._plan = (self.epoch, _process_batches(batches, self.batch_size, self.world, self.rank))
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


def _process_batches(batches: list[list[int]], batch_size: int, world: int, rank: int) -> list[list[int]]:
    """This process's slice of each global batch. With several processes only the full global batches are kept:
    every process needs a whole slice, and the short batch is anywhere once length grouping has shuffled them."""
    if world > 1:
        batches = [b for b in batches if len(b) == batch_size * world]
    return [b[rank * batch_size:(rank + 1) * batch_size] for b in batches]


class RunDir:
    """A task's run directory: ``checkpoint.pt`` (replaced atomically), ``metrics.jsonl`` (the step records and the
    evaluations' records), ``training.png`` (drawn at each evaluation, and at a step record when the last drawing
    is ``PLOT_EVERY_S`` old), ``best/`` (``save_best(model, directory)`` fills a temporary directory that then
    replaces it) and the trackers' directories."""

    PLOT_EVERY_S = 30.0

    def __init__(self, out_dir: Path, metric: str, save_best: Callable[[nn.Module, Path], None] | None) -> None:
        self.out_dir, self.metric, self.writer = Path(out_dir), metric, save_best
        self.checkpoint_path = self.out_dir / CHECKPOINT
        self.logging_dir = self.out_dir
        self.plotted = time.monotonic()

    def start(self, resumed: bool, step: int, history: list[dict]) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        recover_dir(self.out_dir / BEST)
        if resumed:  # drop evaluations logged after the checkpoint: they are about to be redone
            write_jsonl(self.out_dir / METRICS, history)
        else:
            self.checkpoint_path.unlink(missing_ok=True)
            (self.out_dir / METRICS).unlink(missing_ok=True)

    def log(self, record: dict, history: list[dict]) -> None:
        append_jsonl(self.out_dir / METRICS, record)
        if record["kind"] == "eval" or time.monotonic() - self.plotted >= self.PLOT_EVERY_S:
            plot_history(history, self.out_dir / PLOT, self.metric)
            self.plotted = time.monotonic()

    def save(self, checkpoint: dict, history: list[dict]) -> None:
        atomic_torch_save(checkpoint, self.checkpoint_path)

    def save_best(self, model: nn.Module) -> None:
        if self.writer is not None:
            replace_dir(self.out_dir / BEST, lambda directory: self.writer(model, directory))


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
    session = _Session(model, job, config, cpu, _Progress(**checkpoint["progress"]) if checkpoint else _Progress())
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
    finally:
        session.close()
    p = session.p
    return {"best": p.best_metrics, "best_step": p.best_step, "steps": p.step, "session_steps": p.step - first_step,
            "history": [r for r in p.history if r["kind"] == "eval"],
            "step_records": [r for r in p.history if r["kind"] == "step"], "finished": p.finished}


def _encoder_width(model: nn.Module) -> int:
    """The hidden size of ``model.encoder`` (or of ``model``), which sets the default learning rate; 384 if neither
    says."""
    return getattr(getattr(getattr(model, "encoder", model), "config", None), "hidden_size", BASE_WIDTH)


class _Objective(nn.Module):
    """The model and its loss as one module: DDP wraps both (a loss with weights of its own, such as Sentence-BERT's
    classifier, is trained and synchronised too), and the loss is handed the bare model."""

    def __init__(self, model: nn.Module, loss_fn: Callable[[nn.Module, dict[str, Tensor]], Tensor]) -> None:
        super().__init__()
        self.model = model
        self.loss_fn = loss_fn  # registered as a submodule when it is an nn.Module

    def forward(self, batch: dict[str, Tensor]) -> Tensor:
        return self.loss_fn(self.model, batch)


@dataclass
class _Progress:
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


class _Window:
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


class _Session:
    """One session of a run: the prepared model, optimizer and schedule, where training stands, and the steps of the
    loop (:meth:`loop`), in the order they happen."""

    def __init__(self, model: nn.Module, job: Job, config: TrainConfig, cpu: bool, progress: _Progress) -> None:
        processes = join_processes(cpu)
        self.p = progress
        run_name = job.output.checkpoint_path.parent.resolve().name  # the run directory's name ("demo")
        trackers = make_trackers(config.report_to, job.output.logging_dir, run_name, progress.step, progress.trackers)
        ddp = DistributedDataParallelKwargs(find_unused_parameters=config.find_unused_parameters)
        # accelerate keeps one AcceleratorState (the precision) per process: each run starts its own; the launch's
        # PartialState (process group, device) stays
        AcceleratorState._reset_state(reset_partial_state=False)
        self.accelerator = Accelerator(mixed_precision=accelerate_precision(config.precision),
                                       step_scheduler_with_optimizer=False, cpu=processes.device.type == "cpu",
                                       kwargs_handlers=[ddp], log_with=trackers or None)
        self.is_main, self.rank = self.accelerator.is_main_process, self.accelerator.process_index
        self.job, self.config, self.bare_model = job, config, model
        if job.data.steps_per_epoch is None and config.max_steps is None:
            raise ValueError("an endless stream of batches needs config.max_steps")
        self.total_steps = config.max_steps
        if job.data.steps_per_epoch is not None:
            self.total_steps = min(job.data.steps_per_epoch * config.epochs, config.max_steps or math.inf)
        self.log_every = config.log_every or log_interval(self.total_steps)
        objective = _Objective(model, job.loss_fn)
        optimizer = build_optimizer(_param_groups(objective, job.param_groups, config), config)
        scheduler = build_scheduler(optimizer, self.total_steps, config.warmup)
        self.model, self.optimizer, self.scheduler = self.accelerator.prepare(objective, optimizer, scheduler)
        self.raw = self.accelerator.unwrap_model(self.model)
        self.ema = EMA(self.raw, config.ema) if config.ema is not None else None
        self.adv_weight = embedding_weight(model) if config.adversarial is not None else None
        self.meta = {"format": _CHECKPOINT_FORMAT, "config": asdict(config),
                     "num_processes": self.accelerator.num_processes, **job.meta}
        self.window = _Window(self.accelerator.device)       # since the last evaluation
        self.step_window = _Window(self.accelerator.device)  # since the last step record
        self.session_start = time.perf_counter()

    # ---------------------------------------------------------------------------------------------- start and end
    def restore(self, state: dict, path: Path) -> None:
        """Continue from checkpoint ``state`` (written by :meth:`save` of an identical run)."""
        _check_resumable(state["meta"], self.meta, self.job.resumable, path)
        self.bare_model.load_state_dict(state["model"])
        if isinstance(self.job.loss_fn, nn.Module):
            self.job.loss_fn.load_state_dict(state["loss_fn"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.ema is not None:
            self.ema.load_state_dict(state["ema"])
        if self.accelerator.scaler is not None and state["scaler"] is not None:
            self.accelerator.scaler.load_state_dict(state["scaler"])
        self.job.data.load_state_dict(state["data"])
        mine = state["ranks"][self.rank]
        set_rng_state(mine["rng"])
        self.window.load_state_dict(mine["window"])
        self.step_window.load_state_dict(mine["step_window"])

    def start_trackers(self) -> None:
        """Start the trackers of ``config.report_to`` (their hyper-parameters: the config and the job's settings)."""
        if not self.config.report_to:
            return
        if self.is_main:
            self.job.output.logging_dir.mkdir(parents=True, exist_ok=True)
        self.accelerator.init_trackers(PROJECT, config=flat_hparams({**asdict(self.config), **self.job.hparams}))
        if self.is_main:
            self.p.trackers = tracker_ids(self.accelerator.trackers)

    def close(self) -> None:
        self.accelerator.unwrap_model(self.model, keep_fp32_wrapper=False)  # undo accelerate's autocast wrapper
        for tracker in self.accelerator.trackers:  # not end_training(): it would end the process group too
            tracker.finish()

    def elapsed(self) -> float:
        return self.p.elapsed_s + time.perf_counter() - self.session_start

    # ------------------------------------------------------------------------------------------------------ the loop
    def loop(self, progress: bool, stop_after: int | None, time_limit_s: float | None) -> None:
        """Steps until the run is finished (the last step, or early stopping) or the session ends; evaluations and
        checkpoints where ``config`` puts them, and one at the end."""
        config, data, p = self.config, self.job.data, self.p
        bar = tqdm(total=self.total_steps, initial=p.step, desc=self.job.name, unit="step", dynamic_ncols=True,
                   disable=not (progress and self.is_main))
        self.model.train()
        try:
            while not p.finished:
                self.step(data.draw(p.step))
                last = p.step >= self.total_steps
                self.show(bar, self.log_step() if last or p.step % self.log_every == 0 else None)
                if last or (config.eval_every is None and data.epoch_end) or (
                        config.eval_every is not None and p.step % config.eval_every == 0):
                    last = self.evaluate_and_log() or last
                p.finished = last
                if p.finished and self.job.evaluate is None:  # no evaluation: the final (EMA) model is the one kept
                    self.save_best()
                    p.best_step = p.step
                stop = not p.finished and self.session_ends(stop_after, time_limit_s)
                if p.finished or stop or data.epoch_end or (
                        config.save_every is not None and p.step % config.save_every == 0):
                    self.save()
                if stop:
                    break
            self.accelerator.wait_for_everyone()  # every process returns once the main one has written
        finally:
            bar.close()

    def step(self, batches: list[dict[str, Tensor]]) -> None:
        """One optimizer step over ``batches`` (gradients accumulated; DDP synchronises them at the last)."""
        start = time.perf_counter()
        for i, batch in enumerate(batches):
            batch = _to_device(batch, self.accelerator.device)
            synced = i == len(batches) - 1  # DDP all-reduces the gradients in the last batch's backward
            with nullcontext() if synced else self.accelerator.no_sync(self.model):
                grad_before = (self.adv_weight.grad.detach().clone()
                               if self.adv_weight is not None and self.adv_weight.grad is not None else None)
                loss = self.model(batch)
                if not isinstance(loss, Tensor) or loss.dim() != 0:
                    raise ValueError(f"loss_fn must return a scalar tensor, got {loss!r:.80}")
                self.accelerator.backward(loss / len(batches))
                if self.adv_weight is not None:
                    self.adversarial(batch, batch_gradient(self.adv_weight.grad, grad_before, synced),
                                     1.0 / len(batches))
            self.window.add(loss, batch)
            self.step_window.add(loss, batch)
        # the norm is measured either way (clipping at infinity multiplies the gradients by exactly 1)
        norm = self.accelerator.clip_grad_norm_(self.model.parameters(), self.config.max_grad_norm or math.inf)
        self.window.add_grad_norm(norm)
        self.step_window.add_grad_norm(norm)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.ema is not None:
            self.ema.update(self.raw)
        self.p.step += 1
        seconds = time.perf_counter() - start
        self.window.seconds += seconds
        self.step_window.seconds += seconds

    def adversarial(self, batch: dict, grad: Tensor | None, scale: float) -> None:
        """FGM / PGD after the clean backward of ``batch``, from its embedding gradient ``grad``
        (:mod:`zhie.training.adversarial`)."""
        config, weight, model = self.config, self.adv_weight, self.model

        def backward(loss: Tensor) -> None:
            self.accelerator.backward(loss * scale)

        if config.adversarial == "fgm":
            fgm_step(weight, grad, lambda: model(batch), backward, config.adv_epsilon)
        else:
            pgd_step(weight, grad, lambda: self.raw(batch), lambda: model(batch), backward, config.adv_epsilon,
                     config.adv_alpha, config.adv_steps)

    def show(self, bar: tqdm, record: dict | None) -> None:
        """The progress bar, with the numbers of the step ``record`` just logged, if any."""
        if bar.disable:
            return
        if record is not None:
            bar.set_postfix(loss=f"{record['loss']:.4f}", lr=f"{self.optimizer.param_groups[0]['lr']:.2e}",
                            **({"tok/s": f"{record['tokens_per_s']:.0f}"} if record["tokens_per_s"] else {}),
                            refresh=False)
        bar.update(self.p.step - bar.n)

    def session_ends(self, stop_after: int | None, time_limit_s: float | None) -> bool:
        """Whether this session stops here; every process takes the main process's decision on time."""
        if stop_after is not None and self.p.step >= stop_after:
            return True
        return time_limit_s is not None and bool(
            broadcast_object(time.perf_counter() - self.session_start >= time_limit_s))

    # ------------------------------------------------------------------------------------------------ evaluation
    def log_step(self) -> dict:
        """Log a step record: the means since the last one (module docstring)."""
        summary = self.step_window.summary(self.accelerator)
        record = {"kind": "step", "step": self.p.step, **self.job.data.position(), **summary, "lr": self.lrs(),
                  "elapsed_s": round(self.elapsed(), 3)}
        if self.job.step_log is not None:
            record.update(jsonable(self.job.step_log()))
        self.step_window.reset()
        self.log(record)
        return record

    def evaluate_and_log(self) -> bool:
        """Evaluate, keep the best model, log the record; True when early stopping says stop."""
        summary = self.window.summary(self.accelerator)
        record = {"kind": "eval", **self.job.data.position(), "step": self.p.step, "train_loss": summary["loss"],
                  "lr": self.lrs(), "tokens_per_s": summary["tokens_per_s"], "elapsed_s": round(self.elapsed(), 3),
                  "dev": {}}
        if self.job.train_log is not None:
            record.update(jsonable(self.job.train_log()))
        if self.job.evaluate is not None:
            record["dev"] = self.evaluate()
            self.keep_if_best(record["dev"])
        self.window.reset()
        self.log(record)
        return self.config.patience is not None and self.p.bad_evals >= self.config.patience

    def lrs(self) -> dict[str, float]:
        return {g["name"]: g["lr"] for g in self.optimizer.param_groups}

    def evaluate(self) -> dict:
        """``job.evaluate`` on every process (module docstring: no process waits for another's evaluation), with the
        EMA weights in place; the main process's metrics on every process."""
        with self.ema_weights():
            self.model.eval()
            try:
                with torch.no_grad():
                    metrics = jsonable(self.job.evaluate(self.bare_model))
            finally:
                self.model.train()
        metrics = broadcast_object(metrics)
        metric = self.job.metric
        if not isinstance(metrics, dict) or not isinstance(metrics.get(metric), (int, float)):
            raise ValueError(f"evaluate() must return a dict with a number under metric={metric!r}, got {metrics!r}")
        return metrics

    def keep_if_best(self, metrics: dict) -> None:
        p, score = self.p, float(metrics[self.job.metric])
        if not math.isnan(score) and (p.best_score is None or score > p.best_score):
            p.best_score, p.best_metrics, p.best_step, p.bad_evals = score, metrics, p.step, 0
            self.save_best()
        else:
            p.bad_evals += 1

    def log(self, record: dict) -> None:
        """The one place where a record is logged: into the history (saved in the checkpoint), the job's output and
        the trackers."""
        self.p.history.append(record)
        if self.is_main:
            self.job.output.log(record, self.p.history)
            if self.accelerator.trackers:
                self.accelerator.log(tracker_values(record), step=record["step"])

    # ----------------------------------------------------------------------------------------------------- saving
    def ema_weights(self):
        return self.ema.applied(self.raw) if self.ema is not None else nullcontext()

    def save_best(self) -> None:
        """The weights just evaluated (the EMA average with ``config.ema``) as the best model."""
        if self.is_main:
            with self.ema_weights():
                self.job.output.save_best(self.bare_model)

    def save(self) -> None:
        """A checkpoint from which the run resumes exactly; each process's generators (its own stream of dropout
        masks) and running loss are gathered into it."""
        ranks = all_gather_objects({"rng": rng_state(), "window": self.window.state_dict(),
                                    "step_window": self.step_window.state_dict()})
        if not self.is_main:
            return
        loss_fn, scaler = self.job.loss_fn, self.accelerator.scaler
        self.job.output.save({
            "meta": self.meta,
            "model": self.bare_model.state_dict(),
            "loss_fn": loss_fn.state_dict() if isinstance(loss_fn, nn.Module) else None,
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "ema": self.ema.state_dict() if self.ema is not None else None,
            "scaler": scaler.state_dict() if scaler is not None else None,
            "data": self.job.data.state_dict(),
            "ranks": ranks,
            "progress": asdict(self.p) | {"elapsed_s": self.elapsed()},
        }, self.p.history)


def _param_groups(objective: _Objective, param_groups: list[dict] | None, config: TrainConfig) -> list[dict]:
    """The optimizer's groups: :func:`build_param_groups`, or the job's own (named ``group0``, ... for logging, the
    loss module's weights in one more) with tagged parameters moved to their multiplier's group."""
    if param_groups is None:
        return build_param_groups(objective, config)
    own = list(objective.loss_fn.parameters()) if isinstance(objective.loss_fn, nn.Module) else []
    groups = param_groups + ([{"params": own}] if own else [])
    return with_lr_multipliers(objective, [{"name": f"group{i}", **g} for i, g in enumerate(groups)], config.lr)


def _to_device(batch: dict, device: torch.device) -> dict:
    if not isinstance(batch, dict):
        raise TypeError(f"collate must return a dict of tensors, got {type(batch).__name__}")
    return {k: v.to(device, non_blocking=True) if isinstance(v, Tensor) else v for k, v in batch.items()}


def _check_resumable(saved: dict, current: dict, resumable: frozenset[str], path: Path) -> None:
    """Refuse to resume a checkpoint written by a run that would compute something else."""
    if saved.get("format") != current["format"]:
        raise ValueError(f"{path} has checkpoint format {saved.get('format')!r}, this version writes "
                         f"{current['format']}; {START_OVER}")
    defaults = {f.name: f.default for f in fields(TrainConfig) if f.default is not MISSING}
    old = {**defaults, **saved["config"]}  # a field added since the checkpoint was written had its default then
    changes = [_change(f"config.{key}", old.get(key), value)
               for key, value in current["config"].items() if key not in resumable and old.get(key) != value]
    changes += [_change(key, saved[key], value) if key in saved else f"{key}: not recorded by the run that wrote it"
                for key, value in current.items() if key not in ("config", "format") and saved.get(key) != value]
    if changes:
        raise ValueError(f"{path} was written by a different run; resuming it would mix two runs. What differs:\n  "
                         + "\n  ".join(changes) + f"\nRun with the same settings and data, or {START_OVER}")


START_OVER = ("start this run over with --no-resume (resume=False in Python), or give it another output directory "
              "(--out)")


def _change(key: str, old, new) -> str:
    """One line of a refused resume: ``key`` was ``old``, is now ``new`` (long values cut; a data file's hash says
    that the file changed)."""
    if key.startswith("data."):
        return f"{key}: the file's contents changed (sha256 {str(old)[:12]}… -> {str(new)[:12]}…)"
    old, new = repr(old), repr(new)
    return f"{key}: {old if len(old) <= 80 else old[:77] + '...'} -> {new if len(new) <= 80 else new[:77] + '...'}"
