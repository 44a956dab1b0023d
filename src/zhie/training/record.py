"""``training.json``: what a run of :func:`zhie.fit` records next to each model it saves, for the model card.

:func:`run_record` is taken once when the run starts: the command line (``zhie …``, or ``python …`` for a script), the
encoder (and its Hub name), the data files with their sizes and sha256, the training settings and the machine. Each
saved model adds the time it was saved and its full dev metrics (per type); when the run ends, :func:`finish` adds to
``best/`` the step, epoch and training time of its evaluation and the run's totals, and writes the card again
(:mod:`zhie.core.card`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import shlex
import sys
from collections.abc import Callable
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path

from zhie.core import card
from zhie.core.files import atomic_write_text
from zhie.tasks.modeldir import META_FILE

__all__ = ["file_facts", "finish", "machine", "now", "run_record", "saver"]

logger = logging.getLogger(__name__)


def now() -> str:
    """The time, UTC, to the second, ISO 8601."""
    return datetime.now(UTC).replace(microsecond=0).isoformat()


def file_facts(role: str, path: str | os.PathLike) -> dict:
    """``{"role", "path", "bytes", "sha256"}`` of one data file (read in 1 MiB blocks)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return {"role": role, "path": str(path), "bytes": Path(path).stat().st_size, "sha256": digest.hexdigest()}


def machine() -> dict:
    """Where the run trains: the platform, CPU cores, GPUs, processes, and the versions of Python, torch and
    transformers (no host name)."""
    import torch
    import transformers

    from zhie.dist import world_size

    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() \
        else []
    return {"platform": platform.platform(), "cpus": os.cpu_count(), "gpus": gpus, "processes": world_size(),
            "python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__}


def base_model(encoder: str) -> str | None:
    """The Hub name of the encoder a model was trained from, when it has one (``e5-small``: the model it is converted
    from; a local directory or a random encoder: None)."""
    from zhie.encoders import e5, is_random

    if encoder == e5.NAME and not Path(encoder).exists():
        return e5.HUB_NAME
    if is_random(encoder) or Path(encoder).exists():
        return None
    return encoder


def run_record(files: dict[str, str], *, encoder: str, config, options: dict) -> dict:
    """The record of a run reading ``files`` (role -> path) and training with ``config`` (a
    :class:`~zhie.training.TrainConfig`) and ``options`` (the rest of :func:`zhie.fit`'s arguments)."""
    argv = sys.argv if Path(sys.argv[0]).name == "zhie" else sys.orig_argv  # else: python and its arguments
    return {"command": shlex.join([Path(argv[0]).name, *argv[1:]]), "encoder": encoder,
            "base_model": base_model(encoder), "data": [file_facts(role, path) for role, path in files.items()],
            "train_config": asdict(config), "options": json.loads(json.dumps(options, default=str)),
            "machine": machine()}


def write_run_config(out: Path, command: str, settings: dict, config=None, derived: dict | None = None,
                     tables: dict[str, dict] | None = None) -> None:
    """``out/config.toml`` (:func:`run_config_text`)."""
    from zhie.core.config_file import RUN_CONFIG

    atomic_write_text(out / RUN_CONFIG, run_config_text(out, command, settings, config, derived, tables))


def run_config_text(out: Path, command: str, settings: dict, config=None, derived: dict | None = None,
                    tables: dict[str, dict] | None = None) -> str:
    """The ``config.toml`` of a run in ``out`` (:mod:`zhie.core.config_file`): the job ``command`` (``"train ner"``)
    with its ``settings`` as given (named as its flags), the :class:`~zhie.training.TrainConfig` ``config`` as given
    (rates left None are derived) in ``[training]``, other ``tables`` (a task's own options), and what the job
    ``derived`` (the rates it used). ``zhie COMMAND --config out/config.toml --out NEW`` trains it again; another
    ``--encoder`` derives its own rates."""
    from zhie.core import config_file

    training = {} if config is None else {"training": {k: v for k, v in asdict(config).items()
                                                       if k != "find_unused_parameters"}}
    header = (f"# the configuration of this run: `zhie {command} --config {out / config_file.RUN_CONFIG} --out NEW` "
              f"trains it again into NEW\n")
    return config_file.dumps(command, settings, {**training, **(tables or {})}, derived, header)


def write_summary(path: Path, summary: dict, progress: bool) -> None:
    """Write a job's ``summary`` of its inputs (``distill.json``) as JSON into ``path`` (its directory made), and log
    it on one line when ``progress``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(summary, ensure_ascii=False, indent=2))
    if progress:
        logger.info(json.dumps(summary, ensure_ascii=False))


def saver(task, record: dict, evaluator=None) -> Callable:
    """The loop's ``save_best`` for a run of ``task`` that ``record`` (:func:`run_record`) describes: the task saves
    the model with its record, the time and the dev metrics of the evaluation that just chose it (``evaluator``, an
    :class:`~zhie.tasks.base.Evaluator`; without one, the run's last model has none)."""

    def save_best(model, directory: Path) -> None:
        task.save(model, directory, record={**record, "saved": now(), "metric": task.metric,
                                            "dev": evaluator.last if evaluator is not None else None})

    return save_best


def finish(best: Path, result: dict, about: dict) -> None:
    """Add to ``best/training.json`` the step, epoch and training time of the evaluation that saved the model and the
    run's steps and time (``result``: :func:`zhie.training.train`'s), and write its card again; nothing when the run
    saved no model with a record, or when it trained nothing now (it had finished) and its record says so already
    (``run``). A run killed after its last checkpoint but before this is finished by the next: the record, with
    ``run``, is written after the card."""
    path = best / card.RECORD_FILE
    if not path.exists():
        return
    record = json.loads(path.read_text(encoding="utf-8"))
    if not result.get("session_steps") and "run" in record:  # a finished run's model and card stay as they were
        return
    history = result.get("history") or []
    chosen = next((h for h in history if h["step"] == result.get("best_step")), None)
    if chosen is not None:
        record["best"] = {"step": chosen["step"], "epoch": chosen["epoch"], "elapsed_s": chosen["elapsed_s"]}
    if history:
        record["run"] = {"steps": result.get("steps"), "elapsed_s": history[-1]["elapsed_s"], "finished": now()}
    meta = json.loads((best / META_FILE).read_text(encoding="utf-8"))
    atomic_write_text(best / card.CARD_FILE, card.render(meta, record, about))
    atomic_write_text(path, json.dumps(record, ensure_ascii=False, indent=2))
