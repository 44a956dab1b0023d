"""The teachers' side of distillation: the one loader of teacher models (:func:`load_teachers`, for ``zhie distill
student`` and ``zhie distill mtmt``), and the outputs that a student of ``zhie distill student`` learns from, computed
once, stored in ``OUT/teacher/targets.pt`` (:data:`TARGETS`) with what they were computed from, and read back or reused
(:func:`teacher_lessons`)."""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from zhie.core.files import atomic_write, remove_leftovers
from zhie.dist import is_main_process
from zhie.model import Ensemble, Model
from zhie.tasks.batching import sorted_batches
from zhie.tasks.modeldir import resolve_model_dir
from zhie.tasks.pipeline import Pipeline, load_pipeline

from .record import file_facts

__all__ = ["Lesson", "load_teachers", "teacher_lessons"]

logger = logging.getLogger(__name__)

TARGETS = Path("teacher") / "targets.pt"  # under a run directory: the stored teachers' outputs
ACTIVITY_ITEMS = 4000  # the items whose activations rank the units that a narrowed cut student keeps


def load_teachers(paths: list[str | os.PathLike], device: torch.device) -> Pipeline:
    """One teacher pipeline of the model directories ``paths``, in eval mode on ``device``: the model itself, or the
    :class:`Ensemble` of several (seeds of one training: the same task, settings and vocabulary)."""
    pipes = [load_pipeline(p, device=str(device)) for p in paths]
    first = pipes[0]
    for path, pipe in zip(paths[1:], pipes[1:]):
        if type(pipe.task) is not type(first.task) or pipe.task.config != first.task.config:
            raise ValueError(f"{path} is not a model of the same task and settings as {paths[0]} "
                             f"({pipe.task.name} {dataclasses.asdict(pipe.task.config)}); an ensemble of teachers "
                             "must be seeds of one training")
        if pipe.task.tokenizer.get_vocab() != first.task.tokenizer.get_vocab():
            raise ValueError(f"{path} has another vocabulary than {paths[0]}: the teachers of an ensemble must read "
                             "the same tokens (train them on the same data with the same --keep-tokens)")
    if len(pipes) == 1:
        first.model.eval()
        return first
    return type(first)(first.task, Ensemble([p.model for p in pipes]).eval(), str(device))


def first_model(teacher: Pipeline) -> Model:
    """The teacher's model, or the first member of its ensemble (whose encoder a student is made from)."""
    return teacher.model.members[0] if isinstance(teacher.model, Ensemble) else teacher.model


def teacher_identity(teachers: list[str | os.PathLike], files: dict[str, str], settings: dict) -> dict:
    """What the stored targets were computed from: the sha256 of each teacher's weights and settings files, of the
    data files (role -> path) and the settings."""
    models = [{f.name: file_facts(f.name, f)["sha256"] for f in sorted(resolve_model_dir(path).iterdir())
               if f.suffix == ".safetensors" or f.name == "zhie.json"} for path in teachers]
    return {"teachers": models, "data": {role: file_facts(role, p)["sha256"] for role, p in files.items()}, **settings}


@dataclass
class Lesson:
    """One training item of the student and the teacher's stored target for it."""

    item: Any
    target: Any
    hidden: Tensor | None = None  # the teacher's last hidden states [tokens, hidden] (fp16), with --hidden-weight


def item_batches(task, items: list, batch_size: int, progress: bool, what: str) -> Iterator[tuple[list[int], dict]]:
    """``(indices, collated batch)`` over ``items``: batches of similar length where the task's items have ``ids``
    (``group_by_length``), else in item order; with ``progress``, a log line every 100 batches naming ``what``."""
    lengths = [len(it.ids) if task.group_by_length else 0 for it in items]
    batches = list(sorted_batches(lengths, batch_size))
    for k, idx in enumerate(batches):
        yield idx, task.collate([items[i] for i in idx])
        if progress and (k + 1) % 100 == 0:
            logger.info("%s: %d/%d batches", what, k + 1, len(batches))


@torch.no_grad()
def teacher_targets(teacher: Pipeline, items: list, batch_size: int, temperature: float, device: torch.device,
                    progress: bool = False) -> list:
    """The teacher's stored target of every item (:meth:`~zhie.tasks.base.Task.soft_targets`), in item order, in the
    batches of :func:`item_batches`."""
    task, model = teacher.task, teacher.model
    targets: list = [None] * len(items)
    for idx, batch in item_batches(task, items, batch_size, progress, "teacher targets"):
        output = model(input_ids=batch["input_ids"].to(device), attention_mask=batch["attention_mask"].to(device),
                       heads=[task.head_name])[task.head_name]
        for i, target in zip(idx, task.soft_targets(output, batch, temperature)):
            targets[i] = target
    return targets


@torch.no_grad()
def unit_activity(encoder: nn.Module, task, items: list, measures: dict, device: torch.device,
                  progress: bool = False, limit: int = ACTIVITY_ITEMS) -> dict[str, list[Tensor]]:
    """``{name: each layer's mean activity}`` of the units of ``encoder`` (the teacher's, or an ensemble's first) that
    each ``measures[name]`` (an :class:`zhie.encoders.Activity` class: feed-forward neurons, attention heads) counts,
    over a pass of the encoder alone on the first ``limit`` of ``items`` (the training windows come first)."""
    activities = {name: kind(encoder) for name, kind in measures.items()}
    try:
        for _, batch in item_batches(task, items[:limit], 64, progress, "unit activity"):
            for activity in activities.values():
                activity.mask = batch["attention_mask"]
            encoder(input_ids=batch["input_ids"].to(device), attention_mask=batch["attention_mask"].to(device))
    finally:
        for activity in activities.values():
            activity.close()
    return {name: activity.means() for name, activity in activities.items()}


@torch.no_grad()
def teacher_hidden(teacher: Pipeline, items: list, batch_size: int, device: torch.device,
                   progress: bool = False) -> list[Tensor]:
    """The teacher encoder's last hidden states of every item, ``[its tokens (specials included), hidden]`` in fp16 on
    the CPU, in item order, in the batches of :func:`item_batches`."""
    states: list = [None] * len(items)
    for idx, batch in item_batches(teacher.task, items, batch_size, progress, "teacher hidden states"):
        mask = batch["attention_mask"]
        hidden = teacher.model.encoder(input_ids=batch["input_ids"].to(device),
                                       attention_mask=mask.to(device)).last_hidden_state
        for row, i in enumerate(idx):
            states[i] = hidden[row, :int(mask[row].sum())].to("cpu", torch.float16)
    return states


def teacher_lessons(teacher: Pipeline, items: Callable[[], list], out: Path, identity: dict, *, temperature: float,
                    device: torch.device, resume: bool = True, targets_from: str | os.PathLike | None = None,
                    measures: dict | None = None, hidden: bool = False, progress: bool = False) -> dict:
    """What the student of the run ``out`` learns from: ``{"identity", "lessons"}`` (:class:`Lesson`), read back from
    ``out`` (:func:`stored_lessons`, with ``resume``), else copied from the run ``targets_from``
    (:func:`reused_lessons`), else computed by the teacher on ``items()`` (the student's items, made only then) at
    ``temperature`` (:func:`teacher_targets`); then what they lack of: each layer's activity of the units of
    ``measures`` (``{name: Activity class}``, :func:`unit_activity` of :func:`first_model`'s encoder, stored under
    ``name``) and, with ``hidden``, the teacher's last hidden states (:func:`teacher_hidden`). Each addition is stored
    in ``out/TARGETS`` at once, so that a run that stops there does not compute it again."""
    types = type(teacher.task).item_types
    if is_main_process():
        remove_leftovers(out / TARGETS.parent)  # a killed save's (the job holds the run directory's lock)
    stored = stored_lessons(out, identity, resume, types)
    if stored is None and targets_from is not None:
        stored = reused_lessons(Path(targets_from), identity, types)
        save_lessons(out, stored)
    if stored is None:
        made = items()
        targets = teacher_targets(teacher, made, 64, temperature, device, progress)
        stored = {"identity": identity, "lessons": [Lesson(it, t) for it, t in zip(made, targets)]}
        save_lessons(out, stored)
    missing = {name: kind for name, kind in (measures or {}).items() if name not in stored}
    if missing:
        stored = {**stored, **unit_activity(first_model(teacher).encoder, teacher.task,
                                            [les.item for les in stored["lessons"]], missing, device, progress)}
        save_lessons(out, stored)
    if hidden and stored["lessons"] and stored["lessons"][0].hidden is None:
        states = teacher_hidden(teacher, [les.item for les in stored["lessons"]], 64, device, progress)
        stored = {**stored, "lessons": [Lesson(les.item, les.target, h) for les, h in zip(stored["lessons"], states)]}
        save_lessons(out, stored)
    return stored


def save_lessons(out: Path, stored: dict) -> None:
    """``stored`` in ``out/TARGETS``, written by the main process only, whole or not at all."""
    if is_main_process():
        path = out / TARGETS
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, lambda f: torch.save(stored, f))


def identity_changes(stored: dict, identity: dict) -> list[str]:
    """The keys of ``identity`` whose values a stored identity does not share, sorted."""
    return sorted(k for k in identity if stored.get(k) != identity[k])


def load_lessons(path: Path, item_types: tuple[type, ...]) -> dict:
    """Stored teacher outputs (:func:`save_lessons`), loaded without running any code a copied-in file may carry:
    ``torch.load(weights_only=True)`` with only :class:`Lesson` and the task's ``item_types`` allowed besides
    tensors and plain values."""
    import pickle

    try:
        with torch.serialization.safe_globals([Lesson, *item_types]):
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        raise ValueError(f"{path}: not teacher outputs that zhie loads ({str(err).splitlines()[0]}); remove the file, "
                         "and the teacher labels the items again") from None


def reused_lessons(run: Path, identity: dict, item_types: tuple[type, ...]) -> dict:
    """The teacher outputs that the distillation in ``run`` stored, which must have the same ``identity`` (teachers'
    weights, data files, settings) as the run that reuses them."""
    path = run / TARGETS
    if not path.exists():
        raise ValueError(f"--targets-from {run}: no stored teacher outputs there ({TARGETS}); name the --out "
                         "directory of an earlier zhie distill run")
    stored = load_lessons(path, item_types)
    changed = identity_changes(stored["identity"], identity)
    if changed:
        raise ValueError(f"--targets-from {run}: its teacher outputs come from other {', '.join(changed)}; reuse "
                         "only a run of the same teachers, data and settings")
    return stored


def stored_lessons(out: Path, identity: dict, resume: bool, item_types: tuple[type, ...]) -> dict | None:
    """What an earlier run with the same ``identity`` stored in ``out`` (``{"identity", "lessons"}``, and
    ``"ffn_activity"`` and ``"head_activity"`` where it measured them); None when there is none (or ``resume`` is
    off). A run directory that holds a checkpoint of another teacher or data is refused."""
    path = out / TARGETS
    if not resume or not path.exists():
        return None
    stored = load_lessons(path, item_types)
    if stored["identity"] == identity:
        return stored
    if (out / "checkpoint.pt").exists():
        changed = identity_changes(stored["identity"], identity)
        raise ValueError(f"{out} holds a distillation from other {', '.join(changed)}: resuming would mix two runs; "
                         "use another --out, or --no-resume to start this one over")
    return None
