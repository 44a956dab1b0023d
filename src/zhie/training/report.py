"""metrics.jsonl and training.png in the output directory."""

from __future__ import annotations

import json
import numbers
from pathlib import Path

from .checkpoint import atomic_write, atomic_write_text

__all__ = ["append_jsonl", "jsonable", "plot_history", "write_jsonl"]


def jsonable(value: object) -> object:
    """Metrics as JSON: numbers (python, numpy, 0-d tensors) -> float/int, dicts and lists recursively."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if hasattr(value, "item"):  # numpy scalars, 0-d tensors
        return jsonable(value.item())
    return float(value)


def append_jsonl(path: Path, record: dict) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record, ensure_ascii=False) + "\n")


def write_jsonl(path: Path, records: list[dict]) -> None:
    atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))


def plot_history(history: list[dict], path: Path, metric: str) -> None:
    """The records of the evaluations against the optimizer step, written atomically as PNG: the training loss (and
    the dev ``loss`` where the evaluation gives one), the dev ``metric`` (and ``train_<metric>`` where the record has
    it: pre-training's MLM accuracy), tokens/s where measured. Records with ``per_batch`` (a multi-task loss's rows
    ``{"batch", "losses", "weights"}``) add each task's loss and weight per batch.

    Uses :class:`matplotlib.figure.Figure` directly (Agg canvas, no pyplot, no global backend switch).
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    def points(value) -> list[tuple[int, float]]:
        pairs = [(h["step"], value(h)) for h in history]
        return [(step, v) for step, v in pairs if isinstance(v, float)]

    rows = [row for h in history for row in h.get("per_batch", [])]
    speed = points(lambda h: h.get("tokens_per_s"))
    fig = Figure(figsize=(4.5 * (2 + bool(rows) + bool(speed)), 3.5), layout="constrained")
    FigureCanvasAgg(fig)
    axes = list(fig.subplots(1, 2 + bool(rows) + bool(speed)))
    loss_ax, metric_ax = axes[0], axes[1]
    for ax, curves, title in (
            (loss_ax, {"training": points(lambda h: h.get("train_loss")),
                       "dev": points(lambda h: h.get("dev", {}).get("loss"))}, "loss"),
            (metric_ax, {"training": points(lambda h: h.get(f"train_{metric}")),
                         "dev": points(lambda h: h.get("dev", {}).get(metric))}, metric)):
        for label, curve in curves.items():
            if curve:
                ax.plot(*zip(*curve), marker="o", ms=3, label=label)
        ax.set(title=title, xlabel="step", ylabel=title)
    if rows:
        _plot_tasks(loss_ax, axes[2], rows)
    if speed:
        axes[-1].plot(*zip(*speed), marker="o", ms=3, color="tab:green")
        axes[-1].set(title="tokens/s", xlabel="step")
    for ax in axes:
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small")
        ax.grid(alpha=0.3)

    atomic_write(Path(path), lambda f: fig.savefig(f, format="png", dpi=100))


def _plot_tasks(loss_ax, weight_ax, rows: list[dict]) -> None:
    """Each task's loss (on ``loss_ax``, log scale) and weight per batch."""
    names = dict.fromkeys(name for row in rows for name in row["losses"])  # a sampled step has one task
    for name in names:
        mine = [row for row in rows if name in row["losses"]]
        batches = [row["batch"] for row in mine]
        loss_ax.plot(batches, [row["losses"][name] for row in mine], lw=0.8, label=name)
        weight_ax.plot(batches, [row["weights"][name] for row in mine], lw=0.8, label=name)
    loss_ax.set(yscale="log")
    weight_ax.set(title="task weights", xlabel="batch", ylabel="weight")
