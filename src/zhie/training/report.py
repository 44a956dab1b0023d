"""metrics.jsonl and training.png in the output directory."""

from __future__ import annotations

import json
import numbers
from pathlib import Path

from zhie.core.files import append_whole

from .checkpoint import atomic_write, atomic_write_text

__all__ = ["append_jsonl", "jsonable", "plot_history", "read_metrics", "smooth", "write_jsonl"]


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
    """``record`` as one more line of ``path``, whole or not at all (:func:`zhie.core.files.append_whole`)."""
    append_whole(Path(path), (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8"))


def write_jsonl(path: Path, records: list[dict]) -> None:
    atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))


def read_metrics(path: Path, kind: str | None = "eval") -> list[dict]:
    """The records of a ``metrics.jsonl``: the evaluations' (``kind="eval"``), the step records (``"step"``) or all
    (None), in order (:mod:`zhie.training.loop`)."""
    records = [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines()]
    return [r for r in records if kind is None or r["kind"] == kind]


def smooth(values: list[float], weight: float = 0.8) -> list[float]:
    """TensorBoard's way of smoothing: an exponential moving average, debiased (the first value is not pulled to
    0)."""
    out, average = [], 0.0
    for i, value in enumerate(values, 1):
        average = weight * average + (1 - weight) * value
        out.append(average / (1 - weight**i))
    return out


def plot_history(history: list[dict], path: Path, metric: str) -> None:
    """The records (both kinds) against the optimizer step, written atomically as PNG: the training loss of each step
    record, raw and smoothed (:func:`smooth`), with the dev ``loss`` where the evaluation gives one; the learning
    rates; the dev ``metric`` at each evaluation (and ``train_<metric>`` where the record has it: pre-training's MLM
    accuracy); where the step records have them, a multi-task loss's ``task_losses`` and ``task_weights``, and
    tokens/s.

    Uses :class:`matplotlib.figure.Figure` directly (Agg canvas, no pyplot, no global backend switch).
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    steps = [h for h in history if h["kind"] == "step"]
    evals = [h for h in history if h["kind"] == "eval"]
    panels = [("loss", _loss_curves(steps, evals)), ("learning rate", _lr_curves(steps)),
              (metric, {"training": _points(evals, lambda h: h.get(f"train_{metric}")),
                        "dev": _points(evals, lambda h: h["dev"].get(metric))}),
              ("task losses", _member_curves(steps, "task_losses")),
              ("task weights", _member_curves(steps, "task_weights")),
              ("tokens/s", {"": _points(steps, lambda h: h.get("tokens_per_s"))})]
    panels = [(title, curves) for title, curves in panels if title in ("loss", metric) or any(curves.values())]
    cols = 2 if len(panels) == 4 else min(3, len(panels))
    rows = -(-len(panels) // cols)
    fig = Figure(figsize=(4.5 * cols, 3.5 * rows), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax, (title, curves) in zip(axes, panels):
        for label, curve in curves.items():
            if curve:
                style = _STYLES.get(label, {"lw": 1.0, "marker": "o" if len(curve) < 30 else None, "ms": 3})
                ax.plot(*zip(*curve), label=label or None, **style)
        ax.set(title=title, xlabel="step")
        if title == "task losses":
            ax.set(yscale="log")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small")
        ax.grid(alpha=0.3)
    for ax in axes[len(panels):]:
        ax.set_visible(False)

    atomic_write(Path(path), lambda f: fig.savefig(f, format="png", dpi=100))


_STYLES = {"training": {"lw": 0.8, "alpha": 0.35, "color": "tab:blue"},
           "training (smoothed)": {"lw": 1.6, "color": "tab:blue"},
           "dev": {"marker": "o", "ms": 4, "color": "tab:orange"}}


def _points(records: list[dict], value) -> list[tuple[int, float]]:
    pairs = [(h["step"], value(h)) for h in records]
    return [(step, v) for step, v in pairs if isinstance(v, (int, float)) and not isinstance(v, bool)]


def _loss_curves(steps: list[dict], evals: list[dict]) -> dict:
    raw = _points(steps, lambda h: h["loss"])
    return {"training": raw, "training (smoothed)": list(zip([s for s, _ in raw], smooth([v for _, v in raw]))),
            "dev": _points(evals, lambda h: h["dev"].get("loss"))}


def _lr_curves(steps: list[dict]) -> dict:
    """One curve per distinct schedule, named after the parameter groups that follow it."""
    curves: dict[tuple, list[str]] = {}
    for name in dict.fromkeys(name for h in steps for name in h["lr"]):
        curves.setdefault(tuple(_points(steps, lambda h, name=name: h["lr"].get(name))), []).append(name)
    return {", ".join(names): list(curve) for curve, names in curves.items()}


def _member_curves(steps: list[dict], key: str) -> dict:
    names = dict.fromkeys(name for h in steps for name in h.get(key, {}))
    return {name: _points(steps, lambda h, name=name: h.get(key, {}).get(name)) for name in names}
