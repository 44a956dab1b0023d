"""Watching a run (issue 26): step records in metrics.jsonl (window means, their clock, exact resume), the plot, the
flags, and the experiment trackers (TensorBoard's events read back by its own reader; MLflow's file store; W&B's
offline run)."""

import importlib.util
import math

import pytest
import torch

from zhie.training import TrainConfig, load_checkpoint
from zhie.training.progress import log_interval
from zhie.training.report import plot_history, read_metrics, smooth

from .test_training import loss_fn, run

STEP_KEYS = {"kind", "step", "epoch", "loss", "grad_norm", "tokens_per_s", "lr", "elapsed_s"}


def crash_at(batch: int):
    """A loss that raises at its ``batch``-th call (after the checkpoint of ``save_every``)."""
    calls = 0

    def crashing(model, b):
        nonlocal calls
        calls += 1
        if calls == batch:
            raise RuntimeError("interrupted")
        return loss_fn(model, b)

    return crashing


def test_step_records_are_the_means_over_their_window(tmp_path):
    config = TrainConfig(epochs=1, batch_size=8, lr=1e-2, head_lr=1e-2, max_grad_norm=None)  # 8 steps
    model_1, every = run(tmp_path / "1", TrainConfig(**{**config.__dict__, "log_every": 1}), evaluate=None)
    model_3, third = run(tmp_path / "3", TrainConfig(**{**config.__dict__, "log_every": 3}), evaluate=None)
    assert all(torch.equal(v, model_3.state_dict()[k]) for k, v in model_1.state_dict().items())  # logging is inert

    ones = every["step_records"]
    assert [r["step"] for r in ones] == list(range(1, 9)) and all(set(r) == STEP_KEYS for r in ones)
    assert [r["step"] for r in third["step_records"]] == [3, 6, 8]  # and the last step, off the clock
    for record, window in zip(third["step_records"], [ones[0:3], ones[3:6], ones[6:8]]):
        for key in ("loss", "grad_norm"):
            assert record[key] == pytest.approx(sum(r[key] for r in window) / len(window), rel=1e-12)
        assert record["lr"] == window[-1]["lr"] and record["epoch"] == window[-1]["epoch"]
        assert record["tokens_per_s"] > 0
    assert read_metrics(tmp_path / "3" / "metrics.jsonl", kind="step") == third["step_records"]
    assert [r["kind"] for r in read_metrics(tmp_path / "3" / "metrics.jsonl", kind=None)] == ["step"] * 3 + ["eval"]


def test_the_default_clock_gives_about_100_records_and_one_every_50_steps_at_least():
    assert [log_interval(n) for n in (1, 50, 100, 101, 1008, 5000, 100_000)] == [1, 1, 1, 2, 11, 50, 50]


def test_the_plot_draws_every_step_and_each_evaluation(tmp_path):
    steps = [{"kind": "step", "step": s, "loss": 2.0 / s, "lr": {"encoder": 1e-3 * s, "head": 1e-3 * s},
              "tokens_per_s": 100.0, "task_losses": {"a": 1.0, "b": 2.0}, "task_weights": {"a": 0.5}}
             for s in range(1, 11)]
    evals = [{"kind": "eval", "step": 5, "dev": {"f1": 0.5}}, {"kind": "eval", "step": 10, "dev": {"f1": 0.7}}]
    plot_history(steps[:5] + evals[:1] + steps[5:] + evals[1:], tmp_path / "p.png", "f1")
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert smooth([1.0, 1.0, 1.0]) == pytest.approx([1.0, 1.0, 1.0])  # debiased: no pull towards 0
    assert smooth([0.0, 10.0], weight=0.5) == pytest.approx([0.0, 5.0 / 0.75])


def test_flags_reach_the_config_and_a_missing_tracker_gives_its_install_line(monkeypatch):
    from zhie.cli import build_parser
    from zhie.training.config import config_from_flags

    common = ["train", "ner", "--train", "t.json", "--dev", "d.json", "--out", "o"]
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object())  # as if every tracker were installed
    args = build_parser().parse_args([*common, "--log-every", "7", "--report-to", "tensorboard", "mlflow"])
    config = config_from_flags(args)
    assert (config.log_every, config.report_to) == (7, ("tensorboard", "mlflow"))
    assert config_from_flags(build_parser().parse_args(common)).report_to == ()  # default: none
    with pytest.raises(ValueError, match="'tensorbored' is not a tracker"):
        TrainConfig(report_to=("tensorbored",))
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ValueError, match=r"wandb package, which is not installed: pip install .zhie\[wandb\]."):
        TrainConfig(report_to=("wandb",))


def test_tensorboard_events_hold_the_logged_steps_and_a_resumed_run_logs_them_once(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    config = TrainConfig(epochs=2, batch_size=8, lr=1e-2,
                         head_lr=1e-2, log_every=3, save_every=5, report_to=("tensorboard",))
    _, whole = run(tmp_path / "a", config)
    with pytest.raises(RuntimeError, match="interrupted"):
        run(tmp_path / "b", config, loss=crash_at(13))  # in step 13: the records at 6, 8 (eval) and 12 are redone
    _, resumed = run(tmp_path / "b", config)

    def scalars(directory, tag):
        events = EventAccumulator(str(directory / "tensorboard"))
        events.Reload()
        return [(e.step, e.value) for e in events.Scalars(tag)]

    steps = [(r["step"], r["loss"]) for r in whole["step_records"]]
    assert [s for s, _ in steps] == [3, 6, 9, 12, 15, 16]
    for directory in (tmp_path / "a", tmp_path / "b"):
        loss = scalars(directory, "train/loss")
        assert [s for s, _ in loss] == [s for s, _ in steps]
        assert [v for _, v in loss] == pytest.approx([v for _, v in steps], rel=1e-6)  # float32 in the events
        assert [s for s, _ in scalars(directory, "eval/f1")] == [8, 16]
        assert [s for s, _ in scalars(directory, "train/lr/encoder")] == [s for s, _ in steps]
        assert all(math.isfinite(v) and v > 0 for _, v in scalars(directory, "train/grad_norm"))
    hparams = list((tmp_path / "a" / "tensorboard").rglob("hparams.yml"))
    assert len(hparams) == 1 and "lr: 0.01" in hparams[0].read_text()
    assert [r["step"] for r in resumed["step_records"]] == [s for s, _ in steps]


def test_mlflow_file_store_in_the_run_directory(tmp_path, monkeypatch):
    if importlib.util.find_spec("mlflow") is None:
        pytest.skip("mlflow is not installed (pip install 'zhie[mlflow]')")
    from mlflow.tracking import MlflowClient

    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_ALLOW_FILE_STORE", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_RUN_ID"):
        monkeypatch.delenv(name, raising=False)
    config = TrainConfig(epochs=2, batch_size=8, lr=1e-2,
                         head_lr=1e-2, log_every=4, save_every=5, report_to=("mlflow",))
    with pytest.raises(RuntimeError, match="interrupted"):
        run(tmp_path, config, loss=crash_at(13))
    first = load_checkpoint(tmp_path / "checkpoint.pt")["progress"]["trackers"]["mlflow"]
    _, result = run(tmp_path, config)
    assert load_checkpoint(tmp_path / "checkpoint.pt")["progress"]["trackers"] == {"mlflow": first}  # the same run

    client = MlflowClient(tracking_uri=(tmp_path / "mlruns").as_uri())
    history = {m.step: m.value for m in client.get_metric_history(first, "train/loss")}
    assert history == pytest.approx({r["step"]: r["loss"] for r in result["step_records"]}, rel=1e-6)
    assert [m.step for m in client.get_metric_history(first, "eval/f1")] == [8, 16]
    params = client.get_run(first).data.params
    assert params["lr"] == "0.01" and params["report_to"] == "('mlflow',)"


def test_wandb_offline_run_in_the_run_directory(tmp_path, monkeypatch):
    if importlib.util.find_spec("wandb") is None:
        pytest.skip("wandb is not installed (pip install 'zhie[wandb]')")
    for name in ("WANDB_MODE", "WANDB_PROJECT", "WANDB_DIR", "WANDB_RUN_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    config = TrainConfig(epochs=1, batch_size=8, lr=1e-2, head_lr=1e-2, log_every=2, report_to=("wandb",))
    run(tmp_path, config)
    run_id = load_checkpoint(tmp_path / "checkpoint.pt")["progress"]["trackers"]["wandb"]
    (log,) = (tmp_path / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb")
    data = log.read_bytes()
    assert b"train/loss" in data and b"train/grad_norm" in data and b"eval/f1" in data
