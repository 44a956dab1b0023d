"""Experiment trackers (``--report-to``): TensorBoard, MLflow and Weights & Biases through accelerate's tracking API.

Each writes where a run can be read offline, beside its other files (``directory``: a task's run directory):
TensorBoard's event files in ``directory/tensorboard`` (``tensorboard --logdir runs`` compares every run under
``runs/``); MLflow's file store in ``directory/mlruns`` unless ``MLFLOW_TRACKING_URI`` names another store or a
server; W&B's offline runs in ``directory/wandb`` (``wandb sync`` uploads them) unless ``WANDB_MODE`` says
otherwise. The trackers get the run's settings as hyper-parameters, each step record's numbers under ``train/``
and each evaluation's metrics under ``eval/``, at the record's optimizer step. A resumed run goes on in the same
TensorBoard directory (the steps after the checkpoint are purged, then logged again), MLflow run and W&B run.

Each tracker is an optional extra (``pip install 'zhie[tensorboard]'``, ``zhie[mlflow]``, ``zhie[wandb]``, all three:
``zhie[track]``); asking for one that is not installed is an error that gives the install line.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

__all__ = ["TRACKERS", "check_trackers", "flat_hparams", "make_trackers", "tracker_ids", "tracker_values"]

TRACKERS = ("tensorboard", "mlflow", "wandb")  # each the name of its package, its module and its extra
PROJECT = "zhie"  # W&B's project and MLflow's experiment (WANDB_PROJECT, MLFLOW_EXPERIMENT_NAME override it)


def check_trackers(names: str | tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """``names`` (a name, or several) as a tuple without ``"none"``; an error for a name that is not a tracker, or a
    tracker whose package is not installed (with the install line)."""
    names = tuple(name for name in ((names,) if isinstance(names, str) else names) if name != "none")
    for name in names:
        if name not in TRACKERS:
            raise ValueError(f"report_to: {name!r} is not a tracker; choose from {', '.join(TRACKERS)}")
        if importlib.util.find_spec(name) is None:
            raise ValueError(f"--report-to {name} needs the {name} package, which is not installed: "
                             f"pip install 'zhie[{name}]' (or 'zhie[track]' for every tracker)")
    return names


def make_trackers(names: tuple[str, ...], directory: Path, run_name: str, step: int, ids: dict) -> list:
    """accelerate's trackers for ``names``, writing under ``directory``, for a run at ``step`` (0, or the step it
    resumes from) whose MLflow and W&B runs, if it had any, are ``ids`` (:func:`tracker_ids`)."""
    from accelerate.tracking import MLflowTracker, TensorBoardTracker, WandBTracker

    trackers = []
    for name in names:
        if name == "tensorboard":  # purge_step: TensorBoard drops the events from that step on, logged again now
            trackers.append(TensorBoardTracker("tensorboard", directory, purge_step=step + 1))
        elif name == "mlflow":
            if "MLFLOW_TRACKING_URI" not in os.environ:
                import mlflow

                os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 keeps it, in maintenance mode
                mlflow.set_tracking_uri((directory / "mlruns").resolve().as_uri())
            trackers.append(MLflowTracker(PROJECT, run_id=ids.get("mlflow"), run_name=run_name))
        else:
            resume = {"id": ids["wandb"], "resume": "allow"} if "wandb" in ids else {}
            trackers.append(WandBTracker(os.environ.get("WANDB_PROJECT", PROJECT), name=run_name,
                                         dir=str(directory), mode=os.environ.get("WANDB_MODE", "offline"), **resume))
    return trackers


def tracker_ids(trackers: list) -> dict:
    """The MLflow and W&B runs of started ``trackers``, for a resumed run to go on in them."""
    ids = {}
    for tracker in trackers:
        if tracker.name == "mlflow":
            ids["mlflow"] = tracker.tracker.info.run_id
        elif tracker.name == "wandb":
            ids["wandb"] = tracker.tracker.id
    return ids


def flat_hparams(settings: dict) -> dict:
    """``settings`` as hyper-parameters every tracker takes: numbers, strings and booleans (others as text)."""
    return {key: value if isinstance(value, (bool, int, float, str)) else str(value)
            for key, value in settings.items()}


def tracker_values(record: dict) -> dict[str, float]:
    """A record of ``metrics.jsonl`` as the trackers' scalars: a step record's numbers under ``train/`` (``train/loss``,
    ``train/lr/encoder``, ``train/task_losses/ner``), an evaluation's dev metrics under ``eval/`` (``eval/f1``) and
    what the objective recorded since the last one (``train_accuracy`` -> ``train/accuracy``)."""
    if record["kind"] == "step":
        return _numbers({k: v for k, v in record.items() if k not in ("kind", "step", "elapsed_s")}, "train")
    extra = {k.removeprefix("train_"): v for k, v in record.items() if k.startswith("train_") and k != "train_loss"}
    return _numbers(record["dev"], "eval") | _numbers(extra, "train")


def _numbers(value: object, prefix: str) -> dict[str, float]:
    if isinstance(value, dict):
        return {key: v for k, item in value.items() for key, v in _numbers(item, f"{prefix}/{k}").items()}
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return {prefix: value}
    return {}
