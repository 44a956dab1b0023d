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
    """Training loss and dev ``metric`` per evaluation against the optimizer step, written atomically as PNG. Records
    with ``per_batch`` (a multi-task loss's rows ``{"batch", "losses", "weights"}``) add each task's loss and weight per
    batch.

    Uses :class:`matplotlib.figure.Figure` directly (Agg canvas, no pyplot, no global backend switch).
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    steps = [h["step"] for h in history]
    dev = [(h["step"], h["dev"][metric]) for h in history if isinstance(h.get("dev", {}).get(metric), float)]
    rows = [row for h in history for row in h.get("per_batch", [])]
    fig = Figure(figsize=(13.5 if rows else 9, 3.5), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 3 if rows else 2)
    loss_ax, dev_ax = axes[0], axes[1]
    loss_ax.plot(steps, [h["train_loss"] for h in history], marker="o", label="objective")
    loss_ax.set(title="training loss", xlabel="step", ylabel="loss")
    if rows:
        names = dict.fromkeys(name for row in rows for name in row["losses"])  # a sampled step has one task
        for name in names:
            mine = [row for row in rows if name in row["losses"]]
            batches = [row["batch"] for row in mine]
            loss_ax.plot(batches, [row["losses"][name] for row in mine], lw=0.8, label=name)
            axes[2].plot(batches, [row["weights"][name] for row in mine], lw=0.8, label=name)
        loss_ax.set(yscale="log")
        loss_ax.legend(fontsize="small")
        axes[2].set(title="task weights", xlabel="batch", ylabel="weight")
        axes[2].legend(fontsize="small")
    if dev:
        dev_ax.plot(*zip(*dev), marker="o", color="tab:green")
    dev_ax.set(title=f"dev {metric}", xlabel="step", ylabel=metric)
    for ax in axes:
        ax.grid(alpha=0.3)

    atomic_write(Path(path), lambda f: fig.savefig(f, format="png", dpi=100))
