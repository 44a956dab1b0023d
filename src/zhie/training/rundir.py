"""Where the training jobs write (each an :class:`~zhie.training.job.Output` of the engine): a task's run directory
(:class:`RunDir`, whose best model is a model directory) and pre-training's output directory (:class:`Snapshot`, an
encoder directory replaced as a whole at every save); the names of their files.

Only the main process writes here; the engine calls it.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from zhie.core.config_file import RUN_CONFIG
from zhie.encoders.mlm import MaskedLM, save_head

from .checkpoint import atomic_torch_save, atomic_write_text, recover_dir, remove_leftovers, replace_dir
from .report import append_jsonl, plot_history, write_jsonl

__all__ = ["BEST", "CHECKPOINT", "METRICS", "PLOT", "PRETRAIN_PLOT", "SUMMARY", "RunDir", "Snapshot"]

CHECKPOINT = "checkpoint.pt"  # a run's resumable checkpoint (both kinds of output)
METRICS = "metrics.jsonl"     # its records (zhie.training.progress)
PLOT = "training.png"         # a task's run: its records drawn
BEST = "best"                 # a task's run: its best model directory
PRETRAIN_PLOT = "pretraining.png"
SUMMARY = "pretrain.json"     # pre-training's settings and summary


class RunDir:
    """A task's run directory: ``checkpoint.pt`` (replaced atomically), ``metrics.jsonl`` (the step records and the
    evaluations' records), ``training.png`` (drawn at a record when the last drawing is ``PLOT_EVERY_S`` old, and at
    the run's last checkpoint: ~0.8 s of matplotlib a drawing, which a short run's every evaluation paid),
    ``best/`` (``save_best(model, directory)`` fills a temporary directory that then replaces it) and the trackers'
    directories."""

    PLOT_EVERY_S = 30.0

    def __init__(self, out_dir: Path, metric: str, save_best: Callable[[nn.Module, Path], None] | None) -> None:
        self.out_dir, self.metric, self.writer = Path(out_dir), metric, save_best
        self.checkpoint_path = self.out_dir / CHECKPOINT
        self.logging_dir = self.out_dir
        self.plotted = time.monotonic()

    def start(self, resumed: bool, step: int, history: list[dict]) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        recover_dir(self.out_dir / BEST)
        remove_leftovers(self.out_dir / BEST)  # what a killed finish() left (zhie.training.record)
        if resumed:  # drop evaluations logged after the checkpoint: they are about to be redone
            write_jsonl(self.out_dir / METRICS, history)
        else:  # a run that starts over leaves nothing of an earlier one where its own will be: no old model in best/
            self.checkpoint_path.unlink(missing_ok=True)
            (self.out_dir / METRICS).unlink(missing_ok=True)
            (self.out_dir / PLOT).unlink(missing_ok=True)
            shutil.rmtree(self.out_dir / BEST, ignore_errors=True)

    def log(self, record: dict, history: list[dict]) -> None:
        append_jsonl(self.out_dir / METRICS, record)
        if time.monotonic() - self.plotted >= self.PLOT_EVERY_S:
            self.plot(history)

    def plot(self, history: list[dict]) -> None:
        plot_history(history, self.out_dir / PLOT, self.metric)
        self.plotted = time.monotonic()

    def save(self, checkpoint: dict, history: list[dict]) -> None:
        atomic_torch_save(checkpoint, self.checkpoint_path)
        if checkpoint["progress"]["finished"]:
            self.plot(history)

    def save_best(self, model: nn.Module) -> None:
        if self.writer is not None:
            replace_dir(self.out_dir / BEST, lambda directory: self.writer(model, directory))


class Snapshot:
    """Pre-training's output directory, replaced as a whole at every save (:func:`zhie.core.files.replace_dir`): the
    encoder directory, the MLM head, the checkpoint, the records, the summary and the plot of one moment. The trackers
    write beside it, in ``<out>-logs`` (their files are written as they go, never replaced)."""

    def __init__(self, out: Path, model: MaskedLM, tokenizer, summary: dict, say: Callable[[str], None],
                 run_config: str = "") -> None:
        self.out, self.model, self.tokenizer, self.summary, self.say = out, model, tokenizer, summary, say
        self.run_config = run_config  # the run's config.toml (zhie.training.record.run_config_text), kept in each
        self.checkpoint_path = out / CHECKPOINT
        self.logging_dir = out.with_name(f"{out.name}-logs")

    def start(self, resumed: bool, step: int, history: list[dict]) -> None:
        if resumed:
            self.say(f"resuming {self.out} at step {step} of {self.summary['config']['steps']}")

    def log(self, record: dict, history: list[dict]) -> None:
        self.say(json.dumps(record, ensure_ascii=False))

    def save(self, checkpoint: dict, history: list[dict]) -> None:
        from zhie import encoders  # transformers: imported by the job that saves an encoder

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
            if self.run_config:
                atomic_write_text(directory / RUN_CONFIG, self.run_config)
            if history:
                plot_history(history, directory / PRETRAIN_PLOT, "accuracy")

        self.out.parent.mkdir(parents=True, exist_ok=True)
        replace_dir(self.out, write)

    def save_best(self, model: MaskedLM) -> None:
        """Nothing: the snapshot holds the model."""
