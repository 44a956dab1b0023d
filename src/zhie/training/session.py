"""One session of a run of the training engine (:func:`zhie.training.loop.run`): the prepared model, optimizer and
schedule, where training stands, and the steps of the loop in the order they happen (:meth:`Session.loop`): the
optimizer steps (gradient accumulation and clipping, EMA, FGM/PGD), the records (:meth:`Session.log`), the evaluations
with best-model saving and early stopping, and the checkpoints from which a run resumes exactly.

Device placement, mixed precision and DDP come from :mod:`accelerate`; the model and its loss are one module
(:class:`Objective`), so that DDP wraps both.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import asdict
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState
from accelerate.utils import DistributedDataParallelKwargs
from torch import Tensor, nn
from tqdm.auto import tqdm

from zhie.dist import all_gather_objects, broadcast_object
from zhie.precision import accelerate_precision

from .adversarial import batch_gradient, embedding_weight, fgm_step, pgd_step
from .checkpoint import CHECKPOINT_FORMAT, check_resumable, rng_state, set_rng_state
from .config import TrainConfig
from .ema import EMA
from .job import Job, join_processes
from .optim import build_optimizer, build_param_groups, build_scheduler, with_lr_multipliers
from .progress import Progress, Window, log_interval
from .report import jsonable
from .tracking import PROJECT, flat_hparams, make_trackers, tracker_ids, tracker_values

__all__ = ["Objective", "Session"]


class Objective(nn.Module):
    """The model and its loss as one module: DDP wraps both (a loss with weights of its own, such as Sentence-BERT's
    classifier, is trained and synchronised too), and the loss is handed the bare model."""

    def __init__(self, model: nn.Module, loss_fn: Callable[[nn.Module, dict[str, Tensor]], Tensor]) -> None:
        super().__init__()
        self.model = model
        self.loss_fn = loss_fn  # registered as a submodule when it is an nn.Module

    def forward(self, batch: dict[str, Tensor]) -> Tensor:
        return self.loss_fn(self.model, batch)


class Session:
    """One session of a run: the prepared model, optimizer and schedule, where training stands, and the steps of the
    loop (:meth:`loop`), in the order they happen."""

    def __init__(self, model: nn.Module, job: Job, config: TrainConfig, cpu: bool, progress: Progress) -> None:
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
        objective = Objective(model, job.loss_fn)
        optimizer = build_optimizer(_param_groups(objective, job.param_groups, config), config)
        scheduler = build_scheduler(optimizer, self.total_steps, config.warmup)
        self.model, self.optimizer, self.scheduler = self.accelerator.prepare(objective, optimizer, scheduler)
        self.raw = self.accelerator.unwrap_model(self.model)
        self.ema = EMA(self.raw, config.ema) if config.ema is not None else None
        self.adv_weight = embedding_weight(model) if config.adversarial is not None else None
        self.meta = {"format": CHECKPOINT_FORMAT, "config": asdict(config),
                     "num_processes": self.accelerator.num_processes, **job.meta}
        self.saved_step = progress.step if progress.step else None  # the last checkpoint's (None: none yet)
        self.window = Window(self.accelerator.device)       # since the last evaluation
        self.step_window = Window(self.accelerator.device)  # since the last step record
        self.session_start = time.perf_counter()

    # ---------------------------------------------------------------------------------------------- start and end
    def restore(self, state: dict, path: Path) -> None:
        """Continue from checkpoint ``state`` (written by :meth:`save` of an identical run)."""
        check_resumable(state["meta"], self.meta, self.job.resumable, path)
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
        """Log a step record: the means since the last one (:mod:`zhie.training.progress`)."""
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
        """``job.evaluate`` on every process (:mod:`zhie.training.job`: no process waits for another's evaluation),
        with the EMA weights in place; the main process's metrics on every process."""
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
        self.saved_step = self.p.step


def _param_groups(objective: Objective, param_groups: list[dict] | None, config: TrainConfig) -> list[dict]:
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
