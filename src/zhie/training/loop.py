"""The training loop shared by every task (NER, word segmentation, relation extraction, sentence embeddings).

Tasks own their model, data and loss; the loop only sees opaque encoded items, a ``collate`` that turns a list
of them into a dict of tensors, and ``loss_fn(model, batch) -> scalar``. It adds: parameter groups with their
own learning rates, AdamW with linear warm-up/decay, gradient accumulation and clipping, length-grouped
batches, EMA weights, evaluation with best-model saving and early stopping, metric logging and a plot, and
checkpoints from which an interrupted run resumes bit-exactly (same batches, same dropout masks, same
weights). Device placement, mixed precision (``config.precision``: the encoder in bf16/fp16 under autocast, the heads
and losses in fp32, see :class:`zhie.model.Model`) and DDP come from :mod:`accelerate`.

Several processes (``torchrun`` / ``accelerate launch``): each step's global batch of ``batch_size x processes``
items (the batch one process would draw with that size) is cut into one slice per process, so N processes with
``batch_size`` B compute the step of one process with ``batch_size`` N x B (for losses that are means over the
items of a batch). Each process draws its own dropout masks (seed + rank); the main process alone evaluates (and
tells the others the result), writes the logs, the checkpoint and the best model.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedDataParallelKwargs, set_seed
from torch import Tensor, nn
from tqdm.auto import tqdm

from zhie.precision import accelerate_precision

from .adversarial import embedding_weight, fgm_step, pgd_step
from .batching import epoch_batches
from .checkpoint import atomic_torch_save, load_checkpoint, recover_dir, replace_dir, rng_state, set_rng_state
from .config import TrainConfig
from .dist import all_gather_objects, broadcast_object, world_size
from .ema import EMA
from .optim import build_param_groups, build_scheduler, with_lr_multipliers
from .rdrop import RDropLoss
from .report import append_jsonl, jsonable, plot_history, write_jsonl

__all__ = ["train"]

CHECKPOINT = "checkpoint.pt"
METRICS = "metrics.jsonl"
PLOT = "training.png"
BEST = "best"
_CHECKPOINT_FORMAT = 2  # 2: the model and its loss module under "model." and "loss_fn."
# Config fields that may change between an interrupted run and its resumption (they do not change what is
# computed).
_RESUMABLE_CHANGES = {"save_every"}


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

    epoch: int = 0                 # epochs completed
    batch: int = 0                 # batches of the current epoch done (always a multiple of grad_accum)
    step: int = 0                  # optimizer steps done
    best_score: float | None = None
    best_metrics: dict = field(default_factory=dict)
    best_step: int | None = None
    bad_evals: int = 0             # evaluations since the last improvement
    history: list[dict] = field(default_factory=list)
    loss_sum: float = 0.0          # sum of batch losses since the last evaluation
    loss_count: int = 0
    elapsed_s: float = 0.0         # wall time of the sessions before this one
    finished: bool = False


class _Window:
    """Training loss and throughput since the last evaluation (kept on the device: no sync per batch)."""

    def __init__(self, device: torch.device, loss_sum: float = 0.0, loss_count: int = 0) -> None:
        self.loss_sum = torch.tensor(loss_sum, dtype=torch.float64, device=device)
        self.loss_count = loss_count
        self.tokens = torch.zeros((), dtype=torch.int64, device=device)
        self.count_tokens = True
        self.seconds = 0.0

    def add(self, loss: Tensor, batch: dict) -> None:
        self.loss_sum += loss.detach().double()
        self.loss_count += 1
        mask = batch.get("attention_mask")
        if isinstance(mask, Tensor):
            self.tokens += mask.sum()
        else:
            self.count_tokens = False

    def reset(self) -> None:
        self.loss_sum.zero_()
        self.loss_count = 0
        self.tokens.zero_()
        self.count_tokens = True
        self.seconds = 0.0

    def mean_loss(self) -> float:
        return self.loss_sum.item() / max(self.loss_count, 1)

    def tokens_per_s(self, tokens: Tensor | None = None) -> float | None:
        if not self.count_tokens or self.seconds <= 0:
            return None
        return (self.tokens if tokens is None else tokens).item() / self.seconds


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
) -> dict:
    """Train ``model`` on ``train_items``; returns ``{"best", "best_step", "steps", "history"}``.

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
        config: :class:`TrainConfig`.
        out_dir: receives ``checkpoint.pt``, ``metrics.jsonl``, ``training.png`` and ``best/``.
        evaluate: ``evaluate(model) -> metrics``, called in eval mode under ``torch.no_grad()`` with the EMA
            weights in place (if ``config.ema``); on the main process only. ``None``: no evaluation; ``save_best`` is
            then called once, at the end, with the final (EMA) weights.
        metric: the key of the metrics to maximise (best model and early stopping).
        save_best: ``save_best(model, directory)`` writes the model into ``directory`` (which exists and is
            empty). It is given a temporary directory that then replaces ``out_dir/best``.
        lengths: lengths of the items; given, batches are grouped by length (:func:`epoch_batches`).
        param_groups: AdamW parameter groups; default :func:`build_param_groups`. Parameters that a module tags
            with a learning-rate multiplier (the CRF transitions) are moved to groups of their own either way.
        resume: continue from ``out_dir/checkpoint.pt`` if it exists; ``False`` starts over.
        progress: show a tqdm bar (main process only).
        train_log: called at each evaluation, on every process: what the loss recorded since the last one (a
            multi-task loss's per-step losses and weights), added to the evaluation's record (the main process's).
    """
    out_dir = Path(out_dir)
    if config.rdrop is not None and not isinstance(loss_fn, RDropLoss):
        raise ValueError("config.rdrop needs an R-Drop loss: pass loss_fn=RDropLoss(task, alpha, head) "
                         "(zhie.fit does this for you)")
    n_items = len(train_items)
    if lengths is not None and len(lengths) != n_items:
        raise ValueError(f"lengths has {len(lengths)} entries for {n_items} training items")

    # Without a GPU, accelerate joins the processes of a launch (over gloo) only when told that the run is on CPU;
    # else each process would train alone.
    accelerator = Accelerator(mixed_precision=accelerate_precision(config.precision),
                              step_scheduler_with_optimizer=False,
                              cpu=world_size() > 1 and not torch.cuda.is_available(),
                              kwargs_handlers=[DistributedDataParallelKwargs(
                                  find_unused_parameters=config.find_unused_parameters)])
    if accelerator.num_processes != world_size():
        raise RuntimeError(f"launched as {world_size()} processes, but accelerate found no way to run them together "
                           f"on {accelerator.device} (it runs {accelerator.num_processes})")
    is_main = accelerator.is_main_process
    world, rank = accelerator.num_processes, accelerator.process_index
    if is_main:
        out_dir.mkdir(parents=True, exist_ok=True)
        recover_dir(out_dir / BEST)
    ckpt_path, metrics_path, plot_path = out_dir / CHECKPOINT, out_dir / METRICS, out_dir / PLOT

    # Global batches of batch_size x world items, one slice per process; with several processes a last batch that
    # cannot give every process a full slice is dropped.
    global_batch = config.batch_size * world
    batches_per_epoch = math.ceil(n_items / global_batch) if world == 1 else n_items // global_batch
    if batches_per_epoch == 0:
        raise ValueError(f"{n_items} training items make no batch for {world} process(es) "
                         f"(batch_size={config.batch_size})")
    steps_per_epoch = math.ceil(batches_per_epoch / config.grad_accum)
    total_steps = steps_per_epoch * config.epochs
    if config.max_steps is not None:
        total_steps = min(total_steps, config.max_steps)

    bare_model = model
    objective = _Objective(model, loss_fn)
    if param_groups is None:
        groups = build_param_groups(objective, config)
    else:
        own = [p for p in objective.loss_fn.parameters()] if isinstance(loss_fn, nn.Module) else []
        groups = with_lr_multipliers(objective, _named_groups(param_groups + ([{"params": own}] if own else [])),
                                     config.lr)
    optimizer = torch.optim.AdamW(groups, lr=config.lr, weight_decay=config.weight_decay)
    scheduler = build_scheduler(optimizer, total_steps, config.warmup)
    model, optimizer, scheduler = accelerator.prepare(objective, optimizer, scheduler)
    raw = accelerator.unwrap_model(model)
    ema = EMA(raw, config.ema) if config.ema is not None else None
    meta = {"format": _CHECKPOINT_FORMAT, "config": asdict(config), "n_items": n_items,
            "grouped_by_length": lengths is not None, "num_processes": world}

    p = _Progress()
    if resume and ckpt_path.exists():
        state = load_checkpoint(ckpt_path)
        _check_resumable(state["meta"], meta, ckpt_path)
        raw.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        if ema is not None:
            ema.load_state_dict(state["ema"])
        if accelerator.scaler is not None and state["scaler"] is not None:
            accelerator.scaler.load_state_dict(state["scaler"])
        set_rng_state(state["rng_by_rank"][rank] if world > 1 else state["rng"])
        p = _Progress(**state["progress"])
        if is_main:  # drop evaluations logged after the checkpoint: they are about to be redone
            write_jsonl(metrics_path, p.history)
    else:
        set_seed(config.seed + rank)  # one stream of dropout masks per process (DDP has synchronised the weights)
        if is_main:
            ckpt_path.unlink(missing_ok=True)
            metrics_path.unlink(missing_ok=True)

    window = _Window(accelerator.device, p.loss_sum, p.loss_count)
    session_start = time.perf_counter()

    def elapsed() -> float:
        return p.elapsed_s + time.perf_counter() - session_start

    def ema_weights():
        return ema.applied(raw) if ema is not None else nullcontext()

    adv_weight = embedding_weight(bare_model) if config.adversarial is not None else None

    def adversarial(batch: dict, grad_before: Tensor | None, scale: float) -> None:
        """FGM / PGD after the clean backward of ``batch`` (:mod:`zhie.training.adversarial`)."""
        grad = adv_weight.grad
        if grad is not None and grad_before is not None:
            grad = grad - grad_before  # this batch's own gradient under accumulation
        if config.adversarial == "fgm":
            fgm_step(adv_weight, grad, lambda: model(batch), lambda loss: accelerator.backward(loss * scale),
                     config.adv_epsilon)
        else:
            pgd_step(adv_weight, grad, lambda: raw(batch), lambda: model(batch),
                     lambda loss: accelerator.backward(loss * scale), config.adv_epsilon, config.adv_alpha,
                     config.adv_steps)

    def write_best() -> None:
        if is_main and save_best is not None:
            replace_dir(out_dir / BEST, lambda directory: save_best(bare_model, directory))

    def evaluate_and_log(epoch_position: float) -> bool:
        """Evaluate, keep the best model, log; True when early stopping says stop."""
        record = {
            "epoch": round(epoch_position, 4),
            "step": p.step,
            "train_loss": accelerator.reduce(window.loss_sum / max(window.loss_count, 1), "mean").item(),
            "lr": {g["name"]: g["lr"] for g in optimizer.param_groups},
            "tokens_per_s": window.tokens_per_s(accelerator.reduce(window.tokens.clone(), "sum")),
            "elapsed_s": round(elapsed(), 3),
            "dev": {},
        }
        if train_log is not None:
            record.update(jsonable(train_log()))
        if evaluate is not None:
            metrics = None
            if is_main:  # once, on the main process; the others wait for its result
                with ema_weights():
                    model.eval()
                    try:
                        with torch.no_grad():
                            metrics = jsonable(evaluate(bare_model))
                    finally:
                        model.train()
            metrics = broadcast_object(metrics)
            if not isinstance(metrics, dict) or not isinstance(metrics.get(metric), (int, float)):
                raise ValueError(f"evaluate() must return a dict with a number under metric={metric!r}, "
                                 f"got {metrics!r}")
            score = float(metrics[metric])
            record["dev"] = metrics
            if not math.isnan(score) and (p.best_score is None or score > p.best_score):
                p.best_score, p.best_metrics, p.best_step, p.bad_evals = score, metrics, p.step, 0
                with ema_weights():  # the weights just evaluated are the ones saved
                    write_best()
            else:
                p.bad_evals += 1
        p.history.append(record)
        window.reset()
        if is_main:
            append_jsonl(metrics_path, record)
            plot_history(p.history, plot_path, metric)
        return config.patience is not None and p.bad_evals >= config.patience

    def save_checkpoint() -> None:
        rngs = all_gather_objects(rng_state())  # every process's generators: its own stream of dropout masks
        if not is_main:
            return
        progress_state = asdict(p) | {"loss_sum": window.loss_sum.item(), "loss_count": window.loss_count,
                                      "elapsed_s": elapsed()}
        atomic_torch_save({
            "meta": meta,
            "model": raw.state_dict(),
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "ema": ema.state_dict() if ema is not None else None,
            "scaler": accelerator.scaler.state_dict() if accelerator.scaler is not None else None,
            "rng": rngs[0],
            **({"rng_by_rank": rngs} if world > 1 else {}),
            "progress": progress_state,
        }, ckpt_path)

    bar = tqdm(total=total_steps, initial=p.step, desc="train", unit="step", dynamic_ncols=True,
               disable=not (progress and is_main))
    model.train()
    try:
        while not p.finished:
            # The epoch's batches are a pure function of (seed, epoch): a resumed run skips those done.
            batches = _process_batches(epoch_batches(n_items, global_batch, seed=config.seed, epoch=p.epoch,
                                                     lengths=lengths), config.batch_size, world, rank)
            epoch_end = False
            while not (epoch_end or p.finished):
                step_start = time.perf_counter()
                group = batches[p.batch:p.batch + config.grad_accum]  # the batches of one optimizer step
                for i, indices in enumerate(group):
                    batch = _to_device(collate([train_items[j] for j in indices]), accelerator.device)
                    last_in_group = i == len(group) - 1
                    with nullcontext() if last_in_group else accelerator.no_sync(model):
                        grad_before = (adv_weight.grad.detach().clone()
                                       if adv_weight is not None and adv_weight.grad is not None else None)
                        loss = model(batch)
                        if not isinstance(loss, Tensor) or loss.dim() != 0:
                            raise ValueError(f"loss_fn must return a scalar tensor, got {loss!r:.80}")
                        accelerator.backward(loss / len(group))
                        if adv_weight is not None:
                            adversarial(batch, grad_before, 1.0 / len(group))
                    window.add(loss, batch)
                if config.max_grad_norm is not None:
                    accelerator.clip_grad_norm_(model.parameters(), config.max_grad_norm)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)
                if ema is not None:
                    ema.update(raw)
                p.step += 1
                p.batch += len(group)
                window.seconds += time.perf_counter() - step_start

                if not bar.disable:
                    tokens_per_s = window.tokens_per_s()
                    bar.set_postfix(loss=f"{window.mean_loss():.4f}", lr=f"{optimizer.param_groups[0]['lr']:.2e}",
                                    **({"tok/s": f"{tokens_per_s:.0f}"} if tokens_per_s is not None else {}),
                                    refresh=False)
                    bar.update()

                epoch_end = p.batch == batches_per_epoch
                last_step = p.step >= total_steps
                if (last_step or (config.eval_every is None and epoch_end)
                        or (config.eval_every is not None and p.step % config.eval_every == 0)):
                    early_stop = evaluate_and_log(p.epoch + p.batch / batches_per_epoch)
                    last_step = last_step or early_stop
                p.finished = last_step
                if epoch_end:
                    p.epoch, p.batch = p.epoch + 1, 0
                if p.finished and evaluate is None:  # no evaluation: the final (EMA) model is the one to keep
                    with ema_weights():
                        write_best()
                    p.best_step = p.step
                if p.finished or epoch_end or (config.save_every is not None and p.step % config.save_every == 0):
                    save_checkpoint()
        accelerator.wait_for_everyone()  # every process returns once the main one has written the best model
    finally:
        bar.close()
        accelerator.unwrap_model(model, keep_fp32_wrapper=False)  # undo accelerate's autocast forward wrapper

    return {"best": p.best_metrics, "best_step": p.best_step, "steps": p.step, "history": p.history}


def _process_batches(batches: list[list[int]], batch_size: int, world: int, rank: int) -> list[list[int]]:
    """This process's slice of each global batch. With several processes only the full global batches are kept:
    every process needs a whole slice, and the short batch is anywhere once length grouping has shuffled them."""
    if world > 1:
        batches = [b for b in batches if len(b) == batch_size * world]
    return [b[rank * batch_size:(rank + 1) * batch_size] for b in batches]


def _named_groups(param_groups: list[dict]) -> list[dict]:
    """Copies of user-given groups, each with a "name" for logging."""
    return [{"name": f"group{i}", **group} for i, group in enumerate(param_groups)]


def _to_device(batch: dict, device: torch.device) -> dict:
    if not isinstance(batch, dict):
        raise TypeError(f"collate must return a dict of tensors, got {type(batch).__name__}")
    return {k: v.to(device, non_blocking=True) if isinstance(v, Tensor) else v for k, v in batch.items()}


def _check_resumable(saved: dict, current: dict, path: Path) -> None:
    """Refuse to resume a checkpoint written by a run that would compute something else."""
    if saved.get("format") != current["format"]:
        raise ValueError(f"{path} has checkpoint format {saved.get('format')!r}, this version writes "
                         f"{current['format']}; pass resume=False to start over")
    defaults = {f.name: f.default for f in fields(TrainConfig) if f.default is not MISSING}
    old = {**defaults, **saved["config"]}  # a field added since the checkpoint was written had its default then
    changes = [f"config.{key}: {old.get(key)!r} -> {value!r}"
               for key, value in current["config"].items()
               if key not in _RESUMABLE_CHANGES and old.get(key) != value]
    changes += [f"{key}: {saved.get(key)!r} -> {value!r}" for key, value in current.items()
                if key not in ("config", "format") and saved.get(key) != value]
    if changes:
        raise ValueError(f"{path} was written by a different run ({'; '.join(changes)}); resume with the same "
                         "settings and data, or pass resume=False (or another out_dir) to start over")
