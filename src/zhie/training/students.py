"""``zhie distill --teacher DIR``: a smaller student of a trained model, of any task kind, a job on the training engine.

The recipe (TextBrewer's and PaddleNLP's lesson: soft targets from the teacher on a lot of unlabelled text):

1. The teacher: one model directory, or several (seeds of one training: an :class:`~zhie.model.Ensemble`, outputs
   averaged).
2. The student: the teacher's encoder cut to the layers ``keep_layers`` (:func:`student_layers`: the first N, or N
   spread over the depth ending with the last layer, or given indices), with the teacher's embeddings and heads, its
   layers narrowed if asked (feed-forward neurons, attention heads: those most active on the items,
   :func:`unit_activity`) and a table of character bigrams added if asked (:mod:`zhie.encoders.student_bert`); or
   a convolutional encoder over the teacher's embeddings; or a narrower transformer over them (``narrow``:
   :func:`narrow_student`); or the teacher's architecture started again from the encoder it was fine-tuned from
   (``fresh``, born-again distillation: :func:`fresh_encoder`). Always the same task,
   labels, tokenizer and limits, so ``predict``/``eval``/``serve``/``export`` take it as they are.
3. The items: the task's training items of the labelled ``train`` file, and of unlabelled texts labelled by the
   teacher's predictions (texts that are also in ``dev`` are left out) (:meth:`~zhie.tasks.base.Task.distill_items`).
4. The targets: the teacher's head outputs on every item, computed once before the student trains and stored in
   ``OUT/teacher/targets.pt`` with what they were computed from (teachers' weights, data files, temperature); a run
   that resumes reads them back (and refuses a run directory made from other teachers or data).
5. The loss: ``hard_weight × the task's own loss (gold labels; the teacher's predictions on unlabelled text) +
   (1 − hard_weight) × the soft-target loss`` of :mod:`zhie.losses.distill` (a sentence-embedding task has no hard
   loss: its student matches the teacher's pair similarities).

The best student on ``dev`` is an ordinary model directory in ``OUT/best``; its ``training.json`` and card name the
teachers and the recipe.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from zhie import encoders
from zhie.core.files import atomic_write
from zhie.data.base import read_texts
from zhie.dist import is_main_process, local_device
from zhie.encoders import student_bert
from zhie.encoders.conv import STUDENT_DILATIONS, STUDENT_RESIDUAL, ConvConfig
from zhie.model import Ensemble, Model
from zhie.tasks.base import Evaluator
from zhie.tasks.batching import seeded, sorted_batches
from zhie.tasks.modeldir import resolve_model_dir
from zhie.tasks.pipeline import Pipeline, load_pipeline

from .checkpoint import claims_out
from .config import TrainConfig
from .loop import train
from .record import file_facts, finish, run_record, saver, write_summary

__all__ = ["DistillObjective", "distill_student", "student_layers"]

logger = logging.getLogger(__name__)

TARGETS = Path("teacher") / "targets.pt"
STUDENTS = ("cut", "conv", "narrow", "fresh")


def student_layers(keep: str, layers: int | None, total: int) -> list[int]:
    """The teacher layers a student keeps: ``keep`` is ``"first"`` (the first ``layers``), ``"spread"`` (``layers``
    evenly spaced, ending with the last: 12 -> 4 keeps 2, 5, 8, 11) or comma-separated indices (then ``layers`` must
    be None or their number)."""
    if keep not in ("first", "spread"):
        try:
            chosen = [int(x) for x in keep.split(",")]
        except ValueError:
            raise ValueError(f"--keep-layers {keep!r}: use first, spread or comma-separated layer indices") from None
        if layers is not None and layers != len(chosen):
            raise ValueError(f"--keep-layers names {len(chosen)} layers but --encoder-layers says {layers}")
        return chosen
    if layers is None:
        raise ValueError(f"--keep-layers {keep} needs --encoder-layers N (how many of the teacher's {total} to keep)")
    if not 1 <= layers <= total:
        raise ValueError(f"--encoder-layers {layers}: the teacher has {total} layers; keep 1 to {total}")
    if keep == "first":
        return list(range(layers))
    return [round((i + 1) * total / layers) - 1 for i in range(layers)]


@dataclass
class Lesson:
    """One training item of the student and the teacher's stored target for it."""

    item: Any
    target: Any
    hidden: Tensor | None = None  # the teacher's last hidden states [tokens, hidden] (fp16), with --hidden-weight


class DistillObjective(nn.Module):
    """``objective(model, batch)``: ``hard_weight × task.head_loss + (1 − hard_weight) × task.soft_loss``, plus
    ``hidden_weight ×`` :func:`hidden_loss` of the student's last hidden states, through a learnt linear map
    ``widths = (student, teacher)`` (started as the identity where they are equal; trained with the student, not
    saved with it), against the teacher's (``batch["teacher_hidden"]``)."""

    def __init__(self, task, hard_weight: float, temperature: float, hidden_weight: float = 0.0,
                 widths: tuple[int, int] | None = None) -> None:
        super().__init__()
        self.task, self.hard_weight, self.temperature = task, hard_weight, temperature
        self.hidden_weight = hidden_weight
        if hidden_weight:
            self.projection = nn.Linear(*widths)
            if widths[0] == widths[1]:
                with torch.no_grad():
                    self.projection.weight.copy_(torch.eye(widths[0]))
                    self.projection.bias.zero_()

    def forward(self, model: Model, batch: dict[str, Tensor]) -> Tensor:
        name = self.task.head_name
        hidden, outputs = model.hidden_and_outputs(batch["input_ids"], batch["attention_mask"], heads=[name])
        output = outputs[name]
        soft = self.task.soft_loss(output, batch, self.temperature)
        loss = soft if self.hard_weight == 0 else (
            self.hard_weight * self.task.head_loss(model.heads[name], output, batch) + (1 - self.hard_weight) * soft)
        if self.hidden_weight:
            loss = loss + self.hidden_weight * hidden_loss(self.projection(hidden), batch["teacher_hidden"],
                                                           batch["attention_mask"])
        return loss


def hidden_loss(student: Tensor, teacher: Tensor, mask: Tensor) -> Tensor:
    """The mean over the tokens of ``mask`` (``[b, n]``, 1 = token) of the mean squared difference between the
    student's (projected) and the teacher's hidden states ``[b, n, hidden]`` (TinyBERT's hidden-state loss)."""
    weights = mask.to(student.dtype).unsqueeze(-1)
    return ((student - teacher.to(student.dtype)) ** 2 * weights).sum() / (weights.sum() * student.shape[-1])


def load_teachers(paths: list[str | os.PathLike], device: torch.device) -> Pipeline:
    """One teacher pipeline of the model directories ``paths``: the model itself, or their :class:`Ensemble`."""
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
        return first
    return type(first)(first.task, Ensemble([p.model for p in pipes]).eval(), str(device))


def teacher_identity(teachers: list[str | os.PathLike], files: dict[str, str], settings: dict) -> dict:
    """What the stored targets were computed from: the sha256 of each teacher's weights and settings files, of the
    data files (role -> path) and the settings."""
    models = [{f.name: file_facts(f.name, f)["sha256"] for f in sorted(resolve_model_dir(path).iterdir())
               if f.suffix == ".safetensors" or f.name == "zhie.json"} for path in teachers]
    return {"teachers": models, "data": {role: file_facts(role, p)["sha256"] for role, p in files.items()}, **settings}


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


ACTIVITY_ITEMS = 4000  # the items whose activations rank the units that a narrowed cut student keeps


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


def read_unlabelled(paths: list[str | os.PathLike], exclude: set[str], limit: int | None) -> tuple[list[str], dict]:
    """The distinct texts of ``paths`` (one per line, or JSON lines with "text") that are not in ``exclude`` (the dev
    texts), the first ``limit`` of them; and counts of what was left out."""
    seen, texts, stats = set(exclude), [], {"unlabelled_read": 0, "unlabelled_in_dev_or_repeated": 0}
    for path in paths:
        for text in read_texts(path):
            stats["unlabelled_read"] += 1
            if text in seen:
                stats["unlabelled_in_dev_or_repeated"] += 1
                continue
            seen.add(text)
            texts.append(text)
    stats["unlabelled_beyond_limit"] = max(0, len(texts) - limit) if limit is not None else 0
    return (texts[:limit] if limit is not None else texts), stats


@claims_out
def distill_student(teachers: list[str | os.PathLike], train_path: str | os.PathLike, *, out: str | os.PathLike,
                    dev: str | os.PathLike | None = None, unlabelled: list[str | os.PathLike] | None = None,
                    max_unlabelled: int | None = None, format: str = "auto", keep_layers: str = "first",
                    encoder_layers: int | None = None, student: str = "cut", width: int = 256,
                    ffn_width: int | None = None, attention_heads: int | None = None,
                    dilations: list[int] | None = None, bigrams: int = 0, head: str | None = None,
                    hard_weight: float = 0.5, temperature: float = 1.0, hidden_weight: float = 0.0,
                    targets_from: str | os.PathLike | None = None,
                    config: TrainConfig | None = None, resume: bool = True, progress: bool = True) -> dict:
    """Distil the model directories ``teachers`` (one, or seeds of one training) into a student, trained on the
    labelled ``train_path`` and the ``unlabelled`` text files; the best on ``dev`` (the last without it) goes to
    ``out/best``. Returns the loop's summary. See the module's docstring for the recipe.

    ``student`` (:func:`student_model`): ``"cut"`` keeps the teacher layers of :func:`student_layers`
    (``keep_layers``, ``encoder_layers``), their feed-forward blocks narrowed to ``ffn_width`` neurons if given
    (:func:`zhie.encoders.prune_ffn`, by the neurons' activity on the items, :func:`unit_activity`), their attention
    to ``attention_heads`` heads if given (by their contribution on the items,
    :class:`zhie.encoders.student_bert.HeadActivity`), with a table of ``bigrams`` hashed character bigrams if given
    (zeros at first; both make it a :class:`zhie.encoders.student_bert.StudentBertModel`);
    ``"conv"`` is a convolutional encoder of ``encoder_layers`` blocks (default 4) of ``width`` over the teacher's
    embeddings, block ``i`` of dilation ``dilations[i % len(dilations)]`` (default
    :data:`zhie.encoders.conv.STUDENT_DILATIONS`), with a table of character bigrams hashed into ``bigrams`` rows if
    given (:class:`zhie.encoders.conv.ConvConfig`'s ``bigram_buckets``), and ``head`` (:func:`other_head`) if given;
    ``"narrow"`` is a transformer of ``encoder_layers`` layers (default 4) of ``width`` over the teacher's embeddings
    (:func:`narrow_student`), with ``head`` if given.

    ``hidden_weight`` (0: off) adds the hidden-state loss (:class:`DistillObjective`) against the teacher's last hidden
    states, computed once by a pass of the teacher's encoder and stored with its outputs (one teacher only: the
    hidden states of separately trained seeds are not in one space).

    ``targets_from``: the run directory of an earlier distillation whose stored teacher outputs this one reuses
    instead of running the teachers again (copied into ``out``); they must come from the same teachers, data files
    and settings (:func:`reused_lessons`)."""
    if not 0 <= hard_weight <= 1:
        raise ValueError(f"--hard-weight {hard_weight}: a weight between 0 and 1")
    if temperature <= 0:
        raise ValueError(f"--temperature {temperature}: must be positive")
    if hidden_weight < 0:
        raise ValueError(f"--hidden-weight {hidden_weight}: must be 0 (off) or positive")
    if hidden_weight and len(teachers) > 1:
        raise ValueError("--hidden-weight matches one teacher's hidden states; the seeds of an ensemble were trained "
                         "apart and their hidden states are not in one space: give one --teacher")
    if not teachers:
        raise ValueError("name at least one teacher model directory (--teacher DIR)")
    config = config or TrainConfig(lr=1e-4, batch_size=16)
    if config.head_lr is None:  # the student's heads start trained (the teacher's) or small: the encoder's rate
        config = dataclasses.replace(config, head_lr=config.lr)
    device = local_device()
    teacher = load_teachers(teachers, device)
    cls = type(teacher.task)
    hard = hard_weight if cls.hard_labels else 0.0
    train_examples = cls.read(train_path, format)
    dev_examples = cls.read(dev, format) if dev is not None else None
    dev_texts = set(cls.texts(dev_examples)) if dev_examples else set()
    texts, text_stats = read_unlabelled(list(unlabelled or []), dev_texts, max_unlabelled)

    first = teacher.model.members[0] if isinstance(teacher.model, Ensemble) else teacher.model
    total = first.encoder.config.num_hidden_layers
    if student not in STUDENTS:
        raise ValueError(f"--student {student}: choose one of {', '.join(STUDENTS)}")
    kept = student_layers(keep_layers, encoder_layers, total) if student == "cut" else None
    if student == "fresh" and encoder_layers not in (None, total):
        raise ValueError(f"--student fresh keeps the teacher's architecture ({total} layers); leave out "
                         f"--encoder-layers {encoder_layers}, or use --student cut for fewer layers")
    if ffn_width is not None and student != "cut":
        raise ValueError("--ffn-width narrows the teacher's layers: it is for --student cut (a conv student's width "
                         "is --width)")
    if attention_heads is not None and student != "cut":
        raise ValueError("--attention-heads narrows the teacher's layers: it is for --student cut")
    if dilations is not None and student != "conv":
        raise ValueError("--dilations sets a convolutional student's blocks: it is for --student conv")
    if bigrams and student not in ("conv", "cut"):
        raise ValueError("--bigrams adds a table of character bigrams to a convolutional or a cut student: it is for "
                         "--student conv or --student cut")
    dilations = list(STUDENT_DILATIONS if dilations is None else dilations)
    # each kind's checks now, not after the teachers' pass
    if student == "conv":
        ConvConfig(dilations=dilations, bigram_buckets=bigrams)
    elif student == "narrow":
        narrow_config(first.encoder, width, encoder_layers or 4)
    elif student == "cut" and (bigrams or attention_heads is not None):
        student_bert.check_student_bert(first.encoder, bigrams, attention_heads)
    if ffn_width is not None:
        encoders.ffn_layers(first.encoder)  # a clear error now for an encoder without them, not after the targets
    student_task = teacher.task  # the first teacher's: its labels, vocabulary and files (a segmenter's words)
    if head is not None and head != getattr(student_task.config, "head", None):
        student_task = other_head(student_task, head, resolve_model_dir(teachers[0]))

    origin = teacher_origin(resolve_model_dir(teachers[0])) if student == "fresh" else None

    out = Path(out)
    files = {"train": str(train_path), **({"dev": str(dev)} if dev is not None else {}),
             **{f"unlabelled {k + 1}": str(path) for k, path in enumerate(unlabelled or [])}}
    recipe = {"teachers": [str(t) for t in teachers], "teacher_layers": total, "student": student,
              "head": getattr(student_task.config, "head", None),
              **({"kept_layers": kept, "ffn_width": ffn_width,
                  **({"attention_heads": attention_heads} if attention_heads is not None else {}),
                  **({"bigrams": bigrams} if bigrams else {})}
                 if student == "cut" else
                 {"conv_layers": encoder_layers or 4, "width": width, "dilations": dilations,
                  "residual": STUDENT_RESIDUAL, **({"bigrams": bigrams} if bigrams else {})}
                 if student == "conv" else {"layers": encoder_layers or 4, "width": width}
                 if student == "narrow" else {"origin": origin}),
              "hard_weight": hard, "temperature": temperature,
              **({"hidden_weight": hidden_weight} if hidden_weight else {}), "unlabelled_texts": len(texts),
              "max_unlabelled": max_unlabelled, **text_stats}
    identity = teacher_identity(teachers, {k: v for k, v in files.items() if k != "dev"},
                                {"temperature": temperature, "max_unlabelled": max_unlabelled, "format": format})
    stored = stored_lessons(out, identity, resume)
    if stored is None and targets_from is not None:
        stored = reused_lessons(Path(targets_from), identity)
        if is_main_process():
            (out / TARGETS).parent.mkdir(parents=True, exist_ok=True)
            atomic_write(out / TARGETS, lambda f: torch.save(stored, f))
    if stored is None:
        items = student_task.distill_items(train_examples, texts, lambda t: teacher.predict(t, batch_size=64))
        targets = teacher_targets(teacher, items, 64, temperature, device, progress)
        stored = {"identity": identity, "lessons": [Lesson(it, t) for it, t in zip(items, targets)]}
        if is_main_process():
            path = out / TARGETS
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(path, lambda f: torch.save(stored, f))
    measures = {name: kind for name, kind, wanted in (("ffn_activity", encoders.FfnActivity, ffn_width),
                                                      ("head_activity", student_bert.HeadActivity, attention_heads))
                if wanted is not None and name not in stored}
    if measures:
        stored = {**stored, **unit_activity(first.encoder, teacher.task, [les.item for les in stored["lessons"]],
                                            measures, device, progress)}
        if is_main_process():
            atomic_write(out / TARGETS, lambda f: torch.save(stored, f))
    if hidden_weight and stored["lessons"] and stored["lessons"][0].hidden is None:
        states = teacher_hidden(teacher, [les.item for les in stored["lessons"]], 64, device, progress)
        stored = {**stored, "lessons": [Lesson(les.item, les.target, h) for les, h in zip(stored["lessons"], states)]}
        if is_main_process():
            atomic_write(out / TARGETS, lambda f: torch.save(stored, f))
    lessons = stored["lessons"]
    ffn = (ffn_width, [stored["ffn_activity"][k] for k in kept]) if ffn_width is not None else None
    attention = (attention_heads, [stored["head_activity"][k] for k in kept]) if attention_heads is not None else None

    model = student_model(first, student_task, student, kept, encoder_layers or 4, width, config.seed, ffn,
                          dilations, origin, bigrams, attention, fresh_head=student_task is not teacher.task)
    summary = {"task": cls.name, "items": len(lessons), **recipe}
    if is_main_process():
        write_summary(out / "distill.json", summary, progress)
    evaluator = Evaluator(student_task, dev_examples) if dev_examples is not None else None
    record = run_record(files, encoder=str(teachers[0]), config=config,
                        options={"distilled_from": recipe}) if is_main_process() else {}

    def collate(batch: list[Lesson]) -> dict[str, Tensor]:
        collated = student_task.soft_batch(student_task.collate([b.item for b in batch]), [b.target for b in batch])
        if hidden_weight:
            states = torch.zeros((*collated["input_ids"].shape, batch[0].hidden.shape[-1]), dtype=torch.float16)
            for row, b in enumerate(batch):
                states[row, :len(b.hidden)] = b.hidden
            collated["teacher_hidden"] = states
        return collated

    lengths = [len(les.item.ids) for les in lessons] if cls.group_by_length else None
    widths = (model.encoder.config.hidden_size, first.encoder.config.hidden_size)
    objective = DistillObjective(student_task, hard, temperature, hidden_weight, widths)
    result = train(model, lessons, collate=collate, loss_fn=objective,
                   config=config, out_dir=out, evaluate=evaluator, metric=student_task.metric,
                   save_best=saver(student_task, record, evaluator), lengths=lengths, resume=resume,
                   progress=progress, identity={**identity, **{f"student.{k}": v for k, v in recipe.items()}})
    if is_main_process() and result["session_steps"]:  # a finished run's model and card stay as they were
        finish(out / "best", result, student_task.describe())
    return result


HEAD_FAMILIES = ({"gp", "egp"}, {"crf", "softmax"})  # heads of one output type: span logits, tag emissions


def other_head(task, head: str, directory: Path):
    """The teacher's ``task`` with the head ``head`` instead of its own, which must give the same output type (the
    student learns from the teacher's outputs); its files (a segmenter's vocabulary) read from ``directory``. The
    student's head of that kind starts afresh (:func:`student_model`)."""
    own = task.config.head
    if not any({own, head} <= family for family in HEAD_FAMILIES):
        raise ValueError(f"--head {head}: a student of a {own} teacher takes a head of the same output type "
                         f"({' or '.join(sorted(next(f for f in HEAD_FAMILIES if own in f)))})")
    other = type(task)(dataclasses.replace(task.config, head=head), task.tokenizer)
    other.load_files(directory)
    return other


def student_model(teacher: Model, task, kind: str, kept: list[int] | None, blocks: int, width: int,
                  seed: int, ffn: tuple[int, list[Tensor]] | None = None,
                  dilations: list[int] | tuple[int, ...] = STUDENT_DILATIONS, origin: str | None = None,
                  bigrams: int = 0, attention: tuple[int, list[Tensor]] | None = None,
                  fresh_head: bool = False) -> Model:
    """The student before training: ``"cut"``, a copy of ``teacher`` with only the encoder layers ``kept`` (their
    feed-forward blocks narrowed by ``ffn``, ``(width, each kept layer's activity)``, :func:`zhie.encoders.prune_ffn`;
    with ``bigrams`` rows of hashed bigrams, zeros at first, and the attention heads of ``attention``, ``(count, each
    kept layer's head activity)``, :func:`zhie.encoders.student_bert.student_bert`) and the teacher's heads (with
    ``fresh_head``, the task's fresh heads instead: another head kind than the teacher's); ``"conv"``, a
    convolutional encoder of ``blocks`` blocks of ``width`` and ``dilations``, with ``bigrams`` rows of hashed bigrams
    (:func:`zhie.encoders.conv.conv_student`: the teacher's embedding table, the rest initialised from ``seed``) with
    the task's fresh heads of that width; ``"narrow"``, :func:`narrow_student` of ``blocks`` layers of ``width`` with
    the task's fresh heads of that width; ``"fresh"``, :func:`fresh_encoder` of the teacher's encoder and ``origin``
    (the encoder the teacher was fine-tuned from) with the task's fresh heads."""
    if kind == "cut":
        encoder = encoders.select_layers(copy.deepcopy(teacher.encoder), kept)
        if ffn is not None:
            encoders.prune_ffn(encoder, *ffn)
        if bigrams or attention is not None:
            encoder = student_bert.student_bert(encoder, bigrams, attention)
        if not fresh_head:
            return Model(encoder, copy.deepcopy(dict(teacher.heads.items()))).cpu().train()
    elif kind == "conv":
        from zhie.encoders.conv import conv_student

        encoder = conv_student(teacher.encoder, hidden_size=width, layers=blocks, dilations=dilations,
                               bigram_buckets=bigrams, seed=seed)
    elif kind == "narrow":
        encoder = narrow_student(teacher.encoder, width, blocks, seed)
    else:
        encoder = fresh_encoder(teacher.encoder, task.tokenizer, origin, seed)
    with seeded(seed):
        model = Model(encoder, task.build_heads(encoder.config.hidden_size))
    return model.cpu().train()


def narrow_student(teacher_encoder: nn.Module, width: int, layers: int, seed: int) -> nn.Module:
    """A transformer narrower than the teacher over the teacher's own embeddings: ALBERT's layout with nothing shared
    (``num_hidden_groups`` = ``layers``), whose embeddings (words, positions, token types and their LayerNorm, of the
    teacher's width) are copies of the teacher's, so that its first activations are the teacher's, followed by a learnt
    projection to ``width`` and ``layers`` transformer layers of ``width`` (heads of 64, feed-forward 4 × ``width``,
    the teacher's activation), initialised from ``seed``. Only BERT-like teachers have such embeddings (e5-small and
    ``tiny``); others are refused."""
    student = encoders.build(narrow_config(teacher_encoder, width, layers), seed=seed)
    with torch.no_grad():
        for name in NARROW_COPIED:
            getattr(student.embeddings, name).load_state_dict(getattr(teacher_encoder.embeddings, name).state_dict())
    return student


NARROW_COPIED = ("word_embeddings", "position_embeddings", "token_type_embeddings", "LayerNorm")


def narrow_config(teacher_encoder: nn.Module, width: int, layers: int):
    """The ALBERT configuration of :func:`narrow_student`; a clear error for a teacher that is not BERT-like or a
    ``width`` that is not a positive multiple of 64."""
    from transformers import AlbertConfig

    teacher = teacher_encoder.config
    emb = getattr(teacher_encoder, "embeddings", None)
    if emb is None or not all(hasattr(emb, name) for name in NARROW_COPIED) or teacher.model_type != "bert":
        raise ValueError(f"--student narrow copies a BERT-like teacher's embeddings (words, positions, token types); "
                         f"this teacher's encoder is {teacher.model_type!r}: use --student conv")
    if width % 64 or width <= 0:
        raise ValueError(f"--width {width}: a narrow student's width is a multiple of 64 (its attention heads are 64 "
                         "wide)")
    return AlbertConfig(vocab_size=teacher.vocab_size, embedding_size=teacher.hidden_size, hidden_size=width,
                        num_hidden_layers=layers, num_hidden_groups=layers, num_attention_heads=width // 64,
                        intermediate_size=4 * width, inner_group_num=1, hidden_act=teacher.hidden_act,
                        hidden_dropout_prob=teacher.hidden_dropout_prob,
                        attention_probs_dropout_prob=teacher.attention_probs_dropout_prob,
                        max_position_embeddings=teacher.max_position_embeddings,
                        type_vocab_size=teacher.type_vocab_size, layer_norm_eps=teacher.layer_norm_eps,
                        pad_token_id=teacher.pad_token_id)


def teacher_origin(directory: Path) -> str:
    """The encoder the model in ``directory`` was fine-tuned from (its ``training.json``'s ``encoder``)."""
    try:
        return json.loads((directory / "training.json").read_text(encoding="utf-8"))["encoder"]
    except (OSError, ValueError, KeyError, TypeError):
        raise ValueError(f"{directory}: no training.json naming the encoder it was trained from; --student fresh "
                         "starts again from that encoder, so it needs a model that zhie trained") from None


def fresh_encoder(teacher_encoder: nn.Module, tokenizer, origin: str | None, seed: int) -> nn.Module:
    """The teacher's encoder as it was before its training (a born-again student's): the pre-trained encoder
    ``origin`` (the teacher's ``training.json`` ``encoder``, e.g. ``e5-small``) with its vocabulary cut to the
    teacher's tokens (``tokenizer``'s, in its order) and its first ``num_hidden_layers`` layers; when the teacher
    was trained from a random encoder (``tiny``, ``new:...``, or ``origin`` None), the teacher's architecture
    initialised anew from ``seed``."""
    layers = teacher_encoder.config.num_hidden_layers
    if origin is None or encoders.is_random(origin):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return type(teacher_encoder)(copy.deepcopy(teacher_encoder.config))
    model, full = encoders.load(origin)
    tokens = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    ids = full.convert_tokens_to_ids(tokens)
    unknown = [t for t, i in zip(tokens, ids) if i is None or (i == full.unk_token_id and t != full.unk_token)]
    if unknown:
        raise ValueError(f"the teacher's tokens {unknown[:5]} are not in {origin}'s vocabulary: it was not fine-tuned "
                         f"from {origin}, so --student fresh cannot start again from it")
    model, pruned = encoders.prune_vocab(model, full, ids)
    if pruned.convert_ids_to_tokens(list(range(len(pruned)))) != tokens:
        raise ValueError(f"{origin}'s vocabulary cut to the teacher's tokens does not give the teacher's token ids; "
                         "--student fresh needs the teacher's vocabulary to be a cut of its encoder's")
    if model.config.num_hidden_layers != layers:
        encoders.truncate_layers(model, layers)
    return model


def identity_changes(stored: dict, identity: dict) -> list[str]:
    """The keys of ``identity`` whose values a stored identity does not share, sorted."""
    return sorted(k for k in identity if stored.get(k) != identity[k])


def reused_lessons(run: Path, identity: dict) -> dict:
    """The teacher outputs that the distillation in ``run`` stored, which must have the same ``identity`` (teachers'
    weights, data files, settings) as the run that reuses them."""
    path = run / TARGETS
    if not path.exists():
        raise ValueError(f"--targets-from {run}: no stored teacher outputs there ({TARGETS}); name the --out "
                         "directory of an earlier zhie distill run")
    stored = torch.load(path, weights_only=False)  # our own file: dataclasses of the task's items
    changed = identity_changes(stored["identity"], identity)
    if changed:
        raise ValueError(f"--targets-from {run}: its teacher outputs come from other {', '.join(changed)}; reuse "
                         "only a run of the same teachers, data and settings")
    return stored


def stored_lessons(out: Path, identity: dict, resume: bool) -> dict | None:
    """What an earlier run with the same ``identity`` stored in ``out`` (``{"identity", "lessons"}``, and
    ``"ffn_activity"`` and ``"head_activity"`` where it measured them); None when there is none (or ``resume`` is
    off). A run directory that holds a checkpoint of another teacher or data is refused."""
    path = out / TARGETS
    if not resume or not path.exists():
        return None
    stored = torch.load(path, weights_only=False)  # our own file: dataclasses of the task's items
    if stored["identity"] == identity:
        return stored
    if (out / "checkpoint.pt").exists():
        changed = identity_changes(stored["identity"], identity)
        raise ValueError(f"{out} holds a distillation from other {', '.join(changed)}: resuming would mix two runs; "
                         "use another --out, or --no-resume to start this one over")
    return None
