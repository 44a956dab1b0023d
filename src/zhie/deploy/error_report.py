"""``zhie eval MODEL --data FILE --errors errors.jsonl``: what a model gets wrong, example by example.

Each task lists the errors of one example (:meth:`zhie.tasks.base.Task.errors`: NER's false positives, false
negatives and wrong types; CWS's wrong word boundaries; GPLinker's triples); this module runs the model once over the
labelled file, scores it as ``zhie eval`` does, writes one JSON line per error (``example``: its 0-based index in the
file, ``text``: its sentence, then the task's fields) through a temporary file and a rename, and counts the most
frequent confusions (gold -> predicted).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from zhie.core.files import atomic_write_text

NOTHING = "(none)"  # a confusion's side that has nothing: a false positive's gold, a false negative's prediction


def evaluate(pipe, examples: list, batch_size: int = 32, max_tokens: int | None = None) -> tuple[dict, list[dict]]:
    """``(metrics, errors)`` of the pipeline ``pipe`` on the labelled ``examples``: the metrics of ``pipe.evaluate``,
    from the same predictions as the errors."""
    from zhie.tasks.base import Task

    task = pipe.task
    if type(task).errors is Task.errors:  # before the model runs
        raise ValueError(f"the {task.name} task has no error report; leave out --errors")
    texts = task.texts(examples)  # one per example, for a task that lists errors
    predictions = pipe.predict(texts, batch_size=batch_size, max_tokens=max_tokens)
    errors = [{"example": i, **error, "text": text}
              for i, (example, text, prediction) in enumerate(zip(examples, texts, predictions, strict=True))
              for error in task.errors(example, prediction)]
    return task.score(examples, predictions), errors


def write(path: str | Path, errors: list[dict]) -> None:
    """``errors`` as JSON lines, all or nothing."""
    atomic_write_text(Path(path), "".join(json.dumps(e, ensure_ascii=False) + "\n" for e in errors))


def confusions(errors: list[dict], top: int = 10) -> list[tuple[str, str, int]]:
    """The ``top`` most frequent ``(gold, predicted, count)`` among ``errors`` (ties: first seen first)."""
    counts = Counter((e["gold"] if e["gold"] is not None else NOTHING,
                      e["predicted"] if e["predicted"] is not None else NOTHING) for e in errors)
    return [(gold, predicted, n) for (gold, predicted), n in counts.most_common(top)]


def summary(errors: list[dict], path: str | Path, top: int = 10) -> str:
    """What ``zhie eval --errors`` prints after the metrics: the errors by kind and the most frequent confusions."""
    kinds = Counter(e["kind"] for e in errors)
    lines = [f"\n{len(errors)} errors written to {path}" + (": " if kinds else "")
             + ", ".join(f"{kind} {n}" for kind, n in kinds.most_common())]
    rows = confusions(errors, top)
    if rows:
        width = max(len("gold"), *(len(g) for g, _, _ in rows)) + 2
        lines += ["most frequent confusions (gold -> predicted):", f"{'count':>7}  {'gold':<{width}}predicted"]
        lines += [f"{n:>7}  {gold:<{width}}{predicted}" for gold, predicted, n in rows]
    return "\n".join(lines)
