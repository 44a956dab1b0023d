"""``zhie distill student --teacher DIR``: a smaller student of a trained model, of any task kind, a job on the
training engine; its options are :class:`StudentOptions`' fields. The teachers' side (loading them, their stored
outputs) is :mod:`zhie.training.teachers`; the student model of each kind is :mod:`zhie.training.student_models`.

The recipe (TextBrewer's and PaddleNLP's lesson: soft targets from the teacher on a lot of unlabelled text):

1. The teacher: one model directory, or several (seeds of one training: an :class:`~zhie.model.Ensemble`, outputs
   averaged) (:func:`~zhie.training.teachers.load_teachers`).
2. The student (:func:`~zhie.training.student_models.student_model`): the teacher's encoder cut to the layers
   ``keep_layers`` (:func:`~zhie.training.student_models.student_layers`: the first N, or N spread over the depth
   ending with the last layer, or given indices), with the teacher's embeddings and heads, its layers narrowed if
   asked (feed-forward neurons, attention heads: those most active on the items,
   :func:`~zhie.training.teachers.unit_activity`) and a table of character bigrams added if asked
   (:mod:`zhie.encoders.student_bert`); or a convolutional encoder over the teacher's embeddings; or a narrower
   transformer over them (``narrow``: :func:`~zhie.training.student_models.narrow_student`); or the teacher's
   architecture started again from the encoder it was fine-tuned from (``fresh``, born-again distillation:
   :func:`~zhie.training.student_models.fresh_encoder`). Always the same task, labels, tokenizer and limits, so
   ``predict``/``eval``/``serve``/``export`` take it as they are.
3. The items: the task's training items of the labelled ``train`` file, and of unlabelled texts labelled by the
   teacher's predictions (texts that are also in ``dev`` are left out) (:meth:`~zhie.tasks.base.Task.distill_items`).
4. The targets: the teacher's head outputs on every item, computed once before the student trains and stored in
   ``OUT/teacher/targets.pt`` with what they were computed from (teachers' weights, data files, temperature); a run
   that resumes reads them back (and refuses a run directory made from other teachers or data)
   (:func:`~zhie.training.teachers.teacher_lessons`).
5. The loss: ``hard_weight × the task's own loss (gold labels; the teacher's predictions on unlabelled text) +
   (1 − hard_weight) × the soft-target loss`` of :mod:`zhie.losses.distill` (a sentence-embedding task has no hard
   loss: its student matches the teacher's pair similarities).

The best student on ``dev`` is an ordinary model directory in ``OUT/best``; its ``training.json`` and card name the
teachers and the recipe.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from zhie import encoders
from zhie.core.options import add_config_flags, option, option_fields, values_from_flags
from zhie.data import FORMATS
from zhie.data.base import read_texts
from zhie.dist import is_main_process, local_device
from zhie.encoders import student_bert
from zhie.encoders.conv import STUDENT_DILATIONS, STUDENT_RESIDUAL
from zhie.model import Model
from zhie.tasks.base import Evaluator
from zhie.tasks.modeldir import resolve_model_dir

from .checkpoint import claims_out
from .config import TrainConfig, add_job_flags, config_from_flags
from .loop import train
from .record import finish, run_record, saver, write_run_config, write_summary
from .student_models import STUDENTS, check_student, other_head, student_model, teacher_origin
from .teachers import Lesson, first_model, load_teachers, teacher_identity, teacher_lessons

__all__ = ["DistillObjective", "StudentOptions", "distill_student"]

STUDENT_LR = 1e-4  # the student's encoder learning rate when none is given; its heads learn at the same rate


def dilation_list(text: str) -> list[int]:
    """``--dilations 1,2,4,8`` as ``[1, 2, 4, 8]``; argparse reports the ``ValueError`` of anything else."""
    try:
        return [int(d) for d in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give whole numbers separated by commas, e.g. 1,2,4,8") from None


@dataclass
class StudentOptions:
    """The options of ``zhie distill student`` (:func:`distill_student`'s keywords take their defaults from here)."""

    teacher: tuple[str, ...] | None = option(None, "the trained model directory; repeat for an ensemble of seeds "
                                                   "(outputs averaged)", action="extend", metavar="DIR", required=True)
    train: str | None = option(None, "the labelled training file (the teacher's task reads it)", required=True)
    dev: str | None = option(None, "labelled development file: picks the best evaluation")
    out: str | None = option(None, "run directory; best/ is an ordinary model directory", required=True)
    format: str = option("auto", "format of the data files", choices=("auto", *FORMATS))
    unlabelled: tuple[str, ...] | None = option(None, "unlabelled text, one per line or JSON lines with 'text', that "
                                                      "the teacher labels; repeat for several files (texts also in "
                                                      "--dev are left out)", action="extend", metavar="FILE")
    max_unlabelled: int | None = option(None, "read at most this many unlabelled texts")
    student: str = option("cut", "cut: the teacher with fewer layers (--keep-layers); conv: a convolutional encoder of "
                                 "--encoder-layers blocks (default 4) of --width channels over the teacher's "
                                 "embeddings; narrow: a transformer of --encoder-layers layers (default 4) of --width "
                                 "over the teacher's embeddings; fresh: the teacher's architecture started again from "
                                 "the encoder it was fine-tuned from (born-again distillation)", choices=STUDENTS)
    encoder_layers: int | None = option(None, "the student's layers (cut: how many of the teacher's it keeps)")
    keep_layers: str = option("first", "which teacher layers the student keeps: first (the first --encoder-layers), "
                                       "spread (evenly spaced, ending with the last) or indices such as 2,5,8,11")
    width: int = option(256, "--student conv: channels of each block; narrow: hidden size (a multiple of 64)")
    ffn_width: int | None = option(None, "--student cut: keep the N most important feed-forward neurons of each kept "
                                         "layer (their mean activation on the training text times their output "
                                         "weights' norm; e5-small has 1536): a narrower, faster transformer",
                                   metavar="N")
    attention_heads: int | None = option(None, "--student cut: keep the K attention heads of each kept layer that "
                                               "contribute most to its output on the training text (e5-small has "
                                               "12 of 32 dimensions)", metavar="K")
    dilations: list[int] | None = option(None, "--student conv: the blocks' dilations, cycled (default 1,2,4,1: each "
                                               "token sees 17 characters after 4 blocks; 1,2,4,8 sees 31 at the same "
                                               "cost)", type=dilation_list, metavar="D,D,...")
    bigrams: int = option(0, "--student conv or cut: add a learnt table of character bigrams hashed into N rows "
                             "(e.g. 65536; 0: none): one more gather per token; a cut student's starts at zero",
                          metavar="N")
    head: str | None = option(None, "another head of the teacher's output type (egp for a gp teacher: ~10x cheaper; "
                                    "softmax for crf), fresh (give it a --head-lr such as 1e-3); default the "
                                    "teacher's (a cut student keeps its weights)")
    hard_weight: float = option(0.5, "weight of the task's own loss on gold (and teacher-predicted) labels; the "
                                     "soft-target loss gets 1 minus it")
    temperature: float = option(1.0, "softens the teacher's and student's outputs (span and tag outputs; a "
                                     "similarity student takes none)")
    hidden_weight: float = option(0.0, "add W x the mean squared difference between the student's last hidden states "
                                       "(through a learnt linear map) and the teacher's (TinyBERT's hidden-state "
                                       "loss; one --teacher; 0: off)", metavar="W")
    targets_from: str | None = option(None, "reuse the teacher outputs stored by an earlier zhie distill student run "
                                            "(its --out directory) of the same teachers, data and settings, instead "
                                            "of running the teachers again", metavar="RUN")


OPTIONS = StudentOptions  # the defaults of distill_student's keywords
TRAINING = [f.name for f in option_fields(TrainConfig) if f.name != "rdrop"]  # R-Drop: zhie train's, one task's loss


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
                    dev: str | os.PathLike | None = OPTIONS.dev,
                    unlabelled: list[str | os.PathLike] | None = OPTIONS.unlabelled,
                    max_unlabelled: int | None = OPTIONS.max_unlabelled, format: str = OPTIONS.format,
                    keep_layers: str = OPTIONS.keep_layers, encoder_layers: int | None = OPTIONS.encoder_layers,
                    student: str = OPTIONS.student, width: int = OPTIONS.width,
                    ffn_width: int | None = OPTIONS.ffn_width, attention_heads: int | None = OPTIONS.attention_heads,
                    dilations: list[int] | None = OPTIONS.dilations, bigrams: int = OPTIONS.bigrams,
                    head: str | None = OPTIONS.head, hard_weight: float = OPTIONS.hard_weight,
                    temperature: float = OPTIONS.temperature, hidden_weight: float = OPTIONS.hidden_weight,
                    targets_from: str | os.PathLike | None = OPTIONS.targets_from,
                    config: TrainConfig | None = None, resume: bool = True, progress: bool = True) -> dict:
    """Distil the model directories ``teachers`` (one, or seeds of one training) into a student, trained on the
    labelled ``train_path`` and the ``unlabelled`` text files; the best on ``dev`` (the last without it) goes to
    ``out/best``. Returns the loop's summary. See the module's docstring for the recipe.

    ``student`` (:func:`~zhie.training.student_models.student_model`; the options each kind takes:
    :func:`~zhie.training.student_models.check_student`): ``"cut"`` keeps the teacher layers of
    :func:`~zhie.training.student_models.student_layers` (``keep_layers``, ``encoder_layers``), their feed-forward
    blocks narrowed to ``ffn_width`` neurons if given (:func:`zhie.encoders.prune_ffn`, by the neurons' activity on
    the items, :func:`~zhie.training.teachers.unit_activity`), their attention to ``attention_heads`` heads if given
    (by their contribution on the items, :class:`zhie.encoders.student_bert.HeadActivity`), with a table of
    ``bigrams`` hashed character bigrams if given (zeros at first; both make it a
    :class:`zhie.encoders.student_bert.StudentBertModel`);
    ``"conv"`` is a convolutional encoder of ``encoder_layers`` blocks (default 4) of ``width`` over the teacher's
    embeddings, block ``i`` of dilation ``dilations[i % len(dilations)]`` (default
    :data:`zhie.encoders.conv.STUDENT_DILATIONS`), with a table of character bigrams hashed into ``bigrams`` rows if
    given (:class:`zhie.encoders.conv.ConvConfig`'s ``bigram_buckets``), and ``head``
    (:func:`~zhie.training.student_models.other_head`) if given;
    ``"narrow"`` is a transformer of ``encoder_layers`` layers (default 4) of ``width`` over the teacher's embeddings
    (:func:`~zhie.training.student_models.narrow_student`), with ``head`` if given.

    ``hidden_weight`` (0: off) adds the hidden-state loss (:class:`DistillObjective`) against the teacher's last hidden
    states, computed once by a pass of the teacher's encoder and stored with its outputs (one teacher only: the
    hidden states of separately trained seeds are not in one space).

    ``targets_from``: the run directory of an earlier distillation whose stored teacher outputs this one reuses
    instead of running the teachers again (copied into ``out``); they must come from the same teachers, data files
    and settings (:func:`~zhie.training.teachers.reused_lessons`).

    ``config``: the loop's :class:`~zhie.training.TrainConfig`; its ``lr`` None is :data:`STUDENT_LR`, its ``head_lr``
    None the encoder's rate; ``out/config.toml`` keeps the options as given, the rates used in ``[derived]``."""
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
    given = config or TrainConfig()
    if given.rdrop is not None:
        raise ValueError("R-Drop (--rdrop) regularises zhie train's own loss; a student learns from its teacher: leave "
                         "it out")
    lr = STUDENT_LR if given.lr is None else given.lr
    # the student's heads start trained (the teacher's) or small: the encoder's rate
    config = dataclasses.replace(given, lr=lr, head_lr=lr if given.head_lr is None else given.head_lr)
    device = local_device()
    teacher = load_teachers(teachers, device)
    cls = type(teacher.task)
    if not cls.soft_temperature and temperature != OPTIONS.temperature:
        raise ValueError(f"--temperature {temperature}: a {cls.name} student matches its teacher's outputs as they "
                         "are, with no temperature; leave it out")
    hard = hard_weight if cls.hard_labels else 0.0
    train_examples = cls.read(train_path, format)
    dev_examples = cls.read(dev, format) if dev is not None else None
    dev_texts = set(cls.texts(dev_examples)) if dev_examples else set()
    texts, text_stats = read_unlabelled(list(unlabelled or []), dev_texts, max_unlabelled)

    first = first_model(teacher)
    total = first.encoder.config.num_hidden_layers
    kept, dilations = check_student(first.encoder, student, keep_layers=keep_layers, encoder_layers=encoder_layers,
                                    width=width, ffn_width=ffn_width, attention_heads=attention_heads,
                                    dilations=dilations, bigrams=bigrams)
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
    # the dev texts too: they are left out of the unlabelled texts, so other dev texts make other items
    identity = teacher_identity(teachers, files,
                                {**({"temperature": temperature} if cls.soft_temperature else {}),
                                 "max_unlabelled": max_unlabelled, "format": format})
    measures = {name: kind for name, kind, wanted in (("ffn_activity", encoders.FfnActivity, ffn_width),
                                                      ("head_activity", student_bert.HeadActivity, attention_heads))
                if wanted is not None}
    stored = teacher_lessons(
        teacher, lambda: student_task.distill_items(train_examples, texts, lambda t: teacher.predict(t, batch_size=64)),
        out, identity, temperature=temperature, device=device, resume=resume, targets_from=targets_from,
        measures=measures, hidden=bool(hidden_weight), progress=progress)
    lessons = stored["lessons"]
    ffn = (ffn_width, [stored["ffn_activity"][k] for k in kept]) if ffn_width is not None else None
    attention = (attention_heads, [stored["head_activity"][k] for k in kept]) if attention_heads is not None else None

    model = student_model(first, student_task, student, kept, encoder_layers or 4, width, config.seed, ffn,
                          dilations, origin, bigrams, attention, fresh_head=student_task is not teacher.task)
    summary = {"task": cls.name, "items": len(lessons), **recipe}
    if is_main_process():
        write_summary(out / "distill.json", summary, progress)
        options = {"teacher": [str(t) for t in teachers], "train": str(train_path), "dev": dev, "out": str(out),
                   "format": format, "unlabelled": [str(u) for u in unlabelled or []], "max_unlabelled": max_unlabelled,
                   "student": student, "encoder_layers": encoder_layers, "keep_layers": keep_layers, "width": width,
                   "ffn_width": ffn_width, "attention_heads": attention_heads,
                   "dilations": ",".join(map(str, dilations)) if dilations != list(STUDENT_DILATIONS) else None,
                   "bigrams": bigrams, "head": head, "hard_weight": hard_weight, "temperature": temperature,
                   "hidden_weight": hidden_weight, "targets_from": targets_from}
        write_run_config(out, "distill student", options, given, {"lr": config.lr, "head_lr": config.head_lr})
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
    if is_main_process():  # a finished run's model and card stay as they were (finish() sees it)
        finish(out / "best", result, student_task.describe())
    return result


def add_command(jobs: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """``zhie distill student``: :class:`StudentOptions`' flags and the training flags that a student takes."""
    p = jobs.add_parser("student", help="a smaller, faster student of a trained model, of any task")
    add_job_flags(p, StudentOptions, TRAINING)
    p.set_defaults(handler=cmd_distill_student)
    return add_config_flags(p, "distill student", {"training": TRAINING})


def cmd_distill_student(args) -> dict:
    options = values_from_flags(args, StudentOptions)
    return distill_student(options.pop("teacher"), options.pop("train"), **options, config=config_from_flags(args),
                           resume=not args.no_resume, progress=not args.quiet)
